"""--compute bf16: edgeprefill.MatMulBf16 against numpy on bf16-rounded operands, the
rounding against torch's bfloat16, the load-time rewrite of a float32 bundle (logits near
the fp32 run's, and exactly the same whether a prompt is chunked or not), and the refusals.
Skipped only where the native library cannot be built."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.engines.ort.bf16_compute import OP, bf16_bits, cpu_has_bf16, pack
from edgeprefill.errors import BackendError, RequestError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.kernels import graph, select
from edgeprefill.sdk import Engine, EngineConfig, GenerationParams
from tests.conftest import TINY_MODEL


def rounded(x: np.ndarray) -> np.ndarray:
    """x rounded to bf16, as float64 (for an exact-sum reference)."""
    return (bf16_bits(x) << 16).astype(np.uint32).view(np.float32).astype(np.float64)


def op_model(weight: np.ndarray) -> bytes:
    packed = pack(weight)
    node = helper.make_node(OP, ["a", "w"], ["y"], domain=graph.DOMAIN, N=weight.shape[1])
    g = helper.make_graph(
        [node], "bf16", [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(packed, "w")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid(graph.DOMAIN, 1)])
    m.ir_version = 10
    return m.SerializeToString()


def run_op(weight: np.ndarray, a: np.ndarray, library, threads: int) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(str(library))
    session = ort.InferenceSession(op_model(weight), so, providers=["CPUExecutionProvider"])
    return session.run(None, {"a": a})[0]


def test_rounding_matches_torch_bfloat16():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10_000).astype(np.float32) * 10.0 ** rng.integers(
        -6, 6, 10_000), np.float32([0.0, -0.0, 1.0, 1.00390625, 1.01171875, 3.4e38, -1e-40])])
    x = x.astype(np.float32)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bf16_bits(x).astype(np.uint16), theirs)


def test_pack_layout():
    """Column n of panel p holds rows (2i, 2i+1) of weight column 64 p + n; zeros beyond."""
    w = np.random.default_rng(1).standard_normal((5, 70)).astype(np.float32)
    r = rounded(w)
    packed = pack(w).view(np.uint32)
    assert packed.shape == (2, 3, 64)
    low = ((packed & 0xFFFF) << 16).view(np.float32)
    high = (packed & 0xFFFF0000).view(np.float32)
    assert low[1, 2, 3] == r[4, 67] and high[1, 2, 3] == 0.0  # K = 5 is odd
    assert low[0, 1, 5] == r[2, 5] and high[0, 1, 5] == r[3, 5]
    assert not packed[1, :, 6:].any()  # columns 70.. of the last panel


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m, k, n", [(1, 576, 960), (6, 64, 64), (7, 33, 70), (50, 128, 200),
                                      (130, 96, 130), (4, 1536, 576)])
def test_op_matches_numpy_on_bf16_operands(library, m, k, n, threads):
    rng = np.random.default_rng(m * k + n)
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    a = rng.standard_normal((1, m, k)).astype(np.float32)
    got = run_op(w, a, library, threads)
    assert got.shape == (1, m, n)
    exact = rounded(a) @ rounded(w)  # the same operands, summed in float64
    magnitude = np.abs(rounded(a)) @ np.abs(rounded(w))
    assert np.all(np.abs(got - exact) <= 1e-5 * magnitude + 1e-30)
    # and not the fp32 product: the operands really were rounded
    assert np.abs(got - a.astype(np.float64) @ w).max() > 1e-4


def test_op_refuses_a_weight_of_another_shape(library):
    w = np.ones((8, 16), np.float32)
    with pytest.raises(Exception, match="does not fit K=10"):
        run_op(w, np.ones((1, 2, 10), np.float32), library, 1)


def load(bundle_dir, compute: str, threads: int = 2) -> OnnxRuntimeBackend:
    backend = OnnxRuntimeBackend(bundle_dir, load_manifest(bundle_dir),
                                 BackendOptions(threads=threads, compute=compute))
    backend.allocate_kv(1, 512)
    return backend


def prompt_logits(backend: OnnxRuntimeBackend, ids: np.ndarray, chunk: int) -> np.ndarray:
    """The last token's logits after prefilling `ids` in chunks of `chunk`."""
    for start in range(0, ids.size, chunk):
        piece = ids[start:start + chunk][None, :]
        logits = backend.run(StepBatch(piece, np.array([start], np.int32),
                                       np.array([piece.shape[1]], np.int32), 0))
    return logits[0].copy()


