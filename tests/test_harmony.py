"""gpt-oss's harmony replies (server/harmony.py), parsed whole and streamed cut at every
place, and what the server hands gpt-oss's chat template for a tool loop. The server
end to end is tests/test_serve_harmony.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from edgeprefill.sdk.chat_template import ChatTemplate
from edgeprefill.server.harmony import HarmonyParser, Reply, reply_harmony
from edgeprefill.server.reasoning import Part
from edgeprefill.server.responses import Shape
from edgeprefill.server.schemas import parse_chat
from edgeprefill.server.tool_parsers import Piece
from tests.chat_templates import HARMONY

ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>"
CALL_AFTER = ('<|channel|>commentary to=functions.get_weather <|constrain|>json'
              '<|message|>{"location": "Tokyo"}<|call|>')
CALL_BEFORE = (' to=functions.get_weather<|channel|>commentary json<|message|>'
               '{"location": "Tokyo"}')
TOKYO = [("get_weather", {"location": "Tokyo"})]
# reply text (the prompt ended with `<|start|>assistant`) -> reasoning, content, calls
CASES = {
    "analysis-then-final": (ANALYSIS + FINAL,
                            "The user wants the weather.", "It is sunny.", []),
    "final-only": ("<|channel|>final<|message|>It is sunny.", "", "It is sunny.", []),
    "call-recipient-after-channel": (CALL_AFTER, "", "", TOKYO),
    "call-recipient-before-channel": (CALL_BEFORE, "", "", TOKYO),
    "analysis-then-call": (ANALYSIS + "<|start|>assistant" + CALL_BEFORE,
                           "The user wants the weather.", "", TOKYO),
    "cut-inside-analysis": ("<|channel|>analysis<|message|>The user wa",
                            "The user wa", "", []),
    "two-analysis-messages": (ANALYSIS + "<|start|>assistant" + ANALYSIS + FINAL,
                              "The user wants the weather.\nThe user wants the weather.",
                              "It is sunny.", []),
    "preamble-then-call": ("<|channel|>commentary<|message|>Checking.<|end|><|start|>"
                           "assistant" + CALL_AFTER, "", "Checking.", TOKYO),
    "not-harmony": ("Just text.", "", "Just text.", []),
}


def calls(reply: Reply) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in reply.calls]


def fed(cuts: list[str]) -> Reply:
    """A reply fed in pieces, assembled as the stream sends it; no marker in any piece."""
    parser = HarmonyParser()
    out = [p for cut in cuts for p in parser.feed(cut)] + parser.finish()
    for piece in out:
        text = piece.text if isinstance(piece, Part) else piece.text + piece.arguments
        assert "<|" not in text and "|>" not in text, (cuts, piece)
        assert not (isinstance(piece, Part) and piece.text == "")
    parts = [p for p in out if isinstance(p, Part)]
    assert [p.reasoning for p in parts] == sorted((p.reasoning for p in parts), reverse=True)
    begun = [p.begin for p in out if isinstance(p, Piece) and p.begin]
    arguments = [p.arguments for p in out if isinstance(p, Piece) and p.arguments]
    return Reply("".join(p.text for p in parts if p.reasoning),
                 "".join(p.text for p in parts if not p.reasoning),
                 [b._replace(arguments="".join(arguments)) for b in begun])


@pytest.mark.parametrize("name", CASES)
def test_a_harmony_reply_splits_into_reasoning_content_and_calls(name):
    text, reasoning, content, expected = CASES[name]
    whole = HarmonyParser().parse(text)
    assert (whole.reasoning, whole.content, calls(whole)) == (reasoning, content, expected)


@pytest.mark.parametrize("name", CASES)
def test_streaming_cut_anywhere_adds_up_to_the_whole_reply(name):
    text = CASES[name][0]
    whole = HarmonyParser().parse(text)
    for at in range(len(text) + 1):
        cut = fed([text[:at], text[at:]])
        assert (cut.reasoning, cut.content, calls(cut)) == \
            (whole.reasoning, whole.content, calls(whole)), at
    one_by_one = fed(list(text))
    assert (one_by_one.reasoning, one_by_one.content) == (whole.reasoning, whole.content)
    assert calls(one_by_one) == calls(whole)


def test_blanks_a_spacing_tokenizer_puts_around_markers_are_dropped():
    spaced = ("<|channel|> analysis <|message|> thinking here <|end|> <|start|> assistant "
              "to=functions.get_weather <|channel|> commentary json <|message|> {} ")
    reply = HarmonyParser().parse(spaced)
    assert (reply.reasoning, reply.content, calls(reply)) == \
        ("thinking here", "", [("get_weather", {})])


def test_constrained_replies_and_servers_without_harmony_are_not_split():
    assert reply_harmony(True, constrained=True) is None
    assert reply_harmony(False, constrained=False) is None
    assert reply_harmony(True, constrained=False) is HarmonyParser


# -- the chat completion: message, deltas and finish reason ------------------------------


def finished(text: str, finish_reason: str = "stop") -> SimpleNamespace:
    """What Shape reads of a finished TokenStream."""
    return SimpleNamespace(text=text, finish_reason=finish_reason, logprobs=None,
                           token_ids=list(range(5)), metrics=SimpleNamespace(prompt_tokens=3))


def test_a_call_comes_back_as_tool_calls_whole_and_streamed():
    text = ANALYSIS + "<|start|>assistant" + CALL_AFTER.removesuffix("<|call|>")
    choice = Shape.new(True, "m", harmony=HarmonyParser).whole(finished(text))["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None
    assert message["reasoning_content"] == message["reasoning"] == \
        "The user wants the weather."
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"location": "Tokyo"}

    shape = Shape.new(True, "m", harmony=HarmonyParser)
    deltas = [c["choices"][0]["delta"] for ch in text for c in shape.chunks(ch)]
    last = shape.last_chunks("stop")
    assert last[-1]["choices"][0]["finish_reason"] == "tool_calls"
    entries = [e for d in deltas if "tool_calls" in d for e in d["tool_calls"]]
    assert entries[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert {e["index"] for e in entries} == {0}
    assert json.loads("".join(e["function"]["arguments"] for e in entries)) == \
        {"location": "Tokyo"}
    assert "".join(d.get("reasoning", "") for d in deltas) == "The user wants the weather."
    assert not any(d.get("content") for d in deltas)


def test_a_call_max_tokens_cut_keeps_finish_reason_length():
    text = CALL_BEFORE[:-5]
    choice = Shape.new(True, "m", harmony=HarmonyParser).whole(finished(text, "length"))
    assert choice["choices"][0]["finish_reason"] == "length"


# -- the prompt: what the server hands the template for a tool loop ----------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"location": {"type": "string"}}}}}


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_a_tool_loop_renders_in_harmony_through_the_servers_messages(field):
    """An earlier reply sent back as this server returned it (its reasoning under either
    name, its call, the tool's result) reaches the template as gpt-oss's reads it: the
    reasoning as `thinking`, arguments as an object."""
    body = {"messages": [
        {"role": "user", "content": "Weather in Tokyo?"},
        {"role": "assistant", "content": None, field: "Need the weather.",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {
             "name": "get_weather", "arguments": '{"location": "Tokyo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]}
    messages = parse_chat(body).prompt
    prompt = ChatTemplate(HARMONY, {}).render(messages, tools=[WEATHER],
                                              add_generation_prompt=True)
    assert prompt.endswith(
        "<|start|>user<|message|>Weather in Tokyo?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"location": "Tokyo"}<|call|>'
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
        '"sunny"<|end|><|start|>assistant')
