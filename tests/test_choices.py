"""The server's view of an n > 1 request as one stream (server/choices.py), on the fake
backend: leaving the merged stream early ends quietly."""

from __future__ import annotations

import asyncio
import gc

from edgeprefill.sdk import GenerationParams
from edgeprefill.server.choices import Choices
from tests.fake_backend import ids


def test_leaving_the_merged_choices_early_leaves_no_unretrieved_error(fake_engine):
    engine = fake_engine(kv_slots=4)
    choices = Choices(engine.submit_n(ids(20), GenerationParams(
        max_new_tokens=300, ignore_eos=True), 3))
    unhandled: list[dict] = []

    async def read_two_then_leave() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: unhandled.append(ctx))
        events = choices.indexed()
        await events.__anext__()
        await events.__anext__()
        await events.aclose()  # a client that disconnects
        choices.cancel()
        await asyncio.sleep(0.05)  # the pumps see their cancellation
        gc.collect()  # an unretrieved exception is reported when its future is collected
        await asyncio.sleep(0)

    asyncio.run(read_two_then_leave())
    assert unhandled == []
    assert all(s.finish_reason == "cancelled" for s in choices.streams)
