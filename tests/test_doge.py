"""SmallDoge's Doge (export/families/doge.py, export/dynamic_mask.py): each key's bias from
its values added to the scores, each query's keep_window_size keys of the largest bias kept
where there are more, and residual weights per channel. Its fixture (conftest.FAMILIES:
doge, keep_window_size past the bundles' context) runs in the generic suites too:
test_exactness compares every chunk's logits with transformers in both flavours. Here, with
keep_window_size 8 so that the top-k bites from the ninth token on: chunks of 1 (decode
steps), 3 and 16 and a padded chunk, rows of other lengths in one call, int4 and int8, the
native kernels left out, what the switches change in transformers' own logits, and what
export refuses.

Those prompts repeat no token: the first layer's values are each token's alone, so a
repeated token ties its keys' bias there, and transformers' top-k breaks a tie at the
boundary in torch.topk's order, which the bundle does not follow (it keeps the tied keys:
dynamic_mask.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from edgeprefill.errors import ExportError
from edgeprefill.export.dynamic_mask import masked
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.kernels import graph, select
from edgeprefill.sdk import Engine
from tests.conftest import FAMILIES, VOCAB, build_hf_model, load_hf_model
from tests.flavour_bundles import check_chunks_against, check_rows_of_other_lengths, hf_logits
from tests.test_exactness import FLAVORS
from tests.test_openelm import check_chunks_and_padding, run_chunks
from tests.test_quantize import dequantize_linears

KEEP = 8
MINIMAL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}


def distinct_ids(length: int, seed: int = 0) -> list[int]:
    """A prompt of `length` tokens, none repeated (BOS then a permutation's first ones)."""
    rng = np.random.default_rng(seed)
    return [1] + [int(t) for t in rng.permutation(np.arange(3, VOCAB))[:length - 1]]


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> Path:
    """The doge fixture with keep_window_size 8."""
    return build_hf_model("doge", tmp_path_factory.mktemp("doge-keep8"),
                          keep_window_size=KEEP)


@pytest.fixture(scope="module")
def kept_bundle(kept, tmp_path_factory):
    made: dict[str, Path] = {}

    def get(flavor: str) -> Path:
        if flavor not in made:
            made[flavor] = tmp_path_factory.mktemp(f"doge-keep8-{flavor}")
            export(kept, made[flavor], ExportOptions(flavor=flavor, chunks=(16,),
                                                     max_context=128, show_progress=False))
        return made[flavor]

    return get


@pytest.mark.parametrize("flavor", FLAVORS)
def test_top_k_keys_chunked_decoded_and_padded_as_transformers(flavor, kept, kept_bundle):
    """A 40-token prompt (five times the keys a query keeps) in chunks of 1, 3 and 16 and
    a padded chunk: each chunk's last logits are transformers' at its position."""
    ids = distinct_ids(40)
    check_chunks_and_padding(kept_bundle(flavor), ids, hf_logits(load_hf_model(kept), ids))


@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_of_other_lengths_in_one_call_keep_their_own_keys(flavor, kept, kept_bundle):
    """Three rows prefilled to 30, 12 and 21 tokens, then one call of 4-token chunks, the
    second row padded after 1 valid token (the standard flavour's: GroupQueryAttention
    takes several rows of a chunk over a past in no call; the ort graph's rows then go one
    by one), and one decode call of the three: each row's logits are transformers' of its
    own prompt."""
    model = load_hf_model(kept)
    prompts = [distinct_ids(35, seed) for seed in (1, 2, 3)]
    check_rows_of_other_lengths(kept_bundle(flavor), flavor, prompts,
                                lambda ids: hf_logits(model, ids))


def test_the_switches_change_transformers_logits(kept):
    """What the tests above check is there to check: keeping 8 keys (against every key),
    the bias itself (A zero: every key's bias 1, a constant) and the residual weights (ones)
    each move transformers' own logits at the prompt's last token."""
    ids = distinct_ids(40)
    model = load_hf_model(kept)
    base = hf_logits(model, ids)[-1]
    layers = model.model.layers
    for layer in layers:
        layer.self_attn.keep_window_size = 2048
    assert np.abs(hf_logits(model, ids)[-1] - base).max() > 0.05
    for layer in layers:
        layer.self_attn.keep_window_size = KEEP
    with torch.no_grad():
        saved = [layer.self_attn.A.clone() for layer in layers]
        for layer in layers:
            layer.self_attn.A.zero_()
        assert np.abs(hf_logits(model, ids)[-1] - base).max() > 0.05
        for layer, a in zip(layers, saved, strict=True):
            layer.self_attn.A.copy_(a)
        for layer in layers:
            layer.input_residual.fill_(1.0)
            layer.post_attention_residual.fill_(1.0)
    assert np.abs(hf_logits(model, ids)[-1] - base).max() > 0.05


def test_int4_computes_transformers_forward_with_dequantized_weights(kept, tmp_path):
    """Every projection quantized by blocks but dt_proj, which stays float (a few numbers
    per key that pick the kept keys): the bundle computes what transformers does with the
    others dequantized."""
    export(kept, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=64, show_progress=False,
        quant=QuantConfig("int4", 32, accuracy_level=0, embeddings=False)))
    model = load_hf_model(kept)
    with torch.no_grad():
        dequantize_linears(model, keep=lambda name: name.endswith("dt_proj"))
    check_chunks_against(tmp_path / "b", model, distinct_ids(40))


