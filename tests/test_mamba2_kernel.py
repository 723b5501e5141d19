"""edgeprefill.Mamba2Scan and its load-time rewrite: the op against the SSM recurrence in
float64 numpy (padding and all) and against the exporter's own Scan (its state to the
bit), the rewrite against that Scan (and nothing near it), and the Mamba-2 families'
bundles on the op against transformers, chunk by chunk and in a batch of rows of
different lengths. Skipped only where the library cannot be built."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import ModelProto, NodeProto, TensorProto, helper

from edgeprefill.bundle import load_graph, load_manifest
from edgeprefill.engines import StepBatch
from edgeprefill.errors import BackendError
from edgeprefill.kernels import graph, select
from edgeprefill.kernels.mamba2_scan import (
    BODY,
    OP,
    fuse_mamba2,
    is_mamba2_scan,
    mamba2_scans,
)
from edgeprefill.kernels.scan_body import matches
from edgeprefill.sdk import Engine
from tests.state_models import assert_engine_chunks_match
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_gated_delta_kernel import body, one_scan_model, run, scans, with_copy

NAMES = ("h", "dtx", "B", "C", "decay")
FAMILY = "granitemoehybrid-mamba"
# The fixture's Mamba-2 layers (tests/conftest.py GRANITE4_H): three (0, 2 and 3), each 8
# heads of 16 with a state of 16.
LAYERS, HEADS, P, N = 3, 8, 16, 16


def op_model() -> ModelProto:
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, f, None) for n in NAMES]
    outputs = [helper.make_tensor_value_info(n, f, None) for n in ("final", "out")]
    node = helper.make_node(OP, list(NAMES), ["final", "out"], domain=graph.DOMAIN)
    m = helper.make_model(helper.make_graph([node], "mamba2", inputs, outputs),
                          opset_imports=[helper.make_opsetid("", 21),
                                         helper.make_opsetid(graph.DOMAIN, 1)])
    m.ir_version = 10
    return m


def inputs(rows: int, chunk: int, heads: int, p: int, n: int, valid: list[int],
           seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs as the exporter makes them: dt in (0.001, 0.5), A = -exp(A_log) in
    [-16, -1], decay = exp(dt A), dtx = dt x, and each row's tokens from valid[row] on
    padding (dt = 0: decay 1, dtx 0, junk B and C)."""
    rng = np.random.default_rng(seed)
    dt = rng.uniform(0.001, 0.5, (rows, chunk, heads))
    for row, count in enumerate(valid):
        dt[row, count:] = 0.0
    a = -rng.uniform(1.0, 16.0, heads)
    feeds = {"h": rng.standard_normal((rows, heads, p, n)),
             "dtx": dt[..., None] * rng.standard_normal((rows, chunk, heads, p)),
             "B": rng.standard_normal((rows, chunk, heads, n)),
             "C": rng.standard_normal((rows, chunk, heads, n)),
             "decay": np.exp(dt * a)}
    return {k: v.astype(np.float32) for k, v in feeds.items()}


def recurrence(feeds: dict, valid: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """h = decay h + dtx (x) B, y = h C in float64 over each row's valid tokens only: the
    final state (the one at the row's last valid token) and the valid tokens' outputs."""
    f = {k: v.astype(np.float64) for k, v in feeds.items()}
    state = f["h"].copy()
    out = np.zeros(f["dtx"].shape)
    for row, count in enumerate(valid):
        h = state[row]  # [H, P, N]
        for t in range(count):
            h *= f["decay"][row, t][:, None, None]
            h += f["dtx"][row, t][:, :, None] * f["B"][row, t][:, None, :]
            out[row, t] = np.einsum("hpn,hn->hp", h, f["C"][row, t])
    return state, out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows, chunk, heads, p, n, valid", [
    (1, 1, 48, 64, 128, [1]),  # a decode step at Granite-4.0-H-1B's widths
    (1, 40, 4, 16, 16, [40]),
    (3, 17, 2, 24, 40, [17, 5, 1]),  # a chunk beside decode rows, padded; N not 16 lanes
    (2, 9, 3, 8, 8, [0, 9]),  # a row with no valid token: its state goes through as it was
])
def test_op_matches_the_recurrence_and_padding_leaves_the_state_alone(
        library, threads, rows, chunk, heads, p, n, valid):
    feeds = inputs(rows, chunk, heads, p, n, valid, seed=chunk)
    final, out = run(op_model(), library, feeds, threads)
    want_state, want_out = recurrence(feeds, valid)
    np.testing.assert_allclose(final, want_state, rtol=1e-5, atol=1e-5)
    for row, count in enumerate(valid):
        np.testing.assert_allclose(out[row, :count], want_out[row, :count], rtol=1e-5,
                                   atol=1e-5)
        if count == 0:
            np.testing.assert_array_equal(final[row], feeds["h"][row])


