"""A bf16 KV cache under --compute bf16 (engines/ort/bf16_kv.py, PrefillAttentionBf16KV).

The reference is the float32-cache kernel on the cache's own values: over a cache of
bf16 values, with keys and values that stay bf16 values when written, both ops compute
the same thing, so every output and cache entry must be the same bits (chunk rows, rows
of one token, padding; with AVX512-BF16 both multiply bf16 pairs, without it both float32,
the bf16 op on its float32 copy of the cache). With AVX512-BF16 a bundle prefills to the
float32 cache's logits bit for bit and its cache is the float32 cache rounded to nearest
even; without it the first layer's cache is (its keys and values come before any
attention) and the rest is near. The arena is half the bytes either way. Skipped only
where the library cannot be built."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from edgeprefill.bundle import load_manifest
from edgeprefill.cli.main import cli
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort import bf16_kv
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.engines.ort.bf16_compute import bf16_bits, cpu_has_bf16
from edgeprefill.kernels import graph
from edgeprefill.sdk import Engine

HEADS, KV_HEADS, HEAD_DIM, CAPACITY = 6, 2, 32, 640
WIDTH = (HEADS + 2 * KV_HEADS) * HEAD_DIM
PASTS = np.array([0, 1, 127, 300])


def layer_model(bf16_cache: bool, products: int = 1) -> bytes:
    """One PrefillAttention (bf16 products unless `products` is 0, valid_lens) over a bound
    cache; the rotary tables are cos 1, sin 0, so a written key is the chunk's key as it
    came."""
    tables = [np.ones((CAPACITY + 1, HEAD_DIM // 2), np.float32),
              np.zeros((CAPACITY + 1, HEAD_DIM // 2), np.float32)]
    inits = [numpy_helper.from_array(t, n) for t, n in zip(tables, ("cos", "sin"), strict=True)]
    gqa = helper.make_node(
        "GroupQueryAttention", ["qkv", "", "", "past_k", "past_v", "seqlens_k", "total", "cos",
                                "sin"], ["out", "present_k", "present_v"], name="gqa",
        domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS,
        scale=HEAD_DIM**-0.5, do_rotary=1, rotary_interleaved=0,
    )
    node = graph.kernel_node(gqa, prefill=True, valid_lens="valid")
    node.attribute.append(helper.make_attribute("bf16", products))
    if bf16_cache:
        node.op_type = graph.PREFILL_BF16_KV_OP
    kind = TensorProto.UINT16 if bf16_cache else TensorProto.FLOAT
    cache = ["rows", KV_HEADS, "capacity", HEAD_DIM]
    values = [
        helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["rows", "chunk", WIDTH]),
        helper.make_tensor_value_info("past_k", kind, cache),
        helper.make_tensor_value_info("past_v", kind, cache),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["rows"]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
        helper.make_tensor_value_info("valid", TensorProto.INT32, ["rows"]),
    ]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None),
               helper.make_tensor_value_info("present_k", kind, None),
               helper.make_tensor_value_info("present_v", kind, None)]
    model = helper.make_model(helper.make_graph([node], "layer", values, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 21),
                                             helper.make_opsetid(graph.DOMAIN, 1)])
    model.ir_version = 10
    return model.SerializeToString()


def session(model: bytes, library, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(str(library))
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def run_layer(sess, qkv: np.ndarray, keys: np.ndarray, values: np.ndarray,
              valid: np.ndarray) -> np.ndarray:
    """One chunk per row at PASTS, the cache bound in place (updated); returns the output."""
    chunk = qkv.shape[1]
    binding = sess.io_binding()
    binding.bind_cpu_input("qkv", qkv)
    binding.bind_cpu_input("seqlens_k", (PASTS + chunk - 1).astype(np.int32))
    binding.bind_cpu_input("total", np.array(PASTS.max() + chunk, np.int32))
    binding.bind_cpu_input("valid", valid.astype(np.int32))
    binding.bind_output("out")
    for name, array in (("k", keys), ("v", values)):
        for kind, bind in (("past_", binding.bind_input), ("present_", binding.bind_output)):
            bind(kind + name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
    sess.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0]


def as_float(bits: np.ndarray) -> np.ndarray:
    """bf16 bits -> the float32 values they stand for."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def bf16_valued(x: np.ndarray) -> np.ndarray:
    return as_float(bf16_bits(x).astype(np.uint16))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("chunk", "valid"), [(40, [40, 1, 17, 0]), (1, [1, 1, 1, 1]),
                                              (64, [64, 64, 2, 33])])
