"""The server's view of an n > 1 request as one stream (server/choices.py), on the fake
backend: leaving the merged stream early ends quietly."""

from __future__ import annotations

import asyncio
import gc
import time

from edgeprefill.sdk import GenerationParams
from edgeprefill.server.choices import Choices
from tests.fake_backend import ids


def test_leaving_the_merged_choices_early_leaves_no_unretrieved_error(fake_engine):
    engine = fake_engine(kv_slots=4)
    choices = Choices(engine.submit_n(ids(20), GenerationParams(
        max_new_tokens=300, ignore_eos=True), 3))
    unhandled: list[dict] = []
    left: list[asyncio.Task] = []  # tasks still pending: "destroyed but it is pending!"

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
        left.extend(t for t in asyncio.all_tasks() if t is not asyncio.current_task())

    asyncio.run(read_two_then_leave())
    assert unhandled == []
    assert left == []
    # The engine ends a cancelled request at its next step boundary: on a loaded machine
    # (the suite's two workers on two cores) that can come after the 50 ms above.
    deadline = time.monotonic() + 10
    while not choices.done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(s.finish_reason == "cancelled" for s in choices.streams)


def test_a_reader_cancelled_mid_wait_leaves_no_task_behind(fake_engine, monkeypatch):
    engine = fake_engine(kv_slots=4)
    run = engine.backend.run
    monkeypatch.setattr(engine.backend, "run", lambda step: (time.sleep(0.02), run(step))[1])
    choices = Choices(engine.submit_n(ids(20), GenerationParams(
        max_new_tokens=300, ignore_eos=True), 3))
    left: list[asyncio.Task] = []

    async def read_all() -> None:
        async for _ in choices.indexed():
            pass

    async def leave_mid_wait() -> None:
        reader = asyncio.ensure_future(read_all())
        await asyncio.sleep(0.1)  # waiting for the next event, in asyncio.wait
        reader.cancel()  # what the server does when the client disconnects
        await asyncio.gather(reader, return_exceptions=True)
        choices.cancel()
        await asyncio.sleep(0.05)
        left.extend(t for t in asyncio.all_tasks() if t is not asyncio.current_task())

    asyncio.run(leave_mid_wait())
    assert left == []  # asyncio logged "Task was destroyed but it is pending!" for each
