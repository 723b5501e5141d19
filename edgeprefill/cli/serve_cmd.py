"""`edgeprefill serve`: an OpenAI-compatible HTTP server for one bundle."""

from __future__ import annotations

import socket
from pathlib import Path

import click

from edgeprefill.cli.options import spin_option
from edgeprefill.cli.serve_limits import limit_options, split_limits
from edgeprefill.errors import EdgeprefillError
from edgeprefill.sdk.scheduler import POLICIES


@click.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to listen on; 0.0.0.0 opens the server to the network.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--model-name", default=None,
              help="The model id clients send (default: the bundle folder's name).")
@click.option("--api-key", envvar="EDGEPREFILL_API_KEY", default=None, show_envvar=True,
              help="Require 'Authorization: Bearer KEY' on every route but /health.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads for the backend (default: physical cores).")
@spin_option
@click.option("--kv-slots", type=click.IntRange(min=1), default=4, show_default=True,
              help="Conversations whose KV cache is held at once.")
@click.option("--policy", type=click.Choice(POLICIES), default="chunked+priority",
              show_default=True, help="Scheduling policy.")
@click.option("--chunk-size", type=click.IntRange(min=1), default=None,
              help="Fixed prefill chunk in tokens (default: adaptive, see --itl-target-ms).")
@click.option("--itl-target-ms", type=click.FloatRange(min=0, min_open=True), default=150.0,
              show_default=True, help="Adaptive chunking keeps decode gaps under this.")
@click.option("--max-pending", type=click.IntRange(min=1), default=64, show_default=True,
              help="Requests admitted at once, running or queued; more get HTTP 429.")
@limit_options
def serve(
    bundle: Path, host: str, port: int, model_name: str | None, api_key: str | None,
    threads: int | None, spin: bool, kv_slots: int, policy: str, chunk_size: int | None,
    itl_target_ms: float, max_pending: int, **limit_values,
) -> None:
    """Serve BUNDLE over an OpenAI-compatible HTTP API (completions, chat, models,
    health, Prometheus metrics). Requests may add edgeprefill's own fields, e.g.
    "priority": -1 (or "high") to jump ahead of other prompts; lower is served first.

    \b
    Example:
      edgeprefill serve build/tiny-recall --port 8000
      curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
           -d '{"prompt": "the secret is jade . what was the secret ?", "max_tokens": 8}'
    """
    try:
        import uvicorn

        from edgeprefill.server import ServerConfig, create_app
        from edgeprefill.server.shutdown import run_until_signalled
        from edgeprefill.server.transport import quiet_fd_exhaustion, uvicorn_config
    except ImportError as err:
        raise EdgeprefillError(
            f"edgeprefill serve needs the server extra ({err.name} is missing): "
            "pip install 'edgeprefill[serve]'"
        ) from None
    from edgeprefill.sdk.engine import Engine

    _check_port_free(host, port)
    limits = split_limits(limit_values)
    config = ServerConfig(model_name=model_name or bundle.resolve().name, api_key=api_key,
                          max_pending=max_pending, **limits.config)
    click.echo(f"loading {bundle} ...", err=True)
    # The engine's queue holds at least what the server admits, so it never refuses one.
    engine = Engine.load(bundle, threads=threads, spin=spin, kv_slots=kv_slots, policy=policy,
                         chunk_size=chunk_size, itl_target_ms=itl_target_ms,
                         max_queue=max_pending)
    try:
        app = create_app(engine, config)
        auth = "API key required" if api_key else "no API key"
        click.echo(f"serving {config.model_name!r} on http://{host}:{port}/v1 ({auth}); "
                   "Ctrl-C to stop", err=True)
        quiet_fd_exhaustion()
        run_until_signalled(uvicorn.Server(uvicorn_config(app, host, port, limits.timeouts)))
        click.echo("stopped", err=True)
    except KeyboardInterrupt:
        # uvicorn has already shut down gracefully and re-raised Ctrl-C: a normal stop.
        click.echo("stopped", err=True)
    finally:
        engine.close()


def _check_port_free(host: str, port: int) -> None:
    """Fail with one clear line before loading the model, not with uvicorn's log."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as err:
        raise EdgeprefillError(
            f"cannot listen on {host}:{port} ({err.strerror}); pick another --port "
            "or stop the program using it"
        ) from None
