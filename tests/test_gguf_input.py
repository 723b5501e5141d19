"""GGUF input: `export model.gguf` equals the transformers model it was converted from (F32)
and transformers' own reading of the file (Q8_0), logits and greedy text; a Llama 3.1+
file's rope scaling (llama.cpp's rope_freqs) equals the original model's; so do Gemma 3,
Phi-3, StarCoder2, LFM2, GPT-2, Falcon and Mamba files, with what transformers' reader
leaves out read back (gguf_metadata.py, gguf_falcon.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edgeprefill.engines import StepBatch
from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.gguf_input import converted
from edgeprefill.sdk import Engine, GenerationParams
from tests.bpe_tokenizers import byte_level_bpe, install
from tests.conftest import build_hf_model, load_hf_model
from tests.gguf_files import llama3_rope_factors, write_gguf, write_out
from tests.test_cli_errors import assert_one_line_error, cli

pytest.importorskip("gguf")

PROMPT = "hello world, the quick brown fox jumps over the lazy dog"
NEW_TOKENS = 12
CACHE: dict[tuple, tuple[Path, Path]] = {}
# llama.cpp's Qwen2 has no sliding window (nor have Qwen2's released checkpoints): the
# fixture's would be lost in the file. transformers 5.24 reads no head_dim from a Qwen3
# GGUF (its attention.key_length): Qwen3Config's default, 128, as every released Qwen3's.
# Nor does it read Gemma 2's softcaps nor query_pre_attn_scalar: Gemma2Config's defaults;
# llama.cpp's Gemma 2 has no output matrix of its own: tied, as Gemma 2's released ones.
OVERRIDES = {"qwen2": {"use_sliding_window": False}, "qwen3": {"head_dim": 128},
             "gemma2": {"query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0,
                        "final_logit_softcapping": 30.0, "tie_word_embeddings": True},
             # Qwen3-MoE: no expert_feed_forward_length read and its expert_count into a
             # field Qwen3MoeConfig no longer has: its defaults, 768 and 128, as
             # Qwen3-30B-A3B's; llama.cpp's has experts on every layer.
             "qwen3_moe": {"moe_intermediate_size": 768, "num_experts": 128,
                           "mlp_only_layers": [], "num_hidden_layers": 1},
             # llama.cpp's Gemma 3 slides 5 layers of 6 (the file names no pattern) and
             # scales queries by 1/sqrt(head_dim), as Gemma 3 1B-12B do; tied, as they are.
             # The global layers' linear rope (factor 2) is read back (gguf_metadata.py).
             "gemma3_text": {"num_hidden_layers": 6, "layer_types": None,
                             "query_pre_attn_scalar": 16, "tie_word_embeddings": True},
             # Phi-3 as conftest's: Phi-4-mini's partial rotary, a 128k variant's longrope
             # (its factor lists as rope_factors_long/short), both read back.
             "phi3": {},
             # llama.cpp's StarCoder2 has no window (the Hub's, 4096, is past these
             # prompts): none; StarCoder2-3B's rope theta, which the file carries
             "starcoder2": {"sliding_window": None, "rope_parameters": {
                 "rope_type": "default", "rope_theta": 999999.4420358813}},
             # GPT2Model writes an MLP 4 x n_embd wide, as GPT-2's (n_inner unset)
             "gpt2": {"n_inner": None},
             # Falcon-7B: multi-query, an MLP 4 x hidden wide, as FalconModel writes it
             "falcon-7b": {"ffn_hidden_size": None},
             # Falcon-40B's: 4 heads in 2 KV groups, ln_attn and ln_mlp (read back by
             # gguf_metadata.py, the qkv regrouped by gguf_falcon.py)
             "falcon": {"ffn_hidden_size": None},
             # the Hub's Mamba checkpoints have no in/out projection biases (nor has
             # llama.cpp's Mamba)
             "mamba": {"use_bias": False}}
# Phi-3-mini-4k's kind: no longrope, a window on every layer (written as
# attention.sliding_window, read back).
PHI3_4K = {"rope_scaling": None, "sliding_window": 12, "partial_rotary_factor": 1.0,
           "original_max_position_embeddings": 1024, "max_position_embeddings": 1024}


def llama3_rope(theta: float, factor: float) -> dict:
    """A llama3 rope_parameters, Llama 3.x's bands (low 1, high 4, original context 8192)."""
    return {"rope_type": "llama3", "rope_theta": theta, "factor": factor,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}


