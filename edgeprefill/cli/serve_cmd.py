"""`edgeprefill serve`: an OpenAI-compatible HTTP server for one bundle."""

from __future__ import annotations

import errno
import ipaddress
import socket
from pathlib import Path

import click

from edgeprefill.cli.options import ENGINE_OPTIONS, SectionedCommand, engine_options
from edgeprefill.cli.serve_limits import LIMIT_NAMES, limit_options, split_limits
from edgeprefill.errors import EdgeprefillError

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")  # uvicorn's and logging's
REASONING_MODES = ("auto", "none")  # server.reasoning.MODES (not imported: --help needs no
# starlette; a test checks they agree)


@click.command(cls=SectionedCommand, sections={
    "Server options": ("host", "port", "model_name", "api_key", "cors_origins",
                       "reasoning_parser", "reasoning_budget", "log_level"),
    "Engine options (as run's)": tuple(ENGINE_OPTIONS),
    "Limits and timeouts": ("max_pending", *LIMIT_NAMES),
})
@click.argument("bundle", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to listen on; 0.0.0.0 opens the server to the network.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port to listen on; 0: one the OS picks (printed at start-up).")
@click.option("--model-name", default=None,
              help="The model id clients send (default: the bundle folder's name; a "
              "bundle exported from ollama:NAME, that NAME).")
@click.option("--api-key", envvar="EDGEPREFILL_API_KEY", default=None, show_envvar=True,
              help="Require 'Authorization: Bearer KEY' or 'x-api-key: KEY' on every "
              "route but /health and / (Ollama's liveness probe).")
@click.option("--cors-origins", default="local", show_default=True,
              help="The web pages whose scripts may call the server (CORS): local (pages "
              "served from localhost, 127.0.0.1 or [::1], any port), origins separated by "
              "commas (e.g. local,https://app.example), * (any page), or none.")
@engine_options()
@click.option("--max-pending", type=click.IntRange(min=1), default=64, show_default=True,
              help="Requests admitted at once, running or queued, a request of n choices "
                   "counting n; more get HTTP 429.")
@limit_options
@click.option("--reasoning-parser", type=click.Choice(REASONING_MODES), default="auto",
              show_default=True,
              help="auto: where the chat template thinks (<think>...</think>: Qwen3, "
              "DeepSeek-R1, SmolLM3), a chat reply's reasoning comes back apart, as "
              "message.reasoning_content and .reasoning (streamed as deltas of both), its "
              "answer as content; none: the reply is all content, tags included.")
@click.option("--reasoning-budget", type=click.IntRange(min=-1), default=-1, show_default=True,
              help="As llama.cpp's: the most tokens a chat reply's <think> block may take "
              "before its </think> is forced and the reply goes on as the answer, where "
              "the request sets no budget (thinking_token_budget, the Messages API's "
              "thinking.budget_tokens); -1: no cap, 0: the block is closed at once.")
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default="info", show_default=True,
              help="info: one line per request (method, path, status, tokens, TTFT, "
              "duration); warning: problems only.")
