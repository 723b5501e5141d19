"""The live server the API test modules share (test_serve_messages, _responses, _ollama,
test_server_routes): the conftest's tiny llama on an engine of 4 KV slots, served on a
free port, and the KV cache idle again after each test. Pytest finds fixtures by the
names a module holds, so a module binds them (an import would be shadowed by the tests'
arguments of those names):

    engine = served_llama.engine
    server = served_llama.server
    kv_is_clean_after_each_test = served_llama.kv_is_clean_after_each_test

Each module that binds them gets its own engine and server (module scope)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from edgeprefill.sdk import Engine
from edgeprefill.server import ServerThread
from tests.test_serve import serving, wait_idle


@pytest.fixture(scope="module")
def engine(bundle) -> Iterator[Engine]:
    engine = Engine.load(bundle("llama"), threads=2, kv_slots=4)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(engine) -> Iterator[ServerThread]:
    with serving(engine) as server:
        yield server


@pytest.fixture(autouse=True)
def kv_is_clean_after_each_test(engine) -> Iterator[None]:
    yield
    wait_idle(engine)