def test_int8_stays_close_to_transformers(kept, tmp_path):
    """int8 quantizes each projection's input on the fly too (DynamicQuantizeMatMul): only
    close to the float forward, within a tenth of the largest logit."""
    export(kept, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                               show_progress=False,
                                               quant=QuantConfig("int8", embeddings=False)))
    ids = distinct_ids(40)
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    got = run_chunks(engine, ids, 16)[-1]
    engine.close()
    want = hf_logits(load_hf_model(kept), ids)[-1]
    assert np.abs(got - want).max() / np.abs(want).max() < 0.1


def test_the_native_kernels_leave_the_dynamic_mask_to_onnx_runtime(kept_bundle, monkeypatch):
    """GroupQueryAttention takes the bias as its attention_bias input; the native kernels'
    softmax adds none, so the kernel choice keeps every Doge layer stock, and says why."""
    model = onnx.load(str(kept_bundle("ort") / "model.onnx"), load_external_data=False)
    nodes = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(nodes) == 2 and all(len(n.input) == 11 and n.input[10] for n in nodes)
    assert [graph.why_not_eligible(n) for n in nodes] == [graph.ATTENTION_BIAS_WHY] * 2
    monkeypatch.setattr(select, "why_not", lambda *args: None)  # as if the library ran here
    choice = select.choose(model, "ort", "float32", "cpu")
    assert choice.library is None
    assert choice.described == (f"GroupQueryAttention ({select.NO_ATTENTION}: "
                                f"{graph.ATTENTION_BIAS_WHY})")
    assert graph.add_native_attention(model) == 0


def test_no_top_k_where_the_context_is_within_the_window(kept, tmp_path):
    """A bundle whose context cannot exceed keep_window_size has no TopK (no call has more
    keys than a query keeps); one past it has one per layer."""
    def top_ks(max_context: int) -> int:
        out = tmp_path / str(max_context)
        export(kept, out, ExportOptions(flavor="standard", chunks=(4,), max_context=max_context,
                                        show_progress=False))
        model = onnx.load(str(out / "model.onnx"), load_external_data=False)
        return sum(n.op_type == "TopK" for n in model.graph.node)

    assert (top_ks(KEEP), top_ks(KEEP + 1)) == (0, 2)


def test_keep_window_size_reads_as_transformers():
    raw = {"model_type": "doge", **MINIMAL}
    assert ModelConfig.from_hf(raw).keep_window == 2048  # DogeConfig's default
    assert ModelConfig.from_hf({**raw, "keep_window_size": 8}).keep_window == 8
    assert ModelConfig.from_hf({**raw, **FAMILIES["doge"]}).qkv_bias


@pytest.mark.parametrize("keys, message", [
    ({"is_moe": True}, "doge: is_moe=true .*is not supported"),
    ({"keep_window_size": 0}, "keep_window_size must be a positive integer, got 0"),
])
def test_what_doge_cannot_run_is_refused_in_one_line(keys, message):
    with pytest.raises(ExportError, match=message) as refused:
        ModelConfig.from_hf({"model_type": "doge", **MINIMAL, **keys})
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_sliding_window_masks_keys_before_the_top_k(flavor, tmp_path):
    """sliding_window 6 (DogeConfig reads it: a sliding causal mask on every layer) with
    keep_window_size 4: each query keeps 4 of its window's 6 keys, as transformers does."""
    hf = build_hf_model("doge", tmp_path / "hf", keep_window_size=4, sliding_window=6)
    export(hf, tmp_path / "b", ExportOptions(flavor=flavor, chunks=(16,), max_context=64,
                                             show_progress=False))
    ids = distinct_ids(40)
    check_chunks_and_padding(tmp_path / "b", ids, hf_logits(load_hf_model(hf), ids))


def masked_in_graph(bias: np.ndarray, mask: np.ndarray, keep: int | None) -> np.ndarray:
    """dynamic_mask.masked of `bias` and the additive `mask` (float16), run alone."""
    g = GraphBuilder()
    dtype = np.dtype(np.float16)
    out = masked(g, g.const(bias, dtype), g.const(mask, dtype), keep, dtype)
    g.rename(out, "kept")
    g.output("kept", dtype, bias.shape)
    model = g.to_model([], {"": 21}, 10)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {})[0]


def test_masked_keys_are_the_minimum_whatever_their_bias_in_float16():
    """As transformers' masked_fill: a masked key's bias is the dtype's minimum, not the
    minimum plus its bias (in float16 a bias of 30000 would lift it to -35504); of the
    visible keys, the two largest are kept."""
    low = float(np.finfo(np.float16).min)
    bias = np.array([[1.0, 3.0, 2.0, 30000.0, 30000.0]])
    mask = np.array([[0.0, 0.0, 0.0, low, low]])
    np.testing.assert_array_equal(masked_in_graph(bias, mask, None),
                                  [[1.0, 3.0, 2.0, low, low]])
    np.testing.assert_array_equal(masked_in_graph(bias, mask, 2), [[low, 3.0, 2.0, low, low]])
