"""Chameleon (export/families/chameleon.py, export/head_affine_norm.py,
export/masked_logits.py): Llama's layers with a q/k LayerNorm per head of its own weight
and bias, Swin-norm layers where swin_norm, the image tokens' logits at float32's minimum,
the VQ-VAE left out. Its fixtures (conftest.FAMILIES: chameleon, chameleon-swin) run in the
generic suites too. Here against transformers' ChameleonForConditionalGeneration (eager,
float32) on text: chunks of 1 (decode steps), 3 and 16 and a padded chunk in both
flavours, both layer kinds; rows of other lengths in one call; int4 and int8; each piece
shown to move transformers' logits and the bundle's alike; a Hub-shaped config.json;
refusals."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.sdk import Engine, GenerationParams
from tests.conftest import CHAMELEON, build_hf_model, load_hf_model
from tests.flavour_bundles import check_rows_of_other_lengths
from tests.test_exactness import FLAVORS, prompt_ids
from tests.test_openelm import check_chunks_and_padding, run_chunks
from tests.test_quantize import dequantize_linears

IMAGE_TOKENS = sorted(CHAMELEON["vocabulary_map"][name]
                      for name in CHAMELEON["vocabulary_map"] if name.startswith("IMGIMG"))
LOWEST = float(np.finfo(np.float32).min)
MINIMAL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
           "vocabulary_map": CHAMELEON["vocabulary_map"]}
SMALL = ExportOptions(chunks=(16,), max_context=64, show_progress=False)


def hf_logits(hf_dir: Path, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return load_hf_model(hf_dir)(torch.tensor([ids])).logits[0].numpy()


def copy_of(hf_dir: Path, to: Path) -> Path:
    shutil.copytree(hf_dir, to)
    return to


def edit_weights(hf_dir: Path, edit) -> None:
    """Rewrite the checkpoint's tensors: edit(name, tensor) -> the tensor to store."""
    path = hf_dir / "model.safetensors"
    weights = {name: edit(name, t) for name, t in load_file(str(path)).items()}
    save_file(weights, str(path), metadata={"format": "pt"})


def bundle_logits(hf_dir: Path, out: Path, ids: list[int], chunk: int = 8,
                  options: ExportOptions = SMALL) -> np.ndarray:
    export(hf_dir, out, options)
    with Engine.load(out, threads=2, background=False) as engine:
        return np.stack(run_chunks(engine, ids, chunk))


def chunk_ends(length: int, chunk: int) -> list[int]:
    return [min(start + chunk, length) - 1 for start in range(0, length, chunk)]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    made: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in made:
            made[family] = build_hf_model(family, tmp_path_factory.mktemp(family))
        return made[family]

    return get


@pytest.fixture(scope="module")
def bundle(hf, tmp_path_factory):
    made: dict[tuple[str, str], Path] = {}

    def get(family: str, flavor: str) -> Path:
        if (family, flavor) not in made:
            out = tmp_path_factory.mktemp(f"{family}-{flavor}")
            export(hf(family), out, ExportOptions(flavor=flavor, chunks=(16,),
                                                  max_context=128, show_progress=False))
            made[family, flavor] = out
        return made[family, flavor]

    return get


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", ["chameleon", "chameleon-swin"])
def test_chunks_decode_and_padding_match_transformers(family, flavor, hf, bundle):
    """Every column, the masked ones included: float32's minimum in both."""
    ids = prompt_ids(40)
    expected = hf_logits(hf(family), ids)
    assert (expected[:, IMAGE_TOKENS] == LOWEST).all()
    check_chunks_and_padding(bundle(family, flavor), ids, expected)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_of_other_lengths_in_one_call(flavor, hf, bundle):
    """Three rows prefilled to 30, 12 and 21 tokens, then 4-token chunks (the second row's
    1 valid token; the ort graph's rows one by one: GroupQueryAttention takes one row with
    a past per call), then one decode call of the three: each row's logits are
    transformers' of its own prompt."""
    family = "chameleon-swin" if flavor == "ort" else "chameleon"
    prompts = [prompt_ids(35, seed) for seed in (1, 2, 3)]
    check_rows_of_other_lengths(bundle(family, flavor), flavor, prompts,
                                lambda ids: hf_logits(hf(family), ids))


