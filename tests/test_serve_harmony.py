"""gpt-oss's harmony replies through the server with the official `openai` client: the
analysis channel as `reasoning_content` / `reasoning`, the final channel as `content`,
commentary calls to `functions.NAME` as `tool_calls`, whole and streamed, in Chat
Completions and the Responses API.

As in tests/test_serve_reasoning.py the model's choices are a script, but a harmony reply
repeats its markers (`<|channel|>` before `analysis`, later before `final`), so the next
token is read off the reply's position rather than off the last token. The bundle's
tokenizer has the harmony markers as special tokens, as o200k_harmony does, and its chat
template is tests/chat_templates.py's HARMONY."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from tests.chat_templates import HARMONY  # noqa: E402
from tests.conftest import top_word_id, word_bundle  # noqa: E402
from tests.test_serve import MODEL, free_port  # noqa: E402

EOS = 2
MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>",
           "<|return|>", "<|call|>")
ANALYSIS = ["<|channel|>", "analysis", "<|message|>", "Need", "the", "weather.", "<|end|>"]
FINAL = ["<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "It", "is",
         "sunny.", "<|return|>"]
ARGUMENTS = ['{"location":', '"Tokyo"}']
CALL_AFTER = ["<|channel|>", "commentary", "to=functions.get_weather", "<|constrain|>",
              "json", "<|message|>", *ARGUMENTS, "<|call|>"]
CALL_BEFORE = ["to=functions.get_weather", "<|channel|>", "commentary", "json",
               "<|message|>", *ARGUMENTS, "<|call|>"]
SCRIPTS = {
    "analysis-then-final": ANALYSIS + FINAL,
    "final-only": FINAL[2:],
    "call-recipient-after-channel": CALL_AFTER,
    "call-recipient-before-channel": CALL_BEFORE,
    "analysis-then-call": ANALYSIS + ["<|start|>", "assistant", *CALL_BEFORE],
}
WORDS = list(dict.fromkeys(w for script in SCRIPTS.values() for w in script))
THOUGHT = "Need the weather."
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"location": {"type": "string"}}}}}
QUESTION = [{"role": "user", "content": "weather in Tokyo ?"}]


@pytest.fixture(scope="module")
def engine(hf_model, tmp_path_factory) -> Iterator[Engine]:
    out = word_bundle(hf_model, tmp_path_factory, "harmony", WORDS, HARMONY,
                      special=[w for w in WORDS if w in MARKERS])
    engine = Engine.load(out, threads=1, kv_slots=4)
    yield engine
    engine.close()


def follow(engine: Engine, script: list[str], prompt_tokens: int) -> None:
    """Greedy decoding now writes `script` after a prompt of `prompt_tokens` tokens, then
    EOS. The real step still runs, so its KV writes stay."""
    import numpy as np

    run = getattr(engine.backend, "unscripted_run", engine.backend.run)
    engine.backend.unscripted_run = run
    ids = [top_word_id(WORDS, w) for w in script]

    def scripted(step):
        logits = run(step)
        chosen = np.full_like(logits, -1e4)
        for row in range(step.rows):
            at = int(step.past_lens[row] + step.valid_lens[row]) - prompt_tokens
            chosen[row, ids[at] if 0 <= at < len(ids) else EOS] = 0.0
        return chosen

    engine.backend.run = scripted


@pytest.fixture(scope="module")
def server(engine) -> Iterator[ServerThread]:
    app = create_app(engine, ServerConfig(model_name=MODEL))
    with ServerThread(app, port=free_port()) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def ask(client, engine, script: str, **options):
    """A chat completion whose reply is SCRIPTS[script] (with the request's tools)."""
    chat = {"tools": options["tools"]} if "tools" in options else {}
    follow(engine, SCRIPTS[script], len(engine.tokenizer.encode(QUESTION, **chat)))
    return client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                          **options)


def fields(part) -> dict:
    """A message's or delta's content and reasoning fields, as sent."""
    extra = part.model_extra or {}
    return {"content": part.content or "", "reasoning_content":
            extra.get("reasoning_content") or "", "reasoning": extra.get("reasoning") or ""}


def added_up(chunks) -> dict:
    """The fields the deltas add up to; no piece of a marker in any delta."""
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    texts = [fields(d) for d in deltas]
    for value in (v for t in texts for v in t.values()):
        assert "<|" not in value and "|>" not in value, value
    whole = {key: "".join(t[key] for t in texts) for key in texts[0]}
    calls: dict[int, dict] = {}
    for entry in (e for d in deltas for e in d.tool_calls or []):
        call = calls.setdefault(entry.index, {"id": entry.id, "name": "", "arguments": ""})
        call["name"] += entry.function.name or ""
        call["arguments"] += entry.function.arguments or ""
    return {**whole, "calls": [(c["name"], json.loads(c["arguments"]))
                               for c in calls.values()]}


def whole_of(message) -> dict:
    calls = [(c.function.name, json.loads(c.function.arguments))
             for c in message.tool_calls or []]
    return {**fields(message), "calls": calls}


