"""`export ollama:NAME[:TAG]`: a model in Ollama's store (a fake one in tmp_path, laid out
as Ollama writes it) exports as its GGUF blob does, with its parameters as the bundle's
sampling defaults; Ollama's name rules; every failure one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from edgeprefill.bundle import Manifest
from edgeprefill.engines import StepBatch
from edgeprefill.errors import BundleError, ExportError
from edgeprefill.export import ollama_store
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.ollama_store import OllamaName
from edgeprefill.sdk import Engine, GenerationParams
from edgeprefill.sdk.generation_defaults import GenerationDefaults
from tests.bpe_tokenizers import byte_level_bpe, install
from tests.conftest import CHAT_TEMPLATE, build_hf_model
from tests.gguf_files import write_gguf
from tests.test_cli_errors import assert_one_line_error
from tests.test_gguf_input import cli_here

pytest.importorskip("gguf")

PROMPT = "hello world, the quick brown fox jumps over the lazy dog"
NEW_TOKENS = 12
MEDIA = "application/vnd.ollama.image."
# As a Modelfile's PARAMETER lines land in the params layer. `<s>` is an added token of
# the test tokenizer (id 1): a stop that ends generation as an EOS id does.
PARAMS = {"temperature": 1.5, "top_k": 1, "top_p": 0.9, "repeat_penalty": 1.0,
          "stop": ["<s>", "\n\n"], "num_ctx": 8192}
TEMPLATE = "{{ .System }} {{ .Prompt }}"  # Ollama's Go template: not used
SYSTEM = "You are a tiny model."
LICENSE = "the tiny model's license"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ollama-gguf")
    tok = byte_level_bpe()
    hf = build_hf_model("llama", root / "hf", vocab_size=tok.get_vocab_size())
    install(tok, hf)
    return write_gguf(hf, root / "tiny-Q8_0.gguf", "Q8_0", chat_template=CHAT_TEMPLATE)


def add_blob(store: Path, data: bytes) -> str:
    """A blob as Ollama stores one: blobs/sha256-<hex of its bytes>; its digest."""
    digest = hashlib.sha256(data).hexdigest()
    (store / "blobs").mkdir(parents=True, exist_ok=True)
    (store / "blobs" / f"sha256-{digest}").write_bytes(data)
    return f"sha256:{digest}"


def add_model(store: Path, name: str, layers: list[tuple[str, bytes]]) -> Path:
    """A manifest for `name` (host/namespace/model/tag) whose layers are (kind, bytes)."""
    entries = [{"mediaType": MEDIA + kind, "digest": add_blob(store, data),
                "size": len(data)} for kind, data in layers]
    path = store / "manifests" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": add_blob(store, b"{}"), "size": 2},
        "layers": entries}))
    return path


@pytest.fixture
def store(tmp_path, tiny_gguf, monkeypatch) -> Path:
    """A store holding `tiny:latest` (a GGUF, its params, template, system message and
    license) and `someone/other:v1`, as OLLAMA_MODELS."""
    store = tmp_path / "ollama-models"
    add_model(store, "registry.ollama.ai/library/tiny/latest", [
        ("model", tiny_gguf.read_bytes()), ("template", TEMPLATE.encode()),
        ("system", SYSTEM.encode()), ("params", json.dumps(PARAMS).encode()),
        ("license", LICENSE.encode())])
    add_model(store, "registry.ollama.ai/someone/other/v1",
              [("model", tiny_gguf.read_bytes())])
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    return store


def exported(source, out: Path) -> Path:
    export(source, out, ExportOptions(chunks=(16, 64), max_context=256, show_progress=False))
    return out


def logits_and_text(bundle: Path) -> tuple[np.ndarray, str]:
    """The bundle's last-position logits over PROMPT and its greedy reply."""
    engine = Engine.load(bundle, threads=2, background=False)
    ids = engine.tokenizer.encode(PROMPT)
    logits = engine.backend.run(StepBatch(np.array([ids], np.int64), np.array([0], np.int32),
                                          np.array([len(ids)], np.int32), first_slot=0))
    text = engine.generate(PROMPT, GenerationParams(max_new_tokens=NEW_TOKENS,
                                                    ignore_eos=True)).result().text
    engine.close()
    return logits[0].copy(), text


