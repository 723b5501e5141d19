"""generation_config.json's sampling values and EOS list are the defaults of the SDK,
`edgeprefill run` and the server; explicit values win."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeprefill.errors import BundleError
from edgeprefill.sdk import Engine, GenerationParams
from edgeprefill.sdk.generation_defaults import GenerationDefaults
from tests.bundle_variants import serve, variant
from tests.test_cli_errors import cli

PROMPT = "w3 w4 w5 w6"
STEPS = 12


@pytest.fixture(scope="module")
def greedy(bundle) -> list[int]:
    """The reference: greedy ids of the unchanged bundle (no sampling defaults), past EOS."""
    with Engine.load(bundle("llama"), threads=2) as engine:
        stream = engine.generate(PROMPT, GenerationParams(max_new_tokens=STEPS, ignore_eos=True))
        return stream.result().token_ids


@pytest.fixture(scope="module")
def stop_at(greedy) -> int:
    """An index whose token appears nowhere before it: made an EOS id, greedy ends there."""
    return next(i for i in range(2, STEPS) if greedy[i] not in greedy[:i] and greedy[i] != 2)


@pytest.fixture(scope="module")
def greedy_eos_bundle(bundle, greedy, stop_at, tmp_path_factory) -> Path:
    """generation_config: temperature 0 and an EOS list holding greedy[stop_at]."""
    config = {"do_sample": True, "temperature": 0.0, "eos_token_id": [2, greedy[stop_at]]}
    return variant(bundle("llama"), tmp_path_factory.mktemp("g") / "b", config)


@pytest.fixture(scope="module")
def hot_bundle(bundle, tmp_path_factory) -> Path:
    """generation_config: sampling at temperature 1.5 with a top_p and a penalty."""
    config = {"do_sample": True, "temperature": 1.5, "top_p": 0.95, "repetition_penalty": 1.1}
    return variant(bundle("llama"), tmp_path_factory.mktemp("h") / "b", config)


def sampled(engine: Engine, **params) -> list[int]:
    stream = engine.generate(PROMPT, engine.default_params(
        max_new_tokens=STEPS, ignore_eos=True, **params))
    return stream.result().token_ids


# -- parsing --------------------------------------------------------------------------------


def test_generation_config_values_are_parsed_once_with_an_eos_int_or_list():
    d = GenerationDefaults.from_dict({"temperature": 0.6, "top_p": 0.9, "top_k": 20,
                                      "repetition_penalty": 1.05, "eos_token_id": 7,
                                      "max_length": 20, "pad_token_id": 0})
    assert d == GenerationDefaults(0.6, 20, 0.9, 1.05, (7,))
    assert GenerationDefaults.from_dict({"eos_token_id": [7, 8]}).eos_token_ids == (7, 8)
    # transformers' greedy search ignores the temperature when do_sample is false.
    assert GenerationDefaults.from_dict({"do_sample": False, "temperature": 0.6}).temperature == 0
    assert GenerationDefaults.from_dict({}).sampling() == {}


@pytest.mark.parametrize("raw,fragment", [
    ({"temperature": "hot"}, "temperature must be a finite number >= 0, got 'hot'"),
    ({"temperature": -1}, "temperature must be"),
    ({"top_p": 0}, "top_p must be a number in (0, 1]"),
    ({"top_k": 1.5}, "top_k must be an integer >= 0"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a finite number > 0"),
    ({"eos_token_id": ["x"]}, "eos_token_id must be an integer >= 0 or a list of them"),
    ({"eos_token_id": True}, "eos_token_id must be"),
])
def test_garbage_in_generation_config_is_one_line_naming_the_field(raw, fragment):
    with pytest.raises(BundleError) as err:
        GenerationDefaults.from_dict(raw)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("generation_config.json: ")


def test_an_engine_refuses_a_bundle_whose_generation_config_is_garbage(bundle, tmp_path):
    path = variant(bundle("llama"), tmp_path / "b", {"top_p": 2})
    with pytest.raises(BundleError, match="top_p must be a number in"):
        Engine.load(path)


def test_export_refuses_a_generation_config_the_runtime_would_refuse(hf_model, tmp_path):
    import shutil

    from edgeprefill.errors import ExportError
    from edgeprefill.export.exporter import ExportOptions, export

    hf = shutil.copytree(hf_model("llama"), tmp_path / "hf")
    (hf / "generation_config.json").write_text(json.dumps({"eos_token_id": ["x"]}))
    with pytest.raises(ExportError) as err:
        export(hf, tmp_path / "out", ExportOptions(show_progress=False))
    assert str(err.value) == f"{hf}: generation_config.json: eos_token_id must be an integer " \
                             ">= 0 or a list of them, got ['x']"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, said", [
    ("[", "is not valid JSON: Expecting value"), ("[1]", "does not hold a JSON object")])
def test_export_names_a_generation_config_that_is_no_json_object_once(hf_model, tmp_path,
                                                                      text, said):
    import shutil

    hf = shutil.copytree(hf_model("llama"), tmp_path / "hf")
    (hf / "generation_config.json").write_text(text)
    result = cli("export", hf, "-o", tmp_path / "out")
    assert result.returncode == 2 and result.stderr.startswith(
        f"error: {hf / 'generation_config.json'} {said}"), result.stderr
    assert result.stderr.count(str(hf)) == 1 and result.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


# -- the SDK --------------------------------------------------------------------------------


def test_sdk_requests_without_params_use_the_bundles_eos_list_and_temperature(
        greedy_eos_bundle, greedy, stop_at):
    with Engine.load(greedy_eos_bundle, threads=2) as engine:
        result = engine.generate(PROMPT).result()
        assert result.token_ids == greedy[:stop_at]
        assert result.finish_reason == "stop"


def test_sdk_explicit_values_win_over_the_bundles(hot_bundle, greedy):
    with Engine.load(hot_bundle, threads=2) as engine:
        # No max_new_tokens given: the default 256 is a cap the context may cut.
        assert engine.default_params() == GenerationParams(
            temperature=1.5, top_p=0.95, repetition_penalty=1.1, fit_context=True)
        assert engine.default_params(temperature=0.0, top_p=None).temperature == 0.0
        hot = sampled(engine, seed=5)
        assert hot == sampled(engine, seed=5)  # seeded: reproducible
        assert hot != greedy  # the bundle's temperature made it sample
        # An explicit 0 wins; the bundle's repetition penalty still holds unless given too.
        assert sampled(engine, temperature=0.0, repetition_penalty=1.0) == greedy
        assert sampled(engine, temperature=0.0) != greedy


# -- edgeprefill run ------------------------------------------------------------------------


def run_cli(bundle: Path, *args: str) -> str:
    result = cli("run", bundle, "--prompt", PROMPT, "--threads", "2", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def decode(engine_bundle: Path, ids: list[int]) -> str:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(engine_bundle / "tokenizer.json")).decode(ids)


def test_cli_run_uses_the_bundles_defaults_unless_an_option_is_given(
        greedy_eos_bundle, hot_bundle, greedy, stop_at):
    assert run_cli(greedy_eos_bundle) == decode(greedy_eos_bundle, greedy[:stop_at])
    with Engine.load(hot_bundle, threads=2) as engine:
        hot = engine.generate(PROMPT, engine.default_params(max_new_tokens=4, seed=9)
                              ).result().token_ids
    assert hot != greedy[:4]
    assert run_cli(hot_bundle, "--max-new-tokens", "4", "--seed", "9") == decode(hot_bundle, hot)
    greedy_text = run_cli(hot_bundle, "--max-new-tokens", "4", "--temperature", "0",
                          "--repetition-penalty", "1")
    assert greedy_text == decode(hot_bundle, greedy[:4])


# -- the server ---------------------------------------------------------------------------


def complete(http, **body) -> dict:
    response = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": STEPS, **body})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def test_server_absent_fields_take_the_bundles_defaults_and_given_ones_win(
        greedy_eos_bundle, greedy, stop_at):
    expected = decode(greedy_eos_bundle, greedy[:stop_at])
    with serve(greedy_eos_bundle) as (_, http):
        choice = complete(http, seed=1)  # the OpenAI default would be temperature 1
        assert (choice["text"].strip(), choice["finish_reason"]) == (expected, "stop")
        assert complete(http, seed=2)["text"] == choice["text"]
        hot = complete(http, temperature=2.0, seed=1, ignore_eos=True)
        assert hot["text"].strip() != decode(greedy_eos_bundle, greedy)


def test_inspect_shows_the_sampling_defaults_and_the_merged_eos_ids(hot_bundle, bundle,
                                                                     tmp_path):
    out = cli("inspect", hot_bundle).stdout
    assert "sampling    temperature 1.5, top_p 0.95, repetition_penalty 1.1" in out
    eos_bundle = variant(bundle("llama"), tmp_path / "e", {"eos_token_id": [9, 2]})
    out = cli("inspect", eos_bundle).stdout
    manifest = json.loads((eos_bundle / "edgeprefill.json").read_text())
    assert f"eos ids     {list(dict.fromkeys([*manifest['eos_token_ids'], 9]))}" in out
    assert "sampling    none set" in out
