"""Chat templates render exactly as transformers' apply_chat_template renders them, and a
template that fails is a one-line RequestError (a 400 from the server, refused at export)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest

from edgeprefill.errors import ExportError, RequestError
from edgeprefill.sdk import chat_template as chat_template_module
from edgeprefill.sdk.chat_template import (
    ChatTemplate,
    check_export_template,
    special_tokens,
    template_source,
    with_default_system,
)
from tests.chat_templates import FEATURES, PUBLISHED
from tests.conftest import TINY_MODEL, write_tokenizer

TOKENS = {
    "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
    "sep_token": "<sep>", "cls_token": "<cls>", "mask_token": "<mask>",
    "tool_token": "<tool>",  # any other *_token string is a template variable too
    "extra_special_tokens": {"image_token": "<img>"},
}
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        # Key order, HTML characters and non-ASCII text must come through tojson untouched.
        "description": "Weather <now> & 'later' in a city, e.g. Zürich or 東京",
        "parameters": {"type": "object", "required": ["city"],
                       "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}},
    },
}]
DOCUMENTS = [{"title": "Doc <1>", "text": "Säntis is 2502 m high."},
             {"title": "Doc 2", "text": "Über & unter"}]
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "  Hello <there> & welcome  "},
    {"role": "assistant", "content": "Hi!"},
    {"role": "user", "content": "What's the weather in Zürich?"},
]
TOOL_CHAT = [
    {"role": "user", "content": "Weather in Bern?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"unit": "c", "city": "Bern"}}}]},
    {"role": "tool", "content": "12 degrees"},
    {"role": "user", "content": "Thanks"},
]
ALTERNATING = CHAT[1:]  # Gemma and Mistral refuse a system turn in some versions


class FrozenDatetime(dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(2031, 2, 3, 4, 5, 6)


@pytest.fixture
def frozen_time(monkeypatch):
    """Both renderers see the same `now` (strftime_now), whatever the clock says."""
    from transformers.utils import chat_template_utils

    monkeypatch.setattr(chat_template_utils, "datetime", FrozenDatetime)
    monkeypatch.setattr(chat_template_module, "datetime", FrozenDatetime)


def checkpoint(path: Path, template: str, tokens: dict | None = None) -> Path:
    """A tokenizer folder as save_pretrained writes it, with this template."""
    path.mkdir(parents=True, exist_ok=True)
    write_tokenizer(path)
    config = {**(TOKENS if tokens is None else tokens), "chat_template": template}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def both(folder: Path, messages, **kwargs) -> tuple[str, str]:
    """(transformers' rendering, ours) of the same call. add_generation_prompt is always
    given: its default differs (transformers: False, ours: True, for serving)."""
    from transformers import PreTrainedTokenizerFast

    kwargs.setdefault("add_generation_prompt", True)

    reference = PreTrainedTokenizerFast.from_pretrained(str(folder)).apply_chat_template(
        messages, tokenize=False, **kwargs)
    ours = ChatTemplate(template_source(folder), special_tokens(folder))
    return reference, ours.render(messages, **kwargs)


FEATURE_CALLS = {
    "plain": dict(messages=CHAT, add_generation_prompt=True),
    "no-generation-prompt": dict(messages=CHAT, add_generation_prompt=False),
    "tools-documents-extra": dict(
        messages=CHAT, add_generation_prompt=True, tools=TOOLS, documents=DOCUMENTS,
        enable_thinking=True, mode="rag"),
    "loop-controls": dict(messages=[
        {"role": "user", "content": "a"}, {"role": "skip", "content": "hidden"},
        {"role": "assistant", "content": "b"}, {"role": "stop", "content": "x"},
        {"role": "user", "content": "never shown"}], add_generation_prompt=True),
    "none-dropped-list-content-reasoning": dict(messages=[
        {"role": "user", "content": [{"type": "text", "text": "parts <b>"}]},
        {"role": "assistant", "content": None, "reasoning_content": "hmm",
         "tool_calls": [{"function": {"name": "f", "arguments": {"b": 1, "a": "é"}}}]},
        {"role": "user", "content": "ok"}], add_generation_prompt=True),
    "extra-overrides-special-token": dict(messages=CHAT, bos_token="[BOS]"),
}


@pytest.mark.parametrize("call", FEATURE_CALLS, ids=list(FEATURE_CALLS))
def test_every_template_feature_renders_as_transformers_renders_it(tmp_path, frozen_time, call):
    folder = checkpoint(tmp_path, FEATURES)
    kwargs = dict(FEATURE_CALLS[call])
    reference, ours = both(folder, kwargs.pop("messages"), **kwargs)
    assert ours == reference
    assert "today=2031-02-03" in ours


def test_the_feature_template_really_uses_its_features(tmp_path, frozen_time):
    """Guards the comparison above against a template that silently renders nothing."""
    folder = checkpoint(tmp_path, FEATURES)
    _, ours = both(folder, CHAT, add_generation_prompt=True, tools=TOOLS, documents=DOCUMENTS,
                   enable_thinking=True)
    assert "<s>[</s>|<pad>|<unk>|<sep>|<cls>|<mask>|<img>|<tool>]" in ours
    assert '"description": "Weather <now> & \'later\' in a city, e.g. Zürich or 東京"' in ours
    assert '{"type": "function", "function": {"name": "get_weather"' in ours  # not sorted
    assert '\n  "type": "function",' in ours  # indent=2
    assert 'opts={"mode": "plain", "think": true}' in ours
    assert "turns=4 last=user" in ours and ours.endswith("<assistant>")


@pytest.mark.parametrize("style", PUBLISHED)
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_published_template_styles_render_as_transformers(
        tmp_path, frozen_time, style, generation_prompt):
    folder = checkpoint(tmp_path, PUBLISHED[style])
    chats = [ALTERNATING] if style in ("gemma", "mistral") else [CHAT, ALTERNATING]
    for messages in chats:
        reference, ours = both(folder, messages, add_generation_prompt=generation_prompt)
        assert ours == reference


@pytest.mark.parametrize("style", ["chatml", "llama3.1"])
def test_tool_calling_templates_render_tools_and_tool_turns_as_transformers(
        tmp_path, frozen_time, style):
    folder = checkpoint(tmp_path, PUBLISHED[style])
    reference, ours = both(folder, TOOL_CHAT, tools=TOOLS, add_generation_prompt=True)
    assert ours == reference
    assert "get_weather" in ours


def test_llama31_renders_todays_date_and_a_caller_date_wins(tmp_path):
    folder = checkpoint(tmp_path, PUBLISHED["llama3.1"])
    template = ChatTemplate(template_source(folder), special_tokens(folder))
    before = dt.datetime.now().strftime("%d %b %Y")
    text = template.render(ALTERNATING)
    after = dt.datetime.now().strftime("%d %b %Y")
    assert f"Today Date: {before}" in text or f"Today Date: {after}" in text
    assert "Today Date: 01 Jan 2030" in template.render(ALTERNATING, date_string="01 Jan 2030")


@pytest.mark.parametrize("style,messages,message", [
    ("gemma", CHAT[1:2] * 2, "Conversation roles must alternate user/assistant/user/assistant/..."),
    ("llama3.1", [{"role": "assistant", "content": None, "tool_calls": [{}, {}]}],
     "This model only supports single tool-calls at once!"),
])
def test_raise_exception_is_a_request_error_with_the_templates_message(
        tmp_path, style, messages, message):
    from jinja2.exceptions import TemplateError
    from transformers import PreTrainedTokenizerFast

    folder = checkpoint(tmp_path, PUBLISHED[style])
    with pytest.raises(TemplateError, match="^" + message.replace(".", r"\.") + "$"):
        PreTrainedTokenizerFast.from_pretrained(str(folder)).apply_chat_template(
            messages, tokenize=False)
    with pytest.raises(RequestError) as err:
        ChatTemplate(template_source(folder), special_tokens(folder)).render(messages)
    assert str(err.value) == f"chat template: {message}"


@pytest.mark.parametrize("source,message", [
    ("{% for m in messages %}{{ m.content }}", "Unexpected end of template"),
    ("{{ messages[0].content + 1 }}", 'TypeError: can only concatenate str (not "int") to str'),
    ("{{ ''.__class__.__mro__ }}", "access to attribute '__class__' of 'str' object is unsafe"),
    ("{{ x.y }}", "'x' is undefined"),
    ("{% set ns = namespace() %}{% set ns._x = 1 %}", "underscore-prefixed attributes"),
    ("{{ messages.append(1) }}", "attribute 'append' of 'list' object is unsafe"),  # immutable
])
def test_a_failing_template_is_one_line_naming_what_failed(source, message):
    template = ChatTemplate(source, {})
    with pytest.raises(RequestError) as err:
        template.render([{"role": "user", "content": "hi"}])
    text = str(err.value)
    assert text.startswith("chat template: ") and message in text and "\n" not in text


def test_bad_messages_tools_and_documents_are_request_errors():
    template = ChatTemplate("{{ messages }}", {})
    for bad in ([], "hi", ["hi"]):
        with pytest.raises(RequestError, match="message"):
            template.render(bad)
    with pytest.raises(RequestError, match="tools must be a list of JSON objects"):
        template.render(CHAT, tools=["get_weather"])
    with pytest.raises(RequestError, match="documents must be a list of JSON objects"):
        template.render(CHAT, documents={"title": "x"})
    # Not iterable at all: had been "chat template: TypeError: 'int' object is not iterable"
    for name in ("tools", "documents"):
        with pytest.raises(RequestError, match=f"^chat template {name} must be a list of JSON "
                                               "objects$"):
            template.render(CHAT, **{name: 5})


def test_special_tokens_come_from_both_files_with_tokenizer_config_winning(tmp_path):
    folder = checkpoint(tmp_path, "x", {"bos_token": "<s>", "pad_token": "<pad>",
                                        "add_bos_token": True})
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": {"content": "<old>", "lstrip": False}, "unk_token": {"content": "<unk>"},
        "mask_token": "<mask>"}))
    assert special_tokens(folder, {"eos_token": "</s>", "sep_token": None}) == {
        "eos_token": "</s>", "bos_token": "<s>", "unk_token": "<unk>", "mask_token": "<mask>",
        "pad_token": "<pad>"}


def test_named_templates_take_the_default_one(tmp_path):
    folder = checkpoint(tmp_path, "x")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "T"},
                               {"name": "default", "template": "D"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert template_source(folder) == "D"
    (folder / "chat_template.jinja").write_text("J")  # the separate file wins
    assert template_source(folder) == "J"


# -- the runtime and export paths --------------------------------------------------------


def test_bundle_tokenizer_passes_keywords_through_to_the_template(bundle):
    from edgeprefill.bundle import load_manifest
    from edgeprefill.sdk.tokenizer import BundleTokenizer

    path = bundle("llama")
    tokenizer = BundleTokenizer(path, load_manifest(path))
    plain = tokenizer.render_chat([{"role": "user", "content": "hi"}])
    assert plain == tokenizer.chat_template.render([{"role": "user", "content": "hi"}])
    bare = tokenizer.render_chat([{"role": "user", "content": "hi"}],
                                 add_generation_prompt=False)
    assert plain.startswith(bare) and plain != bare


def test_export_refuses_a_template_that_fails_on_a_sample_chat_in_one_line(tmp_path):
    from edgeprefill.export.exporter import ExportOptions, export

    hf = tmp_path / "hf"
    shutil.copytree(TINY_MODEL, hf)
    (hf / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((hf / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% if messages | length > 2 %}{{ raise_exception('only one " \
                              "turn, please') }}{% endif %}"
    (hf / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError) as err:
        export(hf, tmp_path / "out", ExportOptions(show_progress=False))
    assert str(err.value).endswith("fails on a sample conversation (user, assistant, user): "
                                   "only one turn, please")
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_published_templates_pass_the_export_check(tmp_path):
    for style, source in PUBLISHED.items():
        check_export_template(checkpoint(tmp_path / style, source))  # no error


@pytest.mark.parametrize("source,message", [
    ("{{ raise_exception('no system turns, please') }}", "chat template: no system turns, please"),
    ("{% for m in messages %}{{ m.content }}", "chat template: Unexpected end of template"),
    ("{{ messages[0].content + 1 }}", "chat template: TypeError: can only concatenate str"),
])
def test_server_answers_400_with_the_templates_message_and_keeps_serving(
        bundle, tmp_path, source, message):
    from tests.bundle_variants import serve, variant

    path = variant(bundle("llama"), tmp_path / "b", chat_template=source)
    with serve(path) as (_, http):
        chat = {"messages": [{"role": "user", "content": "w5"}], "max_tokens": 2}
        response = http.post("/v1/chat/completions", json=chat)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["message"].startswith(message) and error["param"] == "messages"
        assert "Traceback" not in response.text
        text = http.post("/v1/completions", json={"prompt": "w5", "max_tokens": 2})
        assert text.status_code == 200  # text prompts still work with a broken template


def test_cli_chat_with_a_failing_template_is_one_line(bundle, tmp_path):
    from tests.bundle_variants import variant
    from tests.test_cli_errors import assert_one_line_error, cli

    path = variant(bundle("llama"), tmp_path / "b",
                   chat_template="{{ raise_exception('roles must alternate') }}")
    result = cli("run", path, "--prompt", "w5", "--chat", "--max-new-tokens", "2")
    assert_one_line_error(result, "chat template: roles must alternate")


def test_chat_token_ids_match_transformers_for_the_shipped_model(tiny_bundle):
    from transformers import PreTrainedTokenizerFast

    from edgeprefill.bundle import load_manifest
    from edgeprefill.sdk.tokenizer import BundleTokenizer

    messages = [{"role": "user", "content": "the secret is jade ."},
                {"role": "assistant", "content": "jade"},
                {"role": "user", "content": "what was the secret ?"}]
    reference = PreTrainedTokenizerFast.from_pretrained(str(TINY_MODEL)).apply_chat_template(
        messages, add_generation_prompt=True)["input_ids"]
    ours = BundleTokenizer(tiny_bundle, load_manifest(tiny_bundle)).encode(messages)
    assert ours == reference and len(ours) > 10


@pytest.mark.parametrize(("messages", "first"), [
    ([{"role": "user", "content": "hi"}], "w3"),  # none of its own: the default first
    # Ollama looks at the role alone: a developer message is not a system one
    ([{"role": "developer", "content": "d"}, {"role": "user", "content": "hi"}], "w3"),
    ([{"role": "system", "content": "mine"}, {"role": "user", "content": "hi"}], "mine"),
    ([{"role": "system", "content": ""}, {"role": "user", "content": "hi"}], ""),  # off
])
def test_the_default_system_message_goes_first_where_a_chat_has_none(messages, first):
    out = with_default_system(messages, "w3")
    assert out[0]["content"] == first and out[0]["role"] == "system"
    assert list(out[-len(messages):]) == messages  # the chat's own, as they were
    assert with_default_system(messages, None) is messages  # no default: as before


@pytest.mark.parametrize("messages", [[], "hi", [5], None])
def test_a_malformed_or_empty_chat_gets_no_default_render_s_checks_refuse_it(messages):
    assert with_default_system(messages, "w3") is messages


def test_a_number_a_float_cannot_hold_renders_as_it_was_written():
    """A tool call's arguments sent back keep `1e400` (edgeprefill/json_numbers.py): the
    template writes it so through tojson (any options), as a value and as a string, where
    json.loads and transformers would write `Infinity` or `inf`; other values as json."""
    from edgeprefill import json_numbers

    arguments = json_numbers.loads('{"days": 1e400, "n": [-1e-999, 2.5]}')
    source = ("{% set a = messages[0].tool_calls[0].function.arguments %}"
              "{{ a | tojson }}|{{ a | tojson(indent=1) }}|{{ a.days }}|{{ a.n[0] | string }}")
    call = {"type": "function", "function": {"name": "f", "arguments": arguments}}
    text = ChatTemplate(source, {}).render([{"role": "assistant", "tool_calls": [call]}])
    indented = json.dumps({"days": "D", "n": ["N", 2.5]}, indent=1) \
        .replace('"D"', "1e400").replace('"N"', "-1e-999")
    assert text == f'{{"days": 1e400, "n": [-1e-999, 2.5]}}|{indented}|1e400|-1e-999'
