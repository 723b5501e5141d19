"""The bundle manifest (`edgeprefill.json`): what the exporter writes and the runtime reads.

The runtime takes every name, shape and size from here; nothing about a model is
hard-coded. Loading checks the format version, that every listed file is inside the
bundle with its recorded size, and (on request) its sha256.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Any, NoReturn, Union, get_args, get_origin, get_type_hints

from edgeprefill.contract import FileRecord, check_graph_file, check_graph_io
from edgeprefill.errors import BundleError, EdgeprefillError, one_line
from edgeprefill.json_file import load_json_object
from edgeprefill.values import is_int

if TYPE_CHECKING:  # onnx is imported only where a graph is read
    import onnx

# The version changes when a runtime that reads the old format would run a new bundle
# wrongly. A field a runtime may leave unread keeps it (an optional fact, such as
# graph.packed_tokens, which only lets a runtime fuse steps): Manifest.from_dict ignores
# fields it does not know, with a warning.
FORMAT_VERSION = 1
MANIFEST_FILE = "edgeprefill.json"
# A checkpoint's terms travel with its weights: Llama's and Gemma's licenses ask that a
# copy go wherever the model goes, so export copies them into the bundle as they are. They
# are the bundle's files though its manifest lists none (export/staging.py's --overwrite).
LICENSE_GLOBS = ("LICEN[CS]E*", "NOTICE*", "USE_POLICY*")
# The recurrent state's fields (LFM2, Qwen3.5), left out of the manifests of models without
# state layers: a runtime from before them reads those bundles without a warning.
STATE_MODEL_FIELDS = ("state_layers",)
# Left out where empty too: only Falcon-H1's layers keep KV beside their states.
KV_STATE_FIELDS = ("kv_state_layers",)
STATE_GRAPH_FIELDS = ("state_inputs", "state_outputs")
# Gemma 4's fields, OpenELM's and Llama-Nemotron's, left out where empty for the same
# reason.
LAYER_KV_FIELDS = ("shared_kv_layers", "layer_kv", "layer_heads", "attention_free_layers")
# The embedding's rows past the vocabulary (Molmo 2's, Mllama's), left out where there are
# none: a runtime from before it ignores it (with a warning) and refuses those ids, as it
# always did.
EXTRA_ROWS_FIELDS = ("embed_extra_rows",)
# The default system message, left out where there is none: a bundle without one writes
# what it always did, and a runtime from before it ignores it (with a warning) and renders
# chats as the model's template does without it.
DEFAULT_SYSTEM_FIELDS = ("default_system",)
# Multi-head latent attention's, left out where empty: a runtime from before it ignores it
# (with a warning) and keeps a value cache beside each key cache, which runs as before.
VALUE_IS_KEY_FIELDS = ("value_is_key",)
# An embedding bundle's (task "embed", its `embedding` record), left out of a generation
# bundle's manifest, which reads as it always did. A runtime from before them ignores them
# (with a warning) and then refuses the graph, whose output is `hidden`, not `logits`.
# A score bundle's (task "score", its `score` record) likewise: its graph is an embedding
# bundle's, its head a small file the runtime applies (sdk/scoring.py).
TASK_FIELDS = ("task", "embedding", "score")
# what a bundle's graph gives: logits, or hidden states (pooled, or scored by a head)
TASKS = ("generate", "embed", "score")
PROMPT_FIELDS = ("prompts", "default_prompt_name")  # left out where the model has none
POOLINGS = ("lasttoken",)  # export/sentence_layout.py: the one pooling a bundle exports
SCORE_KINDS = ("classifier", "tokens")  # export/score_head.py: where the head came from
# How a score bundle's head outputs become a relevance, by their count: 1, 2, more.
RELEVANCES = ("sigmoid", "sigmoid_difference", "none")

log = logging.getLogger("edgeprefill")


@dataclass(frozen=True)
class ModelInfo:
    family: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    # The layers without KV, each carrying recurrent states per sequence instead (LFM2's
    # short convolutions, Qwen3.5's Gated DeltaNet layers; contract.py): their names in
    # GraphInfo.state_inputs/state_outputs, their shapes and dtypes in the graph's inputs.
    # Absent (older bundles, every other family): every layer is attention.
    state_layers: list[int] = field(default_factory=list)
    # The state layers that hold KV too (Falcon-H1's attention beside its Mamba-2).
    kv_state_layers: list[int] = field(default_factory=list)
    # The layers that read KV an earlier layer wrote in the same step, with none of their
    # own (Gemma 4's KV-shared layers): no KV tensors in the graph. Absent: none.
    shared_kv_layers: list[int] = field(default_factory=list)
    # Layer (as a string) -> [kv_heads, head_dim] where a layer's KV differs from
    # num_kv_heads/head_dim (Gemma 4's full-attention layers). Absent: none differs.
    layer_kv: dict[str, list[int]] = field(default_factory=dict)
    # Layer (as a string) -> its query heads where they differ from num_heads (OpenELM's
    # layer-wise scaling). Absent: none differs. Nothing at run time reads it; it keeps
    # the heads' figures checkable (each layer's a multiple of its KV heads).
    layer_heads: dict[str, int] = field(default_factory=dict)
    # The layers with neither attention nor a recurrent state (Llama-Nemotron's NAS blocks
    # whose attention is left out or replaced by one linear layer): no KV tensors and no
    # state in the graph. Absent: none. A runtime from before the field ignores it (with a
    # warning) and then refuses the graph, which lacks those layers' KV inputs.
    attention_free_layers: list[int] = field(default_factory=list)
    # Rows the embedding table has past vocab_size (Molmo 2's additional_vocab_size image
    # markers, Mllama's 8): token ids a prompt may hold that no logit names. Absent: none.
    embed_extra_rows: int = 0

    @property
    def input_vocab_size(self) -> int:
        """The token ids a prompt may hold: 0 .. input_vocab_size - 1 (the embedding's rows;
        a logit, a logit bias or a stop id is below vocab_size)."""
        return self.vocab_size + self.embed_extra_rows

    @property
    def kv_layers(self) -> int:
        """Layers that hold KV."""
        return self.num_layers - len(self.no_kv_layers)

    @property
    def no_kv_layers(self) -> list[int]:
        """Layers without KV tensors of their own: state layers (but those that keep KV
        beside their states), KV-shared ones and attention-free ones."""
        return sorted({*self.state_layers} - {*self.kv_state_layers} | {*self.shared_kv_layers}
                      | {*self.attention_free_layers})

    def kv_dims(self, layer: int) -> tuple[int, int]:
        """(kv_heads, head_dim) of a layer's KV."""
        heads, dim = self.layer_kv.get(str(layer), (self.num_kv_heads, self.head_dim))
        return int(heads), int(dim)


