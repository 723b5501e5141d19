"""`POST /v1/messages` with scripted models and the official `anthropic` client: a tool
round trip (a tool_use block, then its tool_result in the next request), whole and
streamed; a thinking model's thinking block; and how tool_choice and thinking map onto
the chat route's fields.

The scripts are those of tests/test_serve_tools.py and tests/test_serve_reasoning.py
(the backend runs for real; its logits follow a list of words), so everything between
the logits and the client is the real thing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from edgeprefill.server.errors import ApiError  # noqa: E402
from edgeprefill.server.messages_request import count_body, parse_messages_api  # noqa: E402
from tests import test_serve_reasoning as thinking  # noqa: E402
from tests import test_serve_tools  # noqa: E402
from tests.conftest import write_tokenizer  # noqa: E402
from tests.test_serve import MODEL, free_port  # noqa: E402
from tests.test_serve_tools import ANSWER, CALL, WEATHER, follow_script  # noqa: E402

tool_bundle = test_serve_tools.tool_bundle  # its bundle, as a fixture of this module too

# Anthropic's tool: the chat tool's function, its parameters as input_schema.
TOOL = {"name": "get_weather", "description": WEATHER["function"]["description"],
        "input_schema": WEATHER["function"]["parameters"]}
QUESTION = [{"role": "user", "content": "weather in Paris ?"}]
GREEDY = {"model": MODEL, "max_tokens": 40, "extra_body": {"temperature": 0}}


def serve(engine: Engine) -> ServerThread:
    return ServerThread(create_app(engine, ServerConfig(model_name=MODEL)), port=free_port())


def clients(server: ServerThread) -> tuple[anthropic.Anthropic, openai.OpenAI]:
    return (anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0),
            openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0))


@pytest.fixture(scope="module")
def tools(tool_bundle) -> Iterator[tuple[anthropic.Anthropic, openai.OpenAI]]:
    engine = Engine.load(tool_bundle, threads=1, kv_slots=2)
    follow_script(engine)
    with serve(engine) as server:
        yield clients(server)
    engine.close()


@pytest.fixture(scope="module")
def thinker(hf_model, tmp_path_factory) -> Iterator[anthropic.Anthropic]:
    from edgeprefill.export.exporter import ExportOptions, export

    hf = tmp_path_factory.mktemp("hf-thinking")
    shutil.copytree(hf_model("llama"), hf, dirs_exist_ok=True)
    write_tokenizer(hf, top_words=thinking.WORDS, chat_template=thinking.TEMPLATE)
    out = tmp_path_factory.mktemp("bundle-thinking")
    export(hf, out, ExportOptions(chunks=(16, 64), max_context=256, show_progress=False,
                                  overwrite=True))
    engine = Engine.load(out, threads=1, kv_slots=2)
    thinking.follow_script(engine)
    with serve(engine) as server:
        yield clients(server)[0]
    engine.close()


def result_of(block) -> dict:
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": block.id, "content": "sunny"}]}


def test_a_tool_round_trip_whole(tools):
    claude, chat = tools
    first = claude.messages.create(messages=QUESTION, tools=[TOOL], **GREEDY)
    assert first.stop_reason == "tool_use"
    (call,) = first.content  # no text block: the reply is the call
    assert call.type == "tool_use" and call.name == "get_weather"
    assert call.input == {"city": "Paris"}
    assert first.usage.output_tokens == len(CALL)

    history = [*QUESTION, {"role": "assistant", "content": [b.model_dump() for b in
                                                            first.content]},
               result_of(call)]
    second = claude.messages.create(messages=history, tools=[TOOL], **GREEDY)
    assert second.stop_reason == "end_turn" and second.stop_sequence is None
    assert [b.type for b in second.content] == ["text"]
    assert second.content[0].text == " ".join(ANSWER)
    # The blocks reached the template as the chat route's messages would have.
    same = chat.chat.completions.create(model=MODEL, temperature=0, tools=[WEATHER], messages=[
        *QUESTION,
        {"role": "assistant", "tool_calls": [{"id": call.id, "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps(call.input)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"}])
    assert second.usage.input_tokens == same.usage.prompt_tokens
    counted = claude.messages.count_tokens(model=MODEL, messages=history, tools=[TOOL])
    assert counted.input_tokens == second.usage.input_tokens


def test_a_stop_sequence_that_ends_a_call_names_no_sequence(tools):
    """The stop string ended the turn, its reason a tool call: Anthropic sets stop_sequence
    only with stop_reason "stop_sequence" (it had named the string beside "tool_use")."""
    claude, _ = tools
    stop = {"stop_sequences": ["</tool_call>"]}
    whole = claude.messages.create(messages=QUESTION, tools=[TOOL], **GREEDY, **stop)
    with claude.messages.stream(messages=QUESTION, tools=[TOOL], **GREEDY, **stop) as stream:
        streamed = stream.get_final_message()
    for reply in (whole, streamed):
        assert (reply.stop_reason, reply.stop_sequence) == ("tool_use", None)
        assert [b.type for b in reply.content] == ["tool_use"]


def test_a_tool_round_trip_streamed(tools):
    claude, _ = tools
    with claude.messages.stream(messages=QUESTION, tools=[TOOL], **GREEDY) as stream:
        events = list(stream)
        first = stream.get_final_message()
    raw = [e for e in events if e.type in ("content_block_start", "content_block_delta",
                                           "content_block_stop")]
    start, *deltas, stop = raw
    assert start.content_block.type == "tool_use" and start.content_block.input == {}
    assert start.content_block.name == "get_weather"
    assert [d.delta.type for d in deltas] == ["input_json_delta"] * 2  # one per token
    assert json.loads("".join(d.delta.partial_json for d in deltas)) == {"city": "Paris"}
    assert stop.index == start.index == 0
    (call,) = first.content
    assert call.id == start.content_block.id and call.input == {"city": "Paris"}
    assert first.stop_reason == "tool_use"

    history = [*QUESTION, {"role": "assistant", "content": [call.model_dump()]},
               result_of(call)]
    with claude.messages.stream(messages=history, tools=[TOOL], **GREEDY) as stream:
        text = "".join(stream.text_stream)
        answer = stream.get_final_message()
    assert text == answer.content[0].text == " ".join(ANSWER)
    assert answer.stop_reason == "end_turn"


def test_the_thinking_comes_as_a_block_before_the_answer(thinker):
    whole = thinker.messages.create(messages=QUESTION, **GREEDY)
    thought, said = whole.content
    assert thought.type == "thinking" and thought.thinking == thinking.REASONING
    assert thought.signature == ""
    assert said.type == "text" and said.text == "It is sunny."
    with thinker.messages.stream(messages=QUESTION, **GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert kinds[0] == "thinking_delta" and kinds[-1] == "text_delta"
    assert [b.to_dict() for b in final.content] == [b.to_dict() for b in whole.content]
    # A thinking block sent back is the reply's reasoning again: the answer follows.
    history = [*QUESTION, {"role": "assistant", "content": [b.model_dump() for b in
                                                            whole.content]},
               {"role": "user", "content": "thanks"}]
    assert thinker.messages.create(messages=history, **GREEDY).usage.input_tokens > \
        whole.usage.input_tokens


def test_thinking_disabled_turns_the_template_s_switch_off(thinker):
    reply = thinker.messages.create(messages=QUESTION, thinking={"type": "disabled"},
                                    **GREEDY)
    assert [b.type for b in reply.content] == ["text"]
    assert reply.content[0].text == "It is sunny."
    enabled = thinker.messages.create(
        messages=QUESTION, thinking={"type": "enabled", "budget_tokens": 1024}, **GREEDY)
    assert [b.type for b in enabled.content] == ["thinking", "text"]


BODY = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "tools": [TOOL]}


@pytest.mark.parametrize(("choice", "chat_choice", "parallel"), [
    ({"type": "auto"}, "auto", True),
    ({"type": "none"}, "none", True),
    ({"type": "any"}, "required", True),
    ({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
     "function", False),
])
def test_tool_choice_is_the_chat_route_s(choice, chat_choice, parallel):
    pytest.importorskip("edgeprefill.sdk.constraints")  # any and tool force the reply
    request = parse_messages_api({**BODY, "tool_choice": choice})
    assert request.tools is not None
    assert (request.tools.choice, request.tools.parallel) == (chat_choice, parallel)
    assert (request.params.constraint is not None) == request.tools.forced
    assert request.tools.tools[0]["function"]["parameters"] == TOOL["input_schema"]


def test_tool_choice_auto_without_tools_asks_for_nothing():
    request = parse_messages_api({**BODY, "tools": [], "tool_choice": {"type": "auto"}})
    assert request.tools is None
    with pytest.raises(ApiError, match="needs 'tools'"):
        parse_messages_api({**BODY, "tools": [], "tool_choice": {"type": "any"}})


def test_the_prompt_fields_are_counted_and_the_reply_fields_are_not_accepted():
    assert count_body({k: BODY[k] for k in ("model", "messages", "tools")}).tools is not None
    with pytest.raises(ApiError, match="max_tokens"):
        count_body(BODY)
    with pytest.raises(ApiError, match="tool_choice names 'nope'"):
        parse_messages_api({**BODY, "tool_choice": {"type": "tool", "name": "nope"}})
