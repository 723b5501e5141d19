"""DeepSeek Sparse Attention (export/sparse_index.py, families/sparse_attention.py):
DeepSeek-V3.2, GLM-5 and A.X K2 (gated norms, a gated query), DeepSeek-V3's latent
attention behind a lightning indexer that keeps each query's index_topk keys. Their
conftest fixtures (index_topk past the bundles'
context: dense MLA exactly, no indexer) run in the generic suites. Here, with index_topk 8
so that the selection bites from the ninth key on: chunks of 1 (decode steps), 3 and 16
and a padded chunk, rows of other lengths in one call, GLM-5's shared layers, int4 and
int8, the native kernels left out, a bundle within index_topk that has no indexer, Hub
configs as transformers reads them, and what export refuses.

16 index heads of random weights: a score is a sum of 16 ReLUs, so a key scoring exactly
what another does (a tie at the top-k boundary, which the bundle resolves by keeping both)
does not occur in these prompts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import transformers

from edgeprefill.bundle import MANIFEST_FILE
from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.kernels import graph
from edgeprefill.sdk import Engine
from tests.conftest import FAMILIES, build_hf_model, load_hf_model
from tests.flavour_bundles import check_chunks_against, check_rows_of_other_lengths, hf_logits
from tests.test_exactness import FLAVORS, prompt_ids
from tests.test_mla import dequantized_int4_but_kv_b
from tests.test_openelm import check_chunks_and_padding, run_chunks

TOPK = 8
DSA_FAMILIES = ("deepseek_v32", "glm_moe_dsa", "axk2")
# Shaped as deepseek-ai/DeepSeek-V3.2-Exp's config.json (its keys transformers ignores
# left out): DeepSeek-V3's yarn, rope_interleave true, an indexer of 64 heads of 128.
DEEPSEEK_V32_EXP = {
    "model_type": "deepseek_v32", "index_topk": 2048, "index_head_dim": 128,
    "index_n_heads": 64, "rope_interleave": True, "num_nextn_predict_layers": 1,
    "first_k_dense_replace": 3, "max_position_embeddings": 163840, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
}
# GlmMoeDsaConfig's defaults (GLM-5's shape) with its indexer schedule's keys: full on the
# first three layers, then every fourth
GLM_5 = {"model_type": "glm_moe_dsa", "index_topk_freq": 4, "index_skip_topk_offset": 3,
         "rope_theta": 1000000.0}

# AXK2Config's defaults (A.X K2's shape): no expert groups, experts after the first layer
A_X_K2 = {"model_type": "axk2", "rope_theta": 10000.0}


@pytest.fixture(scope="module")
def sparse(tmp_path_factory):
    """family -> its fixture with index_topk 8."""
    made: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in made:
            made[family] = build_hf_model(family, tmp_path_factory.mktemp(f"{family}-k8"),
                                          index_topk=TOPK)
        return made[family]

    return get


@pytest.fixture(scope="module")
def sparse_bundle(sparse, tmp_path_factory):
    made: dict[tuple[str, str], Path] = {}

    def get(family: str, flavor: str) -> Path:
        if (family, flavor) not in made:
            out = tmp_path_factory.mktemp(f"{family}-k8-{flavor}")
            export(sparse(family), out, ExportOptions(flavor=flavor, chunks=(16,),
                                                      max_context=128, show_progress=False))
            made[family, flavor] = out
        return made[family, flavor]

    return get


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", DSA_FAMILIES)
def test_top_k_keys_chunked_decoded_and_padded_as_transformers(family, flavor, sparse,
                                                               sparse_bundle):
    """A 40-token prompt (five times the keys a query keeps) in chunks of 1, 3 and 16 and
    a padded chunk: each chunk's last logits are transformers' at its position."""
    ids = prompt_ids(40)
    check_chunks_and_padding(sparse_bundle(family, flavor), ids,
                             hf_logits(load_hf_model(sparse(family)), ids))


@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_of_other_lengths_in_one_call_keep_their_own_keys(flavor, sparse,
                                                               sparse_bundle):
    """Three rows prefilled to 30, 12 and 21 tokens, then one call of 4-token chunks, the
    second row padded after 1 valid token (the ort graph's rows go one by one, as
    GroupQueryAttention takes several rows of a chunk over a past in no call), and one
    decode call of the three: each row's logits are transformers' of its own prompt."""
    model = load_hf_model(sparse("deepseek_v32"))
    prompts = [prompt_ids(35, seed) for seed in (1, 2, 3)]
    check_rows_of_other_lengths(sparse_bundle("deepseek_v32", flavor), flavor, prompts,
                                lambda ids: hf_logits(model, ids))


@pytest.mark.parametrize("family", DSA_FAMILIES)
def test_the_selection_changes_transformers_logits(family, sparse):
    """What the tests above check is there to check: keeping 8 keys (against every key)
    moves transformers' own logits at the prompt's last token, and so does GLM-5's
    sharing (its last layer running an indexer of its own instead)."""
    ids = prompt_ids(40)
    model = load_hf_model(sparse(family))
    base = hf_logits(model, ids)[-1]
    indexers = [layer.self_attn.indexer for layer in model.model.layers
                if layer.self_attn.indexer is not None]
    for indexer in indexers:
        indexer.index_topk = 2048
    assert np.abs(hf_logits(model, ids)[-1] - base).max() > 0.05
    for indexer in indexers:
        indexer.index_topk = TOPK
    if family == "glm_moe_dsa":  # layer 3 running an indexer of its own, not reusing 2's
        attn = model.model.layers[3].self_attn
        torch.manual_seed(0)
        attn.skip_topk, attn.indexer = False, type(indexers[0])(model.config, 3)
        assert np.abs(hf_logits(model, ids)[-1] - base).max() > 0.05


def test_the_cache_holds_the_index_key_beside_the_latent_only_past_index_topk(
        sparse, sparse_bundle, tmp_path, caplog):
    """The index_topk 8 bundle of 128 positions caches [k_pe 16 | latent 32 | index key
    32] and has a TopK per layer (beside its routers'); one of 8 positions (no call has
    more keys than a query keeps) caches [k_pe | latent] as DeepSeek-V3 does and has no
    indexer at all (whose weights it does not warn of as unused), and computes
    transformers' logits."""
    def shape(path: Path) -> tuple[int, int]:
        manifest = json.loads((path / MANIFEST_FILE).read_text())
        top_ks = sum(n.op_type == "TopK" for n in onnx.load(
            str(path / "model.onnx"), load_external_data=False).graph.node)
        head_dim = manifest["model"]["head_dim"]
        index = " + index key 32" if head_dim == 80 else ""
        assert f"KV cache: one head of {head_dim} per token and layer (rotated key part 16 " \
            f"+ latent 32{index})" in manifest["source"]["quirks"]  # what inspect shows
        return head_dim, top_ks

    export(sparse("deepseek_v32"), tmp_path / "b", ExportOptions(
        flavor="standard", chunks=(4,), max_context=TOPK, show_progress=False))
    assert "does not use" not in caplog.text
    within, routers = shape(tmp_path / "b")  # the experts' routers' TopKs alone
    assert within == 16 + 32
    assert shape(sparse_bundle("deepseek_v32", "standard")) == (16 + 32 + 32, routers + 3)
    ids = prompt_ids(TOPK)
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    got = np.stack(run_chunks(engine, ids, 4))
    engine.close()
    np.testing.assert_allclose(got, hf_logits(load_hf_model(sparse("deepseek_v32")),
                                              ids)[[3, 7]], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ("deepseek_v32", "axk2"))
