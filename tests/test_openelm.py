"""Apple's OpenELM (`model_type: openelm`, remote code; transformers has no class for it):
layers with query heads, KV heads and FFN widths of their own (layer-wise scaling). The
reference is OpenELM's forward written here from its modeling_openelm.py: RMSNorms (eps
1e-6), the fused qkv's rows split into all query heads, then the keys, then the values,
each head's q and k RMS-normed before rotary on halves, GQA by repeat_interleave, the
fused proj_1 chunked into act(gate) * up, the head tied to the embedding. The fixture's
four layers have 2, 4, 6, 6 query heads (1, 2, 3, 3 KV heads) and FFNs 64, 96, 160 and 192
wide, which the config's multipliers give as OpenELMConfig derives them; its norms'
weights are random, so a norm read from the wrong tensor or skipped changes the logits."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import StepBatch
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.model_quirks import model_quirks
from edgeprefill.sdk import Engine, GenerationParams
from tests.conftest import VOCAB, write_tokenizer
from tests.test_cli_errors import assert_one_line_error, cli
from tests.test_exactness import FLAVORS, prompt_ids

DIM, HEAD_DIM, GROUPS = 96, 16, 2
HEADS, KV_HEADS = [2, 4, 6, 6], [1, 2, 3, 3]
# A listed num_kv_heads stands (OpenELMConfig keeps it): layers 0 and 1 then share their KV
# heads and head size but not their query heads.
LISTED_KV = [1, 1, 3, 3]
WIDTHS = [64, 96, 160, 192]
CONFIG = {
    "model_type": "openelm", "architectures": ["OpenELMForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_openelm.OpenELMConfig",
                 "AutoModelForCausalLM": "modeling_openelm.OpenELMForCausalLM"},
    "vocab_size": VOCAB, "max_context_length": 256, "num_transformer_layers": 4,
    "model_dim": DIM, "head_dim": HEAD_DIM, "num_gqa_groups": GROUPS,
    # make_divisible(96 x m, 16 x 2) / 16 for m in 0.25, 0.5, 0.75, 1.0: 2, 4, 6, 6 heads
    "qkv_multipliers": [0.25, 1.0],
    # make_divisible(96 x m, 32) for m in 0.5, 1.0, 1.5, 2.0: 64, 96, 160, 192
    "ffn_multipliers": [0.5, 2.0], "ffn_dim_divisor": 32, "ffn_with_glu": True,
    "activation_fn_name": "swish", "normalization_layer_name": "rms_norm",
    "normalize_qk_projections": True, "share_input_output_layers": True,
    "rope_freq_constant": 10000, "rope_max_length": 512, "bos_token_id": 1,
    "eos_token_id": 2,
}


def openelm_weights(kv_heads: list[int] = KV_HEADS, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under OpenELM's names and shapes (no lm_head: it shares the
    embedding); the norms' weights far from 1."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    def norm(width: int) -> torch.Tensor:
        return 1.0 + rand(width, scale=0.3)

    out = {"transformer.token_embeddings.weight": rand(VOCAB, DIM, scale=0.5),
           "transformer.norm.weight": norm(DIM)}
    for i, (q, kv, width) in enumerate(zip(HEADS, kv_heads, WIDTHS, strict=True)):
        p = f"transformer.layers.{i}."
        out.update({
            p + "attn_norm.weight": norm(DIM), p + "ffn_norm.weight": norm(DIM),
            p + "attn.qkv_proj.weight": rand((q + 2 * kv) * HEAD_DIM, DIM, scale=DIM**-0.5),
            p + "attn.q_norm.weight": norm(HEAD_DIM), p + "attn.k_norm.weight": norm(HEAD_DIM),
            p + "attn.out_proj.weight": rand(DIM, q * HEAD_DIM, scale=(q * HEAD_DIM)**-0.5),
            p + "ffn.proj_1.weight": rand(2 * width, DIM, scale=DIM**-0.5),
            p + "ffn.proj_2.weight": rand(DIM, width, scale=width**-0.5),
        })
    return out


def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


def rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def heads_of(w: dict[str, torch.Tensor], layer: int) -> tuple[int, int]:
    """A layer's (query heads, KV heads) from its projections' shapes, as its modules hold
    them."""
    p = f"transformer.layers.{layer}.attn."
    q_heads = w[p + "out_proj.weight"].shape[1] // HEAD_DIM
    return q_heads, (w[p + "qkv_proj.weight"].shape[0] // HEAD_DIM - q_heads) // 2


def reference_logits(w: dict[str, torch.Tensor], ids: list[int]) -> np.ndarray:
    """OpenELMForCausalLM's logits [len(ids), vocab], every position."""
    length = len(ids)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    causal = torch.full((length, length), float("-inf")).triu(1)
    embed = w["transformer.token_embeddings.weight"]
    x = embed[torch.tensor(ids)]
    for i in range(len(HEADS)):
        p = f"transformer.layers.{i}."
        q_heads, kv_heads = heads_of(w, i)
        h = rms(x, w[p + "attn_norm.weight"])
        qkv = (h @ w[p + "attn.qkv_proj.weight"].T).reshape(length, -1, HEAD_DIM).transpose(0, 1)
        q, k, v = qkv.split([q_heads, kv_heads, kv_heads], dim=0)
        if p + "attn.q_norm.weight" in w:  # normalize_qk_projections
            q, k = rms(q, w[p + "attn.q_norm.weight"]), rms(k, w[p + "attn.k_norm.weight"])
        q, k = rotated(q, cos, sin), rotated(k, cos, sin)
        k, v = (t.repeat_interleave(q_heads // kv_heads, dim=0) for t in (k, v))
        scores = q @ k.transpose(1, 2) / HEAD_DIM**0.5 + causal
        attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(length, q_heads * HEAD_DIM)
        x = x + attn @ w[p + "attn.out_proj.weight"].T
        gate, up = (rms(x, w[p + "ffn_norm.weight"]) @ w[p + "ffn.proj_1.weight"].T).chunk(2, -1)
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "ffn.proj_2.weight"].T
    head = w.get("lm_head.weight", embed)  # share_input_output_layers: the embedding
    return (rms(x, w["transformer.norm.weight"]) @ head.T).numpy()


def reference_greedy(w: dict[str, torch.Tensor], ids: list[int], new: int) -> list[int]:
    out = list(ids)
    for _ in range(new):
        out.append(int(reference_logits(w, out)[-1].argmax()))
    return out[len(ids):]


def openelm_checkpoint(root: Path, weights: dict[str, torch.Tensor], **config) -> Path:
    hf = root / "openelm"
    hf.mkdir(parents=True)
    save_file({name: t.contiguous() for name, t in weights.items()}, hf / "model.safetensors")
    (hf / "config.json").write_text(json.dumps({**CONFIG, **config}))
    write_tokenizer(hf)
    return hf


@pytest.fixture(scope="module", params=["derived", "listed", "unnormed"])
def openelm(tmp_path_factory, request):
    """(weights, {flavour: bundle}) of the fixture, exported once per flavour: its KV heads
    derived from num_gqa_groups, or listed (LISTED_KV); or without q/k norms
    (normalize_qk_projections false: the ort flavour's attention takes the packed qkv)."""
    root = tmp_path_factory.mktemp("openelm")
    listed = request.param == "listed"
    weights = openelm_weights(LISTED_KV if listed else KV_HEADS)
    config: dict = {"num_kv_heads": LISTED_KV} if listed else {}
    if request.param == "unnormed":
        weights = {name: t for name, t in weights.items()
                   if not name.endswith(("attn.q_norm.weight", "attn.k_norm.weight"))}
        config["normalize_qk_projections"] = False
    hf = openelm_checkpoint(root, weights, **config)
    bundles = {}
    for flavor in FLAVORS:
        bundles[flavor] = root / flavor
        export(hf, bundles[flavor], ExportOptions(chunks=(1, 3, 16), max_context=64,
                                                  flavor=flavor, show_progress=False))
    return weights, bundles


def run_chunks(engine: Engine, ids: list[int], chunk: int, slot: int = 0) -> list[np.ndarray]:
    """Each chunk's last-token logits, the chunks of `ids` run in turn in KV slot `slot`."""
    out = []
    for start in range(0, len(ids), chunk):
        part = ids[start:start + chunk]
        out.append(engine.backend.run(StepBatch(
            np.array([part], np.int64), np.array([start], np.int32),
            np.array([len(part)], np.int32), first_slot=slot))[0].copy())
    return out


def check_chunk_ends(engine: Engine, ids: list[int], expected: np.ndarray,
                     chunks: tuple[int, ...], tolerance: float = 1e-4, label: str = "") -> None:
    """For each size in `chunks`, `ids` prefilled in chunks of it: each chunk's last logits
    are `expected` [len(ids), vocab] at its position, to `tolerance`."""
    for chunk in chunks:
        got = run_chunks(engine, ids, chunk)
        ends = [min(start + chunk, len(ids)) - 1 for start in range(0, len(ids), chunk)]
        np.testing.assert_allclose(np.stack(got), expected[ends], rtol=tolerance,
                                   atol=tolerance, err_msg=f"{label}chunk {chunk}")


def check_chunks_and_padding(bundle: Path, ids: list[int], expected: np.ndarray) -> None:
    """Chunks of 1, 3 and 16 of a 40-token prompt, then a 16-token chunk holding 10 valid
    tokens and 6 of padding: each chunk's last logits are `expected` at its position."""
    engine = Engine.load(bundle, threads=2, background=False)
    check_chunk_ends(engine, ids, expected, (1, 3, 16))
    run_chunks(engine, ids[:16], 16)  # then 10 valid tokens and 6 of padding
    padded = np.full((1, 16), 7, np.int64)
    padded[0, :10] = ids[16:26]
    logits = engine.backend.run(StepBatch(padded, np.array([16], np.int32),
                                          np.array([10], np.int32), 0))
    np.testing.assert_allclose(logits[0], expected[25], rtol=1e-4, atol=1e-4)
    engine.close()


def check_rows_decode_together(bundle: Path, last_logits: Callable[[list[int]], np.ndarray],
                               steps: int) -> None:
    """Three rows in adjacent slots, prompts of 5, 19 and 33 tokens, then `steps` decode
    steps of all three in one call each: every row's logits are `last_logits` (the
    reference forward's last position) of its tokens so far."""
    engine = Engine.load(bundle, threads=2, background=False)
    rows = [prompt_ids(n, seed=n) for n in (5, 19, 33)]
    for slot, ids in enumerate(rows):
        run_chunks(engine, ids, 16, slot)
    lasts = [last_logits(ids) for ids in rows]
    for step in range(steps):
        nexts = [int(last.argmax()) for last in lasts]
        got = engine.backend.run(StepBatch(
            np.array([[t] for t in nexts]), np.array([len(ids) for ids in rows], np.int32),
            np.ones(3, np.int32), 0))
        rows = [ids + [t] for ids, t in zip(rows, nexts, strict=True)]
        lasts = [last_logits(ids) for ids in rows]
        np.testing.assert_allclose(got, np.stack(lasts), rtol=1e-4, atol=1e-4,
                                   err_msg=f"step {step}")
    engine.close()


def test_the_config_reads_each_layers_heads_and_the_tied_head():
    cfg = ModelConfig.from_hf(CONFIG)
    assert [cfg.layer_heads(i) for i in range(4)] == HEADS
    assert [cfg.layer_kv_heads(i) for i in range(4)] == KV_HEADS
    assert (cfg.head_dim, cfg.hidden_size, cfg.intermediate_size) == (HEAD_DIM, DIM, 192)
    assert cfg.tie_embeddings and cfg.qk_norm == "head" and cfg.activation == "silu"
    assert (cfg.norm_eps, cfg.max_positions, cfg.ropes["global"].theta) == (1e-6, 256, 10000)


# apple/OpenELM-270M's config.json as the Hub holds it (the lists as its config class saved
# them, which it derives again from qkv_multipliers when it loads).
OPENELM_270M = {
    "activation_fn_name": "swish", "architectures": ["OpenELMForCausalLM"],
    "bos_token_id": 1, "eos_token_id": 2, "ffn_dim_divisor": 256,
    "ffn_multipliers": [0.5, 0.73, 0.97, 1.2, 1.43, 1.67, 1.9, 2.13, 2.37, 2.6, 2.83, 3.07,
                        3.3, 3.53, 3.77, 4.0],
    "ffn_with_glu": True, "head_dim": 64, "max_context_length": 2048, "model_dim": 1280,
    "model_type": "openelm", "normalization_layer_name": "rms_norm",
    "normalize_qk_projections": True, "num_gqa_groups": 4,
    "num_kv_heads": [3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5],
    "num_query_heads": [12, 12, 12, 12, 12, 16, 16, 16, 16, 16, 16, 16, 20, 20, 20, 20],
    "num_transformer_layers": 16, "qkv_multipliers": [0.5, 1.0], "rope_freq_constant": 10000,
    "rope_max_length": 4096, "share_input_output_layers": True, "vocab_size": 32000,
}


def test_the_quirks_name_the_range_of_the_layers_heads():
    assert model_quirks(ModelConfig.from_hf(OPENELM_270M))[2:] == [
        "12-20 query heads and 3-5 KV heads of 64, by layer"]


@pytest.mark.parametrize("listed", [True, False])
def test_openelm_270ms_heads_derive_as_its_config_class_derives_them(listed):
    """From qkv_multipliers and num_gqa_groups: the lists the Hub's config.json holds,
    read or left out."""
    raw = OPENELM_270M if listed else {k: v for k, v in OPENELM_270M.items()
                                       if k not in ("num_query_heads", "num_kv_heads")}
    cfg = ModelConfig.from_hf(raw)
    assert [cfg.layer_heads(i) for i in range(16)] == OPENELM_270M["num_query_heads"]
    assert [cfg.layer_kv_heads(i) for i in range(16)] == OPENELM_270M["num_kv_heads"]
    assert cfg.intermediate_size == 5120  # make_divisible(4.0 x 1280, 256)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_chunks_of_1_3_and_16_and_a_padded_one_are_openelms_forward(openelm, flavor):
    weights, bundles = openelm
    ids = prompt_ids(40)
    expected = reference_logits(weights, ids)
    check_chunks_and_padding(bundles[flavor], ids, expected)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_of_different_lengths_decode_together_as_openelms_forward(openelm, flavor):
    """Three rows in adjacent slots, prompts of 5, 19 and 33 tokens, then decode steps of
    all three in one call each: every row's logits are the forward's at its position."""
    weights, bundles = openelm
    check_rows_decode_together(bundles[flavor], lambda ids: reference_logits(weights, ids)[-1], 4)


def test_a_head_of_its_own_is_read_where_the_embedding_is_not_shared(tmp_path):
    """share_input_output_layers false (no release has it): OpenELM's `lm_head`."""
    weights = openelm_weights()
    weights["lm_head.weight"] = torch.randn(VOCAB, DIM, generator=torch.Generator()
                                            .manual_seed(1)) * 0.5
    hf = openelm_checkpoint(tmp_path, weights, share_input_output_layers=False,
                            tie_word_embeddings=False)
    export(hf, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                             show_progress=False))
    ids = prompt_ids(20)
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    got = np.stack(run_chunks(engine, ids, 16))
    engine.close()
    np.testing.assert_allclose(got, reference_logits(weights, ids)[[15, 19]], rtol=1e-4,
                               atol=1e-4)


