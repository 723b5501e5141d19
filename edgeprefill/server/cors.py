"""Which web pages' scripts may call the server (CORS), and Starlette's middleware that
answers them.

A browser lets a page's script read a reply from another origin (a web UI on
localhost:3000 calling this server on :8000) only when the reply names the page's
origin in Access-Control-Allow-Origin, and asks first with an OPTIONS preflight that
carries no credentials. By default the local origins may (http or https, localhost,
127.0.0.1 or [::1], any port), as Ollama allows them by default; any other page the user
opens may not make their browser call the local model. `--cors-origins` lists the origins
(comma-separated), `*` allows every one (llama.cpp's server default), `none` turns CORS
off. Preflights are answered before the API-key check: a browser never sends the key on
them, and the request that follows still needs it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from edgeprefill.errors import RequestError

LOCAL = "local"  # the default: the loopback origins, any port
LOCAL_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?"
# An origin as browsers send it: scheme://host[:port], nothing after.
ORIGIN = re.compile(r"^[a-z][a-z0-9+.-]*://[^/?#\s]+$", re.IGNORECASE)


@dataclass(frozen=True)
class CorsPolicy:
    origins: tuple[str, ...] = ()  # exact origins, or ("*",)
    regex: str | None = None  # LOCAL_ORIGINS, or None

    @property
    def enabled(self) -> bool:
        return bool(self.origins or self.regex)

    def describe(self) -> str:
        """For the start-up line."""
        if not self.enabled:
            return "CORS off"
        if self.origins == ("*",):
            return "CORS: any origin"
        shown = ["local pages" if self.regex else "", *self.origins]
        return "CORS: " + ", ".join(s for s in shown if s)


def cors_policy(value: str) -> CorsPolicy:
    """`--cors-origins`: "local", "none", "*", or origins (and "local") separated by
    commas; anything else is refused in one line."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not items:
        raise RequestError("--cors-origins is empty: give local, none, * or origins")
    if items == ["none"]:
        return CorsPolicy()
    if "*" in items:
        if items != ["*"]:
            raise RequestError("--cors-origins: * allows every origin; give it alone")
        return CorsPolicy(("*",))
    regex = LOCAL_ORIGINS if LOCAL in items else None
    origins = tuple(item.rstrip("/") for item in items if item != LOCAL)
    bad = [o for o in origins if o == "none" or not ORIGIN.match(o)]
    if bad:
        raise RequestError(f"--cors-origins: {bad[0]!r} is no origin (scheme://host[:port], "
                           "e.g. http://localhost:3000), nor local, none or *")
    return CorsPolicy(origins, regex)
