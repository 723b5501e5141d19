"""Human-readable metrics for `run --stats` and multi-request runs."""

from __future__ import annotations

from edgeprefill.sdk.metrics import EngineMetrics, RequestMetrics


def request_line(m: RequestMetrics) -> str:
    computed = m.prompt_tokens - m.prefix_reused
    prefill_s = (m.ttft or 0) - (m.queue_time or 0)
    prefill_rate = computed / prefill_s if prefill_s > 0 else 0.0
    decode_s = m.token_times[-1] - m.token_times[0] if len(m.token_times) > 1 else 0.0
    decode_rate = (len(m.token_times) - 1) / decode_s if decode_s > 0 else 0.0
    itl = m.inter_token_latencies
    return (
        f"TTFT {_ms(m.ttft)}  prefill {prefill_rate:.0f} tok/s  decode {decode_rate:.1f} tok/s  "
        f"prompt {m.prompt_tokens} tok ({m.prefix_reused} reused) in {m.chunks} chunks  "
        f"generated {m.generated_tokens}  queue {_ms(m.queue_time)}  "
        f"ITL p50 {_ms(m.itl_percentile(50))} p99 {_ms(m.itl_percentile(99))} "
        f"max {_ms(max(itl) if itl else None)}  finish {m.finish_reason}"
    )


def engine_lines(e: EngineMetrics) -> list[str]:
    return [
        f"engine: prefill {e.prefill_tokens} tok in {e.prefill_steps} steps"
        f"{_shared(e)} at {e.prefill_tokens_per_s:.0f} tok/s, "
        f"decode {e.decode_tokens} tok in {e.decode_steps} steps"
        f"{f' ({e.fused_steps} fused with a prefill chunk)' if e.fused_steps else ''} at "
        f"{e.decode_tokens_per_s:.1f} tok/s, max decode stall {_ms(e.max_decode_stall_s)}",
        f"kv: {e.kv_active} active + {e.kv_retained} retained of {e.kv_slots} slots, "
        f"{e.kv_tokens} tokens held, {e.kv_bytes / 1e6:.1f} MB allocated; prefix hit rate "
        f"{e.prefix_hit_rate:.0%} ({e.prefix_hits}/{e.prefix_lookups}); queue {e.queue_depth}",
    ]


def _shared(e: EngineMetrics) -> str:
    """Prompts' chunks per prefill step, where prompts shared steps."""
    if e.prefill_rows <= e.prefill_steps:
        return ""
    return f" ({e.prefill_rows} prompts' chunks, {e.prefill_rows / e.prefill_steps:.1f} a step)"


def backend_line(backend) -> str:
    """Which kernels the backend runs (the native attention and SwiGlu or the stock graph's
    GroupQueryAttention)."""
    kernels = getattr(backend, "kernels", None)
    described = kernels.described if kernels is not None else "the graph's own"
    int4 = getattr(backend, "int4_prefill", None)
    prefill = f", int4 prefill projections {int4.projections}" if int4 and int4.projections else ""
    switches = getattr(backend, "switches", None)
    merged = f", {switches.describe()}" if switches is not None and switches.describe() else ""
    compute = getattr(backend, "compute", None)
    bf16 = f", compute {compute.described}" if compute and compute.rewritten else ""
    int4_decode = getattr(backend, "int4_decode", None)
    decode = f", {int4_decode.described}" if int4_decode and int4_decode.rewritten else ""
    f32 = getattr(backend, "f32", None)
    decode += f", {f32.described}" if f32 and f32.rewritten else ""
    int8_rows = getattr(backend, "int8_rows", None)
    int8 = f", {int8_rows.described}" if int8_rows and int8_rows.rewritten else ""
    unsigned = getattr(backend, "int8_unsigned", None)
    int8 += f", {unsigned.described}" if unsigned and unsigned.rewritten else ""
    gated = getattr(backend, "gated", 0)
    gate = f", SwiGlu inside {gated} gate/up projections" if gated else ""
    norms = getattr(backend, "norms", 0)
    gate += f", SkipRmsNorm inside {norms} projections" if norms else ""
    ternary = getattr(backend, "integer_projections", 0)
    gate += (f", {ternary} BitNet ternary projections as int8 integer GEMMs (MatMulInteger, "
             "exact)" if ternary else "")
    fused = ", prefill chunk and decode rows in one call" if getattr(
        backend, "fuses_rows", False) else ""
    return (f"backend: {backend.name}, kernels {described}{prefill}{decode}{int8}{bf16}"
            f"{gate}{merged}{fused}")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"
