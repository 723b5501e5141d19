"""`edgeprefill inspect BUNDLE`: what a bundle holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from edgeprefill.values import span

if TYPE_CHECKING:
    from edgeprefill.bundle import ModelInfo

SYSTEM_SHOWN = 72  # characters of the default system message `inspect` shows


@click.command()
@click.argument("bundle", type=click.Path(path_type=str))
@click.option("--verify", is_flag=True, help="Also check the sha256 of every file.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole manifest as JSON.")
def inspect(bundle, verify, as_json):
    """Show a bundle's model, task (generate; embed: its pooling and named prompts;
    score: its head, labels, relevance and pair format), graph contract, chunk buckets,
    EOS ids, sampling defaults and files.

    \b
    Example:
      edgeprefill inspect build/tiny-recall --verify
    """
    from edgeprefill.bundle import load_graph, load_manifest
    from edgeprefill.cli.tables import embeddings_line, head_kind, ternary_line
    from edgeprefill.kernels.select import (
        NATIVE,
        NO_ATTENTION,
        STOCK,
        attentionless_described,
        describe,
        native_described,
        stock_described,
    )
    from edgeprefill.sdk.generation_defaults import GenerationDefaults

    m = load_manifest(bundle, verify_checksums=verify)
    if as_json:
        click.echo(m.to_json(), nl=False)
        return
    model, graph = m.model, m.graph
    defaults = GenerationDefaults.load(bundle)
    eos = list(dict.fromkeys([*m.eos_token_ids, *defaults.eos_token_ids]))
    kernels = describe(graph.flavor, graph.dtype)
    native = kernels == NATIVE  # the library runs here: what the projections' switches need
    # Which attention nodes the kernels take, as the backend finds at load where they run.
    model_proto = load_graph(Path(bundle), m)  # checked: a corrupt graph is one line
    taken, unsupported, left = _attention_taken(model_proto) if graph.flavor == "ort" else \
        ("none", NO_ATTENTION, "")
    if native and taken == "none":
        kernels = f"{STOCK} ({unsupported})"
    stock_attention = kernels != NATIVE
    # A step fuses only where no GroupQueryAttention is left (fusing.stock_attention).
    any_stock_attention = taken != "every" or not native
    if native and graph.state_inputs:  # the DeltaNet and Mamba-2 ops run, whatever attends
        layers = _recurrent_layers(model_proto)
        kernels = native_described(*layers) if kernels == NATIVE else \
            stock_described(unsupported, *layers)
    if native and taken == "some":  # e.g. layers with a smooth softmax keep GroupQueryAttention
        kernels += left  # how many, and why: as --stats says (select.stock_layers)
    if not model.kv_layers:  # no layer attends (Mamba-2): as select.without_attention says
        kernels = attentionless_described(None, *_recurrent_layers(model_proto)) if native \
            else attentionless_described(kernels.removeprefix(f"{STOCK} (")[:-1])
        stock_attention = any_stock_attention = False
    bf16_kv = _bf16_kv_here(native and taken == "every")
    proto = model_proto.graph
    head = head_kind(proto)  # "int8" in an int4 bundle exported with --lm-head int8
    lines = [
        f"bundle      {bundle}",
        f"model       {model.family}: {model.num_layers} layers, hidden {model.hidden_size}, "
        f"{_heads(model)}, vocab {model.vocab_size}{_extra_rows(model)}",
        f"quirks      {'; '.join(m.source.get('quirks') or ['none (plain Llama layout)'])}",
        *_task_lines(m),
        *_gguf_line(m),
        *_adapter_line(m.source),
        *_tokenizer_line(m.source),
        f"graph       {graph.file} ({graph.flavor} flavour, {graph.dtype}, opsets "
        f"{json.dumps(graph.opsets)})",
        embeddings_line(proto),
        _head_line(proto, graph, native) if m.task == "generate" else
        f"lm head     none ({'a score' if m.score else 'an embedding'} bundle's graph ends "
        "at the final norm)",
        *ternary_line(proto),
        f"chunks      {', '.join(map(str, m.chunks))} tokens",
        f"max context {m.max_context} tokens",
        f"kernels     {kernels} on this machine's CPU",
        *_int4_prefill_line(graph, model_proto, native),
        *_int8_line(graph, native),
        *_compute_line(graph, native, stock_attention, bf16_kv, head),
        _kv_line(m, bf16_kv),
        *_state_line(m),
        *_shared_kv_line(m.model),
        *_attention_free_line(m.model),
        _steps_line(graph, native, any_stock_attention, taken == "every", head),
        *_derived_line(bundle, m, model_proto),
        f"eos ids     {eos}",
        f"sampling    {defaults.describe()}  (generation_config.json; requests may override)",
        f"chat        {'template included' if m.tokenizer.chat_template else 'no template'}",
        *_system_line(m.tokenizer.default_system),
        "inputs",
        *_io_lines(graph.inputs, graph.kv_inputs, graph.state_inputs),
        "outputs",
        *_io_lines(graph.outputs, graph.kv_outputs, graph.state_outputs),
        "files" + ("  (sha256 verified)" if verify else ""),
        *[f"  {name:<24} {rec.bytes / 1e6:10.2f} MB  {rec.sha256[:16]}"
          for name, rec in m.files.items()],
    ]
    click.echo("\n".join(lines))


def _task_lines(m) -> list[str]:
    """What the bundle's graph gives: logits to generate from, embeddings, or scores (its
    head's labels and the pair's template; an embedding model's named prompts, where its
    folder named any)."""
    if m.score is not None:
        score = m.score
        how = {"sigmoid": "sigmoid", "sigmoid_difference":
               f"sigmoid({score.labels[-1]} - {score.labels[0]})",
               "none": "none: more than two labels"}[score.relevance]
        uses = "Engine.score only; `run` prints the scores" if score.relevance == "none" \
            else "Engine.score, Engine.rerank, POST /v1/rerank; `run --query` ranks"
        template = "the tokenizer's pair encoding" if score.template is None else \
            json.dumps(score.template)
        transforms = "".join([f", logits x {score.scale:g}" if score.scale != 1.0 else "",
                              f", soft-cap {score.softcap:g}" if score.softcap else ""])
        return [f"task        score: a {score.kind} head ({score.head}), labels "
                f"{', '.join(score.labels)}{transforms}; relevance {how} ({uses})",
                f"pair        {template}"]
    if m.embedding is None:
        return ["task        generate (logits; `run`, `serve`'s completion and chat routes)"]
    normalized = ", L2-normalized" if m.embedding.normalize else ""
    task = (f"task        embed: {m.embedding.pooling} pooling{normalized}, "
            f"{m.model.hidden_size} dimensions (Engine.embed, POST /v1/embeddings, "
            "/api/embed; `run` prints the vectors)")
    prompts = m.embedding.prompts
    if not prompts:
        return [task]
    names = ", ".join(f"{name} ({len(text)} characters)" for name, text in prompts.items())
    return [task, f"prompts     {names}; default: {m.embedding.default_prompt_name or 'none'} "
                  "(--prompt-name, Engine.embed(prompt_name=), the routes' prompt_name)"]


def _gguf_line(m) -> list[str]:
    """Where a bundle exported from a GGUF file came from (export/gguf_input.py), and the
    Ollama model that file was (its name and the GGUF blob's digest)."""
    gguf = m.source.get("gguf")
    if not isinstance(gguf, dict):
        return []
    quant = gguf.get("quant")
    notes = [] if quant in ("F32", "F16", "BF16") else ["dequantized to float"]
    notes += [f"re-quantized {m.graph.quantization}"] if m.graph.quantization else []
    ollama = m.source.get("ollama")  # exported as ollama:NAME (export/ollama_store.py)
    file = f"ollama:{ollama.get('name')} ({str(ollama.get('digest'))[:19]}..., " if \
        isinstance(ollama, dict) else f"{gguf.get('file')} ("
    return [f"source      {file}GGUF {gguf.get('architecture')}, {quant}"
            f"{'; ' + ', '.join(notes) if notes else ''})"]


def _system_line(system: str | None) -> list[str]:
    """The default system message (an Ollama model's SYSTEM), on one line."""
    from edgeprefill.bundle import short_repr

    if system is None:
        return []
    return [f"system      {short_repr(system, SYSTEM_SHOWN)}  (first in every chat that "
            "brings no system message; --json shows it whole)"]


def _extra_rows(model: ModelInfo) -> str:
    """The embedding's rows past the vocabulary, where there are any (Molmo 2's image
    markers): ids a prompt may hold that the model never predicts."""
    extra = model.embed_extra_rows
    return f" (+{extra} ids a prompt may hold, never predicted)" if extra else ""


def _heads(model) -> str:
    if not model.kv_layers:  # Mamba-2: the manifest's head fields are placeholders
        return "no attention"
    from edgeprefill.contract import attention_layers

    kv = [model.kv_dims(i) for i in attention_layers(model.num_layers, model.no_kv_layers)]
    # OpenELM's and DeciLM's counts by layer, as their range (Gemma 4's head sizes by
    # layer: its quirks list them)
    if model.layer_heads or (model.layer_kv and len({dim for _, dim in kv}) == 1):
        heads = {model.num_heads, *model.layer_heads.values()}
        return (f"{span(heads)} heads / {span([h for h, _ in kv])} KV heads of "
                f"{model.head_dim}, by layer")
    return f"{model.num_heads} heads / {model.num_kv_heads} KV heads of {model.head_dim}"


def _io_lines(table: dict, kv_pairs: list[list[str]], states: list[str]) -> list[str]:
    grouped = {name for pair in kv_pairs for name in pair} | set(states)
    lines = [f"  {name:<16} {dtype:<8} {shape}" for name, (dtype, shape) in table.items()
             if name not in grouped]
    shapes: dict[str, list[list[str]]] = {}  # one line per KV shape (Gemma 4 has two)
    for pair in kv_pairs:
        shapes.setdefault(json.dumps(table[pair[0]]), []).append(pair)
    for spec, pairs in shapes.items():
        dtype, shape = json.loads(spec)
        first, last = pairs[0], pairs[-1]
        layers = ",".join(pair[0].rsplit(".", 1)[1] for pair in pairs)
        names = f"{first[0]} .. {last[1]}" if len(shapes) == 1 else \
            f"{first[0].rsplit('.', 1)[0]}/value.{{{layers}}}"
        lines.append(f"  {names}  {dtype} {shape}  ({len(pairs)} layers)")
    kinds: dict[str, list[str]] = {}  # past_conv -> its layers, ...: one line per kind
    for name in states:
        stem, layer = name.rsplit(".", 1)
        kinds.setdefault(stem, []).append(layer)
    for stem, layers in kinds.items():
        dtype, shape = table[f"{stem}.{layers[0]}"]
        lines.append(f"  {stem}.{{{','.join(layers)}}}  {dtype} {shape}  ({len(layers)} layers)")
    return lines


def _shared_kv_line(model) -> list[str]:
    """Gemma 4: the layers reading another layer's KV."""
    if not model.shared_kv_layers:
        return []
    return [f"kv sharing  layers {', '.join(map(str, model.shared_kv_layers))} read the KV an "
            "earlier layer of their kind writes (no cache of their own)"]


def _attention_free_line(model) -> list[str]:
    """Llama-Nemotron: the layers without attention (their NAS block's left out or one
    linear layer)."""
    if not model.attention_free_layers:
        return []
    return [f"attention   none in layers {', '.join(map(str, model.attention_free_layers))} "
            "(one linear layer or nothing in its place; no KV cache)"]


def _state_line(manifest) -> list[str]:
    """A model whose state layers carry a recurrent state instead of KV (LFM2, Qwen3.5,
    Granite 4.0-H, Nemotron-H) or beside it (Falcon-H1)."""
    m, graph = manifest.model, manifest.graph
    if not m.state_layers:
        return []
    from edgeprefill.contract import STATE_NAME

    first = [STATE_NAME.fullmatch(name) for name in graph.state_inputs]
    shapes = ", ".join(f"{match[1]} {graph.inputs[match[0]][1][1:]} "
                       f"{graph.inputs[match[0]][0]}" for match in first
                       if match and int(match[2]) == m.state_layers[0])
    how = "beside their KV" if m.kv_state_layers == m.state_layers else "instead of KV"
    return [f"state       layers {', '.join(map(str, m.state_layers))} carry a recurrent "
            f"state {how} ({shapes} per slot and layer); a slot's cache is reused "
            "whole or up to a snapshot of its states"]


def _head_line(proto, graph, native: bool) -> str:
    """The LM head's weights (cli/tables.py), and where an int8 head sits in an int4 bundle
    (`--lm-head int8`), what runs it here (engines.ort.int8_rows, as for int8 bundles)."""
    from edgeprefill.cli.tables import head_kind, head_line

    line = head_line(proto)
    if (head_kind(proto) == "int8" and graph.quantization != "int8"
            and graph.dtype == "float32"):
        from edgeprefill.engines.ort.int8_rows import describe as describe_int8

        line += f"; here {describe_int8(native)}"
    return line


def _int4_prefill_line(graph, proto, native: bool) -> list[str]:
    """int4 bundles: what their prefill and decode projections run here
    (engines.ort.int4_prefill, engines.ort.int4_decode)."""
    if graph.quantization != "int4":
        return []
    from edgeprefill.engines.ort import int8_rows
    from edgeprefill.engines.ort.int4_decode import describe as describe_decode
    from edgeprefill.engines.ort.int4_prefill import describe as describe_int4
    from edgeprefill.errors import BackendError

    try:
        rows = int8_rows.why_not(native) is None  # as the backend tells int4_prefill
    except BackendError as err:
        return [f"int4 prefill {err}", f"int4 decode {describe_decode(proto, native)}"]
    prefill = describe_int4(proto, graph.flavor, rows=rows, dtype=graph.dtype)
    return [f"int4 prefill {prefill}, for the accuracy-level-4 projections",
            f"int4 decode {describe_decode(proto, native)}"]


def _int8_line(graph, native: bool) -> list[str]:
    """int8 bundles: what their projections run here (engines.ort.int8_rows)."""
    if graph.quantization != "int8" or graph.flavor != "ort":
        return []
    if graph.dtype != "float32":
        return ["int8        MatMulNBits (8-bit weights in blocks, float16 activations)"]
    from edgeprefill.engines.ort.int8_rows import describe as describe_int8

    return [f"int8        {describe_int8(native)}"]


def _derived_line(bundle, manifest, proto) -> list[str]:
    """Bundles whose weights a load may derive from (int4 ones, and float32 ones: MatMulF32's
    panels, `--compute bf16`'s): where the derived weights are cached
    (engines.ort.derived_cache)."""
    graph = manifest.graph
    if graph.dtype != "float32" or graph.flavor != "ort" or graph.quantization == "int8":
        return []
    from edgeprefill.engines.ort.derived import weight_files
    from edgeprefill.engines.ort.derived_cache import describe

    return [f"derived     {describe(Path(bundle), weight_files(proto))}"]


def _attention_taken(graph) -> tuple[str, str, str]:
    """Which of the bundle's attention nodes (`graph`, its ModelProto) the native kernels
    take: "every", "some" or "none" (a smooth softmax, for one, keeps GroupQueryAttention),
    where none, why, and where some, how many stay and why (select.stock_layers)."""
    from edgeprefill.kernels.select import (
        no_attention_reason,
        stock_layers,
        takes_attention,
        takes_every_attention,
    )

    if takes_every_attention(graph):
        return "every", "", ""
    if takes_attention(graph):
        return "some", "", stock_layers(graph)
    return "none", no_attention_reason(graph), ""


def _recurrent_layers(graph) -> tuple[int, int]:
    """How many Gated DeltaNet recurrences the native GatedDeltaRule takes, and how many
    Mamba-2 ones Mamba2Scan takes, in the bundle's ModelProto `graph`."""
    from edgeprefill.kernels.gated_delta import delta_scans
    from edgeprefill.kernels.mamba2_scan import mamba2_scans

    return delta_scans(graph), mamba2_scans(graph)


def _steps_line(graph, native: bool, stock_attention: bool, kernels_take_it: bool,
                head: str | None) -> str:
    """Whether a step's prefill chunk and decode rows can share one call here: what the
    backend decides (engines/ort/fusing.py), with the attention that runs here and the
    projections the load-time rewrites would run (`kernels_take_it`: the native kernels
    would take every attention node)."""
    from edgeprefill.engines.ort.fusing import why_not
    from edgeprefill.errors import BackendError

    try:
        projections = _quantized_ops(graph, native, head)
    except BackendError as err:  # a refused switch: its own line says it too
        return f"steps       {err}"
    why = why_not(graph, stock_attention, projections, kernels_take_it)
    if why is not None:
        return f"steps       a prefill chunk and the decode rows in two calls ({why})"
    rows = (f"; {graph.quantization} projections quantizing each row on its own"
            if graph.quantization else "")
    return ("steps       a prefill chunk and the decode rows in one call (packed tokens; "
            f"where the native kernels take every attention layer{rows})")


def _quantized_ops(graph, native: bool, head: str | None) -> set[str]:
    """The quantized projections' op types a load would run here (what the backend reads
    off its rewritten graph: engines.ort.fusing.quantized_ops, where an LM head counts
    only as a stock op: an int8 one in an int4 bundle where MatMulInt8 does not run)."""
    from edgeprefill.engines.ort import int4_decode, int4_prefill, int8_rows

    if graph.dtype != "float32":  # blocks (MatMulNBits) at any bits; no native kernels
        return {"MatMulNBits"} if graph.quantization else set()
    per_row = int8_rows.why_not(native) is None  # MatMulInt8 runs
    if head == "int8" and graph.quantization == "int4" and not per_row:
        return {"DynamicQuantizeMatMul"} | _quantized_ops(graph, native, None)
    if graph.quantization == "int8":
        return {"MatMulInt8" if per_row else "DynamicQuantizeMatMul"}
    if graph.quantization != "int4":
        return set()
    decode = "MatMulInt4" if int4_decode.why_not(native) is None else "MatMulNBits"
    if int4_prefill.why_not(graph.flavor, "cpu") is not None:  # unswitched
        return {decode} if int4_prefill.every_row_as_decode() else {decode, "MatMulNBits"}
    if int4_prefill.mode() == "level0":
        return {decode, "MatMulNBits"}
    return {decode, "MatMulInt8" if per_row else "DynamicQuantizeMatMul"}


def _bf16_kv_here(every: bool) -> bool:
    """Whether --compute bf16 would keep a bf16 KV cache here (engines.ort.bf16_kv): the
    native kernels take `every` attention node and it is not turned off (a bad
    EDGEPREFILL_BF16_KV: the load says so)."""
    from edgeprefill.engines.ort import bf16_kv
    from edgeprefill.errors import BackendError

    try:
        return every and bf16_kv.why_not_here() is None
    except BackendError:
        return False


def _kv_line(manifest, bf16: bool) -> str:
    """What one KV slot of the bundle's max context holds (what `kv_budget_bytes` is
    divided by), and under --compute bf16 where the cache goes bf16."""
    from edgeprefill.contract import state_slot_bytes
    from edgeprefill.engines.base import kv_slot_bytes
    from edgeprefill.engines.ort.bf16_kv import DTYPE

    m, positions, dtype = manifest.model, manifest.max_context, manifest.graph.dtype
    state = state_slot_bytes(manifest.graph)
    if not m.kv_layers:  # a slot holds the states alone, whatever its positions
        return (f"kv cache    none (no layer attends); a slot holds {state / 1e6:.1f} MB of "
                "recurrent state")
    one = manifest.graph.value_is_key  # one buffer as key and value cache (CPU provider)
    line = (f"kv cache    {kv_slot_bytes(m, positions, dtype, state, one) / 1e6:.1f} MB per "
            f"slot of {positions} positions ({dtype})")
    if bf16 and dtype == "float32":
        line += (f"; {kv_slot_bytes(m, positions, DTYPE, state, one) / 1e6:.1f} MB under "
                 "--compute bf16")
    if one:
        line += ("; one cache per layer, its value the key (on a GPU: "
                 f"{kv_slot_bytes(m, positions, dtype, state) / 1e6:.1f} MB, two)")
    return line


def _compute_line(graph, native: bool, stock_attention: bool, kv_cache: bool,
                  head: str | None) -> list[str]:
    """What the default fp32 runs a float32 bundle's projections on
    (engines.ort.f32_projections) and what `--compute bf16` would run here
    (engines.ort.bf16_compute): the projections of a float32 bundle (a quantized bundle's
    float32 LM head, `--lm-head float`, too), the prefill attention of any bundle the native
    kernels take, and the KV cache where `kv_cache` (_bf16_kv_here)."""
    floats = not graph.quantization or head == "float32"
    if graph.dtype != "float32" or graph.flavor != "ort":
        return []
    from edgeprefill.engines.ort.bf16_compute import describe_bf16
    from edgeprefill.engines.ort.f32_projections import describe as describe_f32
    from edgeprefill.kernels.select import STOCK

    default = (f"fp32 (exact, the default: the projections on {describe_f32(native)})"
               if not graph.quantization else "fp32 (the default)")
    if not native:  # what the load refuses (the kernels line says why they do not run)
        return [f"compute     {default}; --compute bf16 needs the native kernels, which do "
                "not run here"]
    attends = bool(graph.kv_inputs)  # Mamba: no attention to run in bf16 or not
    if (stock_attention or not attends) and not floats:  # what the load refuses
        attention = f"the attention {STOCK}" if attends else "no layer attends"
        return [f"compute     {default}; --compute bf16: nothing to run in bf16 here (the "
                f"quantized projections as exported, {attention})"]
    bf16 = describe_bf16(projections=floats, attention=attends and not stock_attention,
                         kv_cache=kv_cache, attends=attends)
    return [f"compute     {default}; --compute bf16: {bf16}, needs the native kernels"]


def _tokenizer_line(source: dict) -> list[str]:
    """Where the bundle's tokenizer.json was converted from the checkpoint's slow tokenizer
    files (export/slow_tokenizer.py), and how the conversion was checked."""
    slow = source.get("tokenizer")
    if not isinstance(slow, dict):
        return []
    read_as = f", {slow['read_as']}" if slow.get("read_as") else ""
    return [f"tokenizer   converted from the checkpoint's {slow.get('converted_from')} "
            f"by transformers{read_as} ({slow.get('check')})"]


def _adapter_line(source: dict) -> list[str]:
    """The LoRA adapter merged at export (export/lora.py), where there was one."""
    adapter = source.get("adapter")
    if not isinstance(adapter, dict):
        return []
    base = f", trained on {adapter['base_model']}" if adapter.get("base_model") else ""
    return [f"adapter     LoRA merged: {adapter.get('path')} "
            f"(weights sha256 {str(adapter.get('sha256'))[:16]}{base})"]

