"""edgeprefill.GatedDeltaRule and its load-time rewrite: the op against the delta rule in
float64 numpy (decay, padding and all), the rewrite against the exporter's own Scan (and
nothing near it), and the qwen3_5_text bundle with the op against the same load with the
stock Scan, call for call. Skipped only where the library cannot be built."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import ModelProto, NodeProto, TensorProto, helper

from edgeprefill.bundle import load_graph, load_manifest
from edgeprefill.engines import StepBatch
from edgeprefill.kernels import graph, select
from edgeprefill.kernels.gated_delta import OP, delta_scans, fuse_gated_delta, is_delta_scan
from edgeprefill.sdk import Engine
from tests.state_models import run_padded
from tests.test_exactness import prompt_ids

NAMES = ("S", "q", "k", "v", "decay", "beta")
# The fixture's DeltaNet layers (tests/conftest.py QWEN3_5): three, each over 4 value heads
# with keys of 16 and values of 8.
LAYERS, HEADS, DK, DV = 3, 4, 16, 8


def op_model(heads: int, dk: int, dv: int) -> ModelProto:
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, f, None) for n in NAMES]
    outputs = [helper.make_tensor_value_info(n, f, None) for n in ("final", "out")]
    node = helper.make_node(OP, list(NAMES), ["final", "out"], domain=graph.DOMAIN)
    m = helper.make_model(helper.make_graph([node], "delta", inputs, outputs),
                          opset_imports=[helper.make_opsetid("", 21),
                                         helper.make_opsetid(graph.DOMAIN, 1)])
    m.ir_version = 10
    return m


def run(m: ModelProto, library, feeds: dict, threads: int = 2) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    if library is not None:
        so.register_custom_ops_library(str(library))
    session = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def inputs(rows: int, chunk: int, heads: int, dk: int, dv: int, valid: list[int],
           seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs as the exporter makes them: q, k unit vectors per head, decay in
    (0.2, 1), beta in (0, 1), and each row's tokens from valid[row] on padding (decay 1,
    beta 0, junk q, k, v)."""
    rng = np.random.default_rng(seed)

    def unit(shape):
        x = rng.standard_normal(shape)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    feeds = {"S": rng.standard_normal((rows, heads, dk, dv)),
             "q": unit((rows, chunk, heads, dk)) / np.sqrt(dk), "k": unit((rows, chunk, heads, dk)),
             "v": rng.standard_normal((rows, chunk, heads, dv)),
             "decay": rng.uniform(0.2, 1.0, (rows, chunk, heads)),
             "beta": rng.uniform(0.0, 1.0, (rows, chunk, heads))}
    for row, n in enumerate(valid):
        feeds["decay"][row, n:], feeds["beta"][row, n:] = 1.0, 0.0
    return {k: v.astype(np.float32) for k, v in feeds.items()}


