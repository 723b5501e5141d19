"""HF checkpoint folder -> bundle: config, graph, weights, tokenizer, manifest."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgeprefill import __version__
from edgeprefill.bundle import (
    LICENSE_GLOBS,
    MANIFEST_FILE,
    GraphInfo,
    Manifest,
    ModelInfo,
    TokenizerInfo,
    file_record,
    given_path,
)
from edgeprefill.contract import kv_names, state_names
from edgeprefill.errors import ExportError
from edgeprefill.export import ollama_store, slow_tokenizer
from edgeprefill.export.bnb import BnbScheme
from edgeprefill.export.checkpoint import MODEL_FILES, Checkpoint
from edgeprefill.export.config_checks import check_tokenizer_fits
from edgeprefill.export.decoder import DecoderBuilder
from edgeprefill.export.eos_append import append_eos
from edgeprefill.export.flavors import flavor_class
from edgeprefill.export.gguf_input import converted, gguf_file_of
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.lm_head import warn_if_kept_apart
from edgeprefill.export.lora import Adapter, adapter_hint, quantized_base
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.model_quirks import model_quirks
from edgeprefill.export.ollama_params import write_generation_config
from edgeprefill.export.ollama_store import OllamaModel, is_ollama_name
from edgeprefill.export.ollama_system import kept_system
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.export.score_head import HEAD_FILE, ScoreOptions, check_source, score_head
from edgeprefill.export.sentence_layout import TASKS, embedding_head
from edgeprefill.export.staging import check_target, staged
from edgeprefill.export.writer import write_external_data
from edgeprefill.json_file import load_json_object, optional_json_object
from edgeprefill.sdk.chat_template import check_export_template, template_source
from edgeprefill.sdk.generation_defaults import check_export_generation_config

log = logging.getLogger(__name__)

GRAPH_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "generation_config.json", "chat_template.jinja",
)
DTYPES = {"fp32": np.float32, "fp16": np.float16}
DEFAULT_CHUNKS = (16, 64, 256)
# onnxruntime 1.22+ loads IR <= 10 for these opsets; newer onnx writes a higher IR by default.
IR_VERSION = {"ort": 10, "standard": 11}


@dataclass(frozen=True)
class ExportOptions:
    flavor: str = "ort"
    dtype: str = "fp32"
    chunks: tuple[int, ...] = DEFAULT_CHUNKS
    max_context: int | None = None  # default: the model's max positions, capped at 4096
    overwrite: bool = False
    show_progress: bool = True
    quant: QuantConfig | None = None  # weight quantization (ort flavour)
    adapter: Path | None = None  # a PEFT LoRA adapter folder, merged into the weights
    # "embed": an embedding bundle; "generate": a generation bundle; "auto": embed exactly
    # where the folder is sentence-transformers' (export/sentence_layout.py); "score": a
    # score bundle (export/score_head.py), its tokens and pair template in `score`
    task: str = "auto"
    score: ScoreOptions = ScoreOptions()

    def __post_init__(self) -> None:
        flavor_class(self.flavor)  # raises with the valid names
        if self.task not in TASKS:
            raise ExportError(f"unknown task {self.task!r}; choose one of: {', '.join(TASKS)}")
        self.score.check(self.task)
        if self.dtype not in DTYPES:
            raise ExportError(f"unknown dtype {self.dtype!r}; choose one of: {', '.join(DTYPES)}")
        if not self.chunks or any(c < 1 for c in self.chunks):
            raise ExportError(f"chunk sizes must be positive integers, got {self.chunks}")
        if self.quant is not None:
            _check_quantized(self.quant, self.flavor)
        if self.max_context is not None and self.max_context < 2:
            raise ExportError(f"--max-context must be at least 2, got {self.max_context}")


def _check_quantized(quant: QuantConfig, flavor: str) -> None:
    """Quantized weights are com.microsoft ops (the `ort` flavour). A float16 bundle's (a
    GPU's) int8 weights are MatMulNBits' 8-bit blocks, not DynamicQuantizeMatMul's
    (float32-only: the CPU's prefill lever), as they are for ONNX Runtime's CUDA provider
    (export/quantize.py)."""
    if flavor != "ort":
        raise ExportError("quantization needs --flavor ort (its quantized ops are ONNX "
                          "Runtime's)")


def export(hf_dir: str | Path, out_dir: str | Path, options: ExportOptions) -> Manifest:
    """`hf_dir`: a Hugging Face folder, or a GGUF file (or a folder holding one and no
    config.json, or `ollama:NAME[:TAG]`, a model in Ollama's store: export/ollama_store.py),
    which export/gguf_input.py converts to a Hugging Face folder first."""
    given_path(hf_dir, "model", ExportError)  # kept as given: it may be ollama:NAME
    out_dir = given_path(out_dir, "output", ExportError)
    ollama = ollama_store.resolve(hf_dir) if is_ollama_name(hf_dir) else None
    hf_dir = Path(hf_dir if ollama is None else ollama.gguf)
    gguf_file = gguf_file_of(hf_dir)
    if gguf_file is None:
        return _export(hf_dir, out_dir, options, {"path": str(hf_dir.resolve())})
    if options.adapter is not None:
        # A LoRA is trained on the float weights; a GGUF's are llama.cpp's (often
        # quantized) copy of them, which the merge would silently build on.
        given = gguf_file.name if ollama is None else \
            f"{ollama_store.PREFIX}{ollama.name.shortest()}'s model"  # not the blob's hash
        raise ExportError(f"--adapter merges into a Hugging Face base model folder, not a "
                          f"GGUF file ({given}): export the adapter with the base model "
                          "it was trained on")
    check_target(out_dir, options.overwrite)  # before a conversion that may take minutes
    with converted(gguf_file, out_dir, options.show_progress, options.task,
                   options.score) as (folder, gguf):
        source = {"path": gguf.path, "gguf": gguf.as_dict()}
        if gguf.scores:  # a reranker (pooling rank): a score bundle, under auto too
            options = replace(options, task="score",
                              score=replace(options.score, template=gguf.rerank_template))
        system = None
        if ollama is not None:
            system = _add_ollama_files(ollama, folder)
            source["ollama"] = ollama.record()
        return _export(folder, out_dir, options, source, system)


def _add_ollama_files(ollama: OllamaModel, folder: Path) -> str | None:
    """What an Ollama model carries beside its GGUF, into the converted folder the bundle is
    exported from: its parameters as generation_config.json's defaults, its licenses; and
    its SYSTEM message, returned where the bundle can keep it (export/ollama_system.py).
    Its Go template is not needed (the GGUF carries the Jinja chat template the bundle
    uses)."""
    shown = f"{ollama_store.PREFIX}{ollama.name.shortest()}"
    write_generation_config(ollama.params, folder, shown)
    for i, text in enumerate(ollama.licenses):
        (folder / ("LICENSE" if i == 0 else f"LICENSE-{i + 1}")).write_text(text)
    return kept_system(ollama.system, folder, shown)


def _export(hf_dir: Path, out_dir: Path, options: ExportOptions,
            source: dict[str, Any], system: str | None = None) -> Manifest:
    """`source`: what the manifest records of where the checkpoint came from; `system`:
    the bundle's default system message (an Ollama model's SYSTEM), if any."""
    if not hf_dir.is_dir():
        raise ExportError(f"{hf_dir} is not a folder (a Hugging Face checkpoint) nor a "
                          ".gguf file (an Ollama model is named ollama:NAME[:TAG])")
    hint = adapter_hint(hf_dir, MODEL_FILES)
    if hint is not None:
        raise ExportError(hint)
    scores = options.task == "score"
    cfg = ModelConfig.from_dir(hf_dir, classifier=scores)
    if scores:
        check_source(load_json_object(hf_dir / "config.json", ExportError), options.score)
    embedding = embedding_head(hf_dir, options.task)
    if embedding is not None:
        _check_embeddable(cfg, hf_dir)
    adapter = None if options.adapter is None else _adapter(options.adapter, hf_dir, cfg.bnb)
    options = _for_int4_checkpoint(cfg, options)
    if cfg.bitnet is not None and options.quant is not None:
        # Re-quantizing 1.58-bit weights to int8/int4 would save nothing on the projections
        # and move the logits off transformers' (export/bitlinear.py).
        raise ExportError("BitNet's projections are already 1.58-bit (stored as int8 ternary "
                          "weights): export it without --quantize")
    max_context = _max_context(cfg, options.max_context)
    cfg = cfg.for_context(max_context)  # longrope: the factor set this context uses
    chunks = sorted(set(c for c in options.chunks if c <= max_context))
    if not chunks:
        raise ExportError(f"every chunk size in {options.chunks} exceeds the max context "
                          f"{max_context} (--max-context, or the model's positions)")
    tokenizer_files = [f for f in TOKENIZER_FILES if (hf_dir / f).is_file()]
    # Slow files only (tokenizer.model, vocab.json + merges.txt): the bundle's tokenizer.json
    # is converted from them, in memory; the checkpoint folder is never written to.
    slow = None if "tokenizer.json" in tokenizer_files else slow_tokenizer.convert(hf_dir)
    if slow is not None:
        tokenizer_files.insert(0, "tokenizer.json")
        said = {"converted_from": slow.source, "check": slow.checked}
        if slow.read_as is not None:  # the checkpoint's own tokenizer class, read as Llama's
            said["read_as"] = slow.read_as
        source = {**source, "tokenizer": said}
    # (ids of the embedding's extra rows are tokens a prompt may hold: Molmo 2's image
    # markers, which have no logit)
    check_tokenizer_fits(hf_dir / "tokenizer.json" if slow is None else slow.tokenizer,
                         cfg.vocab_size + cfg.embed_extra_rows)
    check_export_template(hf_dir)
    check_export_generation_config(hf_dir)
    _check_generation_eos(hf_dir, cfg.vocab_size)
    with staged(out_dir, options.overwrite) as stage:  # swapped in only when complete
        ckpt = Checkpoint(hf_dir, cfg.renames + cfg.spec.renames,
                          cfg.spec.left_out + cfg.left_out, cfg.fp8,
                          transposed=cfg.spec.transposed, int4=cfg.int4,
                          segments=cfg.spec.segment_renames, adapter=adapter, bnb=cfg.bnb,
                          model_types=_model_types(hf_dir, cfg) if adapter else (),
                          base=_base_prefix(cfg), layout=cfg.spec.stored_layout,
                          joined=cfg.spec.joined, halves=cfg.spec.halves)
        flavor = flavor_class(options.flavor)(cfg, DTYPES[options.dtype], max_context)
        hidden = embedding is not None or scores  # the graph ends at the final norm
        g = DecoderBuilder(cfg, ckpt, flavor, options.quant, embed=hidden).build()
        initializers = write_external_data(g.weights, stage / DATA_FILE, options.show_progress)
        score = None if not scores else score_head(
            ckpt, cfg, load_json_object(hf_dir / "config.json", ExportError),
            slow.tokenizer if slow is not None else _tokenizer(hf_dir), options.score, stage)
        _warn_unused(ckpt, cfg, hidden)  # weights are read as they are written
        if not hidden:  # an embedding or score bundle has no LM head to keep apart
            warn_if_kept_apart(ckpt, cfg)
        _say_left_out(ckpt)
        model = g.to_model(initializers, flavor.opsets, IR_VERSION[options.flavor])
        onnx.save_model(model, stage / GRAPH_FILE)
        for name in tokenizer_files + _license_files(hf_dir):
            if name == "tokenizer.json" and slow is not None:
                slow.tokenizer.save(str(stage / name))
            else:
                shutil.copyfile(hf_dir / name, stage / name)
        if embedding is not None and "tokenizer.json" in tokenizer_files:  # before the records
            append_eos(stage / "tokenizer.json", hf_dir)
        manifest = _manifest(cfg, g, options, chunks, max_context, hf_dir, stage,
                             tokenizer_files, source, adapter)
        if embedding is not None:
            manifest = replace(manifest, task="embed", embedding=embedding)
        if score is not None:
            manifest = replace(manifest, task="score", score=score, files={
                **manifest.files, HEAD_FILE: file_record(stage / HEAD_FILE)})
        if system is not None:
            manifest = replace(manifest, tokenizer=replace(manifest.tokenizer,
                                                           default_system=system))
        (stage / MANIFEST_FILE).write_text(manifest.to_json())
    return manifest


def _tokenizer(hf_dir: Path) -> Any:
    """The checkpoint's tokenizer.json, read (a score bundle's tokens are looked up in it)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(hf_dir / "tokenizer.json"))