@dataclass(frozen=True)
class GraphInfo:
    file: str  # the ONNX graph, relative to the bundle
    data_file: str  # its external weights
    flavor: str  # "ort" or "standard"
    dtype: str  # weights, activations and KV cache: "float32" or "float16"
    opsets: dict[str, int]
    inputs: dict[str, list[Any]]  # name -> [dtype, shape]; str dims are symbolic
    outputs: dict[str, list[Any]]
    kv_inputs: list[list[str]]  # per layer: [past_key, past_value]
    kv_outputs: list[list[str]]  # per layer: [present_key, present_value]
    quantization: str | None = None  # None, "int8" or "int4" (linear layers' weights)
    # The graph runs only each row's valid tokens outside attention (export/tokens.py): rows
    # of different lengths may share a call at the cost of their valid tokens.
    packed_tokens: bool = False
    # The recurrent states of ModelInfo.state_layers in layer order: input and output names.
    state_inputs: list[str] = field(default_factory=list)
    state_outputs: list[str] = field(default_factory=list)
    # The layers whose graph writes into present_value.{i} exactly what it writes into
    # present_key.{i} (multi-head latent attention, absorbed: the value is the key), so a
    # runtime may bind one buffer as both caches (contract.kv_buffers). Absent: none.
    value_is_key: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class TokenizerInfo:
    file: str | None  # tokenizer.json, or None for a bundle that runs from token ids
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None
    # The system message of a chat that brings none (an Ollama model's SYSTEM,
    # export/ollama_system.py; sdk/chat_template.with_default_system). Absent: none.
    default_system: str | None = None