VARIANTS = {"phi3-4k": PHI3_4K,
            # Falcon-11B's: the new decoder architecture with one norm per layer
            "falcon-11b": {"ffn_hidden_size": None, "num_ln_in_parallel_attn": 1}}


# Tiny Llamas with the released models' rope (their context, 131072): Llama 3.2 1B's (head_dim
# 64: 15 frequencies unscaled, 3 smoothed, 14 divided by the factor), Llama 3.1 8B's (head_dim
# 128: 29, 6, 29) and one whose 16-wide heads have a single smoothed frequency (4, 1, 3).
LLAMA3_ROPES = {
    "3.2": {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 64, "rope_parameters": llama3_rope(500000.0, 32.0)},
    "3.1": {"hidden_size": 128, "num_attention_heads": 1, "num_key_value_heads": 1,
            "head_dim": 128, "rope_parameters": llama3_rope(500000.0, 8.0)},
    "one-smoothed": {"rope_parameters": llama3_rope(500000.0, 8.0)},
}


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    """(family, quant) -> (the tiny transformers model's folder, its GGUF file)."""

    def get(family: str, quant: str, permute_qk: bool = True,
            rope: str | None = None, variant: str | None = None) -> tuple[Path, Path]:
        """`rope`: a key of LLAMA3_ROPES (a llama3 rope, written as rope_freqs);
        `variant`: a key of VARIANTS (overrides in place of OVERRIDES')."""
        key = (family, quant, permute_qk, rope, variant)
        if key not in CACHE:
            root = tmp_path_factory.mktemp(f"gguf-{family}-{quant}")
            tok = byte_level_bpe()
            overrides = OVERRIDES.get(family, {})
            if rope is not None:
                overrides = {**LLAMA3_ROPES[rope], "max_position_embeddings": 131072}
            if variant is not None:
                overrides = VARIANTS[variant]
            hf = build_hf_model(family, root / "hf", vocab_size=tok.get_vocab_size(),
                                **overrides)
            install(tok, hf)
            gguf = write_gguf(hf, root / f"tiny-{quant}.gguf", quant, permute_qk=permute_qk)
            CACHE[key] = hf, gguf
        return CACHE[key]

    return get


def exported(gguf: Path, out: Path, **options) -> Path:
    export(gguf, out, ExportOptions(chunks=(16, 64), max_context=256, show_progress=False,
                                    overwrite=True, **options))
    return out


