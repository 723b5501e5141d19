"""`edgeprefill export HF_DIR -o BUNDLE` (or a .gguf file, or ollama:NAME, for HF_DIR)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

import click
from click.core import ParameterSource

from edgeprefill.cli.options import parse_int_list
from edgeprefill.errors import ExportError

if TYPE_CHECKING:
    from edgeprefill.export.score_head import ScoreOptions


# what a score bundle with a relevance serves beside Engine.score (export's summary line)
RANKING = ", Engine.rerank; on serve POST /v1/rerank, /rerank, /score"


def _list_models(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """--list-models: the supported model_types one per line, then the refused ones with
    why; before HF_DIR and -o are asked for (an eager flag, as --help)."""
    if not value or ctx.resilient_parsing:
        return
    from edgeprefill.export.families import FAMILIES, REFUSED_TYPES

    for name in sorted(FAMILIES):
        click.echo(name)
    for name, why in sorted(REFUSED_TYPES.items()):
        click.echo(f"{name}: refused: {why}")
    ctx.exit()


@click.command()
@click.option("--list-models", is_flag=True, is_eager=True, expose_value=False,
              callback=_list_models,
              help="Print the supported model_types one per line, then the refused ones "
                   "with why, and exit. Encoder-decoder, encoder and audio checkpoints of "
                   "any model_type are refused for what their config.json says they are.")
@click.argument("hf_dir", type=click.Path(path_type=str))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(path_type=str),
              help="Bundle folder to write.")
@click.option("--flavor", type=click.Choice(["ort", "standard"]), default="ort",
              show_default=True,
              help="ort: ONNX Runtime contrib ops (fastest on ORT); standard: plain ONNX "
                   "for TensorRT (`edgeprefill build`).")
@click.option("--dtype", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="Weights, activations and KV cache (fp16 for GPU targets).")
@click.option("--chunks", default="16,64,256", show_default=True, callback=parse_int_list,
              help="Prefill chunk buckets, comma-separated.")
@click.option("--max-context", type=int, default=None,
              help="Positions per session (prompt + reply). Default: the model's, capped at 4096.")
@click.option("--quantize", type=click.Choice(["int8", "int4"]), default=None,
              help="Quantize linear-layer weights: int8 (dynamic int8 activations, the "
                   "CPU's prefill lever) or int4 (weight-only, the decode lever). ort "
                   "flavour. At --dtype fp16 (the GPU's: CUDA provider) both are weight-only "
                   "blocks (MatMulNBits).")
@click.option("--block-size", type=int, default=32, show_default=True,
              help="int4, and int8 at --dtype fp16: weights per scale.")
@click.option("--accuracy-level", type=click.IntRange(0, 4), default=4, show_default=True,
              help="int4: MatMulNBits compute type. 4: int8 activations (faster decode; "
                   "on the CPU prefill runs int8 GEMMs derived at load, see "
                   "EDGEPREFILL_INT4_PREFILL); 0: float (exact with the dequantized weights).")
@click.option("--embeddings", type=click.Choice(["quantized", "all", "float"]), default=None,
              help="With --quantize: embedding tables (untied main, Gemma 4 per-layer) "
                   "quantized like the weights (default), all of them (a tied table too, "
                   "its own copy beside the LM head's) or kept float.")
@click.option("--lm-head", type=click.Choice(["int8", "int4", "float"]), default=None,
              help="With --quantize: the LM head's weights. Default: as --quantize; "
                   "int8 in an int4 bundle moves the logits less for a few more bytes.")
@click.option("--adapter", type=click.Path(file_okay=False, path_type=str), default=None,
              help="A PEFT LoRA adapter folder (adapter_config.json, adapter_model."
                   "safetensors) fine-tuned on HF_DIR: merged into the weights as they "
                   "are exported.")
@click.option("--task", type=click.Choice(["auto", "embed", "generate", "score"]),
              default="auto", show_default=True,
              help="embed: an embedding bundle (Engine.embed, /v1/embeddings), the hidden "
                   "state of each text's last token; generate: a generation bundle; score: "
                   "a reranker (Engine.score/rerank, /v1/rerank) from a "
                   "*ForSequenceClassification folder, a causal LM with --score-tokens, "
                   "or a GGUF reranker (pooling_type rank). auto: embed where the folder is "
                   "a sentence-transformers model (modules.json, last-token pooling) or the "
                   "GGUF's pooling_type is last, score where it is rank, else generate.")
@click.option("--score-tokens", default=None, metavar="NO,YES",
              help="--task score on a causal LM: the tokens whose logits at the last "
                   "position are the scores, e.g. no,yes (Qwen3-Reranker: relevance "
                   "sigmoid(yes - no)) or Yes (bge-reranker-v2-gemma: sigmoid(Yes)).")
@click.option("--score-template", default=None,
              help="--task score: the pair's text, with {query} and {document} (required "
                   "with --score-tokens: the format the reranker was trained on). It "
                   "replaces a GGUF reranker's own rerank template; without it a classifier "
                   "reads a pair as its tokenizer's pair encoding.")
@click.option("--score-template-file", type=click.File("r", encoding="utf-8"), default=None,
              help="--score-template read from a file, as it is (trailing newlines kept).")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing bundle folder (one holding only a bundle: other "
                   "files are never deleted).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def export(hf_dir, out_dir, flavor, dtype, chunks, max_context, quantize, block_size,
           accuracy_level, embeddings, lm_head, adapter, task, score_tokens, score_template,
           score_template_file, overwrite, quiet):
    """Export a Hugging Face causal LM folder (config.json, safetensors or
    pytorch_model.bin weights, tokenizer.json) to an edgeprefill bundle. A folder with
    only the slow tokenizer's files (tokenizer.model, or vocab.json + merges.txt) gets a
    tokenizer.json converted by transformers (needs the export extra).

    HF_DIR may also be a GGUF file (llama.cpp, Ollama, LM Studio), or a folder holding
    one and no config.json: it is converted with transformers' GGUF reader (needs
    `pip install -e ".[gguf]"`). Quantized GGUF weights (Q4_K_M, Q8_0, ...) are
    dequantized: the bundle holds them in float, and --quantize int8/int4 re-quantizes
    them, adding its own rounding. A model pulled with Ollama is named `ollama:NAME[:TAG]`
    (its store: $OLLAMA_MODELS, else ~/.ollama/models): its GGUF blob is exported, its
    parameters (temperature, top_k, top_p, repeat_penalty) become the bundle's sampling
    defaults.

    \b
    Example:
      edgeprefill export models/tiny-recall -o build/tiny-recall
      edgeprefill export ~/models/SmolLM2-135M -o build/smollm2 --chunks 32,128 --max-context 2048
      edgeprefill export ~/Downloads/qwen2.5-0.5b-instruct-q8_0.gguf -o build/qwen --quantize int8
      edgeprefill export ollama:qwen3:0.6b -o build/qwen3
      edgeprefill export ~/models/SmolLM2-135M --adapter ~/runs/my-lora -o build/mine
    """
    from edgeprefill.export.exporter import ExportOptions
    from edgeprefill.export.exporter import export as run_export
    from edgeprefill.export.quantize import QuantConfig

    given = click.get_current_context().get_parameter_source
    # Weights in blocks (MatMulNBits): int4, and int8 at fp16 (export/quantize.py).
    blocks = quantize == "int4" or (quantize == "int8" and dtype == "fp16")
    if given("block_size") is ParameterSource.COMMANDLINE and not blocks:
        raise ExportError("--block-size applies to --quantize int4, or int8 at --dtype fp16, "
                          "only")
    if given("accuracy_level") is ParameterSource.COMMANDLINE and quantize != "int4":
        raise ExportError("--accuracy-level applies to --quantize int4 only")
    for name, value in (("--embeddings", embeddings), ("--lm-head", lm_head)):
        if value is not None and quantize is None:
            raise ExportError(f"{name} applies with --quantize int8 or int4 only")
    quant = None if quantize is None else QuantConfig(
        quantize, block_size, accuracy_level, embeddings=embeddings != "float",
        tied_embeddings=embeddings == "all", head=lm_head)

    options = ExportOptions(
        flavor=flavor, dtype=dtype, chunks=tuple(chunks), max_context=max_context,
        overwrite=overwrite, show_progress=not quiet, quant=quant,
        adapter=None if adapter is None else Path(adapter), task=task,
        score=_score_options(score_tokens, score_template, score_template_file),
    )
    began = time.perf_counter()
    with _sigterm_interrupts():
        manifest = run_export(hf_dir, out_dir, options)
    size = sum(f.bytes for f in manifest.files.values())
    dropped = sorted(set(chunks) - set(manifest.chunks))
    if dropped and given("chunks") is ParameterSource.COMMANDLINE:
        click.echo(f"warning: chunk sizes {dropped} exceed the max context "
                   f"{manifest.max_context} and were left out", err=True)
    if manifest.embedding is not None:
        normalized = ", normalized" if manifest.embedding.normalize else ""
        click.echo(f"an embedding bundle ({manifest.embedding.pooling} pooling{normalized}, "
                   f"{manifest.model.hidden_size} dimensions): Engine.embed; on serve POST "
                   "/v1/embeddings, /embed, /api/embed, /score", err=True)
    if manifest.score is not None:
        ranks = manifest.score.relevance != "none"  # more than two labels: no ranking
        click.echo(f"a score bundle ({manifest.score.kind}: "
                   f"{', '.join(manifest.score.labels)}; relevance {manifest.score.relevance})"
                   f": Engine.score{RANKING if ranks else ''}",
                   err=True)
    click.echo(
        f"exported {manifest.model.family} ({manifest.model.num_layers} layers, "
        f"{manifest.graph.flavor} flavour, {manifest.graph.dtype}"
        f"{', ' + manifest.graph.quantization if manifest.graph.quantization else ''}) "
        f"to {out_dir}: "
        f"{size / 1e6:.1f} MB, chunks {manifest.chunks}, max context {manifest.max_context}, "
        f"in {time.perf_counter() - began:.1f} s",
        err=True,
    )


def _score_options(tokens: str | None, template: str | None,
                   template_file: IO[str] | None) -> ScoreOptions:
    """--score-tokens split at commas, and the template given or read."""
    from edgeprefill.export.score_head import ScoreOptions

    if template is not None and template_file is not None:
        raise ExportError("give --score-template or --score-template-file, not both")
    if template_file is not None:
        template = template_file.read()
    return ScoreOptions(tuple(t.strip() for t in tokens.split(",")) if tokens else (),
                        template)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (timeout, docker stop, systemd) and SIGHUP (the terminal closed) stop an
    export as Ctrl-C does: the staging folders are removed on the way out (a bundle's, a
    GGUF's conversion). Killed by the default action, they stayed behind, up to a whole
    bundle's size (a GGUF's conversion under a random name, for good). A SIGHUP that is
    ignored (nohup) stays ignored. The handlers before are back afterwards, also after an
    error: a process running the command in itself (a test, an app) keeps its own. Off the
    main thread Python installs no handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hangup = getattr(signal, "SIGHUP", None)  # (none on Windows)
    caught = [signal.SIGTERM] + ([hangup] if hangup is not None and
                                 signal.getsignal(hangup) is signal.SIG_DFL else [])
    previous = {signum: signal.signal(signum, _interrupt) for signum in caught}
    try:
        yield
    finally:
        # None: a handler not installed from Python, which cannot be put back.
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