@dataclass(frozen=True)
class EmbeddingInfo:
    """An embedding bundle's head (export/sentence_layout.py): how the graph's `hidden`
    rows become a text's vector."""

    pooling: str  # "lasttoken": the hidden state of the text's last token (the graph's row)
    normalize: bool  # L2-normalized (sentence-transformers' Normalize module)
    # sentence-transformers' named prompts (config_sentence_transformers.json), put before a
    # text by name (Qwen3-Embedding's "query": "Instruct: ...\nQuery:"), and the one put
    # before every text no prompt is asked for; written only where the folder has them.
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None


@dataclass(frozen=True)
class ScoreInfo:
    """A score bundle's head (export/score_head.py): the graph's `hidden` row of a text's
    last token times `head`'s weight [labels, hidden] (plus its bias), then the family's
    logit transforms; `relevance` says how those become one relevance in 0..1."""

    head: str  # the bundle's file holding `weight` [labels, hidden] float32, maybe `bias`
    kind: str  # "classifier" (a *ForSequenceClassification's score) or "tokens" (LM rows)
    labels: list[str]  # the head's rows: id2label's names, or the tokens
    relevance: str  # "sigmoid" (one label) | "sigmoid_difference" (two: the 2nd minus the
    #                 1st, e.g. sigmoid(yes - no)) | "none" (more labels: Engine.score only)
    template: str | None = None  # the pair's text, with {query} and {document}
    scale: float = 1.0  # the logits times this (a family's logit scale / scaling), then
    softcap: float | None = None  # c * tanh(logits / c) (Gemma 2's final soft-capping)
    pad_token_id: int | None = None  # a classifier's: trailing pad tokens are not pooled


@dataclass(frozen=True)
class Manifest:
    model: ModelInfo
    graph: GraphInfo
    tokenizer: TokenizerInfo
    chunks: list[int]  # prefill chunk buckets, ascending
    max_context: int  # positions a session may hold (prompt + generated)
    eos_token_ids: list[int]
    bos_token_id: int | None
    files: dict[str, FileRecord] = field(default_factory=dict)  # name -> sha256, bytes
    source: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    # "generate": the graph gives logits; "embed": hidden states, pooled per `embedding`;
    # "score": hidden states, scored per `score`.
    task: str = "generate"
    embedding: EmbeddingInfo | None = None
    score: ScoreInfo | None = None

    def to_json(self) -> str:
        raw = asdict(self)  # keeps the records NamedTuples, which JSON would write as lists
        raw["files"] = {name: record._asdict() for name, record in self.files.items()}
        if not self.model.state_layers:  # a model without state writes what it always did
            for record, keys in ((raw["model"], STATE_MODEL_FIELDS),
                                 (raw["graph"], STATE_GRAPH_FIELDS)):
                for key in keys:
                    del record[key]
        for key in (*LAYER_KV_FIELDS, *KV_STATE_FIELDS, *EXTRA_ROWS_FIELDS):
            if not raw["model"][key]:
                del raw["model"][key]
        for key in VALUE_IS_KEY_FIELDS:
            if not raw["graph"][key]:
                del raw["graph"][key]
        for key in DEFAULT_SYSTEM_FIELDS:
            if raw["tokenizer"][key] is None:
                del raw["tokenizer"][key]
        if self.task == "generate":
            for key in TASK_FIELDS:
                del raw[key]
        else:  # the other task's record left out (an embedding manifest as stop 50 wrote it)
            for key in ("embedding", "score"):
                if raw[key] is None:
                    del raw[key]
        if raw.get("embedding") is not None:
            for key in PROMPT_FIELDS:  # a model without prompts writes what it always did
                if not raw["embedding"][key]:
                    del raw["embedding"][key]
        return json.dumps(raw, indent=2) + "\n"

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Manifest:
        version = raw.get("format_version")
        if version != FORMAT_VERSION:
            raise _version_error(version)
        unknown: list[str] = []
        try:
            manifest = cls(
                model=ModelInfo(**_known(ModelInfo, _record(raw, "model"), "model.", unknown)),
                graph=GraphInfo(**_known(GraphInfo, _record(raw, "graph"), "graph.", unknown)),
                tokenizer=TokenizerInfo(**_known(TokenizerInfo, _record(raw, "tokenizer"),
                                                 "tokenizer.", unknown)),
                files=_file_records(raw.get("files", {})),
                embedding=_embedding(raw.get("embedding"), unknown),
                score=_score(raw.get("score"), unknown),
                **_known(cls, {k: v for k, v in raw.items()
                               if k not in ("model", "graph", "tokenizer", "files",
                                            "embedding", "score")},
                         "", unknown),
            )
        except KeyError as err:  # a required field is missing
            raise BundleError(f"{MANIFEST_FILE} is malformed: the field {err} is missing; "
                              "re-export the bundle") from None
        except TypeError as err:
            raise BundleError(f"{MANIFEST_FILE} is malformed: {err}") from None
        check_manifest(manifest)
        if unknown:
            log.warning("%s: ignoring %s this edgeprefill does not know: %s (written by a "
                        "newer edgeprefill?)", MANIFEST_FILE,
                        "a field" if len(unknown) == 1 else "fields", ", ".join(unknown))
        return manifest