def test_int4_computes_transformers_forward_with_dequantized_weights(family, sparse,
                                                                     tmp_path):
    """Every projection quantized by blocks but kv_b_proj, the routers, the indexer, which
    stays float (it picks the keys), and A.X K2's q_gate_proj (stored split per head): the
    bundle computes what transformers does with the others dequantized (A.X K2's norm
    gates among them)."""
    export(sparse(family), tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=64, show_progress=False,
        quant=QuantConfig("int4", accuracy_level=0)))
    model = load_hf_model(sparse(family))
    dequantized_int4_but_kv_b(model, keep=("indexer", "q_gate_proj"))
    check_chunks_against(tmp_path / "b", model, prompt_ids(40))


def test_int8_stays_close_to_transformers(tmp_path):
    """int8 quantizes each projection's input on the fly too (DynamicQuantizeMatMul): only
    close to the float forward, within a tenth of the largest logit, with an index_topk of
    32 (the indexer dropping up to 8 of the 40 keys; measured 0.083, the fixture's dense
    MLA 0.080). At index_topk 8 the int8 activations move a few keys across the boundary,
    and the tiny fixture's logits follow them: 0.60."""
    hf_dir = build_hf_model("deepseek_v32", tmp_path / "hf", index_topk=32)
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=64, show_progress=False, quant=QuantConfig("int8")))
    ids = prompt_ids(40)
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    got = run_chunks(engine, ids, 16)[-1]
    engine.close()
    want = hf_logits(load_hf_model(hf_dir), ids)[-1]
    assert np.abs(got - want).max() / np.abs(want).max() < 0.1


