"""`edgeprefill run BUNDLE`: generate from a prompt, a chat, or several concurrent requests."""

from __future__ import annotations

import click

from edgeprefill.cli import run_modes
from edgeprefill.cli.options import spin_option
from edgeprefill.errors import RequestError


def _priority(ctx: click.Context, param: click.Parameter, value: str) -> int:
    from edgeprefill.sdk.priority import parse_priority

    try:
        return parse_priority(value)
    except RequestError as err:
        raise click.BadParameter(str(err)) from None


@click.command()
@click.argument("bundle", type=click.Path(path_type=str))
@click.option("-p", "--prompt", help="Prompt text.")
@click.option("--prompt-file", type=click.File("r"), help="Read the prompt from a file.")
@click.option("--chat", is_flag=True, help="Send the prompt as a user message through the "
              "bundle's chat template.")
@click.option("--interactive", is_flag=True, help="Multi-turn chat in the terminal.")
@click.option("--sessions", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Run the prompt as N concurrent requests.")
@click.option("--prompts", "prompts_file", type=click.File("r"),
              help="JSON lines of concurrent requests: {\"prompt\", \"priority\" (lower first), "
                   "\"max_new_tokens\", \"delay_s\"} (or one plain prompt per line).")
@click.option("--priority", default="0", show_default=True, callback=_priority,
              help="Lower is served first (vLLM's meaning); high, normal, low = -1, 0, 1. "
                   "For --sessions, and --prompts lines that give none.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--temperature", type=float, default=None,
              help="0 is greedy. Default (as for --top-k, --top-p, --repetition-penalty): "
                   "the bundle's generation_config.json, else 0.")
@click.option("--top-k", type=int, default=None, help="Default: the bundle's, else 0 (none).")
@click.option("--top-p", type=float, default=None, help="Default: the bundle's, else 1.")
@click.option("--repetition-penalty", type=float, default=None,
              help="Default: the bundle's, else 1.")
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--chunk-size", type=click.IntRange(1), default=None,
              help="Fixed prefill chunk. Default: adaptive over the bundle's buckets.")
@click.option("--policy", type=click.Choice(["fcfs", "chunked", "chunked+priority"]),
              default="chunked+priority", show_default=True)
@click.option("--itl-target-ms", type=float, default=150.0, show_default=True,
              help="Adaptive chunking keeps decode inter-token latency under this.")
@click.option("--threads", type=click.IntRange(1), default=None,
              help="Intra-op threads. Default: physical cores.")
@spin_option
@click.option("--kv-slots", type=click.IntRange(1), default=4, show_default=True,
              help="Conversations whose KV cache is held at once.")
@click.option("--backend", default="onnxruntime", show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda", "tensorrt"]), default="cpu",
              show_default=True)
@click.option("--stats", is_flag=True, help="Print TTFT, prefill/decode tokens/s and chunks "
              "to stderr.")
def run(bundle, prompt, prompt_file, chat, interactive, sessions, prompts_file, priority, stats,
        max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed, stop,
        chunk_size, policy, itl_target_ms, threads, spin, kv_slots, backend, device):
    """Generate text from a bundle. Only the generated text goes to stdout, so it pipes.

    \b
    Examples:
      edgeprefill run build/tiny-recall --prompt-file models/tiny-recall/demo_prompt.txt --stats
      edgeprefill run build/tiny-recall --interactive
      edgeprefill run build/tiny-recall --prompts requests.jsonl --stats
    """
    from edgeprefill.sdk import Engine

    if prompt is not None and prompt_file is not None:
        raise RequestError("give --prompt or --prompt-file, not both")
    if prompt_file is not None:
        prompt = prompt_file.read().rstrip("\n")
    modes = sum([prompt is not None, interactive, prompts_file is not None])
    if modes != 1:
        raise RequestError("give exactly one of --prompt/--prompt-file, --interactive, --prompts")
    engine = Engine.load(
        bundle, backend=backend, device=device, threads=threads, spin=spin, kv_slots=kv_slots,
        policy=policy, chunk_size=chunk_size, itl_target_ms=itl_target_ms,
    )
    with engine:
        params = engine.default_params(
            max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
            repetition_penalty=repetition_penalty, seed=seed, stop=tuple(stop),
        )
        if interactive:
            run_modes.interactive(engine, params, chat, stats)
        elif prompts_file is not None:
            jobs = run_modes.read_requests(prompts_file, params, priority)
            run_modes.concurrent(engine, jobs, stats)
        elif sessions > 1:
            requests = [run_modes.Job(prompt, params, priority, 0.0)] * sessions
            run_modes.concurrent(engine, requests, stats, chat=chat)
        else:
            run_modes.single(engine, prompt, params, chat, stats)
