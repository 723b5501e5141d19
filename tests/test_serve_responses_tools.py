"""`POST /v1/responses` with scripted models and the official `openai` client: a tool
loop (a function_call item, then its function_call_output in the next request), a
thinking model's reasoning item, and structured output through `responses.parse`.

The scripts are those of tests/test_serve_tools.py and tests/test_serve_reasoning.py
(the backend runs for real; its logits follow a list of words), so everything between
the logits and the client is the real thing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
pytest.importorskip("starlette")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from tests import test_serve_reasoning as thinking  # noqa: E402
from tests import test_serve_tools, test_structured_output  # noqa: E402
from tests.conftest import write_tokenizer  # noqa: E402
from tests.test_serve import MODEL, free_port  # noqa: E402
from tests.test_serve_tools import ANSWER, CALL, WEATHER, follow_script  # noqa: E402
from tests.test_structured_output import Person  # noqa: E402

# Their bundles, as fixtures of this module too.
tool_bundle = test_serve_tools.tool_bundle
bpe_bundle = test_structured_output.bpe_bundle

# The Responses API's function tool: the chat tool's function, one level up.
FUNCTION = {"type": "function", **WEATHER["function"]}
QUESTION = "weather in Paris ?"


def serve(engine: Engine, name: str = MODEL) -> ServerThread:
    return ServerThread(create_app(engine, ServerConfig(model_name=name)), port=free_port())


def client_of(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tools(tool_bundle) -> Iterator[openai.OpenAI]:
    engine = Engine.load(tool_bundle, threads=1, kv_slots=2)
    follow_script(engine)
    with serve(engine) as server:
        yield client_of(server)
    engine.close()


@pytest.fixture(scope="module")
def thinker(hf_model, tmp_path_factory) -> Iterator[openai.OpenAI]:
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
        yield client_of(server)
    engine.close()


@pytest.fixture(scope="module")
def structured(bpe_bundle: Path) -> Iterator[openai.OpenAI]:
    engine = Engine.load(bpe_bundle, threads=2, kv_slots=2)
    with serve(engine, "bpe") as server:
        yield client_of(server)
    engine.close()


def ask(client: openai.OpenAI, input_value, **options):
    return client.responses.create(model=MODEL, input=input_value, tools=[FUNCTION],
                                   temperature=0, **options)


def result_of(call) -> dict:
    return {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}


def test_a_tool_loop_whole(tools):
    first = ask(tools, QUESTION)
    assert first.status == "completed" and first.output_text == ""
    (call,) = first.output  # no message: the reply is the call
    assert call.type == "function_call" and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert first.usage.output_tokens == len(CALL)

    items = [{"role": "user", "content": QUESTION}, call.model_dump(exclude_none=True),
             result_of(call)]
    second = ask(tools, items)
    assert second.status == "completed" and second.output_text == " ".join(ANSWER)
    assert [o.type for o in second.output] == ["message"]
    # The items reached the template as the chat route's messages would have.
    chat = tools.chat.completions.create(model=MODEL, temperature=0, tools=[WEATHER], messages=[
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "tool_calls": [{"id": call.call_id, "type": "function", "function": {
            "name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}])
    assert second.usage.input_tokens == chat.usage.prompt_tokens


def test_a_tool_loop_streamed_with_the_stream_helper(tools):
    with tools.responses.stream(model=MODEL, input=QUESTION, tools=[FUNCTION],
                                temperature=0) as stream:
        events = list(stream)
        first = stream.get_final_response()
    types = [e.type for e in events]
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta",
                     "response.function_call_arguments.delta",  # one per argument token
                     "response.function_call_arguments.done", "response.output_item.done",
                     "response.completed"]
    added = events[2].item
    assert added.type == "function_call" and added.name == "get_weather"
    assert added.arguments == "" and added.status == "in_progress"
    pieces = "".join(e.delta for e in events if e.type.endswith("arguments.delta"))
    (call,) = first.output
    assert (call.call_id, call.id) == (added.call_id, added.id)
    assert pieces == call.arguments == events[5].arguments
    assert json.loads(pieces) == {"city": "Paris"}

    items = [{"role": "user", "content": QUESTION}, call.model_dump(exclude_none=True),
             result_of(call)]
    with tools.responses.stream(model=MODEL, input=items, tools=[FUNCTION],
                                temperature=0) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        answer = stream.get_final_response()
    assert "".join(deltas) == answer.output_text == " ".join(ANSWER)


def test_tool_choice_none_shows_no_tools_and_parses_no_calls(tools):
    plain = ask(tools, QUESTION, tool_choice="none")
    assert [o.type for o in plain.output] == ["message"]
    assert plain.output_text == " ".join(CALL)
    assert plain.tool_choice == "none"


def test_the_reasoning_comes_as_an_item_before_the_answer(thinker):
    whole = thinker.responses.create(model=MODEL, input=QUESTION, temperature=0)
    reasoning, message = whole.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert reasoning.summary == [] and reasoning.content[0].type == "reasoning_text"
    assert reasoning.content[0].text == thinking.REASONING
    assert message.type == "message" and whole.output_text == "It is sunny."
    assert 0 < whole.usage.output_tokens_details.reasoning_tokens < whole.usage.output_tokens

    with thinker.responses.stream(model=MODEL, input=QUESTION, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    said = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thought, said) == (thinking.REASONING, "It is sunny.")
    for value in (thought, said):
        assert "<think>" not in value and "</think>" not in value
    assert [o.type for o in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == thinking.REASONING
    assert final.usage == whole.usage


def test_a_reply_sent_back_with_its_reasoning_is_one_assistant_message(thinker):
    whole = thinker.responses.create(model=MODEL, input=QUESTION, temperature=0,
                                     max_output_tokens=30)
    history = [{"role": "user", "content": QUESTION},
               *[o.model_dump(exclude_none=True) for o in whole.output],
               {"role": "user", "content": "thanks"}]
    again = thinker.responses.create(model=MODEL, input=history, temperature=0,
                                     max_output_tokens=1)
    chat = thinker.chat.completions.create(model=MODEL, temperature=0, max_tokens=1, messages=[
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "It is sunny.", "reasoning_content": thinking.REASONING},
        {"role": "user", "content": "thanks"}])
    assert again.usage.input_tokens == chat.usage.prompt_tokens


def test_structured_output_parses_into_a_pydantic_model(structured):
    for stream in (False, True):
        if stream:
            with structured.responses.stream(model="bpe", input="hello", text_format=Person,
                                             max_output_tokens=120, temperature=0) as s:
                done = s.get_final_response()
        else:
            done = structured.responses.parse(model="bpe", input="hello", text_format=Person,
                                              max_output_tokens=120, temperature=0)
        assert done.status == "completed"
        assert isinstance(done.output_parsed, Person)
    reply = structured.responses.create(model="bpe", input="hi", max_output_tokens=80,
                                        temperature=0, text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(reply.output_text), dict)