def test_each_heads_own_norm_moves_transformers_logits_and_the_bundles_alike(hf, tmp_path):
    """The k norm's bias and the q norm's weight of one head (the second) changed in the
    checkpoint: transformers' logits move, and a bundle exported from it moves with them,
    which a norm shared by the heads (or none) would not."""
    changed = copy_of(hf("chameleon"), tmp_path / "hf")

    def edit(name: str, t: torch.Tensor) -> torch.Tensor:
        if name.endswith(("self_attn.k_norm.bias", "self_attn.q_norm.weight")):
            t = t.clone()
            t[1] += 1.5
        return t

    edit_weights(changed, edit)
    ids = prompt_ids(24, seed=7)
    before, after = hf_logits(hf("chameleon"), ids), hf_logits(changed, ids)
    assert np.abs(after - before)[:, :96].max() > 0.05
    got = bundle_logits(changed, tmp_path / "b", ids)
    np.testing.assert_allclose(got, after[[7, 15, 23]], rtol=1e-4, atol=1e-4)


def test_greedy_text_never_picks_an_image_token_as_transformers(hf, tmp_path):
    """The LM head's image-token rows made the largest logits by far: transformers still
    generates text tokens (it masks them), and so does the bundle, token for token."""
    loud = copy_of(hf("chameleon"), tmp_path / "hf")
    edit_weights(loud, lambda name, t: torch.cat([t[:96], t[96:] * 50 + 5])
                 if name == "lm_head.weight" else t)
    ids = prompt_ids(20, seed=2)
    model = load_hf_model(loud)
    with torch.no_grad():
        unmasked = model.lm_head(model.model(torch.tensor([ids])).last_hidden_state)[0, -1]
        want = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                              dtype=torch.long), max_new_tokens=6, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
    assert int(unmasked.argmax()) in IMAGE_TOKENS  # the head alone would pick one
    assert not set(want) & set(IMAGE_TOKENS)
    export(loud, tmp_path / "b", SMALL)
    with Engine.load(tmp_path / "b", threads=2, background=False) as engine:
        got = engine.generate(ids, GenerationParams(max_new_tokens=6, ignore_eos=True)
                              ).result().token_ids
    assert got == want


def test_biases_and_an_epsilon_of_its_own_export_as_transformers_reads_them(tmp_path):
    """attention_bias (q/k/v and o) and mlp_bias: ChameleonAttention's and ChameleonMLP's
    biases, in the Swin-norm layers; rms_norm_eps 0.01, which the RMSNorms read and the
    q/k norms do not (ChameleonLayerNorm's is 1e-5)."""
    hf_dir = build_hf_model("chameleon-swin", tmp_path / "hf", attention_bias=True,
                            mlp_bias=True, rms_norm_eps=0.01)
    ids = prompt_ids(20, seed=4)
    got = bundle_logits(hf_dir, tmp_path / "b", ids)
    np.testing.assert_allclose(got, hf_logits(hf_dir, ids)[chunk_ends(20, 8)],
                               rtol=1e-4, atol=1e-4)


