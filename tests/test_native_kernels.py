"""The native decode attention (edgeprefill.kernels) against ONNX Runtime's own
GroupQueryAttention: one layer exactly-ish, whole models token for token, and the stock
graph wherever the library is absent. Skipped, with the reason, only where the library
cannot be built (no g++, or no way to get ONNX Runtime's headers)."""

from __future__ import annotations

import hashlib

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeprefill.bundle import load_graph, load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort import bf16_kv
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.errors import BackendError
from edgeprefill.kernels import build, graph, select
from edgeprefill.sdk import Engine, GenerationParams
from tests.conftest import TINY_MODEL

HEADS, KV_HEADS, HEAD_DIM, CAPACITY = 6, 2, 32, 640
WIDTH = (HEADS + 2 * KV_HEADS) * HEAD_DIM



@pytest.fixture
def mode(monkeypatch):
    """Sets EDGEPREFILL_KERNELS for the test."""
    return lambda value: monkeypatch.setenv(select.MODE_ENV, value)


def one_layer_model(native: bool) -> bytes:
    """One attention layer over a bound cache: GroupQueryAttention or the kernel."""
    rng = np.random.default_rng(0)
    tables = [rng.standard_normal((CAPACITY + 1, HEAD_DIM // 2)).astype(np.float32)
              for _ in range(2)]
    inits = [numpy_helper.from_array(t, n) for t, n in zip(tables, ("cos", "sin"), strict=True)]
    inputs = ["qkv", "", "", "past_k", "past_v", "seqlens_k", "total", "cos", "sin"]
    node = helper.make_node(
        "GroupQueryAttention", inputs, ["out", "present_k", "present_v"], name="gqa",
        domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS,
        scale=HEAD_DIM**-0.5, do_rotary=1, rotary_interleaved=0,
    )
    if native:
        node = graph.kernel_node(node)
    cache = ["rows", KV_HEADS, "capacity", HEAD_DIM]
    values = [
        helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["rows", 1, WIDTH]),
        helper.make_tensor_value_info("past_k", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("past_v", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["rows"]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
               for n in ("out", "present_k", "present_v")]
    g = helper.make_graph([node], "layer", values, outputs, inits)
    model = helper.make_model(g, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1),
        helper.make_opsetid(graph.DOMAIN, 1),
    ])
    model.ir_version = 10
    return model.SerializeToString()


def run_layer(model: bytes, library, positions: np.ndarray, qkv, cache, threads: int):
    """Runs one decode step with the cache bound in place; returns (out, k, v)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    if library is not None:
        so.register_custom_ops_library(str(library))
    session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    keys, values = cache[0].copy(), cache[1].copy()
    binding = session.io_binding()
    binding.bind_cpu_input("qkv", qkv)
    binding.bind_cpu_input("seqlens_k", positions)
    binding.bind_cpu_input("total", np.array(positions.max() + 1, np.int32))
    binding.bind_output("out")  # first: copy_outputs_to_cpu follows the binding order
    for name, array in (("k", keys), ("v", values)):
        for kind, bind in (("past_", binding.bind_input), ("present_", binding.bind_output)):
            bind(kind + name, "cpu", 0, np.float32, array.shape, array.ctypes.data)
    session.run_with_iobinding(binding)
    out = binding.copy_outputs_to_cpu()[0]
    assert out.shape == (qkv.shape[0], 1, HEADS * HEAD_DIM)
    return out, keys, values


@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_matches_group_query_attention_per_layer(library, threads):
    # Positions around the kernel's 128-position pieces, a fresh row, a row near capacity.
    positions = np.array([0, 127, 128, 300, 511, CAPACITY - 1], np.int32)
    rng = np.random.default_rng(1)
    qkv = rng.standard_normal((len(positions), 1, WIDTH)).astype(np.float32)
    shape = (len(positions), KV_HEADS, CAPACITY, HEAD_DIM)
    cache = [rng.standard_normal(shape).astype(np.float32) * 2 for _ in range(2)]
    want = run_layer(one_layer_model(False), None, positions, qkv, cache, threads)
    got = run_layer(one_layer_model(True), library, positions, qkv, cache, threads)
    for name, a, b in zip(("out", "keys", "values"), want, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=name)
    assert not np.array_equal(got[1], cache[0]), "the new keys were not written in place"


def make_backend(bundle_dir, threads: int = 2) -> OnnxRuntimeBackend:
    options = BackendOptions(threads=threads)
    return OnnxRuntimeBackend(bundle_dir, load_manifest(bundle_dir), options)


def decode_rows(backend: OnnxRuntimeBackend, prompts: list[np.ndarray], steps: int):
    """Prefills each prompt into its own slot, then decodes all rows together greedily;
    returns the logits [steps, rows, vocab]."""
    backend.allocate_kv(len(prompts), 256)
    for slot, ids in enumerate(prompts):
        backend.run(StepBatch(ids[None], np.array([0], np.int32),
                              np.array([len(ids)], np.int32), slot))
    lens = np.array([len(p) for p in prompts], np.int32)
    token = np.array([[p[-1]] for p in prompts])
    logits = []
    for _ in range(steps):
        out = backend.run(StepBatch(token, lens, np.ones(len(prompts), np.int32), 0)).copy()
        logits.append(out)
        token, lens = out.argmax(-1)[:, None], lens + 1
    return np.array(logits)


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral3"])  # mistral3: q scaled, split
def test_rows_with_different_past_lengths_decode_the_same_tokens(library, bundle, mode, family):
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 128, n) for n in (3, 150, 37)]
    mode("off")
    stock = make_backend(bundle(family))
    mode("require")
    native = make_backend(bundle(family))
    assert native.kernels.described == select.NATIVE
    assert stock.kernels.described.startswith(select.STOCK)
    want, got = decode_rows(stock, prompts, 24), decode_rows(native, prompts, 24)
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    for a, b in zip(stock.kv_arrays(), native.kv_arrays(), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def if_switched(model) -> int:
    """The graph switch as it was: each attention an If on "the chunk is one token",
    DecodeAttention then, PrefillAttention else. The reference for one op in every call."""
    from edgeprefill.contract import INPUT_IDS, VALID_LENS

    g = model.graph
    valid = VALID_LENS if any(i.name == VALID_LENS for i in g.input) else None
    count = 0
    for node in g.node:
        if not graph.eligible(node):
            continue
        branches = {}
        for side, kernel in (("then_branch", graph.kernel_node(node, ".decode")),
                             ("else_branch", graph.kernel_node(node, ".prefill", True, valid))):
            outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                    for o in kernel.output]
            branches[side] = helper.make_graph([kernel], f"{kernel.name}.{side}", [], outs)
        node.CopyFrom(helper.make_node("If", ["t.is_decode"], list(node.output), **branches))
        count += 1
    one = helper.make_tensor("t.one", TensorProto.INT64, [1], [1])
    selector = [helper.make_node("Shape", [INPUT_IDS], ["t.chunk"], start=1, end=2),
                helper.make_node("Constant", [], ["t.one"], value=one),
                helper.make_node("Equal", ["t.chunk", "t.one"], ["t.eq"]),
                helper.make_node("Squeeze", ["t.eq"], ["t.is_decode"])]
    for node in reversed(selector):
        g.node.insert(0, node)
    graph.declare_domain(model)
    return count


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
def test_one_attention_op_gives_every_call_the_switched_graphs_bits(library, bundle, mode,
                                                                    monkeypatch, compute):
    """PrefillAttention serves decode steps too, its rows of one token by DecodeAttention's
    code: prompts in chunks, then batched decode steps, give the logits and the cache of the
    If-switched graph bit for bit, and the graph has no If left."""
    from edgeprefill.engines.ort.bf16_compute import cpu_has_bf16

    if compute == "bf16" and not cpu_has_bf16():
        pytest.skip("no AVX512-BF16 here")
    mode("require")
    # The If switch's branches read the cache, which keeps it float32 (bf16_kv.why_not):
    # the one op keeps it too, to compare bits. tests/test_bf16_kv.py covers the bf16 cache.
    monkeypatch.setenv(bf16_kv.MODE_ENV, "off")
    rng = np.random.default_rng(6)
    prompts = [rng.integers(3, 128, n) for n in (3, 150, 37)]

    def loaded(switch) -> OnnxRuntimeBackend:
        monkeypatch.setattr(select, "add_native_attention", switch)
        b = OnnxRuntimeBackend(bundle("llama"), load_manifest(bundle("llama")),
                               BackendOptions(threads=2, compute=compute))
        b.allocate_kv(4, 256)
        return b

    one_op = loaded(graph.add_native_attention)
    switched = loaded(if_switched)
    proto = load_graph(bundle("llama"), load_manifest(bundle("llama")))
    assert graph.add_native_attention(proto) == load_manifest(bundle("llama")).model.num_layers
    assert not any(n.op_type == "If" for n in proto.graph.node)
    want, got = decode_rows(switched, prompts, 12), decode_rows(one_op, prompts, 12)
    np.testing.assert_array_equal(got, want)
    for a, b in zip(switched.kv_arrays(), one_op.kv_arrays(), strict=True):
        np.testing.assert_array_equal(b, a)


def test_engine_greedy_tokens_are_the_same_with_and_without(library, tiny_bundle, mode):
    """The shipped trained model on its demo prompt (~1,000 tokens, then decode)."""
    text = (TINY_MODEL / "demo_prompt.txt").read_text()
    params = GenerationParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    tokens = {}
    for value in ("off", "require"):
        mode(value)
        with Engine.load(tiny_bundle, threads=2) as engine:
            tokens[value] = engine.generate(text, params).result().token_ids
    assert tokens["off"] == tokens["require"] and len(tokens["off"]) == 24


def test_the_bundle_on_disk_is_not_changed(library, bundle, mode):
    path = bundle("llama") / "model.onnx"
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    mode("require")
    make_backend(bundle("llama"))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_without_the_library_the_stock_graph_runs(bundle, mode, monkeypatch, tmp_path):
    monkeypatch.setenv(build.DIR_ENV, str(tmp_path))  # an empty library folder
    mode("auto")
    backend = make_backend(bundle("llama"))
    assert backend.kernels.described == f"{select.STOCK} (library not built: " \
        "python -m edgeprefill.kernels.build)"
    assert backend.kernels.library is None
    mode("require")
    with pytest.raises(BackendError, match="require but the native kernels cannot run"):
        make_backend(bundle("llama"))


def test_standard_flavour_and_bad_mode_are_said_plainly(bundle, mode):
    mode("auto")
    assert "needs an ort-flavour float32 bundle" in make_backend(
        bundle("llama", "standard")).kernels.described
    mode("fast")
    with pytest.raises(BackendError, match="EDGEPREFILL_KERNELS='fast'"):
        make_backend(bundle("llama"))


def test_attention_the_kernel_lacks_stays_group_query_attention():
    def gqa(**attrs):
        inputs = ["qkv", "", "", "pk", "pv", "seqlens", "total", "cos", "sin"]
        attrs = {"num_heads": 4, "kv_num_heads": 2, "do_rotary": 1, **attrs}
        return helper.make_node("GroupQueryAttention", inputs, ["o", "k", "v"],
                                domain="com.microsoft", scale=0.25, **attrs)

    assert graph.eligible(gqa())
    assert graph.eligible(gqa(local_window_size=64))  # a sliding window: the kernels take it
    assert graph.eligible(gqa(softcap=30.0))  # Gemma 2's soft-capped scores: taken too
    assert graph.eligible(gqa(rotary_interleaved=1))  # (tests/test_interleaved_rotary.py)
    assert not graph.eligible(gqa(smooth_softmax=1))
    assert not graph.eligible(gqa(num_heads=194, kv_num_heads=2))  # 97 heads per group
    model = helper.make_model(helper.make_graph([gqa(smooth_softmax=1)], "g", [], []))
    assert graph.add_native_attention(model) == 0
    # What inspect and --stats say then: why, in a user's words, each distinct reason once.
    assert graph.eligible(gqa(do_rotary=0))  # no rotary: its tables go (tests/test_no_rotary.py)
    assert graph.eligible(gqa(do_rotary=0, rotary_interleaved=1))  # nothing rotates
    assert graph.why_not_eligible(gqa(smooth_softmax=1)) == "a smooth softmax"
    sinks = gqa()
    sinks.input.extend(["", "", "sinks"])  # gpt-oss's head_sink, input 11: taken
    assert graph.eligible(sinks)  # (tests/test_attention_sinks.py)
    both = helper.make_model(helper.make_graph(
        [gqa(smooth_softmax=1), gqa(qk_output=1), gqa(smooth_softmax=1)], "g", [], []))
    assert select.no_attention_reason(both) == \
        f"{select.NO_ATTENTION}: a smooth softmax; q.k outputs"
    # The window and the softcap go along to the kernel node (their numbers:
    # tests/test_sliding_window.py, tests/test_soft_cap.py).
    taken = graph.kernel_node(gqa(local_window_size=64, softcap=30.0), prefill=True)
    assert graph.int_attribute(taken, graph.WINDOW) == 64
    assert graph.float_attribute(taken, graph.SOFTCAP, 0.0) == 30.0
    plain = graph.kernel_node(gqa(), prefill=True)
    assert {a.name for a in plain.attribute} == {"num_heads", "kv_num_heads", "scale"}


def test_inspect_and_stats_say_which_attention_runs(library, bundle, mode):
    from tests.test_cli_errors import cli

    mode("require")  # `auto` on a CPU without vector code picks the stock graph (kernel_choice)
    shown = cli("inspect", bundle("llama"))
    assert f"kernels     {select.NATIVE}" in shown.stdout
    ran = cli("run", bundle("llama"), "--prompt", "w5 w6", "--max-new-tokens", "3", "--stats")
    assert ran.returncode == 0, ran.stderr
    assert f"kernels {select.NATIVE}" in ran.stderr


def test_the_build_command_says_what_takes_time(tmp_path, monkeypatch, capsys):
    """It had printed nothing for ~50 s (npm, then g++), and its --help said build.py."""
    from pathlib import Path

    from edgeprefill.kernels import build as kernel_build

    def fetch(target):
        target.mkdir(parents=True)
        (target / "onnxruntime_c_api.h").write_text("")

    def compile_(command, cwd=None, what=""):
        Path(command[command.index("-o") + 1]).write_bytes(b"")

    monkeypatch.delenv(kernel_build.HEADERS_ENV, raising=False)
    monkeypatch.setattr(kernel_build, "library_dir", lambda: tmp_path)
    monkeypatch.setattr(kernel_build, "fetch_headers", fetch)
    monkeypatch.setattr(kernel_build, "run", compile_)
    monkeypatch.setattr(kernel_build.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert kernel_build.main(["--force"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("fetching ONNX Runtime's C API headers (npm pack ")
    assert err[1].startswith("compiling the native kernels with ")
    with pytest.raises(SystemExit):
        kernel_build.main(["--help"])
    assert capsys.readouterr().out.startswith("usage: python -m edgeprefill.kernels.build")
