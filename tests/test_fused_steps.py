"""A prefill chunk and the decode rows in one call, for bundles whose graph packs its valid
tokens (export/tokens.py) and runs the native attention.

References: the same rows run as separate calls (logits and the KV written), and the
greedy text of the engine with fusing off; the scheduling on a fake backend's call trace.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

from edgeprefill.engines.base import StepBatch
from edgeprefill.engines.ort import int4_decode
from edgeprefill.kernels import select
from edgeprefill.sdk import Engine, GenerationParams
from tests.bundle_variants import variant
from tests.fake_backend import ids

LONG = 300


def prompt(n: int, seed: int) -> list[int]:
    return [1] + [int(t) for t in np.random.default_rng(seed).integers(3, 120, size=n - 1)]


def prefill(backend, slot: int, tokens: list[int]) -> None:
    backend.run(StepBatch(np.array([tokens], np.int64), np.array([0], np.int32),
                          np.array([len(tokens)], np.int32), slot))


class Calls(NamedTuple):
    """One step's rows run as separate calls and as one fused call, from the same cache."""
    decoded: np.ndarray  # the decode call's logits, 3 rows
    prefilled: np.ndarray  # the chunk call's logits
    fused: np.ndarray  # the fused call's logits, decode rows first
    separate_kv: list[np.ndarray]
    fused_kv: list[np.ndarray]
    ends: list[int]  # per slot, the positions holding a token's KV after the step


def fused_and_separate(backend, pasts: list[int]) -> Calls:
    """Slots 0-2 decode one token each at `pasts[:3]`; slot 3 prefills 37 more tokens at
    `pasts[3]`: as a decode call and a chunk call, then (the cache restored) as one call."""
    for slot, past in enumerate(pasts):
        prefill(backend, slot, prompt(past, seed=slot))
    saved = [a.copy() for a in backend.kv_arrays()]
    chunk, last = prompt(37, seed=9), [11, 12, 13]
    decoded = backend.run(StepBatch(np.array([last], np.int64).T, np.array(pasts[:3], np.int32),
                                    np.ones(3, np.int32), 0)).copy()
    prefilled = backend.run(StepBatch(np.array([chunk], np.int64), np.array([pasts[3]], np.int32),
                                      np.array([37], np.int32), 3)).copy()
    separate_kv = [a.copy() for a in backend.kv_arrays()]
    for array, old in zip(backend.kv_arrays(), saved, strict=True):
        array[...] = old
    ids_ = np.zeros((4, 37), np.int64)
    ids_[:3, 0] = last
    ids_[3] = chunk
    fused = backend.run(StepBatch(ids_, np.array(pasts, np.int32),
                                  np.array([1, 1, 1, 37], np.int32), 0)).copy()
    ends = [p + 1 for p in pasts[:3]] + [pasts[3] + 37]
    return Calls(decoded, prefilled, fused, separate_kv, [a.copy() for a in backend.kv_arrays()],
                 ends)


