"""`edgeprefill run BUNDLE`: generate from a prompt, a chat, or several concurrent requests."""

from __future__ import annotations

import sys
from typing import IO

import click
from click.core import ParameterSource

from edgeprefill.cli import run_modes
from edgeprefill.cli.chat import ChatLoop
from edgeprefill.cli.options import engine_options
from edgeprefill.errors import RequestError

DEFAULT_NEW_TOKENS = 256  # GenerationParams' default (edgeprefill.sdk loads onnxruntime)


def _priority(ctx: click.Context, param: click.Parameter, value: str) -> int:
    from edgeprefill.sdk.priority import parse_priority

    try:
        return parse_priority(value)
    except RequestError as err:
        raise click.BadParameter(str(err)) from None


@click.command()
@click.argument("bundle", type=click.Path(path_type=str))
# nargs=-1: the words of an unquoted prompt arrive apart (_one_prompt joins them).
@click.argument("prompt_words", metavar="[PROMPT]", nargs=-1)
@click.option("-p", "--prompt", help="Prompt text (or give it after BUNDLE).")
@click.option("--prompt-file", type=click.File("r"), help="Read the prompt from a file.")
@click.option("--chat", is_flag=True, help="Send the prompt as a user message through the "
              "bundle's chat template.")
@click.option("--system", default=None, help="A system message before the prompt (implies "
              "--chat); it takes the place of the bundle's default one (an Ollama "
              "model's SYSTEM: `inspect` shows it).")
@click.option("--interactive", is_flag=True, help="Multi-turn chat in the terminal "
              "(/help lists its commands).")