TOKYO = [("get_weather", {"location": "Tokyo"})]
EXPECTED = {  # script -> reasoning, content, calls
    "analysis-then-final": (THOUGHT, "It is sunny.", []),
    "final-only": ("", "It is sunny.", []),
    "call-recipient-after-channel": ("", "", TOKYO),
    "call-recipient-before-channel": ("", "", TOKYO),
    "analysis-then-call": (THOUGHT, "", TOKYO),
}


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_harmony_reply_splits_whole_and_streamed_token_by_token(client, engine, script):
    reasoning, content, calls = EXPECTED[script]
    expected = {"content": content, "reasoning_content": reasoning, "reasoning": reasoning,
                "calls": calls}
    whole = ask(client, engine, script, tools=[WEATHER]).choices[0]
    assert whole_of(whole.message) == expected
    assert whole.finish_reason == ("tool_calls" if calls else "stop")
    if calls:
        assert whole.message.content is None
        assert whole.message.tool_calls[0].id.startswith("call_")
    if not reasoning:  # a reply without reasoning has no reasoning fields
        assert "reasoning" not in (whole.message.model_extra or {})

    chunks = list(ask(client, engine, script, tools=[WEATHER], stream=True))
    assert added_up(chunks) == expected
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


def test_streamed_logprobs_cover_every_token_while_the_channels_split(client, engine):
    """A marker's token sends an empty delta with its logprobs; the call's pieces of one
    token are one `tool_calls` entry."""
    script = SCRIPTS["analysis-then-call"]
    chunks = list(ask(client, engine, "analysis-then-call", tools=[WEATHER], stream=True,
                      logprobs=True))
    tokens = [t.token for c in chunks if c.choices and c.choices[0].logprobs
              for t in c.choices[0].logprobs.content]
    assert len(tokens) == len(script)  # the markers' too, `<|call|>` (dropped from the text) too
    assert added_up(chunks) == {"content": "", "reasoning_content": THOUGHT,
                                "reasoning": THOUGHT, "calls": TOKYO}


def test_a_reply_cut_inside_its_analysis_is_all_reasoning(client, engine):
    cut = {"content": "", "reasoning_content": "Need the", "reasoning": "Need the",
           "calls": []}
    whole = ask(client, engine, "analysis-then-final", max_tokens=5).choices[0]
    assert whole_of(whole.message) == cut and whole.finish_reason == "length"
    chunks = list(ask(client, engine, "analysis-then-final", max_tokens=5, stream=True))
    assert added_up(chunks) == cut


def test_the_responses_api_gets_a_reasoning_item_and_a_function_call(client, engine):
    follow(engine, SCRIPTS["analysis-then-call"],
           len(engine.tokenizer.encode(QUESTION, tools=[WEATHER])))
    tools = [{"type": "function", "name": "get_weather",
              "parameters": WEATHER["function"]["parameters"]}]
    response = client.responses.create(model=MODEL, input=QUESTION, tools=tools)
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "function_call"]
    assert response.output[0].content[0].text == THOUGHT
    call = response.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == TOKYO[0][1]
    assert call.call_id.startswith("call_")

    events = list(client.responses.create(model=MODEL, input=QUESTION, tools=tools,
                                          stream=True))
    done = events[-1].response
    assert [item.type for item in done.output] == kinds
    assert done.output[0].content[0].text == THOUGHT
    assert json.loads(done.output[1].arguments) == TOKYO[0][1]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") \
        == THOUGHT


def test_reasoning_parser_none_and_completions_return_the_raw_harmony_text(engine, server):
    """What the SDK and `edgeprefill run` show too: the reply with its markers (they are
    kept in decoding), `<|return|>` and `<|call|>` aside, which end generation."""
    raw = ("<|channel|> analysis <|message|> Need the weather. <|end|> <|start|> assistant "
           "<|channel|> final <|message|> It is sunny.")
    app = create_app(engine, ServerConfig(model_name=MODEL, reasoning_parser="none"))
    with ServerThread(app, port=free_port()) as plain:
        client = openai.OpenAI(base_url=f"{plain.url}/v1", api_key="unused", max_retries=0)
        message = ask(client, engine, "analysis-then-final").choices[0].message
    assert fields(message) == {"content": raw, "reasoning_content": "", "reasoning": ""}
    prompt = engine.tokenizer.render_chat(QUESTION, add_generation_prompt=True)
    follow(engine, SCRIPTS["analysis-then-final"], len(engine.tokenizer.encode(QUESTION)))
    body = httpx.post(f"{server.url}/v1/completions", json={
        "prompt": prompt, "max_tokens": 32, "temperature": 0}).json()
    assert body["choices"][0]["text"] == raw


def test_a_strict_tool_under_auto_is_a_400_naming_harmony(client):
    """gpt-oss's calls are harmony headers, which the strict tools' lazy grammar
    (server/strict_tools.py) does not cover: a 400, not a strict that holds nothing."""
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=QUESTION, tools=[strict],
                                       max_tokens=4)
    assert err.value.body["param"] == "tools" and "harmony" in err.value.body["message"]


def test_ollama_s_api_knows_harmony_replies_think(engine, server):
    """/api/show lists the thinking capability (it did not: no <think> tags), and `think`
    is taken, its reasoning coming back as `thinking`."""
    shown = httpx.post(f"{server.url}/api/show", json={"model": MODEL}).json()
    assert "thinking" in shown["capabilities"]
    follow(engine, SCRIPTS["analysis-then-final"], len(engine.tokenizer.encode(QUESTION)))
    reply = httpx.post(f"{server.url}/api/chat", json={
        "model": MODEL, "messages": QUESTION, "think": True, "stream": False,
        "options": {"temperature": 0, "num_predict": 32}})
    assert reply.status_code == 200, reply.text
    message = reply.json()["message"]
    assert (message["thinking"], message["content"]) == ("Need the weather.", "It is sunny.")