def gguf_reference(gguf: Path):
    """transformers' own model of the GGUF file (dequantized as it reads it)."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)


def check_logits(model, bundle: Path, ids: list[int]) -> None:
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    engine = Engine.load(bundle, threads=2, background=False)
    for chunk in (len(ids), 16, 7):
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            logits = engine.backend.run(StepBatch(
                np.array([part], np.int64), np.array([start], np.int32),
                np.array([len(part)], np.int32), first_slot=0))
            np.testing.assert_allclose(logits[0], expected[start + len(part) - 1],
                                       rtol=1e-4, atol=1e-4, err_msg=f"chunk {chunk} at {start}")
    engine.close()


def check_greedy_text(model, hf: Path, bundle: Path) -> None:
    """The bundle's greedy reply to PROMPT, as text, equals the model's, decoded by the
    original tokenizer (so the GGUF's vocabulary round-trips too)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(hf / "tokenizer.json"))  # whatever the model_type
    ids = tok.encode(PROMPT).ids
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                             max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    expected = tok.decode(out[0, len(ids):].tolist())
    engine = Engine.load(bundle, threads=2, background=False)
    assert engine.tokenizer.encode(PROMPT) == ids
    got = engine.generate(PROMPT, GenerationParams(max_new_tokens=NEW_TOKENS,
                                                   ignore_eos=True)).result()
    engine.close()
    assert got.text == expected and len(got.token_ids) == NEW_TOKENS


def prompt_ids(hf: Path) -> list[int]:
    vocab = json.loads((hf / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(7)
    return [1] + [int(t) for t in rng.integers(3, vocab, size=40)]


def test_a_f32_llama_gguf_exports_the_transformers_model_it_was_converted_from(
        gguf_model, tmp_path):
    hf, gguf = gguf_model("llama", "F32")
    bundle = exported(gguf, tmp_path / "b")
    model = load_hf_model(hf)
    check_logits(model, bundle, prompt_ids(hf))
    check_greedy_text(model, hf, bundle)


def test_a_q8_0_llama_gguf_exports_what_transformers_reads_from_it(gguf_model, tmp_path):
    hf, gguf = gguf_model("llama", "Q8_0")
    bundle = exported(gguf, tmp_path / "b")
    check_logits(gguf_reference(gguf), bundle, prompt_ids(hf))
    manifest = json.loads((bundle / "edgeprefill.json").read_text())
    assert manifest["source"]["gguf"] == {"file": "tiny-Q8_0.gguf", "architecture": "llama",
                                          "quant": "Q8_0"}
    assert manifest["source"]["path"] == str(gguf.resolve())


def test_the_q_k_permutation_of_llama_ggufs_is_undone(gguf_model, tmp_path):
    """Written without llama.cpp's q/k permutation, the file reads as another model: the
    comparisons above see the un-permuting."""
    hf, gguf = gguf_model("llama", "F32", permute_qk=False)
    bundle = exported(gguf, tmp_path / "b")
    with pytest.raises(AssertionError):
        check_logits(load_hf_model(hf), bundle, prompt_ids(hf))


def test_tensors_transformers_skips_are_named(gguf_model, tmp_path, caplog):
    hf, _ = gguf_model("llama", "F32")
    gguf = write_gguf(hf, tmp_path / "extra.gguf", extra={"rope_factors_long.weight": np.ones(8)})
    exported(gguf, tmp_path / "b")
    assert "transformers' GGUF reader uses none of the file's rope_factors_long.weight; the " \
           "bundle computes as transformers' model of the file does" in caplog.text


def test_a_llama_3_2_gguf_computes_its_llama3_rope_scaling(gguf_model, tmp_path, caplog):
    """llama.cpp's rope_freqs, which transformers' reader skips, read back as the llama3
    rope of the original model: its logits and greedy text, not transformers' unscaled
    model of the file (which differs, so the comparison sees the scaling)."""
    hf, gguf = gguf_model("llama", "F32", rope="3.2")
    bundle = exported(gguf, tmp_path / "b")
    model = load_hf_model(hf)
    check_logits(model, bundle, prompt_ids(hf))
    check_greedy_text(model, hf, bundle)
    with pytest.raises(AssertionError):
        check_logits(gguf_reference(gguf), bundle, prompt_ids(hf))
    assert "rope_freqs" not in caplog.text
    with converted(gguf, tmp_path / "c", show_progress=False) as (folder, _):  # the config
        config = json.loads((folder / "config.json").read_text())
    assert config["rope_parameters"] == LLAMA3_ROPES["3.2"]["rope_parameters"]


@pytest.mark.slow
@pytest.mark.parametrize("rope", ["3.1", "one-smoothed"])
def test_llama3_rope_scalings_of_more_shapes_export_the_original_model(
        rope, gguf_model, tmp_path):
    hf, gguf = gguf_model("llama", "F32", rope=rope)
    bundle = exported(gguf, tmp_path / "b")
    model = load_hf_model(hf)
    check_logits(model, bundle, prompt_ids(hf))
    check_greedy_text(model, hf, bundle)


@pytest.mark.slow
def test_a_q8_0_llama_3_2_gguf_exports_its_weights_with_the_original_rope(
        gguf_model, tmp_path):
    """transformers' reading of a Q8_0 file alone is no reference here (it drops the
    scaling): its dequantized weights with the original model's rope are."""
    import transformers

    hf, gguf = gguf_model("llama", "Q8_0", rope="3.2")
    bundle = exported(gguf, tmp_path / "b")
    model = gguf_reference(gguf)
    model.config.rope_parameters = transformers.AutoConfig.from_pretrained(hf).rope_parameters
    model.model.rotary_emb = type(model.model.rotary_emb)(model.config)
    check_logits(model, bundle, prompt_ids(hf))


@pytest.mark.parametrize("head_dim, factor", [(64, 32.0), (128, 32.0), (128, 8.0)])
def test_the_released_llamas_rope_factors_read_back_as_their_rope_parameters(head_dim, factor):
    """Llama 3.2 1B's and 3B's, Llama 3.1's and 3.3's rope, as llama.cpp's converter writes
    them, read back as their config.json's values."""
    from edgeprefill.export.gguf_rope import llama3_rope as read_rope

    params = llama3_rope(500000.0, factor)
    factors = llama3_rope_factors({"head_dim": head_dim, "rope_parameters": params})
    rope = read_rope(factors, 500000.0, head_dim, 8192, "x.gguf")
    assert rope is not None and rope.as_params() == params


def test_llama3_shaped_factors_off_the_line_are_refused():
    """Bands as llama3's but a smoothed factor 1% off: the fitted parameters do not
    reproduce them, so no rope is guessed."""
    from edgeprefill.export.gguf_rope import llama3_rope as read_rope

    factors = llama3_rope_factors({"head_dim": 64, "rope_parameters": llama3_rope(5e5, 32.0)})
    factors[16] *= 1.01  # the middle one of the three smoothed
    with pytest.raises(ExportError, match="x.gguf: its rope_freqs.weight .* no llama3 rope"):
        read_rope(factors, 500000.0, 64, 8192, "x.gguf")


def _rope_only_gguf(path: Path, factors: np.ndarray, **metadata) -> Path:
    """A llama GGUF holding rope metadata and rope_freqs only (what gguf_rope reads)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    if "scaling_type" in metadata:
        writer.add_rope_scaling_type(metadata["scaling_type"])
    if "original" in metadata:
        writer.add_rope_scaling_orig_ctx_len(metadata["original"])
    writer.add_tensor("rope_freqs.weight", np.asarray(factors, np.float32))
    write_out(writer)
    return path


def _llama_config(path: Path) -> Path:
    path.write_text(json.dumps({"head_dim": 64, "hidden_size": 128, "num_attention_heads": 2,
                                "rope_parameters": {"rope_type": "default",
                                                    "rope_theta": 500000.0}}))
    return path


def test_a_files_original_context_is_the_one_the_factors_are_read_with(tmp_path):
    """L, lo and hi enter the factors only as lo / L and hi / L: a file naming an original
    context of 4096 reads back as lo 0.5, hi 2 with it, the same frequencies."""
    from gguf import GGUFReader

    from edgeprefill.export.gguf_rope import Llama3Rope, write_rope_scaling

    params = llama3_rope(500000.0, 32.0)
    factors = llama3_rope_factors({"head_dim": 64, "rope_parameters": params})
    config = _llama_config(tmp_path / "config.json")
    path = _rope_only_gguf(tmp_path / "ctx.gguf", factors, original=4096)
    write_rope_scaling(GGUFReader(path), path.name, config)
    read = json.loads(config.read_text())["rope_parameters"]
    assert read == {**params, "low_freq_factor": 0.5, "high_freq_factor": 2.0,
                    "original_max_position_embeddings": 4096}
    as_read = Llama3Rope(500000.0, 32.0, 0.5, 2.0, 4096).inv_freq(64)
    np.testing.assert_array_equal(as_read, Llama3Rope(500000.0, 32.0, 1.0, 4.0, 8192).inv_freq(64))


def test_rope_factors_beside_a_rope_scaling_type_are_refused(tmp_path):
    """llama.cpp would scale by both; the one-line error names the tensor and the key."""
    import gguf
    from gguf import GGUFReader

    from edgeprefill.export.gguf_rope import write_rope_scaling

    factors = llama3_rope_factors({"head_dim": 64, "rope_parameters": llama3_rope(5e5, 32.0)})
    path = _rope_only_gguf(tmp_path / "both.gguf", factors,
                           scaling_type=gguf.RopeScalingType.LINEAR)
    with pytest.raises(ExportError, match="both.gguf: its rope_freqs.weight .* cannot be "
                       "exported: llama.rope.scaling.type 'linear' scales the rope on top"):
        write_rope_scaling(GGUFReader(path), path.name, _llama_config(tmp_path / "config.json"))


def test_rope_factors_that_are_not_a_llama3_scaling_are_refused_in_one_line(
        gguf_model, tmp_path, capsys):
    hf, _ = gguf_model("llama", "F32")
    gguf = write_gguf(hf, tmp_path / "odd.gguf", rope_freqs=np.linspace(1, 8, 8))
    assert_one_line_error(cli_here(capsys, "export", gguf, "-o", tmp_path / "out"),
                          "odd.gguf: its rope_freqs.weight (llama.cpp's per-frequency rope "
                          "factors) cannot be exported: they are no llama3 rope scaling")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if ".gguf-" in p.name]  # no staging left


def test_a_folder_holding_one_gguf_exports_it(gguf_model, tmp_path):
    hf, gguf = gguf_model("qwen2", "F32")
    folder = tmp_path / "downloads"
    folder.mkdir()
    (folder / gguf.name).symlink_to(gguf)
    bundle = exported(folder, tmp_path / "b")
    model = load_hf_model(hf)
    check_logits(model, bundle, prompt_ids(hf))
    check_greedy_text(model, hf, bundle)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "qwen3_moe"])
def test_q8_0_ggufs_of_more_families_export_what_transformers_reads(
        family, gguf_model, tmp_path):
    hf, gguf = gguf_model(family, "Q8_0")
    bundle = exported(gguf, tmp_path / "b")
    model = gguf_reference(gguf)
    check_logits(model, bundle, prompt_ids(hf))
    check_greedy_text(model, hf, bundle)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "gemma2", "qwen3_moe"])
def test_f32_ggufs_of_more_families_export_the_model_they_were_converted_from(
        family, gguf_model, tmp_path):
    hf, gguf = gguf_model(family, "F32")
    bundle = exported(gguf, tmp_path / "b")
    model = load_hf_model(hf)
    check_logits(model, bundle, prompt_ids(hf))
    check_greedy_text(model, hf, bundle)


def _int8():
    from edgeprefill.export.quantize import QuantConfig

    return QuantConfig("int8")


def test_a_q8_0_gguf_re_quantized_to_int8_says_both_in_manifest_and_inspect(
        gguf_model, tmp_path):
    """--quantize on a GGUF re-quantizes its dequantized weights."""
    _, gguf = gguf_model("llama", "Q8_0")
    bundle = exported(gguf, tmp_path / "b", quant=_int8())
    manifest = json.loads((bundle / "edgeprefill.json").read_text())
    assert manifest["graph"]["quantization"] == "int8"
    assert manifest["source"]["gguf"]["quant"] == "Q8_0"
    result = cli("inspect", bundle)
    assert result.returncode == 0, result.stderr
    assert "source      tiny-Q8_0.gguf (GGUF llama, Q8_0; dequantized to float, " \
           "re-quantized int8)" in result.stdout.splitlines()


def _tiny_gguf(path: Path, arch: str) -> Path:
    """A readable GGUF file of `arch` holding metadata only."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    write_out(writer)
    return path


def cli_here(capsys, *args) -> subprocess.CompletedProcess:
    """The CLI's main() in this process (a subprocess each costs seconds of imports)."""
    from edgeprefill.cli.main import main

    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["edgeprefill", *map(str, args)])
        try:
            main()
            code = 0
        except SystemExit as exit:
            code = exit.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def test_gguf_input_errors_are_one_line(tmp_path, capsys):
    split = tmp_path / "split"
    split.mkdir()
    for part in (1, 2):
        (split / f"model-0000{part}-of-00002.gguf").write_bytes(b"GGUF")
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        _tiny_gguf(two / name, "llama")
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf file at all")
    cases = [
        (split / "model-00001-of-00002.gguf", "model-00001-of-00002.gguf is one part of a "
         "split GGUF: merge the parts first (llama.cpp: llama-gguf-split --merge"),
        (split, "is one part of a split GGUF"),
        (two, "has no config.json and 2 .gguf files (a.gguf, b.gguf): name the one"),
        (tmp_path / "notes.txt", "notes.txt is not a folder (a Hugging Face checkpoint) nor "
         "a .gguf file"),
        (tmp_path / "broken.gguf", "broken.gguf is not a readable GGUF file"),
        (_tiny_gguf(tmp_path / "rwkv.gguf", "rwkv6"), "rwkv.gguf: GGUF architecture 'rwkv6' "
         "is not one transformers reads into float weights (supported: bloom, "),
    ]
    for source, fragment in cases:
        assert_one_line_error(cli_here(capsys, "export", source, "-o", tmp_path / "out"),
                              fragment)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    assert_one_line_error(cli_here(capsys, "export", _tiny_gguf(tmp_path / "base.gguf", "llama"),
                                   "--adapter", adapter, "-o", tmp_path / "out"),
                          "--adapter merges into a Hugging Face base model folder, not a GGUF "
                          "file (base.gguf)")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if ".gguf-" in p.name]  # no staging left


def test_a_gguf_file_cut_short_says_so_in_one_line(gguf_model, tmp_path, capsys):
    """Its header whole, its last tensor's bytes cut: it had read as "transformers cannot
    read its metadata" (numpy's reshape error)."""
    _, gguf = gguf_model("llama", "F32")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf.read_bytes()[:-120])
    assert_one_line_error(cli_here(capsys, "export", cut, "-o", tmp_path / "out"),
                          "cut.gguf ends before its tensor data does", "cut short")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if ".gguf-" in p.name]  # no staging left


