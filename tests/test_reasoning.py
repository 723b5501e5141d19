"""A chat reply's `<think>` block split from its answer (server/reasoning.py), at the parser
and response-shape level: no model, so every edge is a string. The server end to end is
tests/test_serve_reasoning.py."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from edgeprefill.cli.serve_cmd import REASONING_MODES
from edgeprefill.sdk.chat_template import ChatTemplate
from edgeprefill.sdk.stream import TokenEvent
from edgeprefill.server.reasoning import (
    MODES,
    ReasoningParser,
    Split,
    prompt_opens_think,
    reply_reasoning,
)
from edgeprefill.server.responses import Shape
from edgeprefill.server.tool_parsers import TaggedParser

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'

# (reply text, the prompt opened the block) -> (reasoning, content)
CASES = [
    # DeepSeek-R1 / Qwen3.5: the template opened the block, the reply only closes it.
    (("\nThe user asks.\n</think>\n\nIt is sunny.", True), ("The user asks.", "It is sunny.")),
    # Qwen3 / SmolLM3 with thinking on: the reply opens the block itself.
    (("<think>\nThe user asks.\n</think>\n\nIt is sunny.", False),
     ("The user asks.", "It is sunny.")),
    # Opened by the prompt and again by the model: the tag is dropped, as vLLM does.
    (("<think>a</think>b", True), ("a", "b")),
    # No block: the reply as written, leading blanks and all.
    (("  It is sunny. <think> is a tag.", False), ("", "  It is sunny. <think> is a tag.")),
    # Cut by max_tokens inside the block: all reasoning, a cut tag included.
    (("The user asks </thi", True), ("The user asks </thi", "")),
    (("<think>\nThe user", False), ("The user", "")),
    # An empty block (the model decided not to think): no reasoning, the answer.
    (("<think>\n\n</think>\n\nIt is sunny.", False), ("", "It is sunny.")),
    (("</think>It is sunny.", True), ("", "It is sunny.")),
    # After the answer began, a tag is text.
    (("a</think>b</think>c<think>d", True), ("a", "b</think>c<think>d")),
    # A reply that stops at "<thi" without a block open: text.
    (("<thi", False), ("", "<thi")),
]


@pytest.mark.parametrize(("reply", "split"), CASES)
def test_a_whole_reply_splits_into_reasoning_and_content(reply, split):
    text, opened = reply
    assert ReasoningParser(opened).parse(text) == Split(*split)


@pytest.mark.parametrize(("reply", "split"), CASES)
def test_streamed_in_any_pieces_no_tag_leaks_and_the_parts_add_up(reply, split):
    text, opened = reply
    rng = random.Random(0)
    for cuts in [list(range(1, len(text))), *(_random_cuts(rng, len(text)) for _ in range(50))]:
        parser, parts = ReasoningParser(opened), []
        for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
            parts += parser.feed(text[start:end])
        parts += parser.finish()
        reasoning = [p.text for p in parts if p.reasoning]
        content = [p.text for p in parts if not p.reasoning]
        assert ("".join(reasoning), "".join(content)) == split
        first_content = next((i for i, p in enumerate(parts) if not p.reasoning), len(parts))
        assert all(p.reasoning for p in parts[:first_content])  # reasoning, then content
        if split[0]:  # a tag is held back until it is known, never sent in a piece
            assert not any(tag in r for r in reasoning for tag in ("<think>", "</think>"))


def _random_cuts(rng: random.Random, length: int) -> list[int]:
    return sorted(rng.sample(range(1, length), min(length - 1, rng.randint(1, 6))))


# The generation prompts of the published templates (the rest of each template is as
# in tests/chat_templates.py: only where the reply starts matters here).
QWEN3 = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
         "{% if enable_thinking is defined and enable_thinking is false %}"
         "<think>\n\n</think>\n\n{% endif %}{% endif %}")
DEEPSEEK_R1 = ("{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}"
               "{% endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜><think>\n"
               "{% endif %}")


@pytest.mark.parametrize(("template", "kwargs", "opened"), [
    (DEEPSEEK_R1, {}, True),
    (QWEN3, {}, False),  # the model opens the block itself
    (QWEN3, {"enable_thinking": False}, False),  # an empty, closed block: the reply is content
    (DEEPSEEK_R1, {"add_generation_prompt": False}, False),
])
def test_where_a_reply_starts_is_read_from_the_rendered_prompt(template, kwargs, opened):
    prompt = ChatTemplate(template, {}).render(
        [{"role": "user", "content": "what does <think> mean?"}], **kwargs)
    assert prompt_opens_think(prompt) is opened


def test_a_user_message_ending_in_think_does_not_open_the_reply():
    prompt = ChatTemplate(QWEN3, {}).render([{"role": "user", "content": "say <think>"}])
    assert not prompt_opens_think(prompt)


def test_constrained_replies_and_servers_without_reasoning_are_not_split():
    assert reply_reasoning(True, constrained=True, opened=True) is None
    assert reply_reasoning(False, constrained=False, opened=True) is None
    make = reply_reasoning(True, constrained=False, opened=True)
    assert make is not None and make().opened


def test_the_cli_offers_the_servers_modes():
    assert REASONING_MODES == MODES


# -- the response shape: reasoning, then content with its tool calls --------------------


def stream(text: str, finish_reason: str = "stop") -> SimpleNamespace:
    """What Shape reads of a finished TokenStream."""
    return SimpleNamespace(text=text, finish_reason=finish_reason, logprobs=None,
                           token_ids=list(range(5)),
                           metrics=SimpleNamespace(prompt_tokens=3))


def shape(opened: bool, tools: bool) -> Shape:
    return Shape.new(True, "m", TaggedParser if tools else None,
                     reasoning=reply_reasoning(True, False, opened))


def streamed(shape: Shape, pieces: list[str], index: int = 0) -> list[dict]:
    deltas = [c["choices"][0]["delta"] for p in pieces for c in shape.chunks(p, index)]
    last = shape.last_chunks("stop", index)
    return [*deltas, *(c["choices"][0]["delta"] for c in last)]


def test_a_tool_call_inside_the_reasoning_is_not_a_call():
    text = f"I could write {CALL} here.</think>\n\nIt is sunny."
    message = shape(True, tools=True).whole(stream(text))["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "It is sunny.",
                       "reasoning_content": f"I could write {CALL} here.",
                       "reasoning": f"I could write {CALL} here."}


def test_a_tool_call_after_the_reasoning_is_parsed_whole_and_streamed():
    text = f"<think>\nweather needed\n</think>\n\n{CALL}"
    body = shape(False, tools=True).whole(stream(text))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["reasoning_content"] == "weather needed"
    (call,) = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}

    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    deltas = streamed(shape(False, tools=True), pieces)
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "weather needed"
    assert "".join(d.get("reasoning", "") for d in deltas) == "weather needed"
    assert not any(d.get("content") for d in deltas)
    arguments = "".join(d["tool_calls"][0]["function"]["arguments"]
                        for d in deltas if "tool_calls" in d)
    assert json.loads(arguments) == {"city": "Paris"}


def test_each_choice_is_split_on_its_own_while_their_chunks_interleave():
    replies = ["<think>one</think>A", "<think>two, longer</think>  B"]
    both = shape(False, tools=False)
    deltas: dict[int, list[dict]] = {0: [], 1: []}
    for i in range(max(map(len, replies))):
        for index, reply in enumerate(replies):
            deltas[index] += [c["choices"][0]["delta"] for c in both.chunks(reply[i:i + 1],
                                                                            index)]
    for index, reply in enumerate(replies):
        deltas[index] += [c["choices"][0]["delta"] for c in both.last_chunks("stop", index)]
        message = shape(False, tools=False).whole(stream(reply))["choices"][0]["message"]
        assert "".join(d.get("reasoning", "") for d in deltas[index]) == message["reasoning"]
        assert "".join(d.get("content", "") for d in deltas[index]) == message["content"]


def test_a_token_whose_text_crosses_the_tag_keeps_its_logprobs_in_one_chunk():
    token = TokenEvent(7, "ok</think>Hi", -0.5, [], "ok</think>Hi")
    chunk = shape(True, tools=False).token_chunk(token, 0)
    assert chunk["choices"][0]["delta"] == {"reasoning_content": "ok", "reasoning": "ok",
                                           "content": "Hi"}
    assert chunk["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.5


def test_a_token_that_writes_a_whole_call_sends_one_chunk_with_one_entry_for_it():
    """A call's id/name delta and its arguments delta, released by one token, go out as
    one `tool_calls` entry beside the token's logprobs (one chunk per token)."""
    both = shape(False, tools=True)
    think = both.token_chunk(TokenEvent(5, "<think>hm</think>", -0.1, [], "x"), 0)
    assert think["choices"][0]["delta"] == {"reasoning_content": "hm", "reasoning": "hm"}
    chunk = both.token_chunk(TokenEvent(7, CALL + " ok", -0.5, [], "y"), 0)
    assert chunk["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.5
    delta = chunk["choices"][0]["delta"]
    (call,) = delta["tool_calls"]
    assert call["index"] == 0 and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert delta["content"] == " ok"


def test_replies_without_reasoning_keep_their_shape():
    message = shape(True, tools=False).whole(stream("</think>Hello"))["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Hello"}
    plain = Shape.new(True, "m").whole(stream("<think>x</think>y"))["choices"][0]["message"]
    assert plain == {"role": "assistant", "content": "<think>x</think>y"}


def test_reasoning_sent_back_on_an_earlier_reply_reaches_the_template():
    """A client sends the assistant's reply back as it got it, reasoning included; Qwen3's
    template replays it for the turns after the last user message. The server had dropped
    the field, so the model saw its own earlier turn without its thoughts."""
    from edgeprefill.server.errors import ApiError
    from edgeprefill.server.schemas import parse_messages

    template = ChatTemplate(
        "{% for m in messages %}{{ m.role }}:{% if m.reasoning_content %}"
        "<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }};{% endfor %}", {})
    for name in ("reasoning_content", "reasoning"):
        messages = parse_messages([{"role": "user", "content": "q"},
                                   {"role": "assistant", "content": "a", name: "why"},
                                   {"role": "tool", "content": "r"}])
        assert template.render(messages) == "user:q;assistant:<think>why</think>a;tool:r;"
    with pytest.raises(ApiError) as refused:
        parse_messages([{"role": "assistant", "content": "a", "reasoning": ["why"]}])
    assert refused.value.param == "messages[0].reasoning"