def test_the_native_kernels_leave_the_selection_to_onnx_runtime(sparse_bundle):
    """GroupQueryAttention takes the selection as its attention_bias input, which the
    native kernels lack: each DSA layer stays stock, and the choice says why."""
    model = onnx.load(str(sparse_bundle("deepseek_v32", "ort") / "model.onnx"),
                      load_external_data=False)
    nodes = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(nodes) == 3 and all(len(n.input) == 11 and n.input[10] for n in nodes)
    assert {graph.why_not_eligible(n) for n in nodes} == {graph.ATTENTION_BIAS_WHY}
    assert graph.add_native_attention(model) == 0


@pytest.mark.parametrize("raw", (DEEPSEEK_V32_EXP, GLM_5, A_X_K2), ids=DSA_FAMILIES)
def test_a_hub_config_reads_as_transformers_builds_its_indexer(raw):
    ours = ModelConfig.from_hf(raw)
    config = transformers.AutoConfig.for_model(**raw)
    with torch.device("meta"):
        layers = transformers.AutoModelForCausalLM.from_config(config).model.layers
    index = ours.sparse_index
    assert index is not None and ours.latent is not None
    indexer = layers[0].self_attn.indexer
    assert (index.heads, index.head_dim, index.topk) == (
        indexer.n_heads, indexer.head_dim, indexer.index_topk)
    assert index.shared == tuple(i for i, layer in enumerate(layers)
                                 if layer.self_attn.indexer is None)
    assert ours.moe is not None and ours.moe.layers == tuple(
        i for i, kind in enumerate(config.mlp_layer_types) if kind == "sparse")
    assert ours.head_dim == ours.latent.rope_dim + ours.latent.kv_lora_rank
    wide = ours.for_context(4096)  # past index_topk: the index key joins the cached head
    assert wide.head_dim == ours.head_dim + indexer.head_dim
    assert ours.for_context(2048).sparse_index is None


@pytest.mark.parametrize("keys, message", (
    ({"q_lora_rank": None}, "q_lora_rank null (one dense query projection) is not "
                            "supported"),
    ({"indexer_types": ["shared", "full"], "num_hidden_layers": 2},
     "indexer_types must be 2 of \"full\" and \"shared\", the first \"full\""),
    ({"index_head_dim": 8}, "index_head_dim at least qk_rope_head_dim"),
))
def test_a_dsa_config_export_does_not_compute_is_refused_in_one_line(keys, message):
    raw = {"model_type": "glm_moe_dsa", **FAMILIES["glm_moe_dsa"], "hidden_size": 64,
           "vocab_size": 128, **keys}
    with pytest.raises(ExportError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig.from_hf(raw)
