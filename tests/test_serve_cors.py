"""Which web pages' scripts may call the server (server/cors.py): by default the local ones
(a web UI on localhost:3000), not others; `--cors-origins` lists them, `*` allows all,
`none` turns CORS off. Preflights pass the API-key check, the requests after them do not."""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from edgeprefill.errors import RequestError  # noqa: E402
from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from edgeprefill.server.cors import cors_policy  # noqa: E402
from tests.test_serve import MODEL, engine, free_port  # noqa: E402, F401

PREFLIGHT = {"Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}
BODY = {"model": MODEL, "prompt": "w5", "max_tokens": 1}


def allowed(server, origin: str, key: str | None = None) -> tuple[bool, bool, int]:
    """(the preflight allows `origin`, the POST's reply names it, the POST's status)."""
    url = f"{server.url}/v1/completions"
    preflight = httpx.options(url, headers={"Origin": origin, **PREFLIGHT})
    headers = {"Origin": origin, **({"Authorization": f"Bearer {key}"} if key else {})}
    post = httpx.post(url, json=BODY, headers=headers)
    return (preflight.status_code == 200
            and preflight.headers.get("access-control-allow-origin") in (origin, "*"),
            post.headers.get("access-control-allow-origin") in (origin, "*"),
            post.status_code)


LOCAL_PAGES = ["http://localhost:3000", "http://127.0.0.1:5173", "https://[::1]"]
OTHERS = ["https://evil.example", "http://localhost.evil.example"]


@pytest.mark.parametrize("value, allowed_origins, refused_origins", [
    ("local", LOCAL_PAGES, [*OTHERS, "https://app.example"]),
    ("https://app.example", ["https://app.example"], [LOCAL_PAGES[0], *OTHERS]),
    ("local,https://app.example", [LOCAL_PAGES[0], "https://app.example"], OTHERS),
    ("*", [*LOCAL_PAGES, *OTHERS], []),
    ("none", [], [*LOCAL_PAGES, "https://app.example"]),
])
def test_the_pages_cors_allows(engine, value, allowed_origins, refused_origins):  # noqa: F811
    app = create_app(engine, ServerConfig(model_name=MODEL, cors=cors_policy(value)))
    with ServerThread(app, port=free_port()) as server:
        for origin in allowed_origins:
            assert allowed(server, origin) == (True, True, 200), origin
        for origin in refused_origins:
            assert allowed(server, origin) == (False, False, 200), origin


def test_a_preflight_needs_no_key_and_the_request_still_does(engine):  # noqa: F811
    """A browser sends no credentials on the preflight: it must pass the key check (it
    was a 401), and the refusal of a request without the key must name the origin, so
    that the page's script can read it."""
    app = create_app(engine, ServerConfig(model_name=MODEL, api_key="k"))
    with ServerThread(app, port=free_port()) as server:
        assert allowed(server, "http://localhost:3000", key="k") == (True, True, 200)
        assert allowed(server, "http://localhost:3000") == (True, True, 401)


@pytest.mark.parametrize("value, said", [
    ("", "is empty"), ("*,local", "give it alone"), ("localhost:3000", "is no origin"),
    ("http://a.example/path", "is no origin"), ("local,none", "is no origin"),
])
def test_a_bad_cors_origins_is_refused_in_a_line(value, said):
    with pytest.raises(RequestError, match=said):
        cors_policy(value)