def test_the_sdk_generates_openelms_greedy_tokens(openelm):
    weights, bundles = openelm
    engine = Engine.load(bundles["ort"], threads=2, background=False, chunk_size=16)
    params = GenerationParams(max_new_tokens=6, ignore_eos=True)
    prompts = [prompt_ids(n, seed=n) for n in (5, 33)]
    streams = [engine.generate(ids, params) for ids in prompts]
    for ids, stream in zip(prompts, streams, strict=True):
        assert stream.result().token_ids == reference_greedy(weights, ids, 6)
    engine.close()


def test_the_manifest_holds_each_layers_heads_and_kv_shapes(openelm):
    weights, bundles = openelm
    model = load_manifest(bundles["ort"]).model
    kv = [heads_of(weights, i)[1] for i in range(4)]
    assert (model.num_heads, model.num_kv_heads, model.head_dim) == (2, 1, HEAD_DIM)
    assert model.layer_heads == {"1": 4, "2": 6, "3": 6}
    assert model.layer_kv == {str(i): [kv[i], HEAD_DIM] for i in range(1, 4) if kv[i] != 1}


def test_inspect_gives_the_range_of_the_layers_heads(openelm):
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli as edgeprefill

    out = CliRunner().invoke(edgeprefill, ["inspect", str(openelm[1]["ort"])]).output
    assert f"2-6 heads / 1-3 KV heads of {HEAD_DIM}, by layer" in out


