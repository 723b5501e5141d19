"""config.json edited one key at a time (null, a string, -1, 0, a float for an int, 2**40,
a list, {} for an object, the key removed): export either succeeds or fails with one line
(an EdgeprefillError), never another exception, never a half-written bundle
(tests/config_mutations.py runs and checks each). The default suite runs the edits that
crashed before and a seeded sample; the whole sweep of every family is slow."""

from __future__ import annotations

import json
import logging
import sys

import numpy as np
import pytest

from edgeprefill.export import staging
from tests.config_mutations import Mutation, mutations, sweep, try_export
from tests.conftest import FAMILIES

# The edits that crashed before they were refused in one line, by family, with what they
# raised; each kind is one check of config_checks.py (or the rope's, or a family's hook).
REGRESSIONS = {
    "llama": [
        "model_type=list",  # TypeError: a list looked up in the family registry
        "rope_parameters=string", "rope_parameters=list",  # AttributeError in the rope code
        "head_dim=huge",  # MemoryError: a 4 TiB rope table
        "num_hidden_layers=huge",  # MemoryError: 2**40 layers listed
        "hidden_size=float",  # no error: exported as int(64.5)
        "eos_token_id=float",  # no error: exported as token int(2.5)
    ],
    "gemma3": ["text_config.query_pre_attn_scalar=negative"],  # a complex attention scale
    "qwen2_vl": ["text_config=string", "text_config=list"],  # AttributeError in its hook
    "olmo3": ["rope_parameters=list"],  # AttributeError in its rope hook
    "llama-tied-llama3rope": ["rope_parameters.low_freq_factor=zero",  # ZeroDivisionError
                              "rope_parameters.high_freq_factor=zero"],
    "gpt_oss": ["rope_parameters.beta_fast=negative",  # ValueError: math domain error
                "rope_parameters.original_max_position_embeddings=zero"],
    "deepseek_v3": ["num_nextn_predict_layers=huge",  # MemoryError listing MTP layers
                    "qk_rope_head_dim=huge"],  # MemoryError: the rope table
    "mamba": ["num_hidden_layers=huge"],  # MemoryError in its legacy hook
    "gpt_bigcode": ["n_layer=huge"],  # MemoryError: its alias, in its legacy hook
    "mellum": ["rope_parameters=string"],  # AttributeError in its refuse hook
    "bloom": ["n_layer=huge"], "mpt": ["n_layers=huge"],  # MemoryError: their aliases,
    # MemoryError: their aliases in their legacy hooks; a sinusoidal table of all the
    # positions the config allows (now the bundle's context's)
    "xglm": ["num_layers=huge", "max_position_embeddings=huge"],
    "ctrl": ["n_layer=huge", "n_positions=huge"],
    "dbrx": ["attn_config=string", "ffn_config=list"],  # AttributeError in its hook
    # MemoryError: a rope table of 2**40 x half the head's frequencies
    "lfm3": ["rope_parameters.full_attention.partial_rotary_factor=huge"],
    "gemma3n": ["text_config.altup_num_inputs=huge",  # MemoryError listing the streams
                "text_config.hidden_size_per_layer_input=zero",  # AssertionError in the
                "text_config.hidden_size_per_layer_input=null"],  # graph builder
}
SAMPLED_FAMILIES = ("llama", "gemma3")
SAMPLE = 40  # random edits per sampled family, besides its regressions


@pytest.fixture(autouse=True)
def quiet_and_unsynced(monkeypatch):
    # The edits' bundles need not survive a power cut: fsync was half of each export.
    monkeypatch.setattr(staging, "_sync", lambda folder: None)
    logging.disable(logging.WARNING)  # "tensors config.json does not use" for each edit
    yield
    logging.disable(logging.NOTSET)


def chosen(family: str, config: dict) -> list[Mutation]:
    """The family's regressions and a sample of its other edits, the same every run."""
    every = mutations(config)
    named = [m for m in every if str(m) in REGRESSIONS.get(family, [])]
    assert len(named) == len(REGRESSIONS.get(family, [])), "a regression is no longer made"
    rest = [m for m in every if m not in named]
    if family not in SAMPLED_FAMILIES:
        return named
    rng = np.random.default_rng(0)
    picks = rng.choice(len(rest), size=min(SAMPLE, len(rest)), replace=False)
    return named + [rest[i] for i in sorted(picks)]