def test_gguf_input_without_its_libraries_says_what_to_install(gguf_model, tmp_path):
    _, gguf = gguf_model("llama", "F32")
    script = ("import sys; sys.modules['gguf'] = None; sys.argv = ['edgeprefill'] + "
              "sys.argv[1:]; from edgeprefill.cli.main import main; main()")
    result = subprocess.run([sys.executable, "-c", script, "export", str(gguf), "-o",
                             str(tmp_path / "out")], capture_output=True, text=True,
                            timeout=120)
    assert_one_line_error(result, 'reading a GGUF file needs torch, transformers and gguf: '
                                  'pip install -e ".[gguf]"')


def test_the_weights_go_to_shards_of_bounded_size_equal_to_the_original(
        gguf_model, tmp_path, monkeypatch):
    """Shards of at most SHARD_BYTES (a larger tensor alone), every tensor the original's
    (llama's q/k rows un-permuted)."""
    from safetensors.numpy import load_file

    from edgeprefill.export import gguf_input

    hf, gguf = gguf_model("llama", "F32")
    monkeypatch.setattr(gguf_input, "SHARD_BYTES", 40_000)
    original = load_file(str(hf / "model.safetensors"))
    with gguf_input.converted(gguf, tmp_path / "b", show_progress=False) as (folder, _):
        shards = sorted(folder.glob("model-*.safetensors"))
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        assert sorted(set(index["weight_map"].values())) == [p.name for p in shards]
        converted = {}
        for shard in shards:
            tensors = load_file(str(shard))
            assert len(tensors) == 1 or sum(t.nbytes for t in tensors.values()) <= 40_000
            converted.update(tensors)
    assert len(shards) > 5 and not folder.exists()
    assert sorted(converted) == sorted(original)
    for name, tensor in original.items():
        np.testing.assert_array_equal(converted[name], tensor, err_msg=name)


