"""A thinking budget (GenerationParams.thinking_budget, sdk/thinking_budget.py): once a
reply's reasoning has used N tokens without closing, its `</think>` is forced one token per
step, and the reply goes on as the model's own continuation.

The reference is the model itself, unforced: the budgeted reply must be the unbudgeted
greedy run's first N reasoning tokens, then exactly the closing tokens, then what greedy
decoding makes of the prompt with those tokens appended (a fresh run that prefills them):
so the forced tokens went through the decode path and the KV cache as any other.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from edgeprefill.errors import RequestError
from edgeprefill.sdk import Engine, GenerationParams
from edgeprefill.sdk.constraints import Constraint
from edgeprefill.sdk.thinking_budget import FORCED_CLOSE
from tests.conftest import follow_tokens, top_word_id, word_bundle

EOS = 2
THOUGHT = ["<think>", "hmm,", "so", "it", "rains", "</", "##think>"]  # closed in two tokens
ANSWER = ["It", "is", "sunny."]
WORDS = ["assistant:", "</think>", "<think>", "hmm,", "so", "it", "rains", "</", "##think>",
         "It", "is", "sunny."]
# The prompt ends in "assistant:" (the model opens its block, as Qwen3's does) or in
# "<think>" (the template opened it, as DeepSeek-R1's does).
TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }} ; {% endfor %}"
            "{% if add_generation_prompt %}assistant: "
            "{% if open_think %}<think>{% endif %}{% endif %}")
QUESTION = [{"role": "user", "content": "weather in Paris ?"}]
GREEDY = {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True}


def word_id(word: str) -> int:
    return top_word_id(WORDS, word)


@pytest.fixture(scope="module")
def thinking_bundle(hf_model, tmp_path_factory):
    return word_bundle(hf_model, tmp_path_factory, "budget", WORDS, TEMPLATE)


@pytest.fixture(scope="module")
def model(thinking_bundle) -> Iterator[Engine]:
    """The random model, unscripted: it chooses its own tokens."""
    engine = Engine.load(thinking_bundle, threads=1, kv_slots=2)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def scripted(thinking_bundle) -> Iterator[Engine]:
    """Greedy decoding follows THOUGHT then ANSWER after "assistant:", and answers after
    a `</think>` (the forced one too)."""
    engine = Engine.load(thinking_bundle, threads=1, kv_slots=2)
    script = [word_id(w) for w in ("assistant:", *THOUGHT, *ANSWER)]
    following = dict(zip(script, [*script[1:], EOS], strict=True))
    following[word_id("</think>")] = word_id(ANSWER[0])
    follow_tokens(engine, following, EOS)
    yield engine
    engine.close()


def prompt(engine: Engine, open_think: bool) -> list[int]:
    kwargs = {"open_think": True} if open_think else {}
    return engine.tokenizer.encode(QUESTION, **kwargs)


def run(engine: Engine, tokens: list[int], **params) -> list[int]:
    stream = engine.submit(tokens, GenerationParams(**{**GREEDY, **params}), 0, None)
    return stream.result().token_ids


@pytest.mark.parametrize("budget", [0, 1, 7])
def test_a_budget_forces_the_close_then_the_model_continues_that_prefix(model, budget):
    tokens = prompt(model, open_think=True)
    close = model.tokenizer.encode_plain(FORCED_CLOSE)
    assert close == [word_id("</think>")]  # the word tokenizer keeps only the tag
    free = run(model, tokens)
    assert word_id("</think>") not in free[:budget + 1]  # the model would think on
    forced = run(model, tokens, thinking_budget=budget)
    head = free[:budget] + close
    assert forced[:len(head)] == head
    continuation = run(model, tokens + head, max_new_tokens=GREEDY["max_new_tokens"]
                       - len(head))
    assert forced == head + continuation
    assert forced != free


def test_a_budget_the_reply_does_not_reach_changes_nothing(model):
    tokens = prompt(model, open_think=True)
    free = run(model, tokens)
    assert run(model, tokens, thinking_budget=GREEDY["max_new_tokens"]) == free


@pytest.mark.parametrize("open_think", [False, True], ids=["model-opens", "prompt-opens"])
def test_reasoning_within_the_budget_is_left_alone(scripted, open_think):
    tokens = prompt(scripted, open_think)
    free = run(scripted, tokens, ignore_eos=False)
    reasoning = len(THOUGHT) - 1  # "<think>" opens the block; it is no reasoning token
    assert free == [word_id(w) for w in [*THOUGHT, *ANSWER][1 if open_think else 0:]]
    for budget in (reasoning, reasoning + 1, 1000):
        assert run(scripted, tokens, ignore_eos=False, thinking_budget=budget) == free


@pytest.mark.parametrize("open_think", [False, True], ids=["model-opens", "prompt-opens"])
def test_one_token_short_of_its_close_the_model_is_closed_for_it(scripted, open_think):
    """The model's own `</think>` takes two tokens ("</", "##think>"): a budget one short
    forces the tag after "</", and the scripted model answers after it."""
    tokens = prompt(scripted, open_think)
    reasoning = len(THOUGHT) - 1
    forced = run(scripted, tokens, ignore_eos=False, thinking_budget=reasoning - 1)
    words = [*THOUGHT[:-1], "</think>", *ANSWER][1 if open_think else 0:]
    assert forced == [word_id(w) for w in words]
    text = scripted.tokenizer.decode(forced)
    assert text.endswith("</ </think> It is sunny.")


def test_a_budget_needs_think_tags_and_no_constraint(bundle):
    with pytest.raises(RequestError, match="^thinking_budget must be an integer >= 0$"):
        GenerationParams(thinking_budget=-1)
    with pytest.raises(RequestError, match="cannot be combined with a constraint"):
        GenerationParams(thinking_budget=8, constraint=Constraint.regex("[a-z]+"))
    with Engine.load(bundle("llama"), threads=1, kv_slots=1) as engine:  # no think tags
        with pytest.raises(RequestError, match="thinking_budget needs a model that thinks") \
                as err:
            engine.generate("w5 w6", GenerationParams(thinking_budget=4))
    assert "\n" not in str(err.value) and err.value.field == "thinking_budget"


# -- the server ---------------------------------------------------------------------------


def serve(engine: Engine, **config):
    pytest.importorskip("starlette")
    from edgeprefill.server import ServerConfig, ServerThread, create_app
    from tests.test_serve import MODEL, free_port

    app = create_app(engine, ServerConfig(model_name=MODEL, **config))
    server = ServerThread(app, port=free_port())
    server.api = app.state.api  # type: ignore[attr-defined]
    return server


@pytest.fixture(scope="module")
def server(scripted):
    with serve(scripted) as server:
        yield server


@pytest.fixture(scope="module")
def http(server):
    httpx = pytest.importorskip("httpx")
    with httpx.Client(base_url=server.url) as client:
        yield client


CHAT = {"messages": QUESTION, "temperature": 0, "max_tokens": 32}
CAPPED = {"reasoning_content": "hmm, so", "content": "It is sunny."}  # a budget of 2
WHOLE = {"reasoning_content": "hmm, so it rains", "content": "It is sunny."}


def message(reply: dict) -> dict:
    got = reply["choices"][0]["message"]
    return {"reasoning_content": got.get("reasoning_content", ""), "content": got["content"]}


def test_the_messages_api_enforces_budget_tokens(http, scripted):
    body = {"messages": QUESTION, "max_tokens": 32, "temperature": 0,
            "thinking": {"type": "enabled", "budget_tokens": 2}}
    reply = http.post("/v1/messages", json=body).json()
    thought, said = reply["content"]
    assert thought["type"] == "thinking" and said == {"type": "text", "text": "It is sunny."}
    assert thought["thinking"] == "hmm, so"
    assert len(scripted.tokenizer.encode_plain(thought["thinking"])) <= 2
    body["thinking"]["budget_tokens"] = 1000
    assert http.post("/v1/messages", json=body).json()["content"][0]["thinking"] == \
        WHOLE["reasoning_content"]


def test_chat_and_responses_take_vllm_s_thinking_token_budget(http):
    reply = http.post("/v1/chat/completions", json={**CHAT, "thinking_token_budget": 2})
    assert message(reply.json()) == CAPPED
    response = http.post("/v1/responses", json={
        "input": "weather in Paris ?", "temperature": 0, "thinking_token_budget": 2}).json()
    reasoning, said = response["output"]
    assert reasoning["content"][0]["text"] == "hmm, so"
    assert said["content"][0]["text"] == "It is sunny."


def test_serve_s_reasoning_budget_is_the_default_a_request_overrides(scripted):
    import httpx

    with serve(scripted, reasoning_budget=2) as server:
        chat = f"{server.url}/v1/chat/completions"
        assert message(httpx.post(chat, json=CHAT).json()) == CAPPED
        free = httpx.post(chat, json={**CHAT, "thinking_token_budget": 100}).json()
        assert message(free) == WHOLE
        # A grammar governs a constrained reply (this word tokenizer can take none): the
        # server's default stays out of it.
        api = server.api
        params = GenerationParams(constraint=Constraint.regex("[a-z]+"))
        assert api._thinking_budget(params, chat=True).thinking_budget is None
        assert api._thinking_budget(GenerationParams(), chat=True).thinking_budget == 2
        assert api._thinking_budget(GenerationParams(), chat=False).thinking_budget is None


def test_a_bundle_without_think_tags_ignores_the_budget_it_cannot_apply(bundle):
    pytest.importorskip("starlette")
    from edgeprefill.server import ServerConfig, create_app

    with Engine.load(bundle("llama"), threads=1, kv_slots=1) as engine:
        api = create_app(engine, ServerConfig(model_name="m", reasoning_budget=4)).state.api
        assert api._thinking_budget(GenerationParams(thinking_budget=8),
                                    chat=True).thinking_budget is None
    with pytest.raises(RequestError, match="^reasoning_budget must be an integer >= -1"):
        ServerConfig(model_name="m", reasoning_budget=-2)


@pytest.mark.parametrize(("route", "body", "param"), [
    ("/v1/chat/completions", {**CHAT, "thinking_token_budget": -1}, "thinking_token_budget"),
    # With thinking off the grammar governs the whole reply (with it on, it holds the
    # answer after the block, which a budget closes: tests/test_serve_think_first.py).
    ("/v1/chat/completions", {**CHAT, "thinking_token_budget": 4, "guided_regex": "[a-z]+",
                              "chat_template_kwargs": {"enable_thinking": False}},
     "thinking_token_budget"),
    ("/v1/messages", {"messages": QUESTION, "max_tokens": 8, "tool_choice": {"type": "any"},
                      "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                      "thinking": {"type": "enabled", "budget_tokens": 4}},
     "thinking.budget_tokens"),
])
def test_a_budget_the_reply_cannot_have_is_a_400_in_one_line(http, route, body, param):
    reply = http.post(route, json=body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error.get("param", param) == param and "\n" not in error["message"]
    assert error["message"].startswith(f"'{param}'")


def test_run_takes_thinking_budget(thinking_bundle, bundle):
    from tests.test_cli_errors import cli

    closed = cli("run", thinking_bundle, "user: w5 ; assistant: <think>", "--thinking-budget",
                 "0", "--max-new-tokens", "3")
    assert closed.returncode == 0, closed.stderr
    assert closed.stdout.split()[0] == "</think>" and len(closed.stdout.split()) == 3
    refused = cli("run", bundle("llama"), "w5 w6", "--thinking-budget", "2")
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines() == [
        "error: --thinking-budget needs a model that thinks in <think> ... </think> blocks; "
        "this bundle's chat template and tokenizer know no such tags"]


def test_serve_s_reasoning_budget_caps_ollama_s_routes_too(scripted):
    """Ollama's API has no budget field: the server's default is the budget there."""
    import httpx

    from tests.test_serve import MODEL

    body = {"model": MODEL, "stream": False, "options": {"temperature": 0, "num_predict": 32}}
    with serve(scripted, reasoning_budget=2) as server:
        chat = httpx.post(f"{server.url}/api/chat", json={**body, "messages": QUESTION})
        said = httpx.post(f"{server.url}/api/generate",
                          json={**body, "prompt": QUESTION[0]["content"]})
    assert chat.json()["message"] == {"role": "assistant", "thinking": CAPPED[
        "reasoning_content"], "content": CAPPED["content"]}
    assert (said.json()["thinking"], said.json()["response"]) == tuple(CAPPED.values())