@click.option("--sessions", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Run the prompt as N concurrent requests.")
@click.option("--prompts", "prompts_file", type=click.File("r"),
              help="JSON lines of concurrent requests: {\"prompt\", \"priority\" (lower "
                   "first), \"delay_s\", and any sampling field such as \"max_new_tokens\"} "
                   "(or a line that is a JSON string or plain text: the prompt alone).")
@click.option("--priority", default="0", show_default=True, callback=_priority,
              help="Lower is served first (vLLM's meaning); high, normal, low = -1, 0, 1. "
                   "For --sessions, and --prompts lines that give none.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=None,
              help=f"Default: {DEFAULT_NEW_TOKENS}, or to the end of the context where the "
                   "prompt leaves less room; a value given here refuses such a prompt.")
@click.option("--temperature", type=float, default=None,
              help="0 is greedy. Default (as for --top-k, --top-p, --repetition-penalty): "
                   "the bundle's generation_config.json, else 0.")
@click.option("--top-k", type=int, default=None, help="Default: the bundle's, else 0 (none).")
@click.option("--top-p", type=float, default=None, help="Default: the bundle's, else 1.")
@click.option("--repetition-penalty", type=float, default=None,
              help="Default: the bundle's, else 1.")
@click.option("--seed", type=int, default=None,
              help="Sampling seed (with --temperature > 0), to reproduce a sampled reply. "
                   "Default: a fresh one each run.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past the end-of-sequence "
              "token (to --max-new-tokens or a stop string).")
@click.option("--thinking-budget", type=click.IntRange(0), default=None,
              help="Reasoning models (<think>...</think>: Qwen3, DeepSeek-R1, SmolLM3): "
              "the most tokens the reply's thinking may take before its </think> is forced "
              "and the reply goes on as the answer. Default: no cap.")
@click.option("--think/--no-think", default=None,
              help="Reasoning models: the chat template's enable_thinking (Qwen3, SmolLM3; "
              "a template without it ignores it; implies --chat). Default: the template's "
              "own. In --interactive, /think and /nothink switch it.")
@click.option("--hide-thinking", is_flag=True,
              help="Reasoning models: print only the answer, not the thinking before it. "
              "Otherwise a chat reply's thinking is printed apart, between 'Thinking...' "
              "and '...done thinking.' (dimmed on a terminal).")
@click.option("--dimensions", type=click.IntRange(1), default=None,
              help="Embedding bundles: the first N dimensions of each vector (normalized "
                   "again where the bundle normalizes). Default: all.")
@click.option("--prompt-name", default=None,
              help="Embedding bundles: put the model's prompt of that name before each text "
                   "(Qwen3-Embedding's 'query' for search queries; `inspect` lists them). "
                   "Default: the model's default prompt, if it names one.")
@click.option("--query", default=None,
              help="Score bundles (rerankers): rank the texts (the PROMPT, or each line of "
                   "--prompts) as documents for this query; prints 'INDEX RELEVANCE' lines, "
                   "best first. Without it each text's raw scores print as a JSON list.")
@engine_options()
@click.option("--stats", is_flag=True, help="Print TTFT, prefill/decode tokens/s and chunks "
              "to stderr.")
def run(bundle, prompt_words, prompt, prompt_file, chat, system, interactive, sessions,
        prompts_file, priority, stats,
        max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed, stop, ignore_eos,
        thinking_budget, think, hide_thinking, dimensions, prompt_name, query, engine):
    """Generate text from a bundle. Only the generated text goes to stdout, so it pipes.
    On an embedding bundle (`inspect` says its task) it prints each text's vector instead,
    as a JSON list, one line per text: the PROMPT, or each line of --prompts. On a score
    bundle (a reranker) it prints each text's scores likewise, or with --query the texts
    ranked as documents for it: 'INDEX RELEVANCE' lines, best first.

    \b
    Examples:
      edgeprefill run build/tiny-recall "the secret is jade . what was the secret ?"
      edgeprefill run build/tiny-recall --prompt-file models/tiny-recall/demo_prompt.txt --stats
      edgeprefill run build/tiny-recall --interactive
      edgeprefill run build/tiny-recall --prompts samples/requests.jsonl --stats
    """
    from edgeprefill.sdk import Engine, GenerationParams

    prompt_arg = _one_prompt(prompt_words)
    if prompt_arg is not None:
        if prompt is not None:
            raise RequestError("give the prompt after BUNDLE or as --prompt, not both")
        prompt = prompt_arg
    if prompt is not None and prompt_file is not None:
        given = "--prompt" if prompt_arg is None else "the prompt after BUNDLE"
        raise RequestError(f"give {given} or --prompt-file, not both")
    if prompt_file is not None:
        prompt = _text(prompt_file, "--prompt-file").rstrip("\n")
    modes = sum([prompt is not None, interactive, prompts_file is not None])
    if modes != 1:
        raise RequestError("give exactly one of a PROMPT (or --prompt/--prompt-file), "
                           "--interactive, --prompts")
    if sessions > 1 and prompt is None:
        raise RequestError("--sessions repeats --prompt/--prompt-file; --prompts and "
                           "--interactive take no --sessions")
    if prompt is not None and not prompt.strip():
        raise RequestError("the prompt is empty")
    lines = _text(prompts_file, "--prompts").splitlines() if prompts_file is not None else None
    task = _task(bundle)
    if task != "score" and query is not None:
        raise RequestError("--query applies to a score bundle (a reranker) only")
    if task == "score":
        from edgeprefill.cli import embed_run, score_run

        embed_run.refuse_generation_options(_on_commandline(embed_run.GENERATION_OPTIONS),
                                            "a score bundle",
                                            "scores, or with --query a ranking")
        _refuse_embedding_options("scores texts", dimensions, prompt_name)
        texts = embed_run.texts_of(prompt, lines, "a score bundle")
        score_run.print_scores(bundle, texts, query, priority, stats, engine)
        return
    if task == "embed":
        from edgeprefill.cli import embed_run

        embed_run.refuse_generation_options(_on_commandline(embed_run.GENERATION_OPTIONS))
        embed_run.print_vectors(bundle, embed_run.texts_of(prompt, lines), dimensions,
                                prompt_name, priority, stats, engine)
        return
    _refuse_embedding_options("generates text", dimensions, prompt_name)
    explicit = dict(
        max_new_tokens=max_new_tokens or DEFAULT_NEW_TOKENS, temperature=temperature,
        top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty, seed=seed,
        stop=tuple(stop), ignore_eos=ignore_eos, fit_context=max_new_tokens is None,
        thinking_budget=thinking_budget,
    )
    chat = chat or system is not None or think is not None
    turn = run_modes.Turn(chat, system, think)
    if lines is not None:  # a bad line fails before the model loads
        given = {k: v for k, v in explicit.items() if v is not None}
        run_modes.read_requests(lines, GenerationParams(**given), priority)
    with Engine.load(bundle, **engine) as loaded:
        from edgeprefill.cli.thinking import ThinkingView

        view = ThinkingView.of(loaded.tokenizer, hide_thinking, sys.stdout.isatty())
        params = loaded.default_params(**explicit)
        jobs = run_modes.read_requests(lines, params, priority) if lines is not None else None
        if interactive:
            ChatLoop(loaded, params, system, stats, chat=chat, view=view, think=think).run()
        elif jobs is not None:
            run_modes.concurrent(loaded, jobs, stats, turn, view)
        elif sessions > 1:
            run_modes.concurrent(loaded, [run_modes.Job(prompt, params, priority, 0.0)]
                                 * sessions, stats, turn, view)
        else:
            run_modes.single(loaded, prompt, params, turn, stats, view)


def _on_commandline(names: tuple[str, ...]) -> set[str]:
    """Which of `names` (run's parameters) the command line set."""
    source = click.get_current_context().get_parameter_source
    return {name for name in names if source(name) is ParameterSource.COMMANDLINE}


def _refuse_embedding_options(this: str, dimensions: int | None,
                              prompt_name: str | None) -> None:
    """--dimensions and --prompt-name on a bundle that is no embedding model (`this`
    says what it does instead)."""
    for name, value in (("--dimensions", dimensions), ("--prompt-name", prompt_name)):
        if value is not None:
            raise RequestError(f"{name} applies to an embedding bundle only; this one {this}")


def _task(bundle: str) -> str:
    """The bundle's task (generate, embed, score). One whose manifest cannot be read is
    taken for a generation bundle: its --prompts lines are checked first, then the load
    says what is wrong with it."""
    from edgeprefill.bundle import load_manifest
    from edgeprefill.errors import BundleError

    try:
        return load_manifest(bundle).task
    except BundleError:
        return "generate"


def _one_prompt(words: tuple[str, ...]) -> str | None:
    """The prompt after BUNDLE. Unquoted, its words arrive apart and are joined by one
    space, as `ollama run MODEL why is the sky blue` joins them (click alone refused them
    as "unexpected extra arguments"); quote a prompt whose spacing matters."""
    return " ".join(words) if words else None


def _text(handle: IO[str], option: str) -> str:
    try:
        return handle.read()
    except UnicodeDecodeError as err:
        raise RequestError(f"{option} {handle.name}: not UTF-8 text ({err.reason} at byte "
                           f"{err.start})") from None