def test_ollama_names_and_the_blob_export_as_the_gguf_file_does(store, tiny_gguf, tmp_path,
                                                                 caplog):
    direct = logits_and_text(exported(tiny_gguf, tmp_path / "direct"))
    blob = next(p for p in (store / "blobs").iterdir() if p.stat().st_size > 1000)
    for i, source in enumerate(("ollama:tiny", "ollama:tiny:latest", blob)):
        bundle = exported(source, tmp_path / f"b{i}")
        logits, text = logits_and_text(bundle)
        np.testing.assert_array_equal(logits, direct[0], err_msg=str(source))
        assert text == direct[1], source
    manifest = json.loads((tmp_path / "b0" / "edgeprefill.json").read_text())  # ollama:tiny
    assert manifest["source"]["ollama"] == {"name": "tiny:latest",
                                            "digest": "sha256:" + blob.name[7:]}
    assert manifest["source"]["gguf"]["quant"] == "Q8_0"
    assert (tmp_path / "b0" / "LICENSE").read_text() == LICENSE
    assert "Ollama parameters the bundle has no default for are left out: num_ctx 8192, " \
           "stop '\\n\\n'" in caplog.text
    assert "SYSTEM" not in caplog.text  # kept: nothing to warn of
    assert manifest["tokenizer"]["default_system"] == SYSTEM
    assert Manifest.from_dict(manifest).tokenizer.default_system == SYSTEM
    manifest["tokenizer"]["default_system"] = 5  # an edited manifest: one line at load
    with pytest.raises(BundleError, match="'default_system' must be"):
        Manifest.from_dict(manifest)
    for plain in ("direct", "b2"):  # the GGUF file and its blob carry no SYSTEM
        assert "default_system" not in json.loads(
            (tmp_path / plain / "edgeprefill.json").read_text())["tokenizer"]


def test_ollama_parameters_become_the_bundles_sampling_defaults(store, tiny_gguf, tmp_path,
                                                                capsys):
    """End to end: `run` without sampling options samples with the params layer's values.
    Its top_k 1 makes temperature 1.5 greedy: the reply is the greedy one, where the same
    run of the GGUF's own bundle (no defaults) samples another."""
    bundle = exported("ollama:tiny", tmp_path / "b")
    assert GenerationDefaults.load(bundle) == GenerationDefaults(
        temperature=1.5, top_k=1, top_p=0.9, repetition_penalty=1.0, eos_token_ids=(1,))
    plain = exported(tiny_gguf, tmp_path / "plain")
    greedy = logits_and_text(plain)[1]
    run = ("run", PROMPT, "--max-new-tokens", NEW_TOKENS, "--ignore-eos", "--seed", 3)
    got = cli_here(capsys, run[0], bundle, *run[1:])
    assert got.returncode == 0, got.stderr
    assert got.stdout.rstrip("\n") == greedy
    sampled = cli_here(capsys, run[0], plain, *run[1:], "--temperature", 1.5)
    assert sampled.stdout.rstrip("\n") != greedy
    shown = cli_here(capsys, "inspect", bundle).stdout.splitlines()
    digest = json.loads((bundle / "edgeprefill.json").read_text())["source"]["ollama"]["digest"]
    assert f"source      ollama:tiny:latest ({digest[:19]}..., GGUF llama, Q8_0; " \
           "dequantized to float)" in shown
    assert "sampling    temperature 1.5, top_k 1, top_p 0.9, repetition_penalty 1.0  " \
           "(generation_config.json; requests may override)" in shown
    assert "eos ids     [2, 1]" in shown
    assert f"system      {SYSTEM!r}  (first in every chat that brings no system message; " \
           "--json shows it whole)" in shown
    assert not any(line.startswith("system ") for line in
                   cli_here(capsys, "inspect", plain).stdout.splitlines())