def _check_embeddable(cfg: ModelConfig, hf_dir: Path) -> None:
    """An embedding bundle's vector is the final norm's output: refused where the family
    projects it further before its LM head (OPT-350m's project_out, ModernBERT decoder's
    prediction head), which no last-token embedding model is built on. A config that says
    `is_causal: false` (Qodo-Embed's; transformers 5 then attends both ways) is warned
    of: the chunk graph is causal, as the remote code such models ship (gte-Qwen2's
    modeling_qwen) runs them."""
    if cfg.embed_width is not None or cfg.head_activation is not None:
        raise ExportError(f"{cfg.family} projects its hidden state before the LM head: an "
                          "embedding bundle of it is not supported; export it with "
                          "--task generate")
    if load_json_object(hf_dir / "config.json", ExportError).get("is_causal") is False:
        log.warning("config.json says is_causal false (bidirectional attention, as "
                    "transformers 5 runs it): the bundle attends causally, as the model's "
                    "own code (auto_map) does where it hard-codes causal attention; its "
                    "vectors differ from a bidirectional run")


def _base_prefix(cfg: ModelConfig) -> str:
    """The prefix of the family's base model tensors (`model.`, `transformer.`): a
    checkpoint saved from the base model alone (Qwen3-Embedding's `layers.0...`) is read
    under it (export/checkpoint.py), as transformers loads it."""
    return cfg.names.layer.split(".")[0] + "."