@pytest.mark.slow
def test_a_gemma3_gguf_exports_the_model_it_was_converted_from(gguf_model, tmp_path):
    """transformers' reading alone drops the global layers' linear rope and scales queries
    by Gemma3TextConfig's 256: gguf_metadata.py restores both from the file."""
    hf, gguf = gguf_model("gemma3_text", "F32")
    bundle = exported(gguf, tmp_path / "b")
    model = load_hf_model(hf)
    check_logits(model, bundle, prompt_ids(hf))
    check_greedy_text(model, hf, bundle)


def test_a_phi3_longrope_gguf_exports_the_model_it_was_converted_from(
        gguf_model, tmp_path, caplog):
    """Phi-4-mini's partial rotary and a 128k variant's longrope factor lists (tensors that
    transformers' reader skips) read back as the original config's rope."""
    import transformers

    hf, gguf = gguf_model("phi3", "F32")
    bundle = exported(gguf, tmp_path / "b")
    model = load_hf_model(hf)
    check_logits(model, bundle, prompt_ids(hf))
    check_greedy_text(model, hf, bundle)
    assert "rope_factors" not in caplog.text
    with converted(gguf, tmp_path / "c", show_progress=False) as (folder, _):
        read = transformers.AutoConfig.from_pretrained(folder)
    original = transformers.AutoConfig.from_pretrained(hf)
    legacy = {"type"}  # the original's rope_scaling spelling, kept beside rope_type
    assert read.rope_parameters == {k: v for k, v in original.rope_parameters.items()
                                    if k not in legacy}
    assert read.original_max_position_embeddings == original.original_max_position_embeddings


