"""A session's conversation only grows by turns the engine accepted."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from edgeprefill.errors import RequestError
from edgeprefill.sdk import Engine, GenerationParams

GREEDY = GenerationParams(max_new_tokens=4, temperature=0.0)


def test_a_refused_chat_turn_leaves_the_conversation_as_it_was(tiny_bundle):
    with Engine.load(tiny_bundle, threads=1, kv_slots=2) as engine:
        session = engine.session()
        first = session.chat("hello", GREEDY).result()
        too_long = "hello " * (engine.manifest.max_context + 10)
        with pytest.raises(RequestError):
            session.chat(too_long, GREEDY)
        # The first reply was folded in; the refused message was not.
        assert session.messages == [{"role": "user", "content": "hello"},
                                    {"role": "assistant", "content": first.text}]
        second = session.chat("again", GREEDY).result()
        # The turn after the refusal is exactly the turn without it.
        with Engine.load(tiny_bundle, threads=1, kv_slots=2) as fresh:
            again = fresh.session()
            assert again.chat("hello", GREEDY).result().token_ids == first.token_ids
            assert again.chat("again", GREEDY).result().token_ids == second.token_ids


def test_template_kwargs_are_checked_when_set_in_the_tokenizer_s_words(tiny_bundle):
    # {"tools": 5} had reached the template at the next turn: "chat template: TypeError:
    # 'int' object is not iterable". The reference: the tokenizer's own call's refusal.
    with Engine.load(tiny_bundle, threads=1, kv_slots=1) as engine:
        with pytest.raises(RequestError) as direct:
            engine.tokenizer.encode([{"role": "user", "content": "hi"}], tools=5)
        session = engine.session()
        for bad in ({"tools": 5}, {"documents": 5}, {"tools": ["get_weather"]}):
            with pytest.raises(RequestError, match="must be a list of JSON objects$") as err:
                session.template_kwargs = bad
        with pytest.raises(RequestError) as err:
            session.template_kwargs = {"tools": 5}
        assert str(err.value) == str(direct.value) == \
            "chat template tools must be a list of JSON objects"
        with pytest.raises(RequestError, match="template_kwargs must be a dict"):
            session.template_kwargs = ["tools"]  # type: ignore[assignment]
        assert session.template_kwargs == {}  # the refused values were not kept
        session.template_kwargs = {"tools": [{"type": "function"}], "enable_thinking": False}
        session.chat("hello", GREEDY).result()  # a good value renders
        assert session.last_prompt and session.messages[0]["content"] == "hello"


def test_submit_naming_a_session_this_engine_never_made_is_refused_in_one_line(tiny_bundle):
    # A made-up id used to be taken as a new session's: it claimed a KV slot under an id
    # that may be a request's, and nothing stopped two turns of it at once.
    with Engine.load(tiny_bundle, threads=1, kv_slots=2) as engine, \
            Engine.load(tiny_bundle, threads=1, kv_slots=2) as other:
        ids = engine.tokenizer.encode("hello")
        foreign = other.session()
        for unknown in (12345, foreign.id + 1000):
            with pytest.raises(RequestError, match=f"unknown session id {unknown}: "):
                engine.submit(ids, GREEDY, 0, unknown)
        # A session's own id is accepted, and is that session's turn.
        session = engine.session()
        reply = engine.submit(ids, GREEDY, 0, session.id).result()
        assert reply.token_ids == engine.generate("hello", GREEDY).result().token_ids


def test_an_empty_text_prompt_is_refused_as_the_completions_route_refuses_it(tiny_bundle,
                                                                              monkeypatch):
    # It used to run the BOS alone and generate from nothing. Whitespace is text where the
    # tokenizer keeps it (a base model may continue from "\n"); where it drops it (this
    # word-level tokenizer), it ran the BOS alone too.
    with Engine.load(tiny_bundle, threads=1, kv_slots=2) as engine:
        assert engine.tokenizer.encode("") != []  # the BOS the request would have run
        with pytest.raises(RequestError, match="^the prompt is empty$"):
            engine.generate("", GREEDY)
        for blank in ("\n", "   "):
            assert engine.tokenizer.encode(blank) == engine.tokenizer.encode("")
            with pytest.raises(RequestError, match="^the prompt is empty \\(its whitespace"):
                engine.generate(blank, GREEDY)
        kept = engine.tokenizer.encode("") + engine.tokenizer.encode_plain("jade")
        encode = engine.tokenizer.encode  # a tokenizer that keeps "\n" as a token
        monkeypatch.setattr(engine.tokenizer, "encode",
                            lambda p, **k: kept if p == "\n" else encode(p, **k))
        newline = engine.generate("\n", replace(GREEDY, ignore_eos=True)).result()
        assert len(newline.token_ids) == 4


def test_an_empty_or_missing_chat_turn_is_refused_in_one_line(tiny_bundle):
    # chat("") rendered a user turn with no text and answered the template's scaffolding;
    # chat(None) handed None to the template.
    with Engine.load(tiny_bundle, threads=1, kv_slots=2) as engine:
        session = engine.session()
        for blank in ("", "  \n"):
            with pytest.raises(RequestError, match="^the chat turn is empty: send the "):
                session.chat(blank, GREEDY)
        with pytest.raises(RequestError, match="^chat\\(\\) takes the user's text as a "
                           "string, got NoneType$"):
            session.chat(None, GREEDY)  # type: ignore[arg-type]
        assert session.messages == []  # nothing joined the conversation
        reply = session.chat("hello", GREEDY).result()
        assert reply.token_ids == engine.generate(
            [{"role": "user", "content": "hello"}], GREEDY).result().token_ids


def test_two_threads_turns_on_one_session_never_lose_one(tiny_bundle):
    """Two threads' turns had both passed the "previous reply is still being generated"
    check (5 in 200 tries), and the conversation kept one of them: every accepted turn is
    now in it, and a refused one says why."""
    def turn(session, barrier, accepted, word: str) -> None:
        barrier.wait()
        try:
            accepted.append(session.chat(f"the secret is {word} . what was the secret ?",
                                         GREEDY))
        except RequestError as err:
            assert "still being generated" in str(err)

    with Engine.load(tiny_bundle, threads=1, kv_slots=2) as engine:
        submit = engine.submit

        def slow_submit(*args, **kwargs):  # widens the window between check and record
            time.sleep(0.02)
            return submit(*args, **kwargs)

        engine.submit = slow_submit  # type: ignore[method-assign]
        for _ in range(10):
            session, barrier, accepted = engine.session(), threading.Barrier(2), []
            threads = [threading.Thread(target=turn, args=(session, barrier, accepted, w))
                       for w in ("jade", "onyx")]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
            for stream in accepted:
                stream.result()
            users = [m for m in session.messages if m["role"] == "user"]
            assert len(users) == len(accepted) >= 1
            session.close()