def _adapter(folder: Path, hf_dir: Path, bnb: BnbScheme | None) -> Adapter:
    """The LoRA adapter to merge, warned of where it names another base model than
    `hf_dir`. Over a bitsandbytes base (QLoRA's: `bnb`) it merges into the weights
    dequantized to float32, as over a float base; any other quantized base is refused (its
    merge needs the float weights)."""
    if not folder.is_dir():
        raise ExportError(f"--adapter {folder} is not a folder")
    adapter = Adapter.load(folder)
    method = quantized_base(load_json_object(hf_dir / "config.json", ExportError))
    if method is not None and bnb is None:
        raise ExportError(f"{hf_dir} is a {method}-quantized checkpoint: a LoRA adapter "
                          "merges into float weights only (or a bitsandbytes base's, "
                          "dequantized); export the adapter with the unquantized base model")
    if bnb is not None:
        # a warning, as export's other notes (the CLI shows warnings): peft's
        # merge_and_unload requantizes the merged weight, the bundle keeps it in float
        log.warning("the adapter %s is merged into the dequantized %s weights of %s", folder,
                    bnb.describe().removesuffix(", dequantized to float"), hf_dir)
    base = adapter.base_model
    if base and Path(base).name.lower() != hf_dir.resolve().name.lower():
        log.warning("the adapter %s was trained on %s, and is merged into %s", folder, base,
                    hf_dir)
    return adapter