def test_the_model_s_system_message_is_first_in_a_chat_that_brings_none(store, tiny_gguf,
                                                                        tmp_path, capsys):
    """As Ollama's handlers put a model's SYSTEM: a chat whose first message is not a
    system message renders as if it began with SYSTEM; one with its own renders as
    without the default. The reference: the plain GGUF's bundle (no default) given the
    system message explicitly. A session's later turns keep it first; `run --chat` uses
    it and `run --system` replaces it."""
    bundle, plain = exported("ollama:tiny", tmp_path / "b"), exported(tiny_gguf,
                                                                      tmp_path / "plain")
    user = [{"role": "user", "content": "w4 w5"}]
    mine = [{"role": "system", "content": "w3"}, *user]
    with Engine.load(bundle, threads=2, background=False) as engine, \
            Engine.load(plain, threads=2, background=False) as reference:
        ours, theirs = engine.tokenizer, reference.tokenizer
        with_default = theirs.render_chat([{"role": "system", "content": SYSTEM}, *user])
        assert SYSTEM in with_default and ours.render_chat(user) == with_default
        assert ours.render_chat(mine) == theirs.render_chat(mine)
        assert SYSTEM not in ours.render_chat(mine)
        assert theirs.render_chat(user) != with_default  # no default: as before
        session = engine.session()
        session.chat("w4", GenerationParams(max_new_tokens=2, ignore_eos=True)).result()
        session.chat("w5", GenerationParams(max_new_tokens=2, ignore_eos=True)).result()
        first, reply, second = session.messages  # the second reply is not in yet
        assert session.last_prompt == theirs.encode(
            [{"role": "system", "content": SYSTEM}, first, reply, second])
    run = ("--max-new-tokens", 4, "--ignore-eos", "--temperature", 0)
    for ours_args, reference_args in ((("--chat",), ("--system", SYSTEM)),
                                      (("--system", "w3"), ("--system", "w3"))):
        got = cli_here(capsys, "run", bundle, PROMPT, *run, *ours_args)
        want = cli_here(capsys, "run", plain, PROMPT, *run, *reference_args)
        assert got.returncode == want.returncode == 0, got.stderr + want.stderr
        assert got.stdout == want.stdout != "", ours_args


def test_a_system_message_the_template_refuses_is_left_out_with_a_warning(tmp_path, caplog):
    """A template that refuses a system turn would fail every chat with a default one;
    a model without a template has no chat to put it in."""
    from edgeprefill.export.ollama_system import kept_system

    refuses = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not " \
              "supported') }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    (tmp_path / "chat_template.jinja").write_text(refuses)
    assert kept_system(SYSTEM, tmp_path, "ollama:x:latest") is None
    assert "ollama:x:latest: its SYSTEM message is left out of the bundle (its chat " \
           "template does not render it: chat template: System role not supported)" \
           in caplog.text
    (tmp_path / "chat_template.jinja").unlink()
    assert kept_system(SYSTEM, tmp_path, "ollama:x:latest") is None
    assert "(the model has no chat template)" in caplog.text
    (tmp_path / "chat_template.jinja").write_text(refuses.replace("raise_exception", "x"))
    assert kept_system(SYSTEM, tmp_path, "ollama:x:latest") is None  # x is undefined
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}"
                                                  "{% endfor %}")
    assert kept_system(SYSTEM, tmp_path, "ollama:x:latest") == SYSTEM
    assert kept_system("", tmp_path, "ollama:x:latest") is None


@pytest.mark.parametrize("text, parts", [
    ("llama3.2", ("registry.ollama.ai", "library", "llama3.2", "latest")),
    ("qwen3:0.6b", ("registry.ollama.ai", "library", "qwen3", "0.6b")),
    ("user/model:tag", ("registry.ollama.ai", "user", "model", "tag")),
    ("hf.co/org/repo:Q4_K_M", ("hf.co", "org", "repo", "Q4_K_M")),
    ("https://hf.co/org/repo", ("hf.co", "org", "repo", "latest")),
    ("localhost:5000/ns/m", ("localhost:5000", "ns", "m", "latest")),  # a port, no tag
    ("_a-b.c:1_x-y.z", ("registry.ollama.ai", "library", "_a-b.c", "1_x-y.z")),
])
def test_names_parse_as_ollama_parses_them(text, parts):
    assert OllamaName.parse(text) == OllamaName(*parts)