def test_the_kernel_on_a_bf16_cache_is_the_float32_kernel_on_its_values(library, threads,
                                                                       chunk, valid):
    rng = np.random.default_rng(7)
    shape = (len(PASTS), KV_HEADS, CAPACITY, HEAD_DIM)
    cache = [bf16_bits(rng.standard_normal(shape).astype(np.float32)).astype(np.uint16)
             for _ in range(2)]
    qkv = rng.standard_normal((len(PASTS), chunk, WIDTH)).astype(np.float32)
    qkv[..., HEADS * HEAD_DIM:] = bf16_valued(qkv[..., HEADS * HEAD_DIM:])  # k and v
    valid = np.array(valid)
    want = [as_float(c) for c in cache]
    want_out = run_layer(session(layer_model(False), library, threads), qkv, *want, valid)
    got = [c.copy() for c in cache]
    got_out = run_layer(session(layer_model(True), library, threads), qkv, *got, valid)
    np.testing.assert_array_equal(got_out, want_out)
    for name, a, b in zip(("keys", "values"), want, got, strict=True):
        np.testing.assert_array_equal(b, bf16_bits(a), err_msg=name)
    assert not np.array_equal(got[0], cache[0]), "the new keys were not written in place"


def test_a_bf16_cache_holds_each_new_key_and_value_rounded_to_nearest_even(library):
    rng = np.random.default_rng(8)
    shape = (len(PASTS), KV_HEADS, CAPACITY, HEAD_DIM)
    qkv = rng.standard_normal((len(PASTS), 40, WIDTH)).astype(np.float32)
    valid = np.array([40, 1, 17, 0])  # a chunk row, a decode row (DecodeRows writes it)
    want = [np.zeros(shape, np.float32) for _ in range(2)]
    run_layer(session(layer_model(False), library, 2), qkv, *want, valid)
    got = [np.zeros(shape, np.uint16) for _ in range(2)]
    run_layer(session(layer_model(True), library, 2), qkv, *got, valid)
    for name, a, b in zip(("keys", "values"), want, got, strict=True):
        np.testing.assert_array_equal(b, bf16_bits(a), err_msg=name)
        assert b.any(), name


def test_the_bf16_op_refuses_float32_products(library):
    sess = session(layer_model(True, products=0), library, 1)
    shape = (len(PASTS), KV_HEADS, CAPACITY, HEAD_DIM)
    cache = [np.zeros(shape, np.uint16) for _ in range(2)]
    qkv = np.zeros((len(PASTS), 2, WIDTH), np.float32)
    with pytest.raises(Exception, match="needs bf16=1"):
        run_layer(sess, qkv, *cache, np.full(len(PASTS), 2))


def make_backend(bundle_dir, compute: str = "bf16") -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(bundle_dir, load_manifest(bundle_dir),
                              BackendOptions(threads=2, compute=compute))


def prefill_and_decode(backend: OnnxRuntimeBackend, prompts: list[np.ndarray], steps: int,
                       forced: np.ndarray | None = None):
    """Each prompt into its own slot in one call, then `steps` greedy decode steps of all
    rows together (or steps feeding the tokens `forced` [steps, rows] picks: another run's
    greedy ones); returns (prompt logits, decode logits [steps, rows, vocab])."""
    backend.allocate_kv(len(prompts), 256)
    first = np.array([backend.run(StepBatch(ids[None], np.array([0], np.int32),
                                            np.array([len(ids)], np.int32), slot))[0]
                      for slot, ids in enumerate(prompts)])
    lens = np.array([len(p) for p in prompts], np.int32)
    token, logits = first.argmax(-1)[:, None], []
    for step in range(steps):
        if forced is not None:
            token = forced[step][:, None]
        out = backend.run(StepBatch(token, lens, np.ones(len(prompts), np.int32), 0)).copy()
        logits.append(out)
        token, lens = out.argmax(-1)[:, None], lens + 1
    return first, np.array(logits)