def serve(
    bundle: Path, host: str, port: int, model_name: str | None, api_key: str | None,
    cors_origins: str, max_pending: int, reasoning_parser: str, reasoning_budget: int,
    log_level: str, engine: dict, **limit_values,
) -> None:
    """Serve BUNDLE over an OpenAI-compatible HTTP API (completions, chat with tools,
    the Responses API (stateless), Anthropic's Messages API, Ollama's native API,
    models, tokenize/detokenize, version, health, Prometheus metrics), logging one line
    per request; an embedding bundle answers /v1/embeddings, Ollama's /api/embed and
    text-embeddings-inference's /embed instead of the generating routes, a score bundle
    (a reranker) /v1/rerank and /rerank (Jina's and TEI's shapes); both answer vLLM's
    /v1/score and /score. Requests may add edgeprefill's own fields, e.g. "priority": -1 (or "high")
    to jump ahead of long prompts; lower is served first.

    \b
    Example:
      edgeprefill serve build/tiny-recall --port 8000
      curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
           -d '{"prompt": "the secret is jade . what was the secret ?", "max_tokens": 8}'
    """
    try:
        import uvicorn

        from edgeprefill.server import ServerConfig, create_app
        from edgeprefill.server.access_log import configure_logging, uvicorn_level
        from edgeprefill.server.cors import cors_policy
        from edgeprefill.server.shutdown import quiet_forced_stop, run_until_signalled
        from edgeprefill.server.transport import quiet_fd_exhaustion, uvicorn_config
    except ImportError as err:
        raise EdgeprefillError(
            f"edgeprefill serve needs the server extra ({err.name} is missing): "
            "pip install 'edgeprefill[serve]'"
        ) from None
    from edgeprefill.sdk.engine import Engine

    listener = _bind(host, port)
    port, sockets = _served_on(listener, port)
    limits = split_limits(limit_values)
    config = ServerConfig(model_name=model_name or served_name(bundle), api_key=api_key,
                          max_pending=max_pending, reasoning_parser=reasoning_parser,
                          reasoning_budget=reasoning_budget, cors=cors_policy(cors_origins),
                          **limits.config)
    click.echo(f"loading {bundle} ...", err=True)
    # The engine's queue holds at least what the server admits, so it never refuses one.
    try:
        loaded = Engine.load(bundle, max_queue=max_pending, **engine)
    except BaseException:
        listener.close()
        raise
    try:
        app = create_app(loaded, config)
        auth = "API key required" if api_key else "no API key"
        shown = f"[{host}]" if ":" in host else host  # an IPv6 address, as URLs write it
        click.echo(f"serving {config.model_name!r} on http://{shown}:{port}/v1 ({auth}; "
                   f"{config.cors.describe()}); Ctrl-C to stop", err=True)
        _warn_if_the_template_fails(loaded)
        if not api_key and not _loopback(host):
            click.echo(f"warning: --host {host} takes requests from other machines, and "
                       "there is no API key: anyone who reaches the port can use the model "
                       "(--api-key, or EDGEPREFILL_API_KEY)", err=True)
        quiet_fd_exhaustion()
        quiet_forced_stop()
        server_config = uvicorn_config(app, host, port, limits.timeouts,
                                       uvicorn_level(log_level))
        server_config.access_log = False  # our line per request replaces uvicorn's
        configure_logging(log_level)  # after uvicorn's own logging setup, so ours stands
        run_until_signalled(uvicorn.Server(server_config), sockets)
        click.echo("stopped", err=True)
    except KeyboardInterrupt:
        # uvicorn has already shut down gracefully and re-raised Ctrl-C: a normal stop.
        click.echo("stopped", err=True)
    finally:
        listener.close()
        loaded.close()


def served_name(bundle: Path) -> str:
    """The model id of a bundle served without --model-name: the name Ollama knew it by
    where it was exported from Ollama's store (its clients send that name: `tiny` for
    `tiny:latest`, which the Ollama routes also take), else the bundle folder's name."""
    from edgeprefill.bundle import load_manifest

    ollama = load_manifest(bundle).source.get("ollama") or {}
    name = ollama.get("name") if isinstance(ollama, dict) else None
    if not isinstance(name, str) or not name:
        return bundle.resolve().name
    return name.removesuffix(":latest")


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (not yet listening): fails with one clear line before
    loading the model, not with uvicorn's log."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    bound = socket.socket(family, socket.SOCK_STREAM)
    try:
        bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bound.bind((host, port))
        return bound
    except OSError as err:
        bound.close()
        # "in use" is about the port; anything else (not one of this machine's
        # addresses, no such host name) is about --host.
        fix = ("pick another --port or stop the program using it"
               if err.errno == errno.EADDRINUSE else
               "give --host one of this machine's addresses (127.0.0.1: this machine only; "
               "0.0.0.0: every interface)")
        raise EdgeprefillError(f"cannot listen on {host}:{port} ({err.strerror}); {fix}") \
            from None


def _served_on(listener: socket.socket, port: int) -> tuple[int, list[socket.socket] | None]:
    """The port served and the sockets uvicorn is to serve on. Port 0 (the OS picks one)
    is served on `listener` itself, so the port printed is the one served (uvicorn would
    bind another of its own choosing). Any other port uvicorn binds again: a host name on
    each of its addresses (`listener` has the first)."""
    if port == 0:
        return listener.getsockname()[1], [listener]
    listener.close()
    return port, None


def _warn_if_the_template_fails(engine) -> None:
    """Export refuses such a template, but a manifest edited since may hold one: then every
    chat request is a 400 that reads as the client's fault. Said once, at start-up."""
    from edgeprefill.errors import RequestError
    from edgeprefill.sdk.chat_template import SAMPLE_CONVERSATION

    template = engine.tokenizer.chat_template
    if template is None:
        return
    try:
        template.render(list(SAMPLE_CONVERSATION))
    except RequestError as err:
        click.echo(f"warning: the bundle's chat template fails on a sample conversation "
                   f"(user, assistant, user): {err}; /v1/chat/completions will refuse what "
                   "it cannot render", err=True)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