@pytest.mark.parametrize(("heads", "message"), [
    ({"2": 4}, r"layer_kv\['2'\] must be a layer's"),  # layer 2 holds 3 KV heads
    ({"9": 4}, r"layer_heads\['9'\] must be a layer's query heads"),  # 4 layers
    ({"3": 0}, r"layer_heads\['3'\] must be"),
])
def test_a_manifest_whose_layer_heads_disagree_with_its_layers_is_refused(
        openelm, tmp_path, heads, message):
    from edgeprefill.errors import BundleError

    raw = json.loads((openelm[1]["ort"] / "edgeprefill.json").read_text())
    raw["model"]["layer_heads"].update(heads)
    (tmp_path / "edgeprefill.json").write_text(json.dumps(raw))
    with pytest.raises(BundleError, match=message):
        load_manifest(tmp_path)


def test_a_checkpoint_whose_layer_disagrees_with_the_multipliers_is_one_line(tmp_path):
    weights = openelm_weights()
    hf = openelm_checkpoint(tmp_path, weights, qkv_multipliers=[0.5, 1.0])  # 4, 4, 6, 6 heads
    result = cli("export", hf, "-o", tmp_path / "b", "--quiet")
    assert_one_line_error(result, "transformer.layers.0.attn.qkv_proj.weight")