def test_bundle_runs_every_projection_in_bf16(library, bundle):
    path = bundle("llama")
    fp32, bf16 = load(path, "fp32"), load(path, "bf16")
    layers = load_manifest(path).model.num_layers
    assert fp32.compute.rewritten == 0
    # per layer qkv, o, gate/up, down and the prefill attention; the LM head
    assert bf16.compute.rewritten == 5 * layers + 1
    ids = np.random.default_rng(0).integers(0, 128, 100).astype(np.int64)  # VOCAB
    want, got = prompt_logits(fp32, ids, 100), prompt_logits(bf16, ids, 100)
    scale = np.abs(want).max()
    assert 0 < np.abs(got - want).max() < 0.05 * scale  # bf16's rounding, no more
    assert np.corrcoef(got, want)[0, 1] > 0.999
    # Each row's arithmetic does not depend on the chunk it came in (nor does the
    # attention's): chunked and one-shot prefill agree exactly in bf16 too.
    np.testing.assert_array_equal(prompt_logits(load(path, "bf16"), ids, 16), got)


def test_tiny_model_still_recalls_in_bf16(library, tiny_bundle):
    prompt = (TINY_MODEL / "demo_prompt.txt").read_text().strip()
    expected = (TINY_MODEL / "demo_answer.txt").read_text().strip()
    with Engine.load(tiny_bundle, compute="bf16") as engine:
        stream = engine.generate(prompt, GenerationParams(max_new_tokens=16), chunk_size=64)
        assert stream.result().text.strip() == expected


def test_refusals_and_quantized_bundles(library, bundle, monkeypatch, tmp_path):
    with pytest.raises(RequestError, match="compute must be one of fp32, bf16"):
        EngineConfig(compute="fp16")
    int4 = tmp_path / "int4"
    export(TINY_MODEL, int4, ExportOptions(chunks=(16,), max_context=64, show_progress=False,
                                           quant=QuantConfig("int4")))
    quantized = load(int4, "bf16")  # keeps its int4 projections, attention in bf16
    assert quantized.compute.rewritten == load_manifest(int4).model.num_layers
    assert "the quantized projections as exported" in quantized.compute.described or (
        not cpu_has_bf16())
    monkeypatch.setenv(select.MODE_ENV, "off")
    with pytest.raises(BackendError, match="needs the native kernels"):
        load(bundle("llama"), "bf16")


def test_cli_runs_bf16_and_says_so(library, bundle, monkeypatch):
    from tests.test_cli_errors import cli

    monkeypatch.setenv(select.MODE_ENV, "require")  # on any CPU (`auto`: vector builds only)
    shown = cli("inspect", bundle("llama"))
    from edgeprefill.engines.ort.f32_projections import describe as describe_f32

    assert (f"compute     fp32 (exact, the default: the projections on {describe_f32(True)}); "
            "--compute bf16: bf16 (MatMulBf16") in shown.stdout
    ran = cli("run", bundle("llama"), "--prompt", "w5 w6", "--max-new-tokens", "3", "--stats",
              "--compute", "bf16")
    assert ran.returncode == 0, ran.stderr
    assert "compute bf16 (MatMulBf16" in ran.stderr
    refused = cli("run", bundle("llama"), "--prompt", "w5", "--compute", "fp16")
    assert refused.returncode == 2 and "'fp16' is not one of 'fp32', 'bf16'" in refused.stderr