@pytest.mark.parametrize("text, part", [
    ("", "model"), ("model:", "tag"), ("ns.x/model", "namespace"), ("-model", "model"),
    ("a/b/c/d", "host"), ("/model", "namespace"), ("m:" + "x" * 81, "tag"),
    ("m" * 81, "model"), ("mo del", "model"), ("ns/mo:de:l", "model"),
])
def test_names_ollama_refuses_are_refused(text, part):
    with pytest.raises(ExportError, match=rf"its {part} is not valid"):
        OllamaName.parse(text)


def test_names_display_as_ollama_list_shows_them():
    assert OllamaName.parse("qwen3").shortest() == "qwen3:latest"
    assert OllamaName.parse("user/m:t").shortest() == "user/m:t"
    assert OllamaName.parse("hf.co/org/repo:Q4_K_M").shortest() == "hf.co/org/repo:Q4_K_M"


def test_the_store_is_ollama_models_else_the_home_one_else_the_services(
        tmp_path, monkeypatch):
    home, service = tmp_path / "home", tmp_path / "service"
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(ollama_store, "SERVICE_STORE", service)
    (service / "manifests").mkdir(parents=True)
    assert ollama_store.store_dir() == service
    (home / ".ollama" / "models" / "manifests").mkdir(parents=True)
    assert ollama_store.store_dir() == home / ".ollama" / "models"
    monkeypatch.setenv("OLLAMA_MODELS", str(service))
    assert ollama_store.store_dir() == service


def test_ollama_export_errors_are_one_line(store, tiny_gguf, tmp_path, monkeypatch, capsys):
    gguf = tiny_gguf.read_bytes()
    add_model(store, "registry.ollama.ai/library/lora/latest",
              [("model", gguf), ("adapter", b"GGUF lora")])
    add_model(store, "registry.ollama.ai/library/tensors/latest",
              [("tensor", b"weights"), ("tensor", b"more")])
    gone = add_model(store, "registry.ollama.ai/library/gone/latest", [("model", b"GGUF..")])
    (store / "blobs" / json.loads(gone.read_text())["layers"][0]["digest"]
     .replace(":", "-")).unlink()
    (store / "manifests/registry.ollama.ai/library/broken/latest").parent.mkdir(parents=True)
    (store / "manifests/registry.ollama.ai/library/broken/latest").write_text("{not json")
    (store / "manifests/registry.ollama.ai/library/nodigest/latest").parent.mkdir(parents=True)
    (store / "manifests/registry.ollama.ai/library/nodigest/latest").write_text(
        json.dumps({"layers": [{"mediaType": MEDIA + "model", "digest": "md5:0"}]}))
    cases = [
        ("ollama:nope:7b", f"ollama:nope:7b is not in the Ollama store {store} (`ollama pull "
         "nope:7b` fetches it); it holds: broken:latest, gone:latest, lora:latest, "
         "nodigest:latest, someone/other:v1, tensors:latest, tiny:latest"),
        ("ollama:Bad Name", "ollama:Bad Name is not an Ollama model name (its model is not "
         "valid): [host/][namespace/]model[:tag]"),
        ("ollama:lora", "ollama:lora:latest carries a LoRA adapter layer (ADAPTER in its "
         "Modelfile): export the adapter's PEFT folder with --adapter"),
        ("ollama:tensors", "holds tensor layers (Ollama's safetensors import), not a GGUF"),
        ("ollama:gone", "ollama:gone:latest: its model blob sha256-"),
        ("ollama:gone", f"is missing from {store / 'blobs'} (an interrupted pull?"),
        ("ollama:broken", "ollama:broken:latest: its manifest "),
        ("ollama:broken", "is malformed (not Ollama's JSON with layers of mediaType and "
         "sha256 digest)"),
        ("ollama:nodigest", "is malformed"),
    ]
    for source, fragment in cases:
        assert_one_line_error(cli_here(capsys, "export", source, "-o", tmp_path / "out"),
                              fragment)
    (tmp_path / "adapter").mkdir()  # the model by its name, not its blob's hash
    assert_one_line_error(cli_here(capsys, "export", "ollama:tiny", "--adapter",
                                   tmp_path / "adapter", "-o", tmp_path / "out"),
                          "not a GGUF file (ollama:tiny:latest's model)")
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "empty"))
    assert_one_line_error(cli_here(capsys, "export", "ollama:tiny", "-o", tmp_path / "out"),
                          f"OLLAMA_MODELS={tmp_path / 'empty'} is not an Ollama model store "
                          "(no manifests/ folder in it)")
    monkeypatch.delenv("OLLAMA_MODELS")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(ollama_store, "SERVICE_STORE", tmp_path / "service")
    assert_one_line_error(cli_here(capsys, "export", "ollama:tiny", "-o", tmp_path / "out"),
                          "no Ollama model store found: looked in ~/.ollama/models and "
                          f"{tmp_path / 'service'} (OLLAMA_MODELS is not set); set "
                          "OLLAMA_MODELS to the folder holding Ollama's manifests/ and blobs/")
    assert not (tmp_path / "out").exists()