def _embedding(raw: object, unknown: list[str]) -> EmbeddingInfo | None:
    """The manifest's `embedding` record, typed (None where there is none)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        _malformed(f"'embedding' must be an object, got {type(raw).__name__}")
    return EmbeddingInfo(**_known(EmbeddingInfo, raw, "embedding.", unknown))


def _score(raw: object, unknown: list[str]) -> ScoreInfo | None:
    """The manifest's `score` record, typed (None where there is none)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        _malformed(f"'score' must be an object, got {type(raw).__name__}")
    return ScoreInfo(**_known(ScoreInfo, raw, "score.", unknown))


def _version_error(version: object) -> BundleError:
    """Says which way the versions differ: re-exporting with an older edgeprefill cannot
    help a bundle a newer one wrote."""
    if version is None:
        return BundleError("edgeprefill.json has no format_version (not written by "
                           "`edgeprefill export`); re-export it with `edgeprefill export`")
    if is_int(version) and version > FORMAT_VERSION:
        return BundleError(f"bundle format version {version} is newer than this "
                           f"edgeprefill's ({FORMAT_VERSION}): upgrade edgeprefill, or "
                           "re-export the model with this one")
    return BundleError(f"bundle format version {version!r} is not supported by this "
                       f"edgeprefill (expects {FORMAT_VERSION}); re-export it with "
                       "`edgeprefill export`")


def _known(record: type, raw: dict[str, Any], prefix: str, unknown: list[str]) -> dict[str, Any]:
    """`raw` without the keys `record` has no field for; their names go to `unknown`. A
    field `record` requires (one without a default) missing from `raw` is refused in one
    line, by its name in the manifest (not the dataclass's TypeError)."""
    names = {f.name for f in fields(record)}
    unknown.extend(f"{prefix}{k}" for k in raw if k not in names)
    required = [f.name for f in fields(record)
                if f.default is MISSING and f.default_factory is MISSING]
    # the nested records are read apart (Manifest.from_dict): not this record's to check
    lacking = [n for n in required if n not in raw and n not in NESTED_RECORDS]
    if lacking:
        raise BundleError(f"{MANIFEST_FILE} is malformed: the field '{prefix}{lacking[0]}' "
                          "is missing; re-export the bundle")
    return {k: v for k, v in raw.items() if k in names}


# The manifest's records read apart from its top-level fields (Manifest.from_dict).
NESTED_RECORDS = ("model", "graph", "tokenizer", "files")


# -- checks of an edited or damaged manifest: one line each, never a traceback later ---------

