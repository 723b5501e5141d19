"""`POST /v1/responses`, OpenAI's Responses API, with the official `openai` client on a
live server (the tiny random llama): the Response object, its streamed events, the input
items, and each field it refuses. Tool loops, reasoning items and structured output:
tests/test_serve_responses_tools.py."""

from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from tests import served_llama  # noqa: E402
from tests.test_serve import (  # noqa: E402
    MODEL,
    NO_EOS,
    assert_error,
    assert_leaving_stops_the_reply,
    slow_down,
)

# The module's live server (tests/served_llama.py), by the names pytest looks up.
engine = served_llama.engine
server = served_llama.server
kv_is_clean_after_each_test = served_llama.kv_is_clean_after_each_test


GREEDY = {"model": MODEL, "temperature": 0, "extra_body": NO_EOS}
MESSAGES = [{"role": "system", "content": "w3"}, {"role": "user", "content": "w4 w5"}]


def chat_reply(client, messages=MESSAGES, max_tokens: int = 5):
    return client.chat.completions.create(messages=messages, max_tokens=max_tokens, **GREEDY)


def test_a_response_is_the_chat_route_s_greedy_reply_in_openai_s_shape(client):
    reply = client.responses.create(instructions="w3", input="w4 w5", max_output_tokens=5,
                                    **GREEDY)
    chat = chat_reply(client)
    assert reply.id.startswith("resp_") and reply.object == "response"
    assert reply.model == MODEL and isinstance(reply.created_at, (int, float))
    (message,) = reply.output
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.content[0].type == "output_text"
    assert reply.output_text == chat.choices[0].message.content != ""
    # Cut by max_output_tokens: incomplete, as is the item it cut.
    assert reply.status == "incomplete" and message.status == "incomplete"
    assert reply.incomplete_details.reason == "max_output_tokens"
    usage = reply.usage
    assert usage.input_tokens == chat.usage.prompt_tokens and usage.output_tokens == 5
    assert usage.total_tokens == usage.input_tokens + 5
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert usage.input_tokens_details.cached_tokens >= 0
    assert reply.instructions == "w3" and reply.max_output_tokens == 5
    assert reply.store is False and reply.tools == [] and reply.tool_choice == "auto"


def test_input_items_are_the_same_messages(client):
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": "w3"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "w4"},
                                                         {"type": "input_text", "text": " w5"}]},
        {"type": "message", "role": "assistant", "status": "completed", "id": "msg_1",
         "content": [{"type": "output_text", "text": "w6", "annotations": []}]},
        {"role": "user", "content": "w7"},
    ]
    reply = client.responses.create(input=items, max_output_tokens=4, **GREEDY)
    messages = [*MESSAGES, {"role": "assistant", "content": "w6"},
                {"role": "user", "content": "w7"}]
    assert reply.output_text == chat_reply(client, messages, 4).choices[0].message.content
    assert reply.usage.input_tokens == chat_reply(client, messages, 4).usage.prompt_tokens