@pytest.mark.slow
@pytest.mark.parametrize("family, quant", [("gemma3_text", "Q8_0"), ("gemma3_text", "Q4_0"),
                                           ("phi3", "Q8_0"), ("phi3", "Q4_0")])
def test_quantized_gemma3_and_phi3_ggufs_export_the_weights_transformers_dequantizes(
        family, quant, gguf_model, tmp_path):
    """Q8_0 and Q4_0 blocks (gguf's writer quantizes no K-quant) dequantized as
    transformers' from_pretrained(gguf_file=) does; its model of the file computes with
    Gemma3TextConfig's query scale and no global rope scaling, Phi-3 with full rotary
    and no longrope: the reference is the original config with its weights."""
    hf, gguf = gguf_model(family, quant)
    bundle = exported(gguf, tmp_path / "b")
    reference = load_hf_model(hf)
    reference.load_state_dict(gguf_reference(gguf).state_dict())
    check_logits(reference, bundle, prompt_ids(hf))


@pytest.mark.parametrize("family, variant", [
    ("starcoder2", None), ("lfm2", None), ("gpt2", None), ("falcon-7b", None),
    ("falcon", None), ("mamba", None),
    pytest.param("falcon", "falcon-11b", marks=pytest.mark.slow)])
def test_f32_ggufs_of_the_other_architectures_export_the_model_they_were_converted_from(
        family, variant, gguf_model, tmp_path):
    """StarCoder2 (its rope theta read back by gguf_metadata.py), LFM2's short-conv
    layers, GPT-2's transposed Conv1D weights, Falcon-7B's multi-query fused qkv and
    the new decoder architecture's grouped one, Mamba's A and convolution, as llama.cpp's
    converter writes them."""
    hf, gguf = gguf_model(family, "F32", variant=variant)
    bundle = exported(gguf, tmp_path / "b")
    model = load_hf_model(hf)
    check_logits(model, bundle, prompt_ids(hf))
    check_greedy_text(model, hf, bundle)