# Positions a manifest may declare: far beyond any exported model, and small enough that
# a hand-edited figure cannot make the runtime try to allocate exabytes of KV cache.
MAX_CONTEXT_LIMIT = 1 << 22
GRAPH_FLAVORS = ("ort", "standard")  # export/flavors.py: what the backends know
QUANTIZATIONS = (None, "int8", "int4")  # export/quantize.py's KINDS, and none


def _record(raw: dict[str, Any], name: str) -> dict[str, Any]:
    value = raw[name]
    if not isinstance(value, dict):
        raise BundleError(f"{MANIFEST_FILE} is malformed: '{name}' must be an object")
    return value


def _file_records(raw: object) -> dict[str, FileRecord]:
    """The manifest's `files` as written ({name: {"sha256": str, "bytes": int}}), typed."""
    if not isinstance(raw, dict) or not all(
        isinstance(name, str) and isinstance(entry, dict) for name, entry in raw.items()
    ):
        _malformed(f"'files' must be an object of {{'sha256': str, 'bytes': int}} records, "
                   f"got {type(raw).__name__} {short_repr(raw)}")
    records = {}
    for name, entry in raw.items():
        sha256, size = entry.get("sha256"), entry.get("bytes")
        if not isinstance(sha256, str) or not is_int(size):
            _malformed(f"files[{name!r}] must be {{'sha256': str, 'bytes': int}}")
        records[name] = FileRecord(sha256, size)
    return records


def check_manifest(manifest: Manifest) -> None:
    """Every field has its declared type, and the figures agree with each other."""
    for record in (manifest, manifest.model, manifest.graph, manifest.tokenizer):
        _check_types(record)
    _check_task(manifest)
    model = manifest.model
    for name in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size",
                 "vocab_size"):
        if getattr(model, name) < 1:
            _malformed(f"model.{name} must be positive, got {getattr(model, name)}")
    if model.embed_extra_rows < 0:
        _malformed(f"model.embed_extra_rows must be >= 0, got {model.embed_extra_rows}")
    if model.num_heads % model.num_kv_heads:
        _malformed(f"model.num_heads ({model.num_heads}) is not a multiple of "
                   f"model.num_kv_heads ({model.num_kv_heads})")
    if not 2 <= manifest.max_context <= MAX_CONTEXT_LIMIT:
        _malformed(f"max_context must be in 2..{MAX_CONTEXT_LIMIT}, got {manifest.max_context}")
    chunks = manifest.chunks
    if not chunks or chunks != sorted(set(chunks)) or chunks[0] < 1:
        _malformed(f"chunks must be distinct positive sizes in ascending order, got {chunks}")
    if chunks[-1] > manifest.max_context:
        _malformed(f"chunk {chunks[-1]} exceeds max_context {manifest.max_context}")
    ids = [*manifest.eos_token_ids, *([] if manifest.bos_token_id is None
                                      else [manifest.bos_token_id])]
    if any(not 0 <= i < model.vocab_size for i in ids):
        _malformed(f"a BOS/EOS token id in {ids} is outside the vocabulary of {model.vocab_size}")
    if manifest.graph.quantization not in QUANTIZATIONS:
        _malformed(f"graph.quantization must be int8, int4 or null, got "
                   f"{manifest.graph.quantization!r}")
    if manifest.graph.flavor not in GRAPH_FLAVORS:
        _malformed(f"graph.flavor must be one of {', '.join(GRAPH_FLAVORS)}, "
                   f"got {manifest.graph.flavor!r}")
    states = model.state_layers
    # A bundle without KV is one whose every layer carries states (Mamba-2): a layer that
    # is neither attends.
    if states != sorted(set(states)) or any(not 0 <= i < model.num_layers for i in states) \
            or (model.kv_layers == 0 and len(states) != model.num_layers):
        _malformed(f"model.state_layers {states} must be distinct layers in ascending "
                   "order, leaving a layer with KV unless every layer carries states")
    both = model.kv_state_layers
    if both != sorted(set(both)) or not set(both) <= set(states):
        _malformed(f"model.kv_state_layers {both} must be distinct state layers in "
                   "ascending order")
    _check_layer_kv(model)
    graph = manifest.graph
    if len(graph.state_inputs) != len(graph.state_outputs) or \
            bool(graph.state_inputs) != bool(states):
        _malformed("graph.state_inputs/state_outputs must pair up, and be given exactly "
                   "where model.state_layers is")
    if len(manifest.graph.kv_inputs) != model.kv_layers or len(
            manifest.graph.kv_outputs) != model.kv_layers or any(
        len(pair) != 2 for pair in (*manifest.graph.kv_inputs, *manifest.graph.kv_outputs)
    ):
        _malformed("graph.kv_inputs/kv_outputs must hold one [key, value] pair per layer "
                   "with KV (every layer but model.state_layers not in model.kv_state_layers, "
                   "model.shared_kv_layers and model.attention_free_layers)")
    _check_value_is_key(manifest)