@pytest.mark.parametrize("copy", [False, True])
def test_the_op_computes_what_the_exporters_scan_does(library, bundle, copy):
    """The exporter's Scan itself (stock ONNX Runtime) against the op it is rewritten to,
    on a chunk with a padded row. The state is the Scan's to the bit: each element rounded
    as the body's Mul, Mul and Add round it. y sums h C over N = 16 in another order than
    the body's MatMul: a few float32 roundings of terms of order 1 (1e-6). Bundles exported
    before stop 40 (`copy`: their body copies h to its output) are switched too."""
    path = bundle(FAMILY)
    m = one_scan_model(load_graph(path, load_manifest(path)), NAMES)
    if copy:
        with_copy(m.graph.node[0], "h_out")
    feeds = inputs(2, 21, HEADS, P, N, [21, 6], seed=7)
    stock = run(m, None, feeds)
    assert fuse_mamba2(m) == 1
    assert [(n.op_type, n.domain) for n in m.graph.node] == [(OP, graph.DOMAIN)]
    native = run(m, library, feeds)
    np.testing.assert_array_equal(native[0], stock[0])
    np.testing.assert_allclose(native[1], stock[1], rtol=1e-5, atol=1e-6)


def test_rewrite_switches_every_mamba2_scan_and_nothing_else(bundle):
    path = bundle(FAMILY)
    m = load_graph(path, load_manifest(path))
    before = [n.op_type for n in m.graph.node]
    assert len(scans(m)) == LAYERS and mamba2_scans(m) == LAYERS
    # the exporter's body adds into h_out itself: no Identity copying h every token
    assert all(matches(scan, BODY) for scan in scans(m))
    assert fuse_mamba2(m) == LAYERS
    assert scans(m) == [] and [n.op_type for n in m.graph.node].count(OP) == LAYERS
    assert len(m.graph.node) == len(before)
    assert any(o.domain == graph.DOMAIN for o in m.opset_import)


def test_near_misses_keep_their_scan(bundle):
    path = bundle(FAMILY)
    base = scans(load_graph(path, load_manifest(path)))[0]

    def variant(change) -> NodeProto:
        node = NodeProto()
        node.CopyFrom(base)
        change(node)
        return node

    def drop_decay(node):  # a body without the decay's Mul
        b = body(node)
        b.node.remove(next(n for n in b.node if n.op_type == "Mul"))

    def add_for_mul(node):  # the same count of nodes, one op another
        next(n for n in body(node).node if n.op_type == "Mul").op_type = "Add"

    def reversed_scan(node):
        node.attribute.append(helper.make_attribute("scan_input_directions", [1] * 4))

    def renamed(node):
        body(node).name = "delta0_step"

    assert is_mamba2_scan(base)
    for change in (drop_decay, add_for_mul, reversed_scan, renamed):
        assert not is_mamba2_scan(variant(change)), change.__name__


def mamba2_layers(path) -> int:
    return sum(s.startswith("past_recurrent.") for s in load_manifest(path).graph.state_inputs)


def native_engine(path, monkeypatch) -> Engine:
    """The bundle on the native kernels (`auto`, the library built: the fixture `library`
    makes any CPU count), every Mamba-2 recurrence on the op, whether or not the attention
    kernels take the bundle's attention."""
    monkeypatch.setenv(select.MODE_ENV, "auto")
    engine = Engine.load(path, threads=2, background=False)
    assert f"{OP} in {mamba2_layers(path)} Mamba-2 layers" in engine.backend.kernels.described
    return engine


def assert_chunks_match_transformers(hf_dir, path, monkeypatch) -> None:
    """Every call's last-token logits equal transformers' (its prompt form, the chunked
    SSD, within rounding of the recurrent form the op runs: 1e-4, tests/test_mamba2.py) at
    that position, in calls of 1 to 40 tokens with a padded last chunk (its padding must
    leave the states as the row's last valid token left them)."""
    assert_engine_chunks_match(native_engine(path, monkeypatch), hf_dir, (1, 3, 16, 40))


