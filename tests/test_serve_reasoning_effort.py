"""`reasoning_effort` (chat) and `reasoning.effort` (Responses) reach the chat template as
vLLM passes them: the variable `reasoning_effort`, and `enable_thinking` false for
"none"; chat_template_kwargs overrides either.

The bundle's template ends the prompt with one word saying what it was given, and the
scripted model repeats the prompt's last word, so a one-token reply is what the template
rendered: no access to the prompt is needed, and the route under test is the real one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.sdk.chat_template import ChatTemplate  # noqa: E402
from edgeprefill.server import ServerThread  # noqa: E402
from edgeprefill.server.schemas import REASONING_EFFORTS, template_kwargs  # noqa: E402
from tests.conftest import follow_tokens, top_word_id, word_bundle  # noqa: E402
from tests.test_serve import MODEL, assert_error, serving  # noqa: E402

EOS = 2
# What the template may end with: the effort (or "unset"), "-off" when thinking is off.
WORDS = [f"{effort}{off}" for effort in (*REASONING_EFFORTS, "unset") for off in ("", "-off")]
TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }} ; {% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
    "{{ reasoning_effort | default('unset') }}"
    "{% if enable_thinking is defined and not enable_thinking %}-off{% endif %}"
)
QUESTION = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(hf_model, tmp_path_factory) -> Iterator[ServerThread]:
    out = word_bundle(hf_model, tmp_path_factory, "effort", WORDS, TEMPLATE)
    engine = Engine.load(out, threads=1, kv_slots=2)
    word_ids = [top_word_id(WORDS, w) for w in WORDS]
    follow_tokens(engine, dict(zip(word_ids, word_ids, strict=True)), EOS)  # an echo
    with serving(engine) as server:
        yield server
    engine.close()


def rendered(client, **fields) -> str:
    """The word the template ended the chat prompt with."""
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                           max_tokens=1, extra_body=fields)
    return reply.choices[0].message.content


@pytest.mark.parametrize("effort", REASONING_EFFORTS)
def test_chat_reasoning_effort_reaches_the_template_with_thinking_off_for_none(client,
                                                                               effort):
    assert rendered(client) == "unset"  # the field absent: neither variable
    expected = f"{effort}-off" if effort == "none" else effort
    assert rendered(client, reasoning_effort=effort) == expected


def test_chat_template_kwargs_override_what_reasoning_effort_implies(client):
    assert rendered(client, reasoning_effort="low",
                    chat_template_kwargs={"reasoning_effort": "high"}) == "high"
    assert rendered(client, reasoning_effort="none",
                    chat_template_kwargs={"enable_thinking": True}) == "none"
    assert rendered(client, reasoning_effort="high",
                    chat_template_kwargs={"enable_thinking": False}) == "high-off"


@pytest.mark.parametrize("effort", ["low", "none"])
def test_responses_reasoning_effort_is_the_chat_routes(client, effort):
    reply = client.responses.create(model=MODEL, input="hi", temperature=0,
                                    max_output_tokens=1, reasoning={"effort": effort})
    assert reply.output_text == rendered(client, reasoning_effort=effort)
    without = client.responses.create(model=MODEL, input="hi", temperature=0,
                                      max_output_tokens=1, reasoning={"summary": "auto"})
    assert without.output_text == "unset"


@pytest.mark.parametrize("value", ["extreme", "HIGH", "", 3, ["low"], {"effort": "low"}])
def test_a_reasoning_effort_outside_openais_values_is_a_400_naming_the_field(server, value):
    chat = httpx.post(f"{server.url}/v1/chat/completions",
                      json={"messages": QUESTION, "reasoning_effort": value})
    assert "'reasoning_effort' must be one of" in \
        assert_error(chat, 400, "reasoning_effort")["message"]
    responses = httpx.post(f"{server.url}/v1/responses",
                           json={"input": "hi", "reasoning": {"effort": value}})
    assert "'reasoning.effort' must be one of" in \
        assert_error(responses, 400, "reasoning.effort")["message"]


@pytest.mark.parametrize("value", ["low", [], {}, ""])
def test_completions_refuse_reasoning_effort_as_a_chat_field(server, value):
    response = httpx.post(f"{server.url}/v1/completions",
                          json={"prompt": "hi", "reasoning_effort": value})
    assert "chat field" in assert_error(response, 400, "reasoning_effort")["message"]


@pytest.mark.parametrize(("field", "value"), [
    ("reasoning_effort", "bogus"), ("reasoning_effort", "low"), ("tools", [{"type": "x"}]),
    ("chat_template_kwargs", {"enable_thinking": False}), ("add_generation_prompt", True)])
def test_tokenize_refuses_chat_fields_beside_a_plain_prompt(server, field, value):
    """They are read only through the chat template; with `prompt` they were ignored, an
    invalid reasoning_effort included, where the chat route refuses it."""
    for text in ("prompt", "content"):
        response = httpx.post(f"{server.url}/tokenize", json={text: "hi", field: value})
        assert "is a chat field: send 'messages'" in assert_error(response, 400, field)["message"]
    plain = httpx.post(f"{server.url}/tokenize", json={"prompt": "hi", "tools": []})
    assert plain.status_code == 200  # an empty tools list, as clients send by habit


def test_tokenize_renders_what_the_chat_route_would(server):
    body = {"messages": QUESTION, "reasoning_effort": "none", "return_token_strs": True}
    tokens = httpx.post(f"{server.url}/tokenize", json=body).json()["token_strs"]
    assert tokens[-1] == "none-off"


def test_a_template_that_reads_neither_variable_renders_unchanged():
    unread = ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }} ; "
                          "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}",
                          {})
    for effort in REASONING_EFFORTS:
        kwargs = template_kwargs({"reasoning_effort": effort})
        assert unread.render(QUESTION, add_generation_prompt=True, **kwargs) == \
            unread.render(QUESTION, add_generation_prompt=True) == "user: hi ; assistant:"