def _for_int4_checkpoint(cfg: ModelConfig, options: ExportOptions) -> ExportOptions:
    """A pre-quantized int4 checkpoint (export/prequantized.py) exports int4: its int4 layers
    as it stores them. Without --quantize, the layers it keeps float stay float (the LM head,
    the embeddings, its ignored projections); --quantize int4 quantizes those as any int4
    export does. --quantize int8 would requantize 4-bit weights: refused. The `standard`
    flavour holds no quantized weights (TensorRT's graph): it reads them dequantized."""
    if cfg.int4 is None:
        return options
    quant = options.quant
    if quant is not None and quant.kind != "int4":
        raise ExportError(f"the checkpoint's weights are int4 ({cfg.int4.method}): export "
                          f"it with --quantize int4 or without --quantize, not {quant.kind}")
    if quant is None and options.flavor == "ort":  # fp32, or fp16 with float16 scales
        implied = QuantConfig("int4", embeddings=False, head="float", float_layers=False)
        return replace(options, quant=implied)
    return options


def _model_types(hf_dir: Path, cfg: ModelConfig) -> tuple[str, ...]:
    """config.json's model_type and its language model's (text_config's, a wrapper's text
    family): the conversion mappings transformers loads the checkpoint by, whose module
    names an adapter may use (export/module_names.py)."""
    text = load_json_object(hf_dir / "config.json", ExportError).get("text_config")
    nested = text.get("model_type") if isinstance(text, dict) else None
    types = (cfg.family, cfg.text_type, nested if isinstance(nested, str) else None)
    return tuple(dict.fromkeys(t for t in types if t))