@pytest.mark.parametrize("family", sorted(set(REGRESSIONS) | set(SAMPLED_FAMILIES)))
def test_an_edited_config_exports_or_is_refused_in_one_line(family, hf_model, tmp_path):
    hf_dir = hf_model(family)
    config = json.loads((hf_dir / "config.json").read_text())
    crashes = []
    for mutation in chosen(family, config):
        work = tmp_path / str(mutation)
        work.mkdir()
        outcome = try_export(hf_dir, mutation.apply(config), work)
        if outcome.kind == "crash" or "\n" in outcome.message:
            crashes.append(f"{mutation}: {outcome.message}")
    assert not crashes, "\n".join(crashes)


@pytest.mark.parametrize("edit, fragment", [
    ("head_dim=huge", "head_dim must be at most"),
    ("hidden_size=float", "hidden_size must be an integer, got 64.5"),
    ("rope_parameters=list", "rope_parameters must be an object, got list"),
    ("model_type=list", "model_type must be a string"),
    ("eos_token_id=float", "bos/eos token ids must be integers, got 2.5"),
    # not the rope's original window, which defaults to it
    ("max_position_embeddings=zero", "config.json: max_position_embeddings must be positive"),
])
def test_the_refusals_name_the_key(edit, fragment, hf_model, tmp_path):
    hf_dir = hf_model("llama")
    config = json.loads((hf_dir / "config.json").read_text())
    mutation = next(m for m in mutations(config) if str(m) == edit)
    outcome = try_export(hf_dir, mutation.apply(config), tmp_path)
    assert outcome.kind == "refused" and fragment in outcome.message, outcome


@pytest.mark.parametrize("edit", ["rope_parameters=string", "text_config.hidden_size=huge"])
def test_the_cli_prints_an_edited_configs_refusal_in_one_line(edit, hf_model, tmp_path,
                                                               monkeypatch, capsys):
    from edgeprefill.cli.main import main

    family = edit.startswith("text_config") and "gemma3" or "llama"
    hf_dir = hf_model(family)
    config = json.loads((hf_dir / "config.json").read_text())
    mutation = next(m for m in mutations(config) if str(m) == edit)
    src = tmp_path / "hf"
    src.mkdir()
    for path in hf_dir.iterdir():
        (src / path.name).symlink_to(path)
    (src / "config.json").unlink()
    (src / "config.json").write_text(json.dumps(mutation.apply(config)))
    monkeypatch.setattr(sys, "argv", ["edgeprefill", "export", str(src), "-o",
                                      str(tmp_path / "out")])
    capsys.readouterr()  # the fixture's build progress
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code != 0
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: config.json: "), err
    assert not (tmp_path / "out").exists()


# Crashes left as they are, each with why (none at present).
KNOWN_CRASHES: dict[str, tuple[str, ...]] = {}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_edit_of_every_family_exports_or_is_refused_in_one_line(family, hf_model,
                                                                      tmp_path):
    crashes = [f"{mutation}: {outcome.message}"
               for mutation, outcome in sweep(family, hf_model(family), tmp_path)
               if (outcome.kind == "crash" or "\n" in outcome.message)
               and str(mutation) not in KNOWN_CRASHES.get(family, ())]
    assert not crashes, "\n".join(crashes)


def transformers_accepts(hf_dir) -> bool:
    """Whether transformers loads the checkpoint and computes finite logits of a prompt."""
    import torch

    from tests.conftest import load_hf_model

    try:
        model = load_hf_model(hf_dir)
        with torch.no_grad():
            return bool(torch.isfinite(model(torch.tensor([[1, 5, 9, 3]])).logits).all())
    except Exception:  # noqa: BLE001 - any refusal of transformers' is one here
        return False


# Edits of the llama fixture that export and transformers judge alike. Where they differ
# (transformers' typed config refuses a wrong type of a key export never reads, such as
# initializer_range or attention_dropout; export refuses max_position_embeddings 0, which
# transformers' rope never reads), neither is wrong: those are left out.
AGREED = [
    ("hidden_size=float", False), ("eos_token_id=float", False),
    ("rope_parameters=list", False), ("num_key_value_heads=zero", False),
    ("rope_parameters.rope_theta=huge", True), ("bos_token_id=null", True),
    ("eos_token_id=removed", True), ("max_position_embeddings=huge", True),
]


@pytest.mark.parametrize("edit, accepted", [
    pytest.param(*case, marks=() if i < 2 or i == 5 else pytest.mark.slow)
    for i, case in enumerate(AGREED)])
def test_export_accepts_an_edited_config_where_transformers_does(edit, accepted, hf_model,
                                                                 tmp_path):
    hf_dir = hf_model("llama")
    config = json.loads((hf_dir / "config.json").read_text())
    mutation = next(m for m in mutations(config) if str(m) == edit)
    outcome = try_export(hf_dir, mutation.apply(config), tmp_path)
    assert (outcome.kind == "ok") == accepted, outcome
    assert transformers_accepts(tmp_path / "hf") == accepted