def _check_task(manifest: Manifest) -> None:
    """task is one of TASKS, and an embedding record is given exactly for "embed", a
    score record exactly for "score"."""
    if manifest.task not in TASKS:
        _malformed(f"task must be one of {', '.join(TASKS)}, got {manifest.task!r}")
    embedding = manifest.embedding
    if (embedding is not None) != (manifest.task == "embed"):
        _malformed("an 'embedding' record is given exactly where task is \"embed\"")
    if embedding is not None:
        _check_types(embedding)
        if embedding.pooling not in POOLINGS:
            _malformed(f"embedding.pooling must be one of {', '.join(POOLINGS)}, got "
                       f"{embedding.pooling!r}")
        default = embedding.default_prompt_name
        if default is not None and default not in embedding.prompts:
            _malformed(f"embedding.default_prompt_name {default!r} is none of "
                       "embedding.prompts")
    if (manifest.score is not None) != (manifest.task == "score"):
        _malformed("a 'score' record is given exactly where task is \"score\"")
    if manifest.score is not None:
        _check_score(manifest.score, manifest.files)


def relevance_of(labels: int) -> str:
    """How `labels` head outputs become a relevance (RELEVANCES by their count)."""
    return RELEVANCES[min(labels, len(RELEVANCES)) - 1]


def _check_score(score: ScoreInfo, files: dict[str, FileRecord]) -> None:
    """The score record's kind, relevance and labels agree, and its head is a bundle file."""
    _check_types(score)
    if score.kind not in SCORE_KINDS:
        _malformed(f"score.kind must be one of {', '.join(SCORE_KINDS)}, got {score.kind!r}")
    if score.relevance not in RELEVANCES:
        _malformed(f"score.relevance must be one of {', '.join(RELEVANCES)}, got "
                   f"{score.relevance!r}")
    if not score.labels or score.relevance != relevance_of(len(score.labels)):
        _malformed(f"score.relevance {score.relevance!r} does not fit "
                   f"{len(score.labels)} labels")
    if score.head not in files:
        _malformed(f"score.head {score.head!r} is not one of the bundle's files")
    if score.softcap is not None and not score.softcap > 0:
        _malformed(f"score.softcap must be positive, got {score.softcap!r}")


def _check_value_is_key(manifest: Manifest) -> None:
    """graph.value_is_key names distinct layers with KV, in an ort graph: the TensorRT
    backend binds every cache to a buffer of its own (and runs only the standard flavour,
    which the exporter leaves without the field)."""
    shared, model = manifest.graph.value_is_key, manifest.model
    if not shared:
        return
    kv = set(range(model.num_layers)) - set(model.no_kv_layers)
    if shared != sorted(set(shared)) or not set(shared) <= kv:
        _malformed(f"graph.value_is_key {shared} must be distinct layers with KV in "
                   "ascending order")
    if manifest.graph.flavor != "ort":
        _malformed(f"graph.value_is_key is for the ort flavour only, not "
                   f"{manifest.graph.flavor!r}")