def _license_files(hf_dir: Path) -> list[str]:
    found = {p.name for g in LICENSE_GLOBS for p in hf_dir.glob(g) if p.is_file()}
    return sorted(found)


def _warn_unused(ckpt: Checkpoint, cfg: ModelConfig, embed: bool = False) -> None:
    # A warning, as transformers' "Some weights of the model checkpoint were not used":
    # a pruned model's config may mean it. (A tied model's stored head is read: lm_head.py.)
    # An embedding bundle leaves the LM head out, as transformers' base model does.
    head = tuple(h + "." for h in cfg.names.lm_head) if embed else ()
    shared = _shared_kv_projections(cfg) + _mtp_layers(cfg) + head + \
        _identity_experts(cfg) + _dropped_indexers(cfg)
    unused = [name for name in ckpt.unused() if not name.startswith(shared)]
    if unused:
        shown = ", ".join(unused[:4]) + (f" and {len(unused) - 4} more" if len(unused) > 4
                                         else "")
        log.warning("the checkpoint holds %d tensor%s config.json does not use (%s): are "
                    "config.json and the weights from the same model?", len(unused),
                    "s" * (len(unused) > 1), shown)


def _identity_experts(cfg: ModelConfig) -> tuple[str, ...]:
    """The zero-computation experts' projections, which transformers' LongCat-Flash
    checkpoints hold (its gate_up_proj counts them) and its experts never read."""
    moe, spec = cfg.moe, cfg.spec.moe
    if moe is None or spec is None:
        return ()
    return tuple(cfg.names.layer.format(i=i) + spec.names.expert.format(j=j)
                 for i in moe.layers for j in range(moe.experts, moe.choices))


def _dropped_indexers(cfg: ModelConfig) -> tuple[str, ...]:
    """The DeepSeek sparse attention indexers of a bundle within index_topk (MiniMax-M3's
    within its blocks' reach), which ModelConfig.for_context leaves out (every key is kept
    there: the dense attention exactly)."""
    if not (cfg.spec.sparse_index or cfg.spec.block_index) or cfg.sparse_index is not None \
            or cfg.block_index is not None:
        return ()
    return tuple(cfg.names.layer.format(i=i) + "self_attn.indexer."
                 for i in range(cfg.num_layers))


def _shared_kv_projections(cfg: ModelConfig) -> tuple[str, ...]:
    """The k/v projections and norms of the KV-shared layers, which Gemma 3n checkpoints
    hold and its transformers model drops at load (`_keys_to_ignore_on_load_unexpected`):
    those layers read an earlier layer's KV."""
    names = cfg.names
    return tuple(names.layer.format(i=i) + part + "."
                 for i in cfg.shared_kv for part in (names.k, names.v, names.k_norm,
                                                     "self_attn.v_norm"))


def _mtp_layers(cfg: ModelConfig) -> tuple[str, ...]:
    """The multi-token-prediction layers after the last (DeepSeek-V3's, GLM-4.5's), which
    transformers ignores at load: a draft model's, not the causal LM's."""
    return tuple(cfg.names.layer.format(i=cfg.num_layers + k) for k in range(cfg.mtp_layers))


def _say_left_out(ckpt: Checkpoint) -> None:
    # One line for the whole vision tower of an image-text checkpoint, not one per tensor:
    # leaving it out is the export's choice, not a config that disagrees with its weights.
    if ckpt.left_out:
        parts = sorted({name.removeprefix("model.").split(".")[0] for name in ckpt.left_out})
        log.warning("the bundle is text-only, it holds the language model only: %d tensors "
                    "of the checkpoint's %s are left out", len(ckpt.left_out), ", ".join(parts))


def _max_context(cfg: ModelConfig, requested: int | None) -> int:
    cap = cfg.context_cap
    if requested is None:
        return min(cfg.max_positions, 4096, cap.tokens if cap else cfg.max_positions)
    if requested > cfg.max_positions:
        raise ExportError(
            f"--max-context {requested} exceeds the model's max_position_embeddings "
            f"({cfg.max_positions})"
        )
    if cap is not None and requested > cap.tokens:
        raise ExportError(f"--max-context {requested} exceeds {cap.reason}")
    return requested


def _io_table(values) -> dict[str, list[Any]]:
    return {v.name: [v.dtype.name, list(v.shape)] for v in values}