@pytest.mark.parametrize("family", [FAMILY, "nemotron_h"])
def test_the_families_on_the_op_equal_transformers_chunk_by_chunk(
        library, hf_model, bundle, monkeypatch, family):
    """Granite 4.0-H's and Nemotron-H's fixtures (the latter's attention without rotary)
    on the native attention and the op."""
    assert_chunks_match_transformers(hf_model(family), bundle(family), monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bamba", "falcon_h1"])
def test_every_mamba2_family_on_the_op_equals_transformers_chunk_by_chunk(
        library, hf_model, bundle, monkeypatch, family):
    assert_chunks_match_transformers(hf_model(family), bundle(family), monkeypatch)


def test_a_chunk_row_beside_decode_rows_on_the_op_equals_transformers(
        library, hf_model, bundle, monkeypatch):
    """One call of rows of different valid lengths (a chunk, padded past nothing, and two
    decode rows padded to its width), after calls that left each slot its own states; then
    a decode call of two rows."""
    engine = native_engine(bundle(FAMILY), monkeypatch)
    if engine.backend.why_not_fused:
        pytest.skip(f"this ort graph takes no fused rows: {engine.backend.why_not_fused}")
    a, b, c = prompt_ids(30, seed=3), prompt_ids(21, seed=4), prompt_ids(26, seed=5)
    want = {name: reference_logits(hf_model(FAMILY), ids)
            for name, ids in (("a", a), ("b", b), ("c", c))}
    run_ = engine.backend.run
    for slot, prompt in ((0, a[:10]), (1, b[:19]), (2, c[:24])):
        run_(StepBatch(np.array([prompt]), np.array([0], np.int32),
                       np.array([len(prompt)], np.int32), slot))
    ids = np.full((3, 16), 77, np.int64)
    ids[0], ids[1, 0], ids[2, 0] = a[10:26], b[19], c[24]
    got = run_(StepBatch(ids, np.array([10, 19, 24], np.int32),
                         np.array([16, 1, 1], np.int32), 0))
    for row, expected in enumerate((want["a"][25], want["b"][19], want["c"][24])):
        np.testing.assert_allclose(got[row], expected, rtol=1e-4, atol=1e-4, err_msg=f"{row}")
    got = run_(StepBatch(np.array([[b[20]], [c[25]]]), np.array([20, 25], np.int32),
                         np.array([1, 1], np.int32), 1))
    np.testing.assert_allclose(got, np.stack([want["b"][20], want["c"][25]]), rtol=1e-4,
                               atol=1e-4)
    engine.close()


def test_kernels_off_keeps_the_scan_and_inspect_names_the_op(library, bundle, monkeypatch):
    from tests.test_cli_errors import cli

    path = bundle(FAMILY)
    m = load_graph(path, load_manifest(path))
    monkeypatch.setenv(select.MODE_ENV, "off")
    choice = select.choose(m, "ort", "float32", "cpu")
    assert choice.library is None and choice.described.startswith(select.STOCK)
    assert len(scans(m)) == LAYERS and not any(n.op_type == OP for n in m.graph.node)
    assert OP not in cli("inspect", path).stdout
    monkeypatch.setenv(select.MODE_ENV, "require")
    choice = select.choose(m, "ort", "float32", "cpu")
    assert choice.described == select.native_described(0, LAYERS) and scans(m) == []
    shown = cli("inspect", path)
    assert f"kernels     {select.native_described(0, LAYERS)}" in shown.stdout, shown.stderr


def test_a_bundle_whose_attention_stays_stock_still_runs_the_op(library, bundle, monkeypatch):
    """Nemotron-H's attention (without rotary) and its three Mamba-2 recurrences go native,
    and `inspect` says so. Given attention the kernels lack (a smooth softmax, here set in
    memory), GroupQueryAttention stays, the recurrences still go native, and `require`
    refuses the load."""
    from tests.test_cli_errors import cli

    path = bundle("nemotron_h")
    m = load_graph(path, load_manifest(path))
    choice = select.choose(m, "ort", "float32", "cpu")
    assert choice.described == select.native_described(0, 3) and scans(m) == []
    shown = cli("inspect", path)
    assert f"kernels     {choice.described}" in shown.stdout, shown.stderr

    def lacking():
        m = load_graph(path, load_manifest(path))
        for node in m.graph.node:
            if node.op_type == select.STOCK:
                node.attribute.append(helper.make_attribute("smooth_softmax", 1))
        return m

    m = lacking()
    reason = select.no_attention_reason(m)
    assert reason == f"{select.NO_ATTENTION}: a smooth softmax"
    choice = select.choose(m, "ort", "float32", "cpu")
    assert choice.described == select.stock_described(reason, 0, 3) and scans(m) == []
    assert choice.library is not None
    monkeypatch.setenv(select.MODE_ENV, "require")
    with pytest.raises(BackendError, match="require but the native kernels cannot run"):
        select.choose(lacking(), "ort", "float32", "cpu")