def test_streamed_events_add_up_to_the_whole_response(client):
    args = dict(instructions="w3", input="w4 w5", max_output_tokens=6, **GREEDY)
    whole = client.responses.create(**args)
    events = list(client.responses.create(stream=True, **args))
    types = [e.type for e in events]
    assert types[:5] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added",
                         "response.output_text.delta"]
    assert types[-5:] == ["response.output_text.delta", "response.output_text.done",
                          "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == whole.output_text == events[-4].text
    item_id = events[2].item.id
    assert {e.item_id for e in events if hasattr(e, "item_id")} == {item_id}
    final = events[-1].response
    assert final.id == events[0].response.id and final.status == "incomplete"
    assert final.output_text == whole.output_text and final.usage.output_tokens == 6


def test_the_raw_stream_is_named_events_without_done(http):
    body = {"model": MODEL, "input": "w9", "max_output_tokens": 2, "stream": True, **NO_EOS}
    with http.stream("POST", "/v1/responses", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    names, data = lines[0::2], lines[1::2]
    assert all(n.startswith("event: ") for n in names)
    assert [n[7:] for n in names] == [json.loads(d[6:])["type"] for d in data]
    assert names[-1] == "event: response.incomplete"


def test_store_metadata_user_and_reasoning_are_accepted(client):
    reply = client.responses.create(input="w4", max_output_tokens=2, store=True,
                                    metadata={"k": "v"}, user="u1",
                                    reasoning={"effort": "low"}, **GREEDY)
    assert reply.store is False  # nothing is kept; the reply says so
    assert reply.metadata == {"k": "v"} and reply.user == "u1"



def test_the_response_echoes_the_request_s_reasoning(http):
    """As OpenAI's Response does: `effort` and `summary` as sent, null where not sent, in
    the whole Response and in every event that carries it. It said null for both always."""
    cases = [(None, {"effort": None, "summary": None}),
             ({"effort": "low", "summary": "auto"}, {"effort": "low", "summary": "auto"}),
             ({"effort": "none"}, {"effort": "none", "summary": None}),
             ({"generate_summary": "concise"}, {"effort": None, "summary": "concise"})]
    for reasoning, echoed in cases:
        body = {"model": MODEL, "input": "w4", "max_output_tokens": 2,
                "reasoning": reasoning, **NO_EOS}
        assert http.post("/v1/responses", json=body).json()["reasoning"] == echoed
        with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as response:
            events = [json.loads(line[6:]) for line in response.iter_lines()
                      if line.startswith("data: ")]
        carrying = [e for e in events if "response" in e]
        assert [e["type"] for e in carrying] == [
            "response.created", "response.in_progress", "response.incomplete"]
        assert all(e["response"]["reasoning"] == echoed for e in carrying)

REFUSED = [
    ({"previous_response_id": "resp_1"}, "previous_response_id", None),
    ({"conversation": "conv_1"}, "conversation", None),
    ({"background": True}, "background", None),
    ({"prompt": {"id": "pmpt_1"}}, "prompt", None),
    ({"truncation": "auto"}, "truncation", None),
    ({"top_logprobs": 2}, "top_logprobs", None),
    ({"max_tool_calls": 1}, "max_tool_calls", None),
    ({"include": ["message.output_text.logprobs"]}, "include", None),
    ({"text": {"verbosity": "low"}}, "text.verbosity", None),
    ({"text": {"format": {"type": "grammar"}}}, "text.format", None),
    ({"reasoning": {"budget": 5}}, "reasoning.budget", None),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", None),
    ({"reasoning": {"summary": "long"}}, "reasoning.summary", None),
    ({"reasoning": {"generate_summary": True}}, "reasoning.generate_summary", None),
    ({"stream_options": {"include_usage": True}}, "stream_options.include_usage", None),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", None),
    ({"tools": [{"type": "function", "name": "a b"}]}, "tools[0].name", None),
    ({"tool_choice": {"type": "web_search"}, "tools": []}, "tool_choice", None),
    ({"max_output_tokens": 0}, "max_output_tokens", None),
    ({"max_output_tokens": 1000}, "max_output_tokens", "context_length_exceeded"),
    ({"temperature": 3}, "temperature", None),
    ({"store": "yes"}, "store", None),
    ({"input": []}, "input", None),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", None),
    ({"input": [{"type": "input_image"}]}, "input[0].type", None),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", None),
    # a role JSON cannot use as a key (a list or an object) was a 500: unhashable type
    ({"input": [{"role": ["user"], "content": "x"}]}, "input[0].role", None),
    ({"input": [{"role": {"user": 1}, "content": "x"}]}, "input[0].role", None),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
     "input[0].content[0]", None),
    ({"input": [{"type": "function_call", "call_id": "c"}]}, "input[0].name", None),
    ({"frequency_penalty": 1}, "frequency_penalty", None),
]


@pytest.mark.parametrize("fields, param, code", REFUSED, ids=[p for _, p, _ in REFUSED])
def test_each_unsupported_field_is_a_400_naming_it(http, fields, param, code):
    body = {"model": MODEL, "input": "w5", **fields}
    error = assert_error(http.post("/v1/responses", json=body), 400, param, code)
    assert param.split("[")[0].split(".")[0] in error["message"] or param.startswith("input")


def test_an_unknown_model_is_a_404_naming_it(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="gpt-5", input="w5")
    assert (missing.value.body["param"], missing.value.body["code"]) == \
        ("model", "model_not_found")


def test_a_client_leaving_mid_stream_cancels_the_response(http, engine, monkeypatch):
    slow_down(monkeypatch, engine, 0.005)
    body = {"model": MODEL, "input": "w5 w6", "max_output_tokens": 400, "stream": True,
            **NO_EOS}
    assert_leaving_stops_the_reply(http, engine, "/v1/responses", body, lines=12)


def test_an_engine_failure_is_a_500_or_error_and_failed_events(client, http, engine,
                                                               monkeypatch):
    def broken(batch):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.backend, "run", broken)
    whole = http.post("/v1/responses", json={"model": MODEL, "input": "w5"})
    assert "device lost" in assert_error(whole, 500)["message"]
    events = list(client.responses.create(model=MODEL, input="w5", stream=True))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert "device lost" in events[-2].message
    assert events[-1].response.status == "failed"
    assert "device lost" in events[-1].response.error.message


def test_responses_are_counted_and_logged_under_their_route(client, http, caplog):
    caplog.set_level("INFO", logger="edgeprefill.server")
    client.responses.create(input="w5", max_output_tokens=3, **GREEDY)
    metrics = http.get("/metrics").text
    assert 'edgeprefill_http_requests_total{endpoint="responses",finish_reason="length"}' \
        in metrics
    assert any("POST /v1/responses 200" in r.getMessage() and "completion_tokens=3" in
               r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("field, body", [
    ("metadata.k", b'"metadata": {"k": NaN}'),
    ("tools[0].parameters.properties.n.maximum",
     b'"tools": [{"type": "function", "name": "f", "parameters": {"type": "object", '
     b'"properties": {"n": {"type": "number", "maximum": Infinity}}}}]'),
])
def test_nan_or_infinity_in_a_field_only_echoed_is_a_400_naming_it(server, field, body):
    """The reply echoes metadata and tools, which no setting's check reads: NaN there had
    been a 500 (the echo could not be written as JSON)."""
    raw = b'{"model": "%s", "input": "w4", "max_output_tokens": 2, %s}' % (
        MODEL.encode(), body)
    response = httpx.post(f"{server.url}/v1/responses", content=raw,
                          headers={"Content-Type": "application/json"})
    assert_error(response, 400, field, None)
