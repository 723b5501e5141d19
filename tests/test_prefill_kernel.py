"""The native prefill attention (edgeprefill.PrefillAttention) against ONNX Runtime's own
GroupQueryAttention: one layer, output and the written cache, for chunk lengths around the
kernel's blocks (32 queries, 64 keys) and rows of different past lengths; whole bundles
(llama, qwen3 with q/k/v apart, phi3 with partial rotary) prefill to the same logits and
greedy tokens, chunked and unchunked. Skipped, with the reason, only where the library
cannot be built."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.kernels import graph, select

HEADS, KV_HEADS, HEAD_DIM, CAPACITY = 6, 2, 32, 640
WIDTH = (HEADS + 2 * KV_HEADS) * HEAD_DIM
PASTS = np.array([0, 1, 127, 300])



def layer_model(native: bool, rotary_dim: int, valid_lens: bool = False, decode: bool = False,
                bf16: bool = False, packed: bool = False, last: bool = False,
                window: int = -1, softcap: float = 0.0, rotary: bool = True,
                sink: np.ndarray | None = None, interleaved: bool = False) -> bytes:
    """One attention layer over a bound cache, chunk length free: GQA or the kernel (with
    `valid_lens`, given each row's valid tokens as an input; `decode`: DecodeAttention, for
    chunks of one token; `bf16`: PrefillAttention's products in bf16; `packed`: its qkv and
    output the valid tokens packed, [1, T, ...], with past_lens as input "past"; `last`: its
    output each row's last valid token only, last=1; `window`: GroupQueryAttention's
    local_window_size, `softcap` its softcap, which graph.kernel_node carries over;
    `rotary` False: do_rotary=0 and no rotary tables, a NoPE layer; `sink`: [HEADS] logits
    as head_sink, gpt-oss's attention sinks; `interleaved`: rotary_interleaved=1)."""
    valid_lens = valid_lens or packed
    rng = np.random.default_rng(0)
    tables = [rng.standard_normal((CAPACITY + 1, rotary_dim // 2)).astype(np.float32)
              for _ in range(2)]
    inits = [numpy_helper.from_array(t, n) for t, n in zip(tables, ("cos", "sin"), strict=True)]
    inputs = ["qkv", "", "", "past_k", "past_v", "seqlens_k", "total", "cos", "sin"]
    if not rotary:
        inputs, inits = inputs[:7], []
    if sink is not None:
        inputs = inputs + [""] * (11 - len(inputs)) + ["sink"]
        inits.append(numpy_helper.from_array(sink.astype(np.float32), "sink"))
    node = helper.make_node(
        "GroupQueryAttention", inputs, ["out", "present_k", "present_v"], name="gqa",
        domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS,
        scale=HEAD_DIM**-0.5, do_rotary=int(rotary), rotary_interleaved=int(interleaved),
        local_window_size=window, softcap=softcap,
    )
    if native:
        node = graph.kernel_node(node, prefill=not decode,
                                 valid_lens="valid" if valid_lens else None)
    if bf16:
        node.attribute.append(helper.make_attribute("bf16", 1))
    if packed:
        if len(node.input) > 8:  # a head_sink after it (graph.PREFILL_SINK)
            node.input[8] = "past"
        else:
            node.input.append("past")
        node.attribute.append(helper.make_attribute("packed", 1))
    if last:
        node.attribute.append(helper.make_attribute(graph.LAST, 1))
    cache = ["rows", KV_HEADS, "capacity", HEAD_DIM]
    qkv_dims = [1, "tokens", WIDTH] if packed else ["rows", "chunk", WIDTH]
    values = [
        helper.make_tensor_value_info("qkv", TensorProto.FLOAT, qkv_dims),
        helper.make_tensor_value_info("past_k", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("past_v", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["rows"]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    if valid_lens:
        values.append(helper.make_tensor_value_info("valid", TensorProto.INT32, ["rows"]))
    if packed:
        values.append(helper.make_tensor_value_info("past", TensorProto.INT32, ["rows"]))
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
               for n in ("out", "present_k", "present_v")]
    g = helper.make_graph([node], "layer", values, outputs, inits)
    model = helper.make_model(g, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1),
        helper.make_opsetid(graph.DOMAIN, 1),
    ])
    model.ir_version = 10
    return model.SerializeToString()


def session(model: bytes, library, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    if library is not None:
        so.register_custom_ops_library(str(library))
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def run_layer(sess, pasts: np.ndarray, qkv: np.ndarray, keys: np.ndarray, values: np.ndarray,
              valid: np.ndarray | None = None, packed: bool = False, last: bool = False):
    """One chunk per row with the cache bound in place (updated); returns the output.
    `packed`: the op takes the valid tokens of qkv packed and gives them packed back;
    `last`: the op (last=1) gives each row's last valid token only, [1, rows, ...]."""
    chunk = qkv.shape[1]
    binding = sess.io_binding()
    if valid is not None:
        binding.bind_cpu_input("valid", valid.astype(np.int32))
    if packed:
        binding.bind_cpu_input("past", pasts.astype(np.int32))
        qkv = np.concatenate([qkv[r, :n] for r, n in enumerate(valid)])[None]
    binding.bind_cpu_input("qkv", qkv)
    binding.bind_cpu_input("seqlens_k", (pasts + chunk - 1).astype(np.int32))
    binding.bind_cpu_input("total", np.array(pasts.max() + chunk, np.int32))
    binding.bind_output("out")  # first: outputs come back in the order they were bound
    for name, array in (("k", keys), ("v", values)):
        for kind, bind in (("past_", binding.bind_input), ("present_", binding.bind_output)):
            bind(kind + name, "cpu", 0, np.float32, array.shape, array.ctypes.data)
    sess.run_with_iobinding(binding)
    out = binding.copy_outputs_to_cpu()[0]
    rows = (1, len(pasts)) if last else qkv.shape[:2]
    assert out.shape == (*rows, HEADS * HEAD_DIM)
    return out



def check_against_stock(native, stock, pasts: np.ndarray, qkv: np.ndarray,
                        valid: np.ndarray | None = None, seed: int = 0,
                        packed: bool = False) -> None:
    """One call of `native` (a kernel layer's session) against `stock` (GroupQueryAttention's)
    over a random cache: the outputs of each row's valid tokens, and the cache each writes.
    GroupQueryAttention takes several rows of a chunk only when all start at 0: it runs
    each row alone over its valid tokens."""
    rng = np.random.default_rng(seed)
    shape = (len(pasts), KV_HEADS, CAPACITY, HEAD_DIM)
    cache = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    lens = np.full(len(pasts), qkv.shape[1]) if valid is None else valid
    want = [c.copy() for c in cache]
    want_out = np.zeros((len(pasts), qkv.shape[1], HEADS * HEAD_DIM), np.float32)
    for r, n in enumerate(lens):
        if n:
            want_out[r, :n] = run_layer(stock, pasts[r:r + 1], qkv[r:r + 1, :n],
                                        want[0][r:r + 1], want[1][r:r + 1])[0]
    got = [c.copy() for c in cache]
    got_out = run_layer(native, pasts, qkv, *got, valid, packed=packed)
    if packed:
        want_out = np.concatenate([want_out[r, :n] for r, n in enumerate(lens)])[None]
    np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-5)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("valid", [[40, 1, 17, 0], [1, 1, 1, 1], [40, 40, 40, 40]])
def test_packed_tokens_give_the_unpacked_bits(library, bf16, valid):
    """packed=1 (the graph's valid tokens packed row after row, as export/tokens.py runs
    the layers) against the same op on the spread rows: each valid token's output and the
    cache, bit for bit, for a fused step (a chunk beside decode rows and an empty row), a
    decode step and a prefill of several rows."""
    valid = np.array(valid)
    rng = np.random.default_rng(9)
    qkv = rng.standard_normal((len(PASTS), 40, WIDTH)).astype(np.float32)
    shape = (len(PASTS), KV_HEADS, CAPACITY, HEAD_DIM)
    cache = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    spread = session(layer_model(True, HEAD_DIM, valid_lens=True, bf16=bf16), library, 2)
    want = [c.copy() for c in cache]
    want_out = run_layer(spread, PASTS, qkv, *want, valid)
    packed = session(layer_model(True, HEAD_DIM, bf16=bf16, packed=True), library, 2)
    got = [c.copy() for c in cache]
    got_out = run_layer(packed, PASTS, qkv, *got, valid, packed=True)
    np.testing.assert_array_equal(
        got_out[0], np.concatenate([want_out[r, :n] for r, n in enumerate(valid)]))
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(b, a)


def test_packed_tokens_must_add_up(library):
    sess = session(layer_model(True, HEAD_DIM, packed=True), library, 1)
    qkv = np.zeros((2, 8, WIDTH), np.float32)
    cache = np.zeros((2, KV_HEADS, 64, HEAD_DIM), np.float32)
    binding = sess.io_binding()
    for name, value in (("qkv", qkv[:1, :5]), ("valid", np.array([3, 3], np.int32)),
                        ("past", np.zeros(2, np.int32)), ("seqlens_k", np.zeros(2, np.int32)),
                        ("total", np.array(8, np.int32))):
        binding.bind_cpu_input(name, value)
    binding.bind_output("out")
    for name in ("k", "v"):
        binding.bind_input("past_" + name, "cpu", 0, np.float32, cache.shape, cache.ctypes.data)
        binding.bind_output("present_" + name, "cpu", 0, np.float32, cache.shape,
                            cache.ctypes.data)
    with pytest.raises(Exception, match="as many qkv tokens as valid_lens sums to"):
        sess.run_with_iobinding(binding)


@pytest.mark.parametrize("rotary_dim", [HEAD_DIM, HEAD_DIM // 2])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_matches_group_query_attention_per_layer(library, threads, rotary_dim):
    stock = session(layer_model(False, rotary_dim), None, threads)
    native = session(layer_model(True, rotary_dim), library, threads)
    rng = np.random.default_rng(1)
    for chunk in (2, 17, 64, 256):
        qkv = rng.standard_normal((len(PASTS), chunk, WIDTH)).astype(np.float32)
        shape = (len(PASTS), KV_HEADS, CAPACITY, HEAD_DIM)
        cache = [rng.standard_normal(shape).astype(np.float32) * 2 for _ in range(2)]
        # GroupQueryAttention takes several rows of a chunk only as a first prompt (all
        # past lengths 0): the reference runs each row alone, the kernel all at once.
        want = [c.copy() for c in cache]
        want_out = np.concatenate([
            run_layer(stock, PASTS[r:r + 1], qkv[r:r + 1], want[0][r:r + 1], want[1][r:r + 1])
            for r in range(len(PASTS))
        ])
        got = [c.copy() for c in cache]
        got_out = run_layer(native, PASTS, qkv, got[0], got[1])
        np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-5,
                                   err_msg=f"out, chunk {chunk}")
        for name, a, b in zip(("keys", "values"), want, got, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=f"{name}, chunk {chunk}")
        assert not np.array_equal(got[0], cache[0]), "the new keys were not written in place"


def test_valid_lens_skip_each_rows_padding(library):
    """Rows of one call with different valid lengths (a prefill chunk beside decode rows):
    each valid token's output and cache entry is what GroupQueryAttention computes for the
    row's valid tokens alone; padding is neither computed (zero output) nor written."""
    stock = session(layer_model(False, HEAD_DIM), None, 2)
    native = session(layer_model(True, HEAD_DIM, valid_lens=True), library, 2)
    rng = np.random.default_rng(4)
    chunk, valid = 40, np.array([40, 1, 17, 0])
    qkv = rng.standard_normal((len(PASTS), chunk, WIDTH)).astype(np.float32)
    shape = (len(PASTS), KV_HEADS, CAPACITY, HEAD_DIM)
    cache = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    want = [c.copy() for c in cache]
    want_out = np.zeros((len(PASTS), chunk, HEADS * HEAD_DIM), np.float32)
    for r, n in enumerate(valid):
        if n:
            want_out[r, :n] = run_layer(stock, PASTS[r:r + 1], qkv[r:r + 1, :n],
                                        want[0][r:r + 1], want[1][r:r + 1])[0]
    got = [c.copy() for c in cache]
    got_out = run_layer(native, PASTS, qkv, got[0], got[1], valid)
    np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-5)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)  # padding positions untouched


@pytest.mark.parametrize("bf16", [False, True])
def test_a_one_token_row_gets_the_decode_kernels_bits(library, bf16):
    """A row of one valid token beside a chunk (a fused step's decode row) gets, bit for bit,
    output and cache, what DecodeAttention computes for it in a call of its own, and a
    decode row's bits do not depend on the other rows of its call: quantized projections
    would turn any rounding difference into other codes (engines/ort/fusing.py). Under bf16
    the one-token rows keep float32 products; the chunk's row does not."""
    pasts = np.array([5, 600, 129, 40])  # rows 0-2 decode (600: 4 pieces); row 3 prefills 40
    chunk, valid = 40, np.array([1, 1, 1, 40])
    rng = np.random.default_rng(7)
    qkv = rng.standard_normal((4, chunk, WIDTH)).astype(np.float32)
    shape = (4, KV_HEADS, CAPACITY, HEAD_DIM)
    cache = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    fused = [c.copy() for c in cache]
    prefill = session(layer_model(True, HEAD_DIM, valid_lens=True, bf16=bf16), library, 2)
    fused_out = run_layer(prefill, pasts, qkv, *fused, valid)

    decode = session(layer_model(True, HEAD_DIM, decode=True), library, 2)
    together = [c[:3].copy() for c in cache]
    together_out = run_layer(decode, pasts[:3], qkv[:3, :1].copy(), *together)
    for r in range(3):
        alone = [c[r:r + 1].copy() for c in cache]
        alone_out = run_layer(decode, pasts[r:r + 1], qkv[r:r + 1, :1].copy(), *alone)
        np.testing.assert_array_equal(fused_out[r, :1], alone_out[0], err_msg=f"row {r}")
        np.testing.assert_array_equal(together_out[r], alone_out[0], err_msg=f"row {r}")
        for name, got, want in zip(("keys", "values"), fused, alone, strict=True):
            np.testing.assert_array_equal(got[r], want[0], err_msg=f"{name}, row {r}")
    assert not fused_out[:3, 1:].any()  # the decode rows' padding: zero, never computed
    # The chunk's row is still the prefill kernel's: close to the reference, not the decode.
    stock = session(layer_model(False, HEAD_DIM), None, 2)
    want = [c[3:].copy() for c in cache]
    want_out = run_layer(stock, pasts[3:], qkv[3:], *want)
    tolerance = 2e-2 if bf16 else 1e-5
    np.testing.assert_allclose(fused_out[3], want_out[0], rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("valid_lens", [False, True])
@pytest.mark.parametrize("bf16", [False, True])
def test_a_decode_call_gets_the_decode_kernels_bits(library, bf16, valid_lens):
    """A call of one token per row (a decode step, which the graph switch now also gives
    this op): every row is DecodeAttention's, output and cache bit for bit, with the graph's
    valid_lens or without (a bundle exported before them)."""
    pasts = np.array([5, 600, 0, 40])  # 600: several pieces
    rng = np.random.default_rng(8)
    qkv = rng.standard_normal((4, 1, WIDTH)).astype(np.float32)
    shape = (4, KV_HEADS, CAPACITY, HEAD_DIM)
    cache = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    mine, theirs = [c.copy() for c in cache], [c.copy() for c in cache]
    prefill = session(layer_model(True, HEAD_DIM, valid_lens=valid_lens, bf16=bf16), library, 2)
    got = run_layer(prefill, pasts, qkv, *mine, np.ones(4) if valid_lens else None)
    decode = session(layer_model(True, HEAD_DIM, decode=True), library, 2)
    want = run_layer(decode, pasts, qkv, *theirs)
    np.testing.assert_array_equal(got, want)
    for a, b in zip(theirs, mine, strict=True):
        np.testing.assert_array_equal(b, a)


def test_first_prompt_of_several_rows_matches_group_query_attention(library):
    """total == chunk: every row starts at 0, as GroupQueryAttention reads a first prompt."""
    rng = np.random.default_rng(3)
    pasts = np.zeros(3, np.int64)
    qkv = rng.standard_normal((3, 70, WIDTH)).astype(np.float32)
    shape = (3, KV_HEADS, CAPACITY, HEAD_DIM)
    cache = [np.zeros(shape, np.float32) for _ in range(2)]
    outs = []
    for native in (False, True):
        sess = session(layer_model(native, HEAD_DIM), library if native else None, 2)
        outs.append(run_layer(sess, pasts, qkv, *[c.copy() for c in cache]))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)


def test_a_chunk_past_the_cache_is_a_one_line_error(library):
    sess = session(layer_model(True, HEAD_DIM), library, 1)
    qkv = np.zeros((1, 8, WIDTH), np.float32)
    cache = np.zeros((1, KV_HEADS, 16, HEAD_DIM), np.float32)
    with pytest.raises(Exception, match="outside the cache"):
        run_layer(sess, np.array([12]), qkv, cache, cache.copy())


def make_backend(bundle_dir, threads: int = 2) -> OnnxRuntimeBackend:
    options = BackendOptions(threads=threads)
    return OnnxRuntimeBackend(bundle_dir, load_manifest(bundle_dir), options)


def prefill(backend: OnnxRuntimeBackend, ids: np.ndarray, chunk: int, steps: int):
    """Prefills `ids` in `chunk`-token chunks, then decodes greedily; returns the logits of
    every prefill chunk's last token and of each decode step."""
    backend.allocate_kv(1, 256)
    logits, past = [], 0
    for start in range(0, len(ids), chunk):
        piece = ids[start:start + chunk]
        out = backend.run(StepBatch(piece[None], np.array([past], np.int32),
                                    np.array([len(piece)], np.int32), 0)).copy()
        logits.append(out)
        past += len(piece)
    for _ in range(steps):
        token = logits[-1].argmax(-1)[:, None]
        logits.append(backend.run(StepBatch(token, np.array([past], np.int32),
                                            np.ones(1, np.int32), 0)).copy())
        past += 1
    return np.array(logits)


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3"])
def test_bundles_prefill_to_the_same_logits_and_tokens(library, bundle, monkeypatch, family):
    ids = np.random.default_rng(4).integers(3, 128, 150)
    monkeypatch.setenv(select.MODE_ENV, "off")
    stock = make_backend(bundle(family))
    monkeypatch.setenv(select.MODE_ENV, "require")
    native = make_backend(bundle(family))
    assert native.kernels.described == select.NATIVE
    for chunk in (len(ids), 64):  # unchunked, then chunks of 64 with a ragged last one
        want, got = prefill(stock, ids, chunk, 8), prefill(native, ids, chunk, 8)
        np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        # A deeper layer's keys are projections of hidden states that carry the earlier
        # layers' (summation-order) differences: the logits' bound, not the layer's 1e-5.
        for a, b in zip(stock.kv_arrays(), native.kv_arrays(), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)


PROFILED_RUN = """
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("t", sys.argv[1])
t = importlib.util.module_from_spec(spec)
spec.loader.exec_module(t)
rng = np.random.default_rng(5)
qkv = rng.standard_normal((len(t.PASTS), 64, t.WIDTH)).astype(np.float32)
cache = [rng.standard_normal((len(t.PASTS), t.KV_HEADS, t.CAPACITY, t.HEAD_DIM)).astype(np.float32)
         for _ in range(2)]
stock = t.session(t.layer_model(False, t.HEAD_DIM), None, 2)
want = np.concatenate([t.run_layer(stock, t.PASTS[r:r + 1], qkv[r:r + 1],
                                   *[c[r:r + 1].copy() for c in cache])
                       for r in range(len(t.PASTS))])
native = t.session(t.layer_model(True, t.HEAD_DIM), sys.argv[2], 2)
got = t.run_layer(native, t.PASTS, qkv, *[c.copy() for c in cache])
np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
"""


def test_profile_line_accounts_for_every_piece(library):
    """EDGEPREFILL_PREFILL_PROFILE=1: one stderr line per call, whose per-thread piece counts
    add up to the call's pieces (4 rows x 2 KV heads x the 64-token chunk's query blocks:
    as many queries per block as fill the build's columns with the group's 3 heads), and
    the output is unchanged. A subprocess: the switch is read once per process."""
    import os
    import re
    import subprocess
    import sys

    from edgeprefill.kernels.build import flags

    columns = next((int(f.split("=")[1]) for f in flags() if f.startswith("-DEP_COLUMNS=")), 96)
    pieces = len(PASTS) * KV_HEADS * -(-64 // (columns // (HEADS // KV_HEADS)))

    env = dict(os.environ, EDGEPREFILL_PREFILL_PROFILE="1")
    done = subprocess.run([sys.executable, "-c", PROFILED_RUN, __file__, str(library)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("prefill-profile")]
    assert len(lines) == 1, done.stderr
    assert f" pieces {pieces}:" in lines[0]
    per_thread = [int(n) for n in re.findall(r"\[(\d+) pieces", lines[0])]
    assert 1 <= len(per_thread) <= 2 and sum(per_thread) == pieces, lines[0]


def _cache_dir(tmp_path, *entries):
    """A fake /sys/devices/system/cpu/cpu0/cache with (level, type, size) entries."""
    for i, (level, kind, size) in enumerate(entries):
        index = tmp_path / f"index{i}"
        index.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (index / name).write_text(value + "\n")
    return tmp_path


@pytest.mark.parametrize("entries, size", [
    ([("1", "Data", "32K"), ("1", "Instruction", "32K"), ("2", "Unified", "1024K")], 32 << 10),
    ([("1", "Instruction", "32K"), ("1", "Data", "48K")], 48 << 10),
    ([("2", "Unified", "2048K")], None),  # no level-1 data cache said
    ([("1", "Data", "lots")], None),
    ([], None),
])
def test_l1_data_cache_is_read_from_sysfs(tmp_path, entries, size):
    from edgeprefill.kernels.build import l1_data_bytes

    assert l1_data_bytes(_cache_dir(tmp_path, *entries)) == size


def test_tiling_is_chosen_by_the_l1_data_cache_and_keys_the_library():
    """32 KB of L1 (AMD Zen 4) takes the 48-column blocking, 48 KB (Intel) and unknown CPUs
    the default; the flags are part of the library's digest (a changed choice never loads a
    library built with the other)."""
    from unittest import mock

    from edgeprefill.kernels import build as kernel_build

    assert kernel_build.tiling_flags(32 << 10) == (
        "-DEP_COLUMNS=48", "-DEP_KEY_BLOCK=128", "-DEP_TILE_ROWS=8")
    assert kernel_build.tiling_flags(48 << 10) == ()
    assert kernel_build.tiling_flags(None) == ()
    digests = set()
    for size in (32 << 10, 48 << 10):
        with mock.patch.object(kernel_build, "l1_data_bytes", return_value=size):
            digests.add(kernel_build.digest())
    assert len(digests) == 2


@pytest.mark.parametrize("family, folded", [("llama", True), ("qwen3", False)])
def test_the_packing_around_each_attention_folds_into_it(bundle, family, folded):
    """A packed-qkv graph's spread (Gather, Squeeze) and gather back (Reshape, Gather) go
    into each PrefillAttention (packed=1, past_lens as input 8); qwen3, whose q/k/v are
    normed apart and concatenated after their spreads, keeps them."""
    path = bundle(family)
    model = onnx.load(str(path / load_manifest(path).graph.file), load_external_data=False)
    layers = load_manifest(path).model.num_layers
    gathers = sum(n.op_type == "Gather" for n in model.graph.node)
    assert graph.add_native_attention(model) == layers
    attention = [n for n in model.graph.node if n.op_type == graph.PREFILL_OP]
    packed = [n for n in attention
              if any(a.name == "packed" and a.i == 1 for a in n.attribute)]
    assert len(packed) == (layers if folded else 0)
    assert all(n.input[8] == "past_lens" for n in packed)
    left = sum(n.op_type == "Gather" for n in model.graph.node)
    assert left == gathers - (2 * layers if folded else 0)
