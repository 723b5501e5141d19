"""A thinking model's reply through the server with the official `openai` client: its
`<think>` block comes back as `reasoning_content` / `reasoning`, its answer as `content`,
whole and streamed.

As in tests/test_serve_tools.py, the model's choices are a script: the backend runs for
real but its logits are replaced so that greedy decoding follows a list of words, and
everything between the logits and the client (chat template, detokenizer, reasoning and
tool parsers, response and stream shapes) is the real thing. The script thinks about a
tool call without making one, and its `</think>` arrives in two tokens ("</" and
"##think>", which the WordPiece decoder joins)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from tests.conftest import follow_tokens, top_word_id, word_bundle  # noqa: E402
from tests.test_serve import MODEL, free_port  # noqa: E402
from tests.test_serve_tools import CALL, WEATHER  # noqa: E402

EOS = 2
THOUGHT = ["<think>", "hmm,", *CALL, "</", "##think>"]
ANSWER = ["It", "is", "sunny."]
WORDS = ["assistant:", "</think>", *THOUGHT, *ANSWER]
REASONING = 'hmm, <tool_call> {"name": "get_weather", "arguments": {"city": "Paris"}} ' \
            "</tool_call>"
# The prompt ends in "assistant:" (the model opens its block, as Qwen3's does), in
# "<think>" (the template opened it, as DeepSeek-R1's does), or in an empty, closed
# block (Qwen3's enable_thinking false).
TEMPLATE = (
    "{% if tools %}system: {% for t in tools %}{{ t | tojson }} {% endfor %}; {% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }} ; {% endfor %}"
    "{% if add_generation_prompt %}assistant: "
    "{% if enable_thinking is defined and not enable_thinking %}<think> </think>"
    "{% elif open_think %}<think>{% endif %}{% endif %}"
)
QUESTION = [{"role": "user", "content": "weather in Paris ?"}]


def word_id(word: str) -> int:
    return top_word_id(WORDS, word)


@pytest.fixture(scope="module")
def engine(hf_model, tmp_path_factory) -> Iterator[Engine]:
    out = word_bundle(hf_model, tmp_path_factory, "thinking", WORDS, TEMPLATE)
    engine = Engine.load(out, threads=1, kv_slots=4)
    follow_script(engine)
    yield engine
    engine.close()


def follow_script(engine: Engine) -> None:
    """Greedy decoding now follows THOUGHT and ANSWER after "assistant:", picks up the
    script after a prompt's "<think>", and answers after a prompt's "</think>"."""
    script = [word_id(w) for w in ("assistant:", *THOUGHT, *ANSWER)]
    following = dict(zip(script, [*script[1:], EOS], strict=True))
    following[word_id("</think>")] = word_id(ANSWER[0])
    follow_tokens(engine, following, EOS)


def serve(engine: Engine, **config) -> ServerThread:
    app = create_app(engine, ServerConfig(model_name=MODEL, **config))
    return ServerThread(app, port=free_port())


@pytest.fixture(scope="module")
def server(engine) -> Iterator[ServerThread]:
    with serve(engine) as server:
        yield server


def ask(client, open_think: bool = False, **options):
    kwargs = {"open_think": True} if open_think else {}
    options.setdefault("extra_body", {})["chat_template_kwargs"] = \
        {**kwargs, **options.pop("template", {})}
    return client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                          **options)


def fields(delta) -> dict[str, str]:
    """A message's or delta's content and reasoning fields, as sent."""
    extra = delta.model_extra or {}
    return {"content": delta.content or "", "reasoning_content":
            extra.get("reasoning_content") or "", "reasoning": extra.get("reasoning") or ""}


def added_up(chunks, index: int = 0) -> dict[str, str]:
    """The fields the deltas of one choice add up to, checking on the way that no piece
    of a tag is in any delta, however the tokens cut it, and that the reasoning comes
    first."""
    deltas = [fields(c.choices[0].delta) for c in chunks
              if c.choices and c.choices[0].index == index]
    for value in (v for d in deltas for v in d.values()):
        assert "<think>" not in value and "</think>" not in value
        assert not value.endswith("</") and not value.startswith("think>")
    order = [key for d in deltas for key in ("reasoning", "content") if d[key]]
    assert order == sorted(order, reverse=True)  # reasoning, then content
    return {key: "".join(d[key] for d in deltas) for key in deltas[0]}


WHOLE = {"content": "It is sunny.", "reasoning_content": REASONING, "reasoning": REASONING}


@pytest.mark.parametrize("open_think", [False, True], ids=["model-opens", "prompt-opens"])
def test_the_reasoning_comes_apart_from_the_answer_whole_and_streamed(client, open_think):
    # A call the model only thinks about is not a call, though the request has tools.
    whole = ask(client, open_think, tools=[WEATHER])
    choice = whole.choices[0]
    assert fields(choice.message) == WHOLE
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    tokens = len(THOUGHT) + len(ANSWER) - (1 if open_think else 0)
    assert whole.usage.completion_tokens == tokens

    chunks = list(ask(client, open_think, tools=[WEATHER], stream=True))
    assert added_up(chunks) == WHOLE
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_with_thinking_off_the_prompt_closes_the_block_and_the_reply_is_content(client):
    on = ask(client).choices[0].message
    off = ask(client, template={"enable_thinking": False}).choices[0].message
    assert fields(on) == WHOLE
    assert fields(off) == {"content": "It is sunny.", "reasoning_content": "",
                           "reasoning": ""}
    assert "reasoning" not in (off.model_extra or {})  # a reply without reasoning: no field


@pytest.mark.parametrize("open_think", [False, True], ids=["model-opens", "prompt-opens"])
def test_a_reply_cut_inside_its_reasoning_is_all_reasoning(client, open_think):
    cut = {"content": "", "reasoning_content": "hmm, <tool_call>",
           "reasoning": "hmm, <tool_call>"}
    whole = ask(client, open_think, max_tokens=3 - (1 if open_think else 0))
    assert fields(whole.choices[0].message) == cut
    assert whole.choices[0].finish_reason == "length"
    chunks = list(ask(client, open_think, max_tokens=3 - (1 if open_think else 0),
                      stream=True))
    assert added_up(chunks) == cut


def test_each_of_n_choices_carries_its_own_reasoning(client):
    whole = ask(client, n=2)
    assert [fields(c.message) for c in whole.choices] == [WHOLE, WHOLE]
    chunks = list(ask(client, n=2, stream=True))
    assert [added_up(chunks, index) for index in (0, 1)] == [WHOLE, WHOLE]


def test_logprobs_cover_every_token_while_the_fields_split(client):
    chunks = list(ask(client, logprobs=True, stream=True))
    tokens = [t.token for c in chunks if c.choices and c.choices[0].logprobs
              for t in c.choices[0].logprobs.content]
    assert len(tokens) == len(THOUGHT) + len(ANSWER)  # the tags' tokens too
    assert added_up(chunks) == WHOLE
    whole = ask(client, logprobs=True)
    assert len(whole.choices[0].logprobs.content) == len(tokens)
    assert fields(whole.choices[0].message) == WHOLE


@pytest.mark.parametrize("open_think", [False, True], ids=["model-opens", "prompt-opens"])
def test_streamed_logprobs_with_tools_and_reasoning_are_the_whole_replys(client, open_think):
    """The reasoning split and the tool parser both hold text back; the stream still
    carries each token's logprobs once, in order, as the whole reply lists them."""
    options = {"logprobs": True, "top_logprobs": 2, "tools": [WEATHER]}
    whole = ask(client, open_think, **options).choices[0].logprobs.content
    script = [*THOUGHT, *ANSWER][1 if open_think else 0:]
    assert [t.token for t in whole] == script
    chunks = list(ask(client, open_think, stream=True, **options))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert [t.model_dump() for t in streamed] == [t.model_dump() for t in whole]
    assert added_up(chunks) == WHOLE