def delta_rule(feeds: dict, valid: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The recurrence in float64 over each row's valid tokens only: the final state (the one
    at the row's last valid token) and the valid tokens' outputs."""
    f = {k: v.astype(np.float64) for k, v in feeds.items()}
    state = f["S"].copy()
    out = np.zeros(f["v"].shape)
    for row, n in enumerate(valid):
        s = state[row]  # [H, dk, dv]
        for t in range(n):
            s *= f["decay"][row, t][:, None, None]
            kv = np.einsum("hk,hkv->hv", f["k"][row, t], s)
            delta = (f["v"][row, t] - kv) * f["beta"][row, t][:, None]
            s += f["k"][row, t][:, :, None] * delta[:, None, :]
            out[row, t] = np.einsum("hk,hkv->hv", f["q"][row, t], s)
    return state, out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows, chunk, heads, dk, dv, valid", [
    (1, 1, 16, 128, 128, [1]),  # a decode step at Qwen3.5-0.8B's widths
    (1, 40, 4, 16, 8, [40]),
    (3, 17, 2, 24, 40, [17, 5, 1]),  # a chunk beside decode rows, padded
    (2, 9, 3, 8, 8, [0, 9]),  # a row with no valid token: its state goes through as it was
])
def test_op_matches_the_delta_rule_and_padding_leaves_the_state_alone(
        library, threads, rows, chunk, heads, dk, dv, valid):
    feeds = inputs(rows, chunk, heads, dk, dv, valid, seed=chunk)
    final, out = run(op_model(heads, dk, dv), library, feeds, threads)
    want_state, want_out = delta_rule(feeds, valid)
    np.testing.assert_allclose(final, want_state, rtol=1e-5, atol=1e-5)
    for row, n in enumerate(valid):
        np.testing.assert_allclose(out[row, :n], want_out[row, :n], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def qwen_graph(tmp_path_factory):
    """The qwen3_5_text ort bundle's path and graph (no weights), exported once here."""
    from edgeprefill.export.exporter import ExportOptions, export
    from tests.conftest import build_hf_model

    hf = build_hf_model("qwen3_5_text", tmp_path_factory.mktemp("q35-delta-hf"))
    out = tmp_path_factory.mktemp("q35-delta-ort")
    export(hf, out, ExportOptions(flavor="ort", chunks=(16, 64), max_context=512,
                                  show_progress=False, overwrite=True))
    return out


def scans(m: ModelProto) -> list[NodeProto]:
    return [n for n in m.graph.node if n.op_type == "Scan"]


def one_scan_model(bundle_graph: ModelProto, names: tuple[str, ...] = NAMES) -> ModelProto:
    """The bundle's first recurrence Scan (a DeltaNet's, or test_mamba2_kernel's Mamba-2
    one) alone, its inputs (`names`) and two outputs the graph's."""
    scan = scans(bundle_graph)[0]
    f = TensorProto.FLOAT
    node = helper.make_node("Scan", list(names), ["final", "out"])
    node.attribute.extend(scan.attribute)
    m = helper.make_model(helper.make_graph(
        [node], "one", [helper.make_tensor_value_info(n, f, None) for n in names],
        [helper.make_tensor_value_info(n, f, None) for n in ("final", "out")]),
        opset_imports=list(bundle_graph.opset_import))
    m.ir_version = bundle_graph.ir_version
    return m


def body(node: NodeProto):
    return next(a.g for a in node.attribute if a.name == "body")


def with_copy(scan: NodeProto, state_out: str) -> None:
    """The body as bundles exported before stop 40 hold it: the state's output
    (`state_out` after the prefix) an Identity of the sum."""
    b = body(scan)
    prefix = b.name[: -len("step")]
    out, total = prefix + state_out, prefix + "state_sum"
    for node in b.node:
        node.input[:] = [total if i == out else i for i in node.input]
        node.output[:] = [total if o == out else o for o in node.output]
    b.node.append(helper.make_node("Identity", [total], [out]))


@pytest.mark.parametrize("copy", [False, True])
def test_the_op_computes_what_the_exporters_scan_does(library, qwen_graph, copy):
    """The exporter's Scan itself (stock ONNX Runtime) against the op it is rewritten to,
    on a chunk with a padded row: the same values to float rounding. Bundles exported
    before stop 40 (`copy`: their body copies S to its output) are switched too."""
    m = one_scan_model(load_graph(qwen_graph, load_manifest(qwen_graph)))
    if copy:
        with_copy(m.graph.node[0], "S_out")
    feeds = inputs(2, 21, HEADS, DK, DV, [21, 6], seed=7)
    stock = run(m, None, feeds)
    assert fuse_gated_delta(m) == 1
    assert [(n.op_type, n.domain) for n in m.graph.node] == [(OP, graph.DOMAIN)]
    native = run(m, library, feeds)
    for got, want in zip(native, stock, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_rewrite_switches_every_delta_scan_and_nothing_else(qwen_graph):
    m = load_graph(qwen_graph, load_manifest(qwen_graph))
    before = [n.op_type for n in m.graph.node]
    assert len(scans(m)) == LAYERS and delta_scans(m) == LAYERS
    # the exporter's body adds into S_out itself: no Identity copying S every token
    assert not any(n.op_type == "Identity" for scan in scans(m) for n in body(scan).node)
    assert fuse_gated_delta(m) == LAYERS
    assert scans(m) == [] and [n.op_type for n in m.graph.node].count(OP) == LAYERS
    assert len(m.graph.node) == len(before)
    assert any(o.domain == graph.DOMAIN for o in m.opset_import)


def test_near_misses_keep_their_scan(qwen_graph):
    base = scans(load_graph(qwen_graph, load_manifest(qwen_graph)))[0]

    def variant(change) -> NodeProto:
        node = NodeProto()
        node.CopyFrom(base)
        change(node)
        return node

    def drop_decay(node):  # a body without the decay's Mul
        b = body(node)
        decay = next(n for n in b.node if n.op_type == "Mul")
        b.node.remove(decay)

    def reversed_scan(node):
        node.attribute.append(helper.make_attribute("scan_input_directions", [1] * 5))

    def renamed(node):
        body(node).name = "other_step"

    assert is_delta_scan(base)
    for change in (drop_decay, reversed_scan, renamed):
        assert not is_delta_scan(variant(change)), change.__name__


def engines(library, path, monkeypatch) -> tuple[Engine, Engine]:
    """The bundle on the native kernels with GatedDeltaRule, and without it (its Scans
    stock, every other kernel the same)."""
    native = Engine.load(path, threads=2, background=False)
    monkeypatch.setattr(select, "fuse_gated_delta", lambda model: 0)
    stock = Engine.load(path, threads=2, background=False)
    assert f"{OP} in {LAYERS} DeltaNet layers" in native.backend.kernels.described
    assert stock.backend.kernels.described == select.NATIVE
    return native, stock


# The logits of the two graphs: float rounding apart (the sums over dk in another order).
RTOL, ATOL = 1e-5, 1e-5


@pytest.mark.parametrize("chunk", [1, 3, 16, 40])
def test_bundle_logits_with_the_op_equal_the_stock_scan_chunk_by_chunk(
        library, qwen_graph, monkeypatch, chunk):
    """Every call's logits, in calls of `chunk` tokens with a padded last chunk (its padding
    must leave the states as the row's last valid token left them), then a decode step."""
    native, stock = engines(library, qwen_graph, monkeypatch)
    ids = prompt_ids(40)
    got = run_padded(native.backend, ids, chunk, split=37)
    want = run_padded(stock.backend, ids, chunk, split=37)
    assert got.keys() == want.keys()
    for position in want:
        np.testing.assert_allclose(got[position], want[position], rtol=RTOL, atol=ATOL,
                                   err_msg=f"chunk {chunk}, position {position}")
    native.close()
    stock.close()


def test_a_chunk_row_beside_decode_rows_equals_the_stock_scan(library, qwen_graph, monkeypatch):
    """One call of rows of different valid lengths (a chunk and two decode rows), after
    calls that left each slot its own states."""
    native, stock = engines(library, qwen_graph, monkeypatch)
    if native.backend.why_not_fused:
        pytest.skip(f"this ort graph takes no fused rows: {native.backend.why_not_fused}")
    a, b, c = prompt_ids(30, seed=3), prompt_ids(21, seed=4), prompt_ids(26, seed=5)
    ids = np.full((3, 16), 77, np.int64)
    ids[0], ids[1, 0], ids[2, 0] = a[10:26], b[19], c[24]
    results = []
    for engine in (native, stock):
        run_ = engine.backend.run
        for slot, prompt in ((0, a[:10]), (1, b[:19]), (2, c[:24])):
            run_(StepBatch(np.array([prompt]), np.array([0], np.int32),
                           np.array([len(prompt)], np.int32), slot))
        results.append(run_(StepBatch(ids, np.array([10, 19, 24], np.int32),
                                      np.array([16, 1, 1], np.int32), 0)).copy())
        results.append(run_(StepBatch(np.array([[b[20]], [c[25]]]), np.array([20, 25], np.int32),
                                      np.array([1, 1], np.int32), 1)).copy())
        engine.close()
    for got, want in zip(results[:2], results[2:], strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_kernels_off_keeps_the_scan(library, qwen_graph, monkeypatch):
    m = load_graph(qwen_graph, load_manifest(qwen_graph))
    monkeypatch.setenv(select.MODE_ENV, "off")
    choice = select.choose(m, "ort", "float32", "cpu")
    assert choice.library is None and choice.described.startswith(select.STOCK)
    assert len(scans(m)) == LAYERS
    assert not any(n.op_type == OP for n in m.graph.node)
    monkeypatch.setenv(select.MODE_ENV, "require")
    choice = select.choose(m, "ort", "float32", "cpu")
    assert choice.described == select.native_described(LAYERS) and scans(m) == []


def test_inspect_names_the_op_where_it_runs(library, qwen_graph, monkeypatch):
    from tests.test_cli_errors import cli

    monkeypatch.setenv(select.MODE_ENV, "require")
    shown = cli("inspect", qwen_graph)
    assert f"kernels     {select.native_described(LAYERS)}" in shown.stdout, shown.stderr
    monkeypatch.setenv(select.MODE_ENV, "off")
    assert OP not in cli("inspect", qwen_graph).stdout