def _check_layer_kv(model: ModelInfo) -> None:
    shared = model.shared_kv_layers
    if shared != sorted(set(shared)) or any(not 0 < i < model.num_layers for i in shared) \
            or set(shared) & set(model.state_layers):
        _malformed(f"model.shared_kv_layers {shared} must be distinct layers after the "
                   "first, in ascending order, none of them a state layer")
    free = model.attention_free_layers
    if free != sorted(set(free)) or any(not 0 <= i < model.num_layers for i in free) \
            or set(free) & {*model.state_layers, *shared}:
        _malformed(f"model.attention_free_layers {free} must be distinct layers in ascending "
                   "order, none of them a state or KV-shared layer")
    for key, dims in model.layer_kv.items():
        if not key.isdigit() or int(key) >= model.num_layers or len(dims) != 2 or \
                min(dims) < 1 or model.layer_heads.get(key, model.num_heads) % dims[0]:
            _malformed(f"model.layer_kv[{key!r}] must be a layer's [kv_heads, head_dim], "
                       f"kv_heads dividing the layer's query heads; got {dims}")
    for key, heads in model.layer_heads.items():
        if not key.isdigit() or int(key) >= model.num_layers or heads < 1 or \
                heads % model.kv_dims(int(key))[0]:
            _malformed(f"model.layer_heads[{key!r}] must be a layer's query heads, a multiple "
                       f"of its KV heads; got {heads}")


def _check_types(record: Any) -> None:
    hints = get_type_hints(type(record))
    for f in fields(record):
        value = getattr(record, f.name)
        if not _is_instance(value, hints[f.name]):
            _malformed(f"'{f.name}' must be {_type_name(hints[f.name])}, got "
                       f"{type(value).__name__} {short_repr(value)}")