@pytest.mark.slow
def test_a_phi3_4k_gguf_exports_its_window(gguf_model, tmp_path):
    hf, gguf = gguf_model("phi3", "F32", variant="phi3-4k")
    bundle = exported(gguf, tmp_path / "b")
    model = load_hf_model(hf)
    check_logits(model, bundle, prompt_ids(hf))
    check_greedy_text(model, hf, bundle)


def _metadata_gguf(path: Path, arch: str, metadata: dict, tensors: dict | None = None) -> Path:
    """A GGUF file of `arch` holding `metadata` ({key suffix: value}) and `tensors` only."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        if isinstance(value, str):
            writer.add_string(f"{arch}.{key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", value)
    for name, data in (tensors or {}).items():
        writer.add_tensor(name, np.asarray(data, np.float32))
    write_out(writer)
    return path


def test_gemma3_27b_scales_queries_by_hidden_over_heads_as_llama_cpp(tmp_path):
    """llama.cpp's Gemma 3 27B (62 layers) scales by 1/sqrt(5376 / 32) = 1/sqrt(168), its
    config's query_pre_attn_scalar; the other sizes by 1/sqrt(head_dim); Gemma 3 4B's
    global rope is linear, factor 8."""
    from gguf import GGUFReader

    from edgeprefill.export.gguf_metadata import write_unmapped

    rope = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    for layers, hidden, heads, head_dim, expected in ((62, 5376, 32, 128, 168),
                                                       (34, 2560, 8, 256, 256)):
        config = tmp_path / "config.json"
        config.write_text(json.dumps({
            "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "head_dim": head_dim, "query_pre_attn_scalar": 256, "rope_parameters": rope}))
        path = _metadata_gguf(tmp_path / f"g{layers}.gguf", "gemma3",
                              {"rope.scaling.type": "linear", "rope.scaling.factor": 8.0})
        assert write_unmapped(GGUFReader(path), path.name, config) == []
        read = json.loads(config.read_text())
        assert read["query_pre_attn_scalar"] == expected
        assert read["rope_parameters"]["full_attention"] == {
            "rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}


def test_phi3_longrope_factors_of_the_wrong_count_are_refused(tmp_path):
    from gguf import GGUFReader

    from edgeprefill.export.gguf_metadata import write_unmapped

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 128, "num_attention_heads": 4,
                                  "max_position_embeddings": 2048}))
    path = _metadata_gguf(tmp_path / "p.gguf", "phi3", {
        "rope.dimension_count": 16, "rope.scaling.original_context_length": 512},
        {"rope_factors_long.weight": np.ones(6), "rope_factors_short.weight": np.ones(6)})
    with pytest.raises(ExportError, match="p.gguf: 6 long and 6 short longrope factors for 16 "
                                          "rotary dimensions"):
        write_unmapped(GGUFReader(path), path.name, config)


def test_a_gemma3_rope_scaling_other_than_linear_is_refused(tmp_path):
    from gguf import GGUFReader

    from edgeprefill.export.gguf_metadata import write_unmapped

    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "num_hidden_layers": 26, "hidden_size": 1152, "num_attention_heads": 4,
        "head_dim": 256, "rope_parameters": {"full_attention": {}, "sliding_attention": {}}}))
    path = _metadata_gguf(tmp_path / "y.gguf", "gemma3", {"rope.scaling.type": "yarn"})
    with pytest.raises(ExportError, match="y.gguf: gemma3.rope.scaling.type 'yarn' is not "
                                          "one Gemma 3 uses"):
        write_unmapped(GGUFReader(path), path.name, config)