# Helium rotates interleaved pairs (2i, 2i + 1), which the kernels have taken since stop 40:
# its cache goes bf16 too, and its rotary must write the same keys into it. Gemma 3's
# sliding layers start their key blocks at the window (in Widen's copy too, on CPUs
# without AVX512-BF16).
@pytest.mark.parametrize("family", ["llama", "helium", "gemma3_text"])
def test_a_bundle_prefills_the_float32_caches_bits_in_half_the_memory(library, bundle,
                                                                       monkeypatch, family):
    rng = np.random.default_rng(6)
    prompts = [rng.integers(3, 128, n) for n in (3, 150, 37)]
    monkeypatch.setenv(bf16_kv.MODE_ENV, "off")
    plain = make_backend(bundle(family))
    monkeypatch.setenv(bf16_kv.MODE_ENV, "auto")
    half = make_backend(bundle(family))
    assert plain.kv_dtype == np.float32 and half.kv_dtype == np.uint16
    assert "the KV cache" in half.compute.described
    assert "the KV cache" not in plain.compute.described
    assert half.kv_slot_bytes(256) * 2 == plain.kv_slot_bytes(256)

    want_first, _ = prefill_and_decode(plain, prompts, 0)
    half_first, _ = prefill_and_decode(half, prompts, 0)
    caches = list(zip(plain.kv_arrays(), half.kv_arrays(), strict=True))
    assert all(b.dtype == np.uint16 for _, b in caches)
    if cpu_has_bf16():  # prompts: the same products, on bf16 pairs either way
        np.testing.assert_array_equal(half_first, want_first)
        for a, b in caches:
            np.testing.assert_array_equal(b, bf16_bits(a))
    else:  # float32 products, on the rounded cache: the first layer's keys and values
        # are the same roundings, the later ones (after attention over rounded ones) near
        for a, b in caches[:2]:
            np.testing.assert_array_equal(b, bf16_bits(a))
        for a, b in caches[2:]:
            np.testing.assert_allclose(as_float(b), a, rtol=0.05, atol=0.05)
        np.testing.assert_array_equal(half_first.argmax(-1), want_first.argmax(-1))
        np.testing.assert_allclose(half_first, want_first, atol=0.15)
        assert not np.array_equal(half_first, want_first), "prefill read a float32 cache"

    # Decode reads the rounded cache: near the float32 cache's logits (0.075 apart at most
    # here with AVX512-BF16, in logits of magnitude ~3), the same tokens. Without it the
    # prompts already differ a little, so the bf16 run is fed the float32 run's tokens.
    first, want = prefill_and_decode(plain, prompts, 8)
    forced = np.concatenate([first.argmax(-1)[None], want.argmax(-1)[:-1]])
    _, got = prefill_and_decode(half, prompts, 8, None if cpu_has_bf16() else forced)
    if cpu_has_bf16():
        np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
    np.testing.assert_allclose(got, want, atol=0.15)
    assert not np.array_equal(got, want), "decode read the float32 cache"


def test_a_kv_budget_holds_twice_the_slots(library, bundle):
    path = bundle("llama")
    budget = 3 * make_backend(path, "fp32").kv_slot_bytes(512)
    slots = {}
    for compute in ("fp32", "bf16"):
        with Engine.load(path, compute=compute, kv_budget_bytes=budget, max_context=512,
                         threads=2) as engine:
            slots[compute] = engine.metrics().kv_slots
    assert slots == {"fp32": 3, "bf16": 6}


def test_the_cache_stays_float32_where_another_node_reads_it(library, bundle, monkeypatch):
    bloom = make_backend(bundle("bloom"))  # ALiBi: the stock attention reads the cache
    assert bloom.kv_dtype == np.float32
    assert "the KV cache" not in bloom.compute.described
    monkeypatch.setenv(bf16_kv.MODE_ENV, "off")
    assert make_backend(bundle("llama")).kv_dtype == np.float32
    monkeypatch.setenv(bf16_kv.MODE_ENV, "sometimes")
    with pytest.raises(Exception, match="EDGEPREFILL_BF16_KV='sometimes'"):
        make_backend(bundle("llama"))


def test_inspect_says_where_the_cache_goes_bf16(library, bundle, monkeypatch):
    def lines(family: str) -> dict[str, str]:
        out = CliRunner().invoke(cli, ["inspect", str(bundle(family))]).output
        return {x[:12].strip(): x[12:] for x in out.splitlines() if x[:12].strip()}

    llama = lines("llama")
    assert "the KV cache" in llama["compute"]
    # The slot sizes the loads allocate: what kv_budget_bytes is divided by.
    capacity = load_manifest(bundle("llama")).max_context
    fp32, bf16 = (make_backend(bundle("llama"), c).kv_slot_bytes(capacity) / 1e6
                  for c in ("fp32", "bf16"))
    assert llama["kv cache"] == (f"{fp32:.1f} MB per slot of {capacity} positions (float32); "
                                 f"{bf16:.1f} MB under --compute bf16")
    bloom = lines("bloom")
    assert "the KV cache" not in bloom["compute"] and "bf16" not in bloom["kv cache"]
    monkeypatch.setenv(bf16_kv.MODE_ENV, "off")
    off = lines("llama")
    assert "the KV cache" not in off["compute"] and "bf16" not in off["kv cache"]