def _value_is_key(cfg: ModelConfig, flavor: str) -> list[int]:
    """The layers whose value cache would repeat their key cache: multi-head latent
    attention's (export/latent_attention.py: v = k), in the ort flavour; the standard one,
    which TensorRT runs, keeps a buffer per cache."""
    return list(cfg.kv_layers) if cfg.latent is not None and flavor == "ort" else []


def _manifest(
    cfg: ModelConfig, g: GraphBuilder, options: ExportOptions, chunks: list[int],
    max_context: int, hf_dir: Path, out_dir: Path, tokenizer_files: list[str],
    source: dict[str, Any], adapter: Adapter | None = None,
) -> Manifest:
    layers = [kv_names(i) for i in cfg.kv_layers]
    states = [state_names(i, kind) for i in cfg.state_layers for kind in cfg.state_kinds(i)]
    tok_config = optional_json_object(hf_dir / "tokenizer_config.json", ExportError)
    gen_config = optional_json_object(hf_dir / "generation_config.json", ExportError)
    eos = list(dict.fromkeys([*cfg.eos_token_ids, *_ids(gen_config.get("eos_token_id"))]))
    graph = GraphInfo(
        file=GRAPH_FILE,
        data_file=DATA_FILE,
        flavor=options.flavor,
        dtype=np.dtype(DTYPES[options.dtype]).name,
        opsets=flavor_class(options.flavor).opsets,
        inputs=_io_table(g.inputs),
        outputs=_io_table(g.outputs),
        kv_inputs=[[n.past_key, n.past_value] for n in layers],
        kv_outputs=[[n.present_key, n.present_value] for n in layers],
        quantization=None if options.quant is None else options.quant.kind,
        packed_tokens=flavor_class(options.flavor).packs_tokens,
        state_inputs=[names.past for names in states],
        state_outputs=[names.present for names in states],
        value_is_key=_value_is_key(cfg, options.flavor),
    )
    files = [GRAPH_FILE, DATA_FILE, *tokenizer_files]
    return Manifest(
        model=ModelInfo(
            family=cfg.family, num_layers=cfg.num_layers, num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
            state_layers=list(cfg.state_layers), kv_state_layers=list(cfg.kv_state_layers),
            shared_kv_layers=sorted(cfg.shared_kv),
            layer_kv={str(i): [cfg.layer_kv_heads(i), cfg.layer_head_dim(i)]
                      for i in cfg.kv_layers
                      if (cfg.layer_kv_heads(i), cfg.layer_head_dim(i)) !=
                      (cfg.num_kv_heads, cfg.head_dim)},
            layer_heads={str(i): cfg.layer_heads(i) for i in range(cfg.num_layers)
                         if cfg.layer_heads(i) != cfg.num_heads},
            attention_free_layers=list(cfg.attention_free_layers),
            embed_extra_rows=cfg.embed_extra_rows,
        ),
        graph=graph,
        tokenizer=TokenizerInfo(
            file="tokenizer.json",
            chat_template=template_source(hf_dir),
            bos_token=_token_text(tok_config.get("bos_token")),
            eos_token=_token_text(tok_config.get("eos_token")),
        ),
        chunks=chunks,
        max_context=max_context,
        eos_token_ids=eos,
        bos_token_id=cfg.bos_token_id,
        files={name: file_record(out_dir / name) for name in files},
        source={**source, "model_type": cfg.family, "edgeprefill": __version__,
                "quirks": model_quirks(cfg),
                **({} if adapter is None else {"adapter": adapter.record()})},
    )




def _token_text(token: Any) -> str | None:
    if isinstance(token, dict):  # AddedToken serialized as {"content": ...}
        return token.get("content")
    return token if isinstance(token, str) else None


def _check_generation_eos(hf_dir: Path, vocab_size: int) -> None:
    """generation_config.json's EOS ids join the bundle's, which a load checks against the
    vocabulary: refuse here what would make a bundle no load accepts."""
    gen_config = optional_json_object(hf_dir / "generation_config.json", ExportError)
    outside = [i for i in _ids(gen_config.get("eos_token_id")) if not 0 <= i < vocab_size]
    if outside:
        raise ExportError(f"generation_config.json: eos_token_id {outside} is outside the "
                          f"vocabulary (vocab_size {vocab_size})")


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]