def test_prefill_attention_in_bf16_stays_near_float32(library):
    """PrefillAttention with bf16=1 against GroupQueryAttention: the output within bf16's
    rounding (and, where the CPU has AVX512-BF16, not the float32 result: the bf16 products
    ran), the cache written exactly (it stays float32)."""
    from tests.test_prefill_kernel import (
        CAPACITY,
        HEAD_DIM,
        KV_HEADS,
        PASTS,
        WIDTH,
        layer_model,
        run_layer,
        session,
    )

    stock = session(layer_model(False, HEAD_DIM), None, 2)
    native = session(layer_model(True, HEAD_DIM, bf16=True), library, 2)
    rng = np.random.default_rng(3)
    for chunk in (2, 17, 65):  # odd key blocks leave a half pair
        qkv = rng.standard_normal((len(PASTS), chunk, WIDTH)).astype(np.float32)
        shape = (len(PASTS), KV_HEADS, CAPACITY, HEAD_DIM)
        cache = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
        want = [c.copy() for c in cache]
        want_out = np.concatenate([
            run_layer(stock, PASTS[r:r + 1], qkv[r:r + 1], want[0][r:r + 1], want[1][r:r + 1])
            for r in range(len(PASTS))])
        got = [c.copy() for c in cache]
        got_out = run_layer(native, PASTS, qkv, got[0], got[1])
        error = np.abs(got_out - want_out)
        assert error.max() < 0.05 and error.mean() < 0.01, (chunk, error.max(), error.mean())
        if cpu_has_bf16():
            assert error.max() > 1e-4, "the bf16 products did not run"
        else:
            assert error.max() < 1e-4, "the fp32 fallback changed the result"
        for a, b in zip(want, got, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)


def test_rows_decoded_together_match_each_alone(library, bundle):
    """A row's bf16 arithmetic does not depend on the rows beside it: two sessions decoded
    in one call give bit for bit the logits each gets decoded alone."""
    path = bundle("llama")
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 128, 23).astype(np.int64), rng.integers(0, 128, 9)]

    def prefilled() -> OnnxRuntimeBackend:
        b = OnnxRuntimeBackend(path, load_manifest(path), BackendOptions(threads=2,
                                                                          compute="bf16"))
        b.allocate_kv(2, 512)
        for slot, ids in enumerate(prompts):
            b.run(StepBatch(ids[None, :], np.array([0], np.int32),
                            np.array([ids.size], np.int32), slot))
        return b

    lens = np.array([p.size for p in prompts], np.int32)
    tokens = np.array([[7], [11]])
    together = prefilled().run(StepBatch(tokens, lens, np.ones(2, np.int32), 0)).copy()
    alone = prefilled()
    for row in range(2):
        got = alone.run(StepBatch(tokens[row:row + 1], lens[row:row + 1],
                                  np.ones(1, np.int32), row))
        np.testing.assert_array_equal(got[0], together[row])


@pytest.mark.parametrize("fast, widened, projections, says", [
    (True, False, True, "bf16 (MatMulBf16 and PrefillAttention's products; AVX512-BF16)"),
    (False, True, True, "bf16 (MatMulBf16 on fp32 FMAs; this CPU has no AVX512-BF16: prefill "
                        "no faster than fp32, decode reads half the weight bytes; "
                        "PrefillAttention in fp32)"),
    (False, False, True, "bf16 (MatMulBf16 in portable loops; this CPU has no AVX512-BF16: "
                         "slower than fp32; PrefillAttention in fp32)"),
    # a quantized bundle: nothing of it computes in bf16 without AVX512-BF16, so no speed is
    # promised for it
    (False, True, False, "bf16 (nothing; this CPU has no AVX512-BF16; PrefillAttention in "
                         "fp32; the quantized projections as exported)"),
])
def test_stats_say_how_bf16_runs_on_this_cpu(monkeypatch, fast, widened, projections, says):
    from edgeprefill.engines.ort import bf16_compute

    monkeypatch.setattr(bf16_compute, "cpu_has_bf16", lambda: fast)
    monkeypatch.setattr(bf16_compute, "widens_bf16", lambda: widened)
    assert bf16_compute.describe_bf16(projections=projections) == says