def _is_instance(value: Any, hint: Any) -> bool:
    """isinstance for the annotations the manifest uses (unions, list[...], dict[...])."""
    if hint is Any:
        return True
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, UnionType):
        return any(_is_instance(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_is_instance(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _is_instance(k, args[0]) and _is_instance(v, args[1]) for k, v in value.items())
    if hint is type(None):
        return value is None
    if hint in (int, float) and isinstance(value, bool):
        return False  # JSON true is no count
    if hint is float:
        return isinstance(value, int | float)
    return isinstance(value, hint)


def _type_name(hint: Any) -> str:
    name = getattr(hint, "__name__", None) if get_origin(hint) is None else None
    return name if isinstance(name, str) else str(hint)


def short_repr(value: Any, width: int = 40) -> str:
    """repr(value), cut to `width` characters with "..." where longer: one line shows it."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def _malformed(problem: str) -> NoReturn:
    raise BundleError(f"{MANIFEST_FILE} is malformed: {problem}; re-export the bundle")


def sha256_of(path: Path, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def file_record(path: Path) -> FileRecord:
    return FileRecord(sha256_of(path), path.stat().st_size)


def load_manifest(bundle_dir: str | Path, verify_checksums: bool = False) -> Manifest:
    """Read and check a bundle's manifest. Sizes are always checked (cheap); sha256 of
    every file only with `verify_checksums` (it reads all the weights)."""
    root = given_path(bundle_dir, "bundle", BundleError)
    path = root / MANIFEST_FILE
    if not path.is_file():
        if not root.exists():
            raise BundleError(f"{root} does not exist")
        source = _export_source(root)
        if source is not None:
            raise BundleError(f"{root} is {source}, not an edgeprefill bundle: make one with "
                              f"`edgeprefill export {root} -o BUNDLE`")
        if root.is_file() and (root.parent / MANIFEST_FILE).is_file():
            # `inspect b/edgeprefill.json`: the manifest, or a graph, given for its folder
            raise BundleError(f"{root} is a file of the bundle {root.parent}: give the folder")
        raise BundleError(f"{root} is not an edgeprefill bundle (no {MANIFEST_FILE})")
    manifest = Manifest.from_dict(load_json_object(path, BundleError))
    check_graph_io(manifest)
    for name, record in manifest.files.items():
        _check_file(root, name, record, verify_checksums)
    return manifest


def _export_source(root: Path) -> str | None:
    """What `edgeprefill export` would take `root` as, if it is no bundle: the input people
    most often give `run` or `inspect` by mistake."""
    if (root / "config.json").is_file():
        return "a Hugging Face model folder"
    if root.suffix.lower() == ".gguf" and root.is_file():
        return "a GGUF file"
    return None


def given_path(value: str | Path, what: str, error: type[EdgeprefillError]) -> Path:
    """`value` as a Path; an empty one refused with `error` naming `what`: Path("") is ".",
    the current folder, which nobody typed. Neither a str nor a PathLike: refused too."""
    if not isinstance(value, str | os.PathLike):
        raise error(f"the {what} path must be a string or a Path, got {type(value).__name__}")
    if str(value) == "":
        raise error(f"the {what} path is empty")
    return Path(value)


def resolve_inside(root: Path, name: str) -> Path:
    """The path of a bundle file, refusing names that leave the bundle directory."""
    path = (root / name).resolve()
    if not path.is_relative_to(root.resolve()):
        raise BundleError(f"bundle file {name!r} points outside the bundle directory")
    return path


def load_graph(bundle_dir: Path, manifest: Manifest) -> onnx.ModelProto:
    """The bundle's ONNX graph without its weights (an onnx.ModelProto), checked against
    what a backend would otherwise fail on with a traceback: a file that is no ONNX model
    (or an empty one), external data outside the bundle directory or past the end of its
    file, and inputs and outputs other than the manifest's (another bundle's graph)."""
    import onnx

    path = resolve_inside(bundle_dir, manifest.graph.file)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # onnx raises DecodeError and others for a corrupt file
        raise BundleError(f"{path} is not a readable ONNX model: {one_line(err)}") from None
    if not model.opset_import or not model.graph.node:  # protobuf parses b"" as empty
        raise BundleError(f"{path} is not a readable ONNX model: it holds no graph; "
                          "re-export the bundle")
    _check_external_data(bundle_dir, model)
    check_graph_file(manifest, *_graph_io(model))
    return model


def _check_external_data(bundle_dir: Path, model: onnx.ModelProto) -> None:
    """Every weight the graph keeps outside it lies inside the bundle directory and
    within its file (ONNX Runtime's own refusal is a traceback)."""
    sizes: dict[str, int] = {}
    for tensor in model.graph.initializer:
        entry = {e.key: e.value for e in tensor.external_data}
        if "location" not in entry:
            continue
        location = entry["location"]
        path = resolve_inside(bundle_dir, location)
        if location not in sizes:
            if not path.is_file():
                raise BundleError(f"bundle file {location} (the graph's weights) is missing "
                                  f"from {bundle_dir}")
            sizes[location] = path.stat().st_size
        try:
            end = int(entry.get("offset", 0)) + int(entry["length"])
        except (KeyError, ValueError):
            continue  # no length: ONNX Runtime reads to the end of the file
        if end > sizes[location]:
            raise BundleError(f"bundle file {location} is too short for the graph: "
                              f"{tensor.name} ends at byte {end} of {sizes[location]}; the "
                              "bundle is corrupt, re-export it")


def _graph_io(model: onnx.ModelProto) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """The graph file's inputs and outputs as the manifest writes them: name -> [dtype,
    shape], a symbolic axis by its name (None where the file leaves it unnamed)."""
    import onnx

    def spec(value: onnx.ValueInfoProto) -> list[Any]:
        tensor = value.type.tensor_type
        try:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        except KeyError:  # no tensor type, or one numpy has no name for
            dtype = str(tensor.elem_type)
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tensor.shape.dim]
        return [dtype, dims if tensor.HasField("shape") else None]

    initializers = {t.name for t in model.graph.initializer}
    inputs = {v.name: spec(v) for v in model.graph.input if v.name not in initializers}
    return inputs, {v.name: spec(v) for v in model.graph.output}


def _check_file(root: Path, name: str, record: FileRecord, full: bool) -> None:
    path = resolve_inside(root, name)
    if not path.is_file():
        raise BundleError(f"bundle file {name} is missing from {root}")
    if path.stat().st_size != record.bytes:
        raise BundleError(f"bundle file {name} has the wrong size: the bundle is corrupt")
    if full and sha256_of(path) != record.sha256:
        raise BundleError(f"bundle file {name} fails its checksum: the bundle is corrupt")