def test_bad_ollama_parameters_are_one_line(store, tiny_gguf, tmp_path, capsys):
    add_model(store, "registry.ollama.ai/library/hot/latest",
              [("model", tiny_gguf.read_bytes()), ("params", b'{"temperature": -1}')])
    add_model(store, "registry.ollama.ai/library/list/latest",
              [("model", tiny_gguf.read_bytes()), ("params", b'["temperature"]')])
    add_model(store, "registry.ollama.ai/library/stops/latest",  # was a TypeError traceback
              [("model", tiny_gguf.read_bytes()), ("params", b'{"stop": [{"a": 1}]}')])
    for source, fragment in [
        ("ollama:hot", "ollama:hot:latest: its parameters: generation_config.json: "
         "temperature must be a finite number >= 0, got -1"),
        ("ollama:list", "ollama:list:latest: its params layer is not a JSON object"),
        ("ollama:stops", "ollama:stops:latest: its parameters: stop must be a string or a "
         "list of strings"),
    ]:
        assert_one_line_error(cli_here(capsys, "export", source, "-o", tmp_path / "out",
                                       "--quiet"), fragment)
    assert not [p for p in tmp_path.iterdir() if ".gguf-" in p.name]  # no staging left


def test_export_help_names_the_ollama_form(capsys):
    result = cli_here(capsys, "export", "--help")
    assert result.returncode == 0
    assert "ollama:NAME[:TAG]" in result.stdout
    assert "edgeprefill export ollama:qwen3:0.6b -o build/qwen3" in result.stdout


def test_a_name_finds_its_model_whatever_its_case_and_a_vision_projector_is_left_out(
        store, tiny_gguf, caplog):
    """As Ollama's EqualFold: `Tiny` is `tiny`; an image-text model's projector layer is
    not exported (the bundle is text-only), with a warning."""
    assert ollama_store.resolve("ollama:Tiny:LATEST").name.shortest() == "tiny:latest"
    add_model(store, "registry.ollama.ai/library/vision/latest",
              [("model", tiny_gguf.read_bytes()), ("projector", b"GGUF mmproj")])
    model = ollama_store.resolve("ollama:vision")
    assert model.gguf.read_bytes() == tiny_gguf.read_bytes()
    assert "ollama:vision:latest: its vision projector layer is left out: the bundle is " \
           "text-only" in caplog.text