def test_reasoning_parser_none_and_the_completions_endpoint_leave_the_text_as_written(
        engine, server):
    raw = f"<think> {REASONING} </think> It is sunny."
    with serve(engine, reasoning_parser="none") as plain:
        client = openai.OpenAI(base_url=f"{plain.url}/v1", api_key="unused", max_retries=0)
        message = ask(client).choices[0].message
    assert fields(message) == {"content": raw, "reasoning_content": "", "reasoning": ""}
    body = httpx.post(f"{server.url}/v1/completions", json={  # the splitting server's
        "prompt": "user: weather in Paris ? ; assistant:", "max_tokens": 32,
        "temperature": 0}).json()
    assert body["choices"][0]["text"] == raw


def test_thinking_tags_that_are_special_tokens_still_split_the_reply(hf_model,
                                                                    tmp_path_factory):
    """A tokenizer may register <think> and </think> as special tokens, which every reply
    dropped: its reasoning came back as content, untagged. The reply keeps them now."""
    script = ["assistant:", "<think>", "hmm,", "</think>", *ANSWER]
    words = [*dict.fromkeys(script)]
    bundle = word_bundle(hf_model, tmp_path_factory, "special-thinking", words, TEMPLATE,
                         special=("<think>", "</think>"))
    engine = Engine.load(bundle, threads=1, kv_slots=2)
    ids = [top_word_id(words, w) for w in script]
    follow_tokens(engine, dict(zip(ids, [*ids[1:], EOS], strict=True)), EOS)
    with serve(engine) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        message = ask(client).choices[0].message
        chunks = list(ask(client, stream=True))
    engine.close()
    split = {"content": "It is sunny.", "reasoning_content": "hmm,", "reasoning": "hmm,"}
    assert fields(message) == split
    assert added_up(chunks) == split
