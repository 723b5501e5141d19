"""`serve`'s limits and timeouts, declared once: options, and the objects built from them."""

from __future__ import annotations

from typing import Any, NamedTuple

import click

LIMIT_OPTIONS = (
    click.option("--max-body-mb", type=click.FloatRange(min=0, min_open=True), default=None,
                 # The figures are server.app's BODY_* (not imported: no starlette for --help).
                 help="Larger request bodies get HTTP 413 (default: from the context, "
                      "64 KiB + 64 bytes per token)."),
    click.option("--header-timeout", type=click.FloatRange(min=0, min_open=True),
                 default=10.0, show_default=True,
                 help="Seconds a client has to send its request headers; then the "
                      "connection is closed."),
    click.option("--body-timeout", type=click.FloatRange(min=0, min_open=True),
                 default=30.0, show_default=True,
                 help="Seconds a client has to send its request body; then HTTP 408."),
    click.option("--keep-alive-timeout", type=click.FloatRange(min=0, min_open=True),
                 default=5.0, show_default=True,
                 help="Seconds an idle connection stays open between requests."),
    click.option("--send-timeout", type=click.FloatRange(min=0, min_open=True),
                 default=30.0, show_default=True,
                 help="Seconds a client may leave its reply unread (the connection's "
                      "buffers full); then the connection is closed and the request "
                      "cancelled."),
    click.option("--shutdown-timeout", type=click.FloatRange(min=0, min_open=True),
                 default=5.0, show_default=True,
                 help="On SIGTERM or Ctrl-C, seconds running requests may finish in."),
    click.option("--prompt-timeout", type=click.FloatRange(min=0, min_open=True),
                 default=10.0, show_default=True,
                 help="Seconds to tokenize a prompt and render its chat template; "
                      "then HTTP 400."),
    click.option("--prompt-workers", type=click.IntRange(min=1), default=1,
                 show_default=True,
                 help="Processes that tokenize and render chat templates (~50 MB each)."),
)

LIMIT_NAMES = ("max_body_mb", "header_timeout", "body_timeout", "keep_alive_timeout",
               "send_timeout", "shutdown_timeout", "prompt_timeout", "prompt_workers")


def limit_options(command):
    for option in reversed(LIMIT_OPTIONS):
        command = option(command)
    return command


class Limits(NamedTuple):
    config: dict[str, Any]  # ServerConfig fields
    timeouts: Any  # server.transport.HttpTimeouts


def split_limits(options: dict[str, Any]) -> Limits:
    """Pop the limit options out of a command's keyword arguments."""
    from edgeprefill.server.transport import HttpTimeouts

    values = {name: options.pop(name) for name in LIMIT_NAMES}
    mb = values["max_body_mb"]
    config = {
        "max_body_bytes": None if mb is None else int(mb * 2**20),
        "body_timeout_s": values["body_timeout"],
        "prompt_timeout_s": values["prompt_timeout"],
        "prompt_workers": values["prompt_workers"],
    }
    timeouts = HttpTimeouts(header=values["header_timeout"],
                            keep_alive=values["keep_alive_timeout"],
                            graceful_shutdown=values["shutdown_timeout"],
                            send=values["send_timeout"])
    return Limits(config, timeouts)