# The decode rows take the decode attention's own code; float32 projections may sum a row
# in another order in a larger call (bf16: they round the same way in both). qwen3 has q/k
# norms (q, k and v apart), phi3 a partial rotary.
@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3"])
@pytest.mark.parametrize("compute", ["fp32", "bf16"])
def test_a_fused_call_computes_what_separate_calls_compute(bundle, library, compute, family):
    engine = Engine.load(bundle(family), threads=2, background=False, kv_slots=4,
                         compute=compute)
    assert engine.manifest.graph.packed_tokens and engine.backend.fuses_rows
    calls = fused_and_separate(engine.backend, [7, 40, 23, 20])
    np.testing.assert_allclose(calls.fused[:3], calls.decoded, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(calls.fused[3:], calls.prefilled, rtol=1e-4, atol=1e-4)
    for got, want in zip(calls.fused_kv, calls.separate_kv, strict=True):
        for slot, end in enumerate(calls.ends):
            np.testing.assert_allclose(got[slot, :, :end], want[slot, :, :end],
                                       rtol=1e-5, atol=1e-5)
    engine.close()


def run_mixed(path, **options) -> tuple[list[list[int]], list]:
    """Three sessions decode while a long prompt arrives, chunked by 64; checks that the
    engine's fused-step count is the trace's."""
    # The ITL target is out of reach: on a loaded machine a slow step would otherwise
    # shrink the adaptive chunks, and the chunk pattern below is the test's subject.
    engine = Engine.load(path, threads=2, background=False, kv_slots=4, trace=True,
                         prefix_reuse=False, itl_target_ms=60_000, **options)
    params = GenerationParams(max_new_tokens=24, ignore_eos=True)
    streams = [engine.generate(prompt(n, seed=n), params) for n in (9, 30, 17)]
    for _ in range(3):
        engine.step()
    streams.append(engine.generate(prompt(LONG, seed=5), params, chunk_size=64))
    while not all(s.metrics.finish_reason for s in streams):
        engine.step()
    engine.check_integrity()
    assert engine.metrics().fused_steps == sum(t.fused and t.kind == "decode" for t in engine.trace)
    engine.close()
    return [s.result().token_ids for s in streams], engine.trace


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
def test_the_engine_fuses_and_generates_what_it_generates_unfused(bundle, library, compute):
    path = bundle("llama")
    fused_tokens, fused_trace = run_mixed(path, compute=compute, prefill_rows=1)
    tokens, trace = run_mixed(path, fuse_steps=False, compute=compute)
    assert fused_tokens == tokens
    assert not any(t.fused for t in trace)
    fused = [t for t in fused_trace if t.fused]
    # Every chunk of the long prompt ran beside the three decode rows, in one call each
    # (the later sessions' prompts, 30 and 17 tokens, beside those decoding before them).
    chunks = [t for t in fused if t.kind == "prefill"]
    assert [t.tokens for t in chunks] == [17, 30, 64, 64, 64, 64, 44]
    beside = [t.tokens for t in fused if t.kind == "decode"]
    assert beside == [1, 2, 3, 3, 3, 3, 3]
    calls = len({(t.start, t.end) for t in trace})
    assert len({(t.start, t.end) for t in fused_trace}) == calls - len(chunks)


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
def test_prompts_arriving_together_share_a_call_and_generate_what_they_generate_alone(
        bundle, library, compute):
    """The three sessions' prompts (9, 30 and 17 tokens) arrive together: one call carries
    all three, each its own row, shortest first (the policy's order); the long prompt's
    64-token chunks then fill the step's budget alone, beside the three decode rows."""
    path = bundle("llama")
    shared_tokens, shared_trace = run_mixed(path, compute=compute)
    assert shared_tokens == run_mixed(path, compute=compute, prefill_rows=1)[0]
    prefills = [t for t in shared_trace if t.kind == "prefill"]
    assert [t.tokens for t in prefills] == [9, 17, 30, 64, 64, 64, 64, 44]
    assert len({(t.start, t.end) for t in prefills[:3]}) == 1  # one call
    assert all(t.fused for t in prefills)
    beside = [t.tokens for t in shared_trace if t.fused and t.kind == "decode"]
    assert beside == [3, 3, 3, 3, 3]


def quantized_backend(quantized, monkeypatch, kind: str, mode: str | None):
    if mode == "off-rows":
        monkeypatch.setenv("EDGEPREFILL_INT8_ROWS", "off")  # the bundle's DynamicQuantizeMatMul
    elif mode:
        monkeypatch.setenv("EDGEPREFILL_INT4_PREFILL", mode)
    return quantized(kind)


# Every projection quantizes each row on its own with one native op for all rows: int8
# bundles' MatMulInt8, int4 bundles' MatMulInt4 with EDGEPREFILL_INT4_PREFILL=decode.
# Both need AVX512-VNNI or AVX2; elsewhere these bundles keep ONNX Runtime's ops and never
# fuse.
needs_int_kernels = pytest.mark.skipif(not int4_decode.cpu_has_int_kernels(),
                                       reason="no AVX512-VNNI nor AVX2 here")
PER_ROW = [pytest.param("int8", None, marks=needs_int_kernels),
           pytest.param("int4", "decode", marks=needs_int_kernels)]


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
@pytest.mark.parametrize("kind, mode", PER_ROW)
def test_a_fused_quantized_call_is_separate_calls_bit_for_bit(quantized, library, monkeypatch,
                                                              kind, mode, compute):
    """Where each row's projections are its own, a fused call's rows are the separate calls'
    bits, logits and KV: the decode rows take the decode attention's code
    (kernels/decode_rows.h), so quantized activations have no rounding to turn into codes."""
    path = quantized_backend(quantized, monkeypatch, kind, mode)
    engine = Engine.load(path, threads=2, background=False, kv_slots=4, compute=compute)
    assert engine.backend.fuses_rows, engine.backend.why_not_fused
    calls = fused_and_separate(engine.backend, [7, 140, 23, 20])
    np.testing.assert_array_equal(calls.fused[:3], calls.decoded)
    np.testing.assert_array_equal(calls.fused[3:], calls.prefilled)
    for got, want in zip(calls.fused_kv, calls.separate_kv, strict=True):
        for slot, end in enumerate(calls.ends):
            np.testing.assert_array_equal(got[slot, :, :end], want[slot, :, :end])
    engine.close()


@pytest.mark.parametrize("kind, mode", PER_ROW)
def test_quantized_bundles_with_per_row_projections_fuse(quantized, library, monkeypatch,
                                                         kind, mode):
    path = quantized_backend(quantized, monkeypatch, kind, mode)
    assert "in one call" in steps(path)
    tokens, trace = run_mixed(path)
    assert any(t.fused for t in trace)
    assert tokens == run_mixed(path, fuse_steps=False)[0]


@pytest.mark.parametrize("kind, mode, why", [
    ("int8", "off-rows", "ONNX Runtime's DynamicQuantizeMatMul"),
    pytest.param("int4", None, "prefill projections run MatMulInt8, decode's MatMulInt4",
                 marks=needs_int_kernels),
    # decode's MatMulNBits too where MatMulInt4 does not run (neither VNNI nor AVX2)
    pytest.param("int4", None, "ONNX Runtime's DynamicQuantizeMatMul",
                 marks=pytest.mark.skipif(int4_decode.cpu_has_int_kernels(),
                                          reason="VNNI or AVX2 here")),
    ("int4", "level0", "ONNX Runtime's MatMulNBits"),
])
def test_other_quantized_bundles_run_two_calls(quantized, library, monkeypatch, kind, mode, why):
    """Per-tensor quantization scales other requests' rows together; a prefill projection
    that is not decode's computes another function for the decode rows: quantized
    activations turn either into other tokens, so these never fuse."""
    path = quantized_backend(quantized, monkeypatch, kind, mode)
    engine = Engine.load(path, threads=2, background=False)
    assert not engine.backend.fuses_rows
    assert why in engine.backend.why_not_fused
    engine.close()
    assert f"two calls ({kind} " in steps(path) and why in steps(path)
    tokens, trace = run_mixed(path, fuse_steps=True)
    assert not any(t.fused for t in trace)
    assert tokens == run_mixed(path, fuse_steps=False)[0]


@needs_int_kernels
def test_an_int8_head_beside_int4_decode_projections(quantized, library, monkeypatch):
    """`--lm-head int8`, every int4 row on MatMulInt4 (EDGEPREFILL_INT4_PREFILL=decode):
    where MatMulInt8 runs the head (VNNI or AVX2) it quantizes each row by itself, so its op
    differing from the body's is no reason for two calls and a fused call is the separate
    calls bit for bit; elsewhere the head stays ONNX Runtime's DynamicQuantizeMatMul, two calls, and
    `inspect` says the same as the backend."""
    path = quantized_backend(quantized, monkeypatch, "int4/int8", "decode")
    engine = Engine.load(path, threads=2, background=False, kv_slots=4)
    if int4_decode.cpu_has_int_kernels():
        assert engine.backend.fuses_rows, engine.backend.why_not_fused
        assert "in one call" in steps(path)
        calls = fused_and_separate(engine.backend, [7, 140, 23, 20])
        np.testing.assert_array_equal(calls.fused[:3], calls.decoded)
        np.testing.assert_array_equal(calls.fused[3:], calls.prefilled)
    else:
        assert "ONNX Runtime's DynamicQuantizeMatMul" in engine.backend.why_not_fused
        assert engine.backend.why_not_fused in steps(path)
    engine.close()


def test_stock_attention_runs_separate_calls(bundle, monkeypatch):
    """ONNX Runtime's GroupQueryAttention takes one row per call with a past: no fusing."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", "off")
    engine = Engine.load(bundle("llama"), threads=2, background=False)
    assert engine.manifest.graph.packed_tokens and not engine.backend.fuses_rows
    engine.close()
    tokens, trace = run_mixed(bundle("llama"))
    assert not any(t.fused for t in trace)
    monkeypatch.delenv("EDGEPREFILL_KERNELS")
    assert tokens == run_mixed(bundle("llama"), fuse_steps=False)[0]


def test_a_standard_flavour_bundle_does_not_pack(bundle):
    engine = Engine.load(bundle("llama", "standard"), threads=2, background=False)
    assert not engine.manifest.graph.packed_tokens and not engine.backend.fuses_rows
    engine.close()


def steps(path) -> str:
    """`edgeprefill inspect`'s steps line for the bundle at `path`."""
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli

    out = CliRunner().invoke(cli, ["inspect", str(path)]).output
    return next(line for line in out.splitlines() if line.startswith("steps"))


def test_inspect_and_stats_say_whether_steps_fuse(bundle, library, monkeypatch):
    from edgeprefill.cli.report import backend_line

    assert "in one call" in steps(bundle("llama"))
    assert "two calls (a TensorRT-ready graph" in steps(bundle("llama", "standard"))
    engine = Engine.load(bundle("llama"), threads=2, background=False)
    assert backend_line(engine.backend).endswith("prefill chunk and decode rows in one call")
    engine.close()
    monkeypatch.setenv("EDGEPREFILL_KERNELS", "off")
    assert steps(bundle("llama")).endswith(
        "two calls (the stock GroupQueryAttention takes one row per call with a past; one call "
        "with the native kernels)")


def lacking_bundle(bundle_dir, dst, layers: int | None = None):
    """A copy of `bundle_dir` whose first `layers` attention nodes (None: all) have a smooth
    softmax, which the native kernels lack (every exported attention they take)."""
    from onnx import helper

    def smooth(model):
        nodes = [n for n in model.graph.node if n.op_type == select.STOCK]
        for node in nodes[:layers]:
            node.attribute.append(helper.make_attribute("smooth_softmax", 1))

    return variant(bundle_dir, dst, graph_edit=smooth)


def test_no_native_kernel_hint_where_they_would_not_take_the_attention(
        bundle, library, tmp_path):
    """Attention the kernels lack (a smooth softmax): the stock attention's reason must not
    send the user to them (inspect and --stats agree)."""
    from edgeprefill.cli.report import backend_line

    path = lacking_bundle(bundle("llama"), tmp_path / "smooth")
    line = steps(path)
    assert line.endswith("two calls (the stock GroupQueryAttention takes one row per call "
                         "with a past)")
    engine = Engine.load(path, threads=1, background=False, warm_up=False)
    assert "native kernels" not in engine.backend.why_not_fused
    assert "native kernels" not in backend_line(engine.backend)
    engine.close()


@pytest.fixture
def fusing_engine(fake_engine):
    return lambda **options: fake_engine("fake-fusing", **{
        "kv_slots": 4, "background": False, "prefix_reuse": False, **options})


def decoding(stream) -> bool:
    return stream.metrics.generated_tokens > 0


def test_fused_calls_bind_the_chunk_beside_the_decode_rows(fusing_engine):
    engine = fusing_engine(chunk_size=64)
    chats = [engine.generate(ids(10, seed=i), GenerationParams(max_new_tokens=40))
             for i in range(2)]
    while not all(decoding(c) for c in chats):
        engine.step()
    engine.backend.calls.clear()
    doc = engine.generate(ids(LONG, 1), GenerationParams(max_new_tokens=2))
    while not decoding(doc):
        engine.step()
    fused = [c for c in engine.backend.calls if c.kind == "fused"]
    assert [c.valid_lens for c in fused] == [(1, 1, 64), (1, 1, 64), (1, 1, 64), (1, 1, 64),
                                             (1, 1, 44)]
    assert [c.past_lens[2] for c in fused] == [0, 64, 128, 192, 256]
    assert all(c.rows == 3 and c.chunk == c.valid_lens[2] for c in fused)
    assert not [c for c in engine.backend.calls if c.kind == "prefill"]
    engine.check_integrity()


def test_no_fusing_when_a_decode_row_has_no_room_for_the_padding(fusing_engine):
    """A decode row near the end of its cache would have the chunk's padding written past
    it: that step runs two calls."""
    engine = fusing_engine(chunk_size=64, max_context=128)
    chat = engine.generate(ids(70, seed=3), GenerationParams(max_new_tokens=50))
    while not decoding(chat):
        engine.step()
    engine.backend.calls.clear()
    doc = engine.generate(ids(100, 1), GenerationParams(max_new_tokens=2))
    while not decoding(doc):
        engine.step()
    calls = engine.backend.calls
    # 64 tokens of padding past the chat's 71 do not fit in 128: two calls. The last 36 do.
    assert [c.kind for c in calls] == ["decode", "prefill", "fused"]
    assert calls[0].past_lens[0] + 64 > 128 and calls[1].valid_lens == (64,)
    assert calls[2].valid_lens == (1, 36)
    engine.check_integrity()


def test_fuse_steps_off_runs_two_calls(fusing_engine):
    engine = fusing_engine(chunk_size=64, fuse_steps=False)
    chat = engine.generate(ids(10), GenerationParams(max_new_tokens=40))
    while not decoding(chat):
        engine.step()
    doc = engine.generate(ids(LONG, 1), GenerationParams(max_new_tokens=2))
    while not decoding(doc):
        engine.step()
    assert "fused" not in [c.kind for c in engine.backend.calls]


def test_asking_to_fuse_where_the_backend_cannot_warns(fake_engine, caplog):
    """fuse_steps=True says "asked for": on a backend that cannot fuse the engine says so
    once, at load; the default and False stay quiet, and fusing backends need no word."""
    warning = "two calls here"
    fake_engine(fuse_steps=True)  # the plain fake backend does not fuse
    assert warning in caplog.text
    caplog.clear()
    fake_engine()
    fake_engine(fuse_steps=False)
    fake_engine("fake-fusing", fuse_steps=True)
    assert warning not in caplog.text


def test_a_failing_fused_call_ends_its_requests_not_the_engine(fusing_engine, monkeypatch):
    engine = fusing_engine(chunk_size=64)
    chat = engine.generate(ids(10), GenerationParams(max_new_tokens=40))
    while not decoding(chat):
        engine.step()
    doc = engine.generate(ids(LONG, 1), GenerationParams(max_new_tokens=2))
    run = engine.backend.run

    def failing(step):
        if step.rows > 1 and step.chunk > 1:
            raise RuntimeError("device lost")
        return run(step)

    monkeypatch.setattr(engine.backend, "run", failing)
    engine.step()  # raises nothing: the loop goes on
    for stream in (chat, doc):
        assert stream.result().finish_reason == "error" and "device lost" in stream.error
    assert engine.kv.usage().active == 0
    later = engine.generate(ids(12, 2), GenerationParams(max_new_tokens=3))
    while not later.metrics.finish_reason:
        engine.step()
    assert later.result().finish_reason == "length"


def test_inspect_agrees_with_the_backend_where_some_attention_stays_stock(
        bundle, library, tmp_path):
    # A layer with what the kernels lack (a smooth softmax) keeps GroupQueryAttention: no
    # step fuses, and inspect says so. (Every exported attention goes native: windows,
    # softcaps, sinks, no or interleaved rotary; tests/test_sliding_window.py,
    # test_soft_cap.py, test_attention_sinks.py, test_no_rotary.py, test_interleaved_rotary.py.)
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli

    path = lacking_bundle(bundle("llama"), tmp_path / "smooth", layers=1)
    engine = Engine.load(path, threads=1, background=False, warm_up=False)
    fuses, described = engine.backend.fuses_rows, engine.backend.kernels.described
    engine.close()
    assert not fuses
    assert "two calls" in steps(path)
    out = CliRunner().invoke(cli, ["inspect", str(path)]).output
    # Both say how many stay, and why (--stats prints `described`).
    left = "; 1 of 2 attention layers stay GroupQueryAttention (a smooth softmax)"
    assert described == select.NATIVE + left
    assert f"kernels     {select.NATIVE}{left} on this machine's CPU" in out


@pytest.mark.parametrize("family", ["gemma2", "granite"])
def test_the_lm_head_is_found_behind_the_ops_after_it(hf_model, tmp_path, family):
    """fusing.lm_head walks back from the logits through a soft-cap (Gemma 2) or a logits
    scaling (Granite) to the head's node, which `quantized_ops` treats apart."""
    import onnx

    from edgeprefill.engines.ort.fusing import lm_head
    from edgeprefill.export.exporter import ExportOptions, export
    from edgeprefill.export.quantize import QuantConfig

    export(hf_model(family), tmp_path, ExportOptions(
        chunks=(16,), max_context=64, show_progress=False, overwrite=True,
        quant=QuantConfig("int4", head="int8")))
    graph = onnx.load(tmp_path / "model.onnx", load_external_data=False).graph
    head = lm_head(graph)
    assert head is not None and head.op_type == "DynamicQuantizeMatMul"
    assert head.input[1] == "lm_head.int8"