@pytest.mark.parametrize(("change", "message"), [
    ({"ffn_with_glu": False}, "ffn_with_glu false"),
    ({"qkv_multipliers": [0.25, 0.5, 1.0]}, "qkv_multipliers must be a number or a pair"),
    ({"ffn_multipliers": [1.0, 2.0, 3.0]}, "ffn_multipliers must be a number, a pair or one"),
    ({"num_kv_heads": [1, 2, 4, 3]}, "layer 2 has 6 query heads"),
    ({"num_gqa_groups": None}, "num_gqa_groups must be a positive integer"),
    ({"num_transformer_layers": 0}, "num_transformer_layers must be a positive integer"),
    ({"ffn_dim_divisor": 0}, "ffn_dim_divisor must be a positive integer"),
])
def test_what_export_cannot_honour_is_refused_in_one_line(tmp_path, change, message):
    hf = openelm_checkpoint(tmp_path, openelm_weights(), **change)
    assert_one_line_error(cli("export", hf, "-o", tmp_path / "b", "--quiet"), message)


def test_a_checkpoint_as_apple_ships_it_says_where_its_tokenizer_is(tmp_path):
    """Apple's OpenELM repositories hold no tokenizer (the models use Llama 2's)."""
    hf = openelm_checkpoint(tmp_path, openelm_weights())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf / name).unlink(missing_ok=True)
    assert_one_line_error(cli("export", hf, "-o", tmp_path / "b"),
                          "copy its tokenizer files into the folder")