def test_an_ollama_export_is_served_under_its_name_with_its_parameters_as_defaults(
        store, tmp_path):
    """The walk `export ollama:tiny` -> `serve` -> the `ollama` client: the bundle answers
    to `tiny` (it answered to its folder's name, a 404 for Ollama's clients), its
    Modelfile's parameters are the defaults of Ollama's routes and OpenAI's alike, and
    a request's `options` override them; /api/show lists them (it listed none). Its
    SYSTEM is the system message of every route's chat that brings none (the prompt's
    token count is the plain GGUF's bundle's for the chat with SYSTEM first), and
    generate's `system` replaces it, as in Ollama."""
    ollama = pytest.importorskip("ollama")
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    from edgeprefill.bundle import load_manifest
    from edgeprefill.cli.serve_cmd import served_name
    from edgeprefill.sdk.tokenizer import BundleTokenizer
    from edgeprefill.server import ServerConfig, ServerThread, create_app
    from tests.test_serve import free_port

    bundle = exported("ollama:tiny", tmp_path / "b")
    assert served_name(bundle) == "tiny"
    plain = exported(tiny_gguf_of(store), tmp_path / "plain")
    assert served_name(plain) == "plain"
    reference = BundleTokenizer(plain, load_manifest(plain))  # no default system message
    with Engine.load(bundle, threads=2, kv_slots=2) as engine:
        greedy = engine.generate(PROMPT, GenerationParams(
            temperature=0, max_new_tokens=NEW_TOKENS, ignore_eos=True)).result().text
        app = create_app(engine, ServerConfig(model_name=served_name(bundle)))
        with ServerThread(app, port=free_port()) as server:
            client = ollama.Client(host=server.url)
            assert [m.model for m in client.list().models] == ["tiny:latest"]
            assert client.show("tiny").parameters.splitlines() == [
                f"{name:<30} {value}" for name, value in (
                    ("temperature", "1.5"), ("top_k", "1"), ("top_p", "0.9"),
                    ("repeat_penalty", "1"))]  # as Ollama's `show` writes them (Go's %#v)
            options = {"num_predict": NEW_TOKENS, "ignore_eos": True, "seed": 3}
            # top_k 1 (the Modelfile's) makes its temperature 1.5 greedy
            reply = client.generate(model="tiny", prompt=PROMPT, raw=True, options=options)
            assert reply.response == greedy
            completion = httpx.post(f"{server.url}/v1/completions", json={
                "model": "tiny", "prompt": PROMPT, "max_tokens": NEW_TOKENS, "seed": 3,
                "ignore_eos": True}).json()
            assert completion["choices"][0]["text"] == greedy
            sampled = client.generate(model="tiny:latest", prompt=PROMPT, raw=True,
                                      options={**options, "top_k": 0})
            assert sampled.response != greedy
            # (the ollama client's ShowResponse has no field for api/types.go's `system`)
            shown = httpx.post(f"{server.url}/api/show", json={"model": "tiny"}).json()
            assert shown["system"] == SYSTEM
            assert_the_system_message_is_the_default(client, server.url, reference)


def assert_the_system_message_is_the_default(client, url: str, reference) -> None:
    """Each chat route's prompt tokens, without a system message and with one ("w3"), are
    the reference's for the chat with SYSTEM first and with "w3" first."""
    import httpx

    user = [{"role": "user", "content": "w4 w5"}]
    for system in (None, "w3"):
        first = [{"role": "system", "content": system or SYSTEM}]
        want = len(reference.encode([*first, *user]))
        mine = [] if system is None else first
        one = {"num_predict": 1}
        counts = {
            "ollama chat": client.chat(model="tiny", messages=[*mine, *user],
                                       options=one).prompt_eval_count,
            "ollama generate": client.generate(model="tiny", prompt="w4 w5", system=system,
                                               options=one).prompt_eval_count,
            "openai chat": httpx.post(f"{url}/v1/chat/completions", json={
                "model": "tiny", "messages": [*mine, *user], "max_tokens": 1}
            ).json()["usage"]["prompt_tokens"],
            "anthropic messages": httpx.post(f"{url}/v1/messages", json={
                "model": "tiny", "messages": user, "max_tokens": 1,
                **({} if system is None else {"system": system})}
            ).json()["usage"]["input_tokens"],
        }
        assert counts == dict.fromkeys(counts, want), (system, want)


def tiny_gguf_of(store: Path) -> Path:
    """The largest blob of the store: the GGUF file of its models."""
    return max((store / "blobs").iterdir(), key=lambda p: p.stat().st_size)