def test_int4_computes_transformers_forward_with_dequantized_weights(hf, tmp_path):
    ids = prompt_ids(40)
    got = bundle_logits(hf("chameleon"), tmp_path / "b", ids, 16, ExportOptions(
        chunks=(16,), max_context=64, show_progress=False,
        quant=QuantConfig("int4", 32, accuracy_level=0, embeddings=False)))
    model = load_hf_model(hf("chameleon"))
    with torch.no_grad():
        dequantize_linears(model)
        want = model(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(got, want[[15, 31, 39]], rtol=1e-3, atol=1e-3)
    assert (got[:, IMAGE_TOKENS] == LOWEST).all()


def test_int8_stays_close_to_transformers(hf, tmp_path):
    """int8 quantizes each projection's input on the fly too: only close to the float
    forward, within a tenth of the largest text logit; the image tokens still masked."""
    ids = prompt_ids(40)
    got = bundle_logits(hf("chameleon"), tmp_path / "b", ids, 16, ExportOptions(
        chunks=(16,), max_context=64, show_progress=False,
        quant=QuantConfig("int8", embeddings=False)))[-1]
    want = hf_logits(hf("chameleon"), ids)[-1]
    text = np.setdiff1d(np.arange(128), IMAGE_TOKENS)
    assert np.abs(got[text] - want[text]).max() / np.abs(want[text]).max() < 0.1
    assert (got[IMAGE_TOKENS] == LOWEST).all()


def hub_config(raw: dict) -> dict:
    """config.json as transformers 4.44's conversion script saved facebook/chameleon-7b's
    (its keys; this fixture's sizes): rope_theta beside a null rope_scaling, the Hub's
    image_token_id, model_parallel_size, swin_norm false, the VQ-VAE's config under the
    original names too (ch, ch_mult, n_embed, ...), torch_dtype."""
    raw = {k: v for k, v in raw.items()
           if k not in ("rope_parameters", "dtype", "transformers_version")}
    vq = raw["vq_config"]
    raw.update({
        "architectures": ["ChameleonForConditionalGeneration"], "rope_theta": 10000.0,
        "rope_scaling": None, "attention_dropout": 0.0, "image_token_id": 3,
        "model_parallel_size": 1, "swin_norm": False, "torch_dtype": "float32",
        "transformers_version": "4.44.0.dev0", "use_cache": True,
        "vq_config": {**vq, "ch": vq["base_channels"], "ch_mult": vq["channel_multiplier"],
                      "n_embed": vq["num_embeddings"], "z_channels": vq["latent_channels"],
                      "double_z": False, "out_ch": 3, "model_type": "chameleon_vqgan"}})
    return raw


def test_a_hub_shaped_checkpoint_exports_its_language_model_as_transformers_reads_it(
        hf, tmp_path):
    hub = copy_of(hf("chameleon"), tmp_path / "hub")
    raw = hub_config(json.loads((hub / "config.json").read_text()))
    (hub / "config.json").write_text(json.dumps(raw))
    names = load_file(str(hub / "model.safetensors")).keys()
    assert any(name.startswith("model.vqmodel.") for name in names)
    cfg = ModelConfig.from_hf(raw)
    assert (cfg.head_dim, cfg.block, cfg.qk_norm, cfg.masked_tokens) == (
        16, "pre", "head_affine", tuple(IMAGE_TOKENS))
    ids = prompt_ids(20, seed=3)
    got = bundle_logits(hub, tmp_path / "b", ids)
    np.testing.assert_allclose(got, hf_logits(hub, ids)[chunk_ends(20, 8)],
                               rtol=1e-4, atol=1e-4)
    manifest = json.loads((tmp_path / "b" / "edgeprefill.json").read_text())
    assert any("VQ-VAE image tokenizer left out" in q for q in manifest["source"]["quirks"])


def test_defaults_read_as_chameleon_config():
    cfg = ModelConfig.from_hf({"model_type": "chameleon", "vocabulary_map": {}})
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads,
            cfg.num_kv_heads, cfg.vocab_size, cfg.max_positions, cfg.norm_eps) == (
        4096, 11008, 32, 32, 32, 65536, 4096, 1e-5)
    assert cfg.masked_tokens == ()


@pytest.mark.parametrize("keys, message", [
    ({"vocabulary_map": None}, "vocabulary_map must be an object .*got absent"),
    ({"vocabulary_map": {"IMGIMGAAZ": 128}},
     "vocabulary_map gives image token 128, not a token id below vocab_size 128"),
])
def test_what_chameleon_cannot_run_is_refused_in_one_line(keys, message):
    with pytest.raises(ExportError, match=message) as refused:
        ModelConfig.from_hf({"model_type": "chameleon", **MINIMAL, **keys})
    assert "\n" not in str(refused.value)


def test_q_k_norms_stored_per_shard_are_refused_in_one_line(hf, tmp_path):
    """Lumina-mGPT's releases store each q/k norm [model_parallel_size, head_dim], which
    transformers' ChameleonLayerNorm ([heads, head_dim]) does not load: refused, named."""
    shard = copy_of(hf("chameleon"), tmp_path / "hf")
    edit_weights(shard, lambda name, t: t[:1].clone()
                 if name.endswith(("q_norm.weight", "q_norm.bias", "k_norm.weight",
                                   "k_norm.bias")) else t)
    with pytest.raises(ExportError, match=r"model.layers.0.self_attn.q_norm.weight has "
                                          r"shape \(1, 16\), but config.json implies "
                                          r"\(4, 16\) \(4 heads of 16\)") as refused:
        export(shard, tmp_path / "b", SMALL)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.5])
def test_masked_logits_sample_to_nothing_without_a_warning(temperature):
    """float32's minimum over a temperature below 1 overflows to -inf (numpy warned of it
    at every sampled token): the masked tokens weigh 0 and nothing is said."""
    from edgeprefill.sdk.nucleus import nucleus

    logits = np.random.default_rng(0).normal(size=128).astype(np.float32) * 3
    logits[IMAGE_TOKENS] = LOWEST
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = nucleus(logits, temperature, 0, 0.9, 0.0)
        probabilities = kept.probabilities(128)
        drawn = {kept.draw(np.random.default_rng(seed)) for seed in range(50)}
    assert probabilities[IMAGE_TOKENS].sum() == 0 and np.isfinite(probabilities).all()
    assert not drawn & set(IMAGE_TOKENS)
