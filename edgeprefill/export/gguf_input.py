"""A GGUF file (llama.cpp, Ollama, LM Studio) -> a staging Hugging Face folder that the
exporter reads like any other: config.json, safetensors weights, tokenizer.json.

transformers does the reading (`from_pretrained(..., gguf_file=...)`'s own pieces): the
metadata becomes its config, llama.cpp's tensor names its parameter names, its
architecture's tensor processor undoes llama.cpp's layouts (the Llama family's q/k rope
permutation, GPT-2's transposes, Gemma's norm offsets, merged MoE experts) and the `gguf`
package dequantizes the blocks (Q4_K, Q8_0, ...) to float32. Its loader holds every
tensor of the model at once; this module runs the same steps one tensor at a time and
writes them to safetensors shards of at most SHARD_BYTES, so a conversion holds one shard
and one tensor in float32, not the whole model.

Quantized weights are dequantized: the bundle holds the GGUF's values in float, and
`--quantize int4/int8` re-quantizes them with its own rounding. What the reader skips of a
Llama 3.1+ file, its rope scaling as llama.cpp's `rope_freqs`, gguf_rope.py restores; what
it leaves out of a Gemma 3 or Phi-3 file's config (Gemma 3's rope scaling and attention
scale, Phi-3's rotary width and longrope factors), gguf_metadata.py; where its tokenizer
is not llama.cpp's (SentencePiece's spaces, a BPE's split), gguf_vocab.py.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from edgeprefill.errors import ExportError
from edgeprefill.export import (
    gguf_falcon,
    gguf_metadata,
    gguf_pooling,
    gguf_rerank,
    gguf_rope,
    gguf_vocab,
)

if TYPE_CHECKING:
    from edgeprefill.export.score_head import ScoreOptions

log = logging.getLogger(__name__)

SUFFIX = ".gguf"
MAGIC = b"GGUF"  # a GGUF file's first four bytes
SHARD_BYTES = 512 * 1024 * 1024  # float32 held before a shard is written out
SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$")  # llama.cpp's gguf-split parts
INSTALL = 'reading a GGUF file needs torch, transformers and gguf: pip install -e ".[gguf]"'
# GGUF's `general.architecture` -> transformers' name for it, where they differ
# (transformers' load_gguf_checkpoint renames these the same way).
RENAMED_ARCHS = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss",
                 "minimax-m2": "minimax_m2"}
# What this module calls of transformers' GGUF reader (modeling_gguf_pytorch_utils).
READER_PIECES = ("load_gguf_checkpoint", "get_gguf_hf_weights_map", "TENSOR_PROCESSORS",
                 "TensorProcessor", "GGUF_SUPPORTED_ARCHITECTURES")
# Names in transformers' GGUF table that are not decoder architectures.
NOT_ARCHS = ("general", "tokenizer", "t5", "t5encoder", "umt5")


@dataclass(frozen=True)
class GgufSource:
    """What the manifest records of a GGUF input: the file and its quantization."""

    file: str  # the file's name
    path: str  # its absolute path
    architecture: str  # general.architecture
    quant: str  # general.file_type's name (Q4_K_M, Q8_0, F16, ...)
    pooling: str | None = None  # an embedding model's {arch}.pooling_type (gguf_pooling.py)
    # a reranker's (pooling rank) pair template, where it exports as a score bundle: its
    # staging folder is a sequence classifier's (gguf_rerank.py)
    rerank_template: str | None = None

    @property
    def scores(self) -> bool:
        return self.rerank_template is not None

    def as_dict(self) -> dict[str, str]:
        pooling = {} if self.pooling is None else {"pooling": self.pooling}
        return {"file": self.file, "architecture": self.architecture, "quant": self.quant,
                **pooling}


def gguf_file_of(source: Path) -> Path | None:
    """The GGUF file an export of `source` reads: `source` itself (a .gguf, or any file
    starting with GGUF's magic bytes), or the one .gguf of a
    folder without a config.json; None where `source` is a Hugging Face folder (or not
    there: the exporter says so)."""
    if source.is_file() and (source.suffix.lower() == SUFFIX or _has_magic(source)):
        _refuse_split(source)
        return source
    if not source.is_dir() or (source / "config.json").exists():
        return None
    found = sorted(p for p in source.iterdir() if p.suffix.lower() == SUFFIX and p.is_file())
    if len(found) == 1:
        _refuse_split(found[0])
        return found[0]
    if len(found) > 1:
        if all(SPLIT.search(p.name) for p in found):
            _refuse_split(found[0])
        raise ExportError(f"{source} has no config.json and {len(found)} .gguf files "
                          f"({', '.join(p.name for p in found[:4])}): name the one to export")
    return None


def _has_magic(path: Path) -> bool:
    """A GGUF file without the suffix: an Ollama blob (blobs/sha256-<hex>)."""
    try:
        with path.open("rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def _refuse_split(path: Path) -> None:
    if SPLIT.search(path.name):
        raise ExportError(f"{path.name} is one part of a split GGUF: merge the parts first "
                          "(llama.cpp: llama-gguf-split --merge FIRST-PART OUT.gguf)")


@contextmanager
def converted(gguf_file: Path, beside: Path, show_progress: bool, task: str = "auto",
              score: ScoreOptions | None = None) -> Iterator[tuple[Path, GgufSource]]:
    """Yield a Hugging Face folder converted from `gguf_file`, written beside the bundle
    folder `beside` (a whole model's float32 weights may not fit a small /tmp), removed
    on the way out; an embedding model's (last-token pooling) in sentence-transformers'
    layout, a reranker's (pooling rank) a sequence classifier's; one that the export
    `task` (with its `score` options) cannot make refused first (gguf_pooling.py,
    gguf_rerank.py)."""
    from edgeprefill.export.score_head import ScoreOptions

    libs = _libraries()
    source = _source(gguf_file, libs, task, score or ScoreOptions())
    parent = beside.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f".{beside.name}.gguf-", dir=parent))
    except OSError as err:
        raise ExportError(f"cannot write beside {beside} in {parent}: "
                          f"{err.strerror or err}") from None
    try:
        _write_hf_folder(gguf_file, folder, source, libs, show_progress)
        yield folder, source
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _libraries() -> Any:
    """transformers' GGUF pieces; ExportError with the install line where they are missing."""
    try:
        import gguf  # noqa: F401
        import torch  # noqa: F401
        import transformers
        import transformers.integrations.gguf.reader  # noqa: F401
        from transformers import modeling_gguf_pytorch_utils as reader
    except ImportError:
        raise ExportError(INSTALL) from None
    if not transformers.utils.import_utils.is_gguf_available():
        raise ExportError(INSTALL + " (gguf>=0.10)")
    if not all(hasattr(reader, name) for name in READER_PIECES):
        raise ExportError(f"{INSTALL}: transformers {transformers.__version__} lacks the GGUF "
                          "reader's pieces this export calls (5.24 has them)")
    return reader


def _source(gguf_file: Path, reader: Any, task: str, score: ScoreOptions) -> GgufSource:
    """The file's architecture, quantization and pooling; refused where transformers cannot
    read the architecture into float weights, or its pooling is not one `task` exports."""
    import struct

    from gguf import LlamaFileType
    from transformers.integrations.gguf.reader import read_gguf_metadata

    try:  # the metadata alone: the vocabulary's strings are skipped, not parsed
        metadata, tensors = read_gguf_metadata(str(gguf_file))
    except (ValueError, OSError, struct.error) as err:
        raise ExportError(f"{gguf_file} is not a readable GGUF file: {err}") from None
    arch = metadata["general.architecture"]
    supported = sorted(a for a in reader.GGUF_SUPPORTED_ARCHITECTURES if a not in NOT_ARCHS)
    if arch not in supported and RENAMED_ARCHS.get(arch) not in supported:
        shown = ", ".join(sorted({k for k, v in RENAMED_ARCHS.items() if v in supported}
                                 | set(supported) - set(RENAMED_ARCHS.values())))
        raise ExportError(f"{gguf_file.name}: GGUF architecture {arch!r} is not one "
                          f"transformers reads into float weights (supported: {shown})")
    file_type = metadata.get("general.file_type")
    try:
        quant = LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        quant = "unknown" if file_type is None else f"file_type {file_type}"
    pooling = gguf_pooling.pooling_of(metadata, gguf_file.name, task)
    template = None
    if pooling == gguf_pooling.RANK:
        template = gguf_rerank.check(metadata, tensors, gguf_file.name, task, score)
    return GgufSource(gguf_file.name, str(gguf_file.resolve()), arch, quant, pooling,
                      template)


def _write_hf_folder(gguf_file: Path, folder: Path, source: GgufSource, reader: Any,
                     show_progress: bool) -> None:
    import transformers
    from gguf import GGUFReader

    where, name = str(gguf_file.parent), gguf_file.name
    try:
        config = transformers.AutoConfig.from_pretrained(where, gguf_file=name)
        tokenizer = transformers.AutoTokenizer.from_pretrained(where, gguf_file=name)
    except (ValueError, KeyError, NotImplementedError) as err:
        if isinstance(err, ValueError) and "cannot reshape array" in str(err):
            # the header read whole (_source), a tensor's bytes fewer than its shape: numpy's
            # words, raised where gguf's reader views the data
            raise ExportError(f"{name} ends before its tensor data does ({err}): the file "
                              "is cut short, an incomplete download or copy?") from None
        raise ExportError(f"{name}: transformers cannot read its metadata: {err}") from None
    config.save_pretrained(folder)
    gguf = GGUFReader(gguf_file)  # one parse of the file's metadata for all that follows
    # before the weights: a rope that cannot be exported is refused before minutes of reading
    gguf_rope.write_rope_scaling(gguf, name, folder / "config.json")
    restored = [gguf_rope.TENSOR, *gguf_metadata.write_unmapped(gguf, name, folder / "config.json")]
    # the completed config names the parameters the weights go to (Falcon-40B's ln_mlp)
    config = transformers.AutoConfig.from_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del tokenizer  # its vocabulary is on disk now
    gguf_vocab.fix_tokenizer(gguf_file, folder / "tokenizer.json")
    _drop_tokens_past_vocab(folder / "tokenizer.json", config.get_text_config().vocab_size)
    gguf_vocab.write_end_ids(gguf_file, folder, config.get_text_config().vocab_size)
    if source.pooling == gguf_pooling.LAST:
        gguf_pooling.write_layout(folder, config.get_text_config().hidden_size)
    head = None
    if source.scores:  # read before minutes of weights: its refusals come first
        head = gguf_rerank.read_head(gguf, name, config.get_text_config().hidden_size)
        restored += [f"{gguf_rerank.HEAD}.weight", f"{gguf_rerank.HEAD}.bias"]
    unused = _write_weights(gguf, folder, config, source, reader, show_progress,
                            {} if head is None else gguf_rerank.head_tensors(head))
    if head is not None:  # the architecture after the weights: they are named as the LM's
        gguf_rerank.write_classifier(folder, source.architecture, head)
    _warn_unused([name for name in unused if name not in restored])


def _drop_tokens_past_vocab(tokenizer_file: Path, vocab_size: int) -> None:
    """transformers' byte-level GGUF tokenizer adds GPT-2's `<|endoftext|>` where the
    vocabulary lacks it (Llama 3's), with an id past the model's embedding rows: no model
    input stands for it, and the exporter refuses a tokenizer whose ids pass vocab_size."""
    tok = json.loads(tokenizer_file.read_text())
    kept = [t for t in tok.get("added_tokens") or [] if t["id"] < vocab_size]
    if len(kept) != len(tok.get("added_tokens") or []):
        tok["added_tokens"] = kept
        tokenizer_file.write_text(json.dumps(tok, ensure_ascii=False))


def _write_weights(gguf: Any, folder: Path, config: Any, source: GgufSource,
                   reader: Any, show_progress: bool, extra: dict[str, np.ndarray]
                   ) -> list[str]:
    """load_gguf_checkpoint's tensor loop, one tensor at a time into shards, over the
    tensors `gguf` (the file's gguf.GGUFReader) maps, and the `extra` tensors (a
    reranker's head); the names of the file's tensors transformers' reader does not use."""
    import torch
    import transformers

    parsed = reader.load_gguf_checkpoint(source.path, return_tensors=False)
    processor = reader.TENSOR_PROCESSORS.get(source.architecture, reader.TensorProcessor)(
        config=parsed["config"])
    with torch.device("meta"):  # the parameter names, no memory
        model = transformers.AutoModelForCausalLM.from_config(config)
    # GGUF's own architecture name: its tensor-name table is keyed by it.
    names = reader.get_gguf_hf_weights_map(model, processor, model_type=source.architecture)
    with _Shards(folder) as shards, tqdm(
        total=sum(int(t.n_bytes) for t in gguf.tensors), unit="B", unit_scale=True,
        desc=f"reading {source.file}", disable=not show_progress, leave=False,
    ) as bar:
        for hf_name, tensor in extra.items():
            shards.add(hf_name, tensor)
        return _convert_tensors(gguf.tensors, processor, names, shards, bar, config)


def _convert_tensors(tensors: Any, processor: Any, names: dict[str, str], shards: _Shards,
                     bar: tqdm, config: Any) -> list[str]:
    """Dequantize and process each GGUF tensor into `shards` (with the step transformers'
    processors lack: Falcon's qkv order); return the names of those transformers' reader
    does not use."""
    from gguf import dequantize

    merged = _merge_counts(names)
    arrived: dict[str, int] = {}
    pending: dict[str, Any] = {"tensors": {}}  # where the MoE processors put their tensors
    unused: list[str] = []
    for tensor in tensors:
        result = processor.process(
            weights=gguf_falcon.grouped_qkv(
                tensor.name, dequantize(tensor.data, tensor.tensor_type), config),
            name=tensor.name,
            tensor_key_mapping=names, parsed_parameters=pending)
        if result.name is not None and result.name in names:
            shards.add(names[result.name], result.weights)
        elif result.name is not None:
            unused.append(result.name)
        target = names.get(tensor.name.removesuffix(".weight"))
        if target in merged:  # gate and up experts fill one tensor: wait for both
            arrived[target] = arrived.get(target, 0) + 1
        for hf_name in list(pending["tensors"]):
            if hf_name not in merged or arrived.get(hf_name) == merged[hf_name]:
                shards.add(hf_name, pending["tensors"].pop(hf_name))
        bar.update(int(tensor.n_bytes))
    return unused


def _warn_unused(unused: list[str]) -> None:
    """Tensors transformers' reader skips (but those gguf_rope and gguf_metadata read): the
    bundle computes as its model of the file does."""
    if unused:
        log.warning("transformers' GGUF reader uses none of the file's %s; the bundle "
                    "computes as transformers' model of the file does, without them",
                    ", ".join(unused))


def _merge_counts(names: dict[str, str]) -> dict[str, int]:
    """Parameters that several GGUF tensors fill (Qwen MoE's gate_up_proj from ffn_gate_exps
    and ffn_up_exps): how many."""
    counts: dict[str, int] = {}
    for hf_name in names.values():
        counts[hf_name] = counts.get(hf_name, 0) + 1
    return {name: n for name, n in counts.items() if n > 1}


class _Shards:
    """safetensors shards of at most SHARD_BYTES (one larger tensor alone) and their index."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.held: dict[str, np.ndarray] = {}
        self.held_bytes = 0
        self.weight_map: dict[str, str] = {}
        self.count = 0

    def __enter__(self) -> _Shards:
        return self

    def add(self, name: str, tensor: Any) -> None:
        array = tensor.numpy() if hasattr(tensor, "numpy") else np.asarray(tensor)
        array = np.ascontiguousarray(array, dtype=np.float32)
        if self.held and self.held_bytes + array.nbytes > SHARD_BYTES:
            self._flush()
        self.held[name] = array
        self.held_bytes += array.nbytes

    def _flush(self) -> None:
        from safetensors.numpy import save_file

        self.count += 1
        file = f"model-{self.count:05d}.safetensors"
        save_file(self.held, str(self.folder / file))
        self.weight_map.update(dict.fromkeys(self.held, file))
        self.held, self.held_bytes = {}, 0

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is not None:
            return
        if self.held:
            self._flush()
        index = {"metadata": {}, "weight_map": self.weight_map}
        (self.folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))

