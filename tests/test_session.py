"""A session's conversation only grows by turns the engine accepted."""

from __future__ import annotations

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
