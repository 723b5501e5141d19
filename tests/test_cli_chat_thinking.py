"""`edgeprefill run` with a reasoning model: the reply's `<think>` block is printed apart
from the answer (or hidden), `--think/--no-think` and `/think` `/nothink` set the
template's enable_thinking, and the next turn's history holds what a server's client
sends back.

The reference is the server's chat route on the same engine: its `content` and
`reasoning_content` for the same conversation, and the prompt tokens it submits. The
model's choices are a script (tests/test_serve_reasoning.py's: the backend runs, its
logits are replaced so that greedy decoding follows a list of words); the CLI runs in
process under click's CliRunner, its typed lines scripted on stdin."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from click.testing import CliRunner  # noqa: E402

from edgeprefill.cli.main import cli  # noqa: E402
from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from tests.conftest import follow_tokens, top_word_id, word_bundle  # noqa: E402
from tests.test_serve import free_port  # noqa: E402

EOS = 2
MODEL = "tiny"
THOUGHT = ["<think>", "hmm,", "rain", "or", "sun", "?", "</", "##think>"]
ANSWER = ["It", "is", "sunny."]
WORDS = ["assistant:", "</think>", *THOUGHT, *ANSWER]
# Qwen3's shape: the model opens its block after the generation prompt, and
# enable_thinking false renders an empty, closed one. Messages render their content
# only, so a turn's reasoning is dropped from the history (as Qwen3's template drops
# the reasoning of turns before the last user message).
TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }} ; {% endfor %}"
    "{% if add_generation_prompt %}assistant: "
    "{% if enable_thinking is defined and not enable_thinking %}<think> </think>"
    "{% endif %}{% endif %}"
)
QUESTION = "weather in Paris ?"
REPLY = re.compile(r"Thinking\.\.\.\n(.*?)\n\.\.\.done thinking\.\n\n(.*?)\n", re.S)


@pytest.fixture(scope="module")
def engine(hf_model, tmp_path_factory) -> Iterator[Engine]:
    out = word_bundle(hf_model, tmp_path_factory, "chat-thinking", WORDS, TEMPLATE)
    engine = Engine.load(out, threads=1, kv_slots=4)
    word = lambda w: top_word_id(WORDS, w)  # noqa: E731
    script = [word(w) for w in ("assistant:", *THOUGHT, *ANSWER)]
    following = dict(zip(script, [*script[1:], EOS], strict=True))
    following[word("</think>")] = word(ANSWER[0])  # thinking off: the answer at once
    follow_tokens(engine, following, EOS)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def http(engine) -> Iterator[httpx.Client]:
    app = create_app(engine, ServerConfig(model_name=MODEL))
    with ServerThread(app, port=free_port()) as server, \
            httpx.Client(base_url=server.url) as client:
        yield client


@pytest.fixture
def prompts(engine, monkeypatch) -> list[list[int]]:
    """The token lists submitted to the engine, by the CLI or the server."""
    seen: list[list[int]] = []
    submit_n = engine.submit_n

    def recording(tokens, *args, **kwargs):
        seen.append(list(tokens))
        return submit_n(tokens, *args, **kwargs)

    monkeypatch.setattr(engine, "submit_n", recording)
    return seen


def run(engine, monkeypatch, *args: str, typed: str = "") -> str:
    """`edgeprefill run BUNDLE ARGS` on the module's engine; its stdout."""
    monkeypatch.setattr(Engine, "load", lambda *a, **k: contextlib.nullcontext(engine))
    result = CliRunner().invoke(cli, ["run", "bundle", *args], input=typed)
    assert result.exit_code == 0, result.output
    return result.stdout


def server_chat(http, messages: list[dict], **body) -> dict:
    reply = http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": messages, "temperature": 0, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]


def user(text: str = QUESTION) -> dict:
    return {"role": "user", "content": text}


def test_the_chat_prints_the_thinking_apart_and_keeps_the_answer_as_history(
        engine, http, prompts, monkeypatch):
    stdout = run(engine, monkeypatch, "--interactive", typed=f"{QUESTION}\n{QUESTION}\n")
    cli_prompts = list(prompts)
    first = server_chat(http, [user()])
    assert first["reasoning_content"] == "hmm, rain or sun?"  # the script, tags gone
    assert first["content"] == "It is sunny."
    replies = REPLY.findall(stdout)
    assert "".join(f"Thinking...\n{r}\n...done thinking.\n\n{c}\n" for r, c in replies) \
        == stdout
    assert replies == [(first["reasoning_content"], first["content"])] * 2
    # The second turn is the conversation a server's client sends back: the answer as
    # content, the reasoning beside it (this template drops it).
    history = [user(), {"role": "assistant", "content": first["content"],
                        "reasoning_content": first["reasoning_content"]}, user()]
    del prompts[:]
    second = server_chat(http, history)
    assert (second["reasoning_content"], second["content"]) == replies[1]
    assert cli_prompts[1] == prompts[0]
    assert cli_prompts[0] == engine.tokenizer.encode([user()])


def test_hide_thinking_prints_the_answer_alone(engine, monkeypatch):
    assert run(engine, monkeypatch, "--chat", "--hide-thinking", QUESTION) == \
        "It is sunny.\n"
    assert run(engine, monkeypatch, "--interactive", "--hide-thinking",
               typed=f"{QUESTION}\n") == "It is sunny.\n"


def test_no_think_renders_the_template_with_thinking_off(engine, http, prompts,
                                                         monkeypatch):
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    stdout = run(engine, monkeypatch, "--no-think", QUESTION)  # --no-think implies --chat
    typed = run(engine, monkeypatch, "--interactive", typed=f"/nothink\n{QUESTION}\n"
                f"/think\n{QUESTION}\n")
    cli_prompts = list(prompts)
    del prompts[:]
    message = server_chat(http, [user()], **off)
    assert "reasoning_content" not in message and stdout == message["content"] + "\n"
    assert cli_prompts[0] == prompts[0]
    assert cli_prompts[1] == prompts[0]  # /nothink: the same prompt
    # /think: the conversation goes on with the template's thinking on again.
    history = [user(), {"role": "assistant", "content": message["content"]}, user()]
    assert cli_prompts[2] == engine.tokenizer.encode(history, enable_thinking=True)
    assert typed.startswith("It is sunny.\nThinking...\n")


@pytest.fixture
def ctrl_c_at_rain(monkeypatch) -> None:
    """Ctrl-C while the CLI waits for the token after "rain" (mid-thought): the reply's
    stream raises KeyboardInterrupt there, as SIGINT's default handler does, its request
    cancelled so the module's engine serves the next test."""
    from edgeprefill.sdk.stream import TokenStream

    original = TokenStream.__iter__

    def interrupted(stream):
        seen = ""
        for event in original(stream):
            yield event
            seen += event.text
            if "rain" in seen:
                stream.cancel()
                stream.result()
                raise KeyboardInterrupt

    monkeypatch.setattr(TokenStream, "__iter__", interrupted)


@pytest.mark.parametrize("args, typed", [(["--chat", QUESTION], ""),
                                         (["--interactive"], f"{QUESTION}\n")])
def test_ctrl_c_mid_thought_closes_the_thinking_block(engine, http, monkeypatch,
                                                      ctrl_c_at_rain, args, typed):
    monkeypatch.setattr(Engine, "load", lambda *a, **k: contextlib.nullcontext(engine))
    stdout = CliRunner().invoke(cli, ["run", "bundle", *args], input=typed).stdout
    closed = re.fullmatch(r"Thinking\.\.\.\n(.*)\n\.\.\.done thinking\.\n\n\n?", stdout, re.S)
    assert closed is not None, stdout
    # What was shown is the start of the reasoning the server returns uninterrupted.
    monkeypatch.undo()
    reasoning = server_chat(http, [user()])["reasoning_content"]
    assert "rain" in closed[1] and reasoning.startswith(closed[1])


def test_ctrl_c_during_hidden_thinking_prints_nothing(engine, monkeypatch, ctrl_c_at_rain):
    monkeypatch.setattr(Engine, "load", lambda *a, **k: contextlib.nullcontext(engine))
    result = CliRunner().invoke(cli, ["run", "bundle", "--chat", "--hide-thinking",
                                      QUESTION])
    assert result.stdout == "" and isinstance(result.exception, SystemExit)


def test_a_raw_prompt_and_a_bundle_without_think_tags_print_as_generated(
        engine, bundle, monkeypatch):
    from edgeprefill.cli.thinking import ThinkingView

    with Engine.load(bundle("llama"), threads=1, kv_slots=1) as plain:
        assert not ThinkingView.of(plain.tokenizer, hide=False, styled=False).splits
    # A raw prompt's reply is all text, as the completions route returns it.
    raw = run(engine, monkeypatch, f"user: {QUESTION} ; assistant:")
    assert raw.split()[0] == "<think>" and "</think>" in raw


def test_the_cli_splits_thinking_without_the_server_package():
    """`run` must not need the `serve` extra to split a reply: the parser is the SDK's."""
    code = "\n".join([
        "import sys, edgeprefill.cli.thinking as t",
        "class Words:",
        "    def decode(self, ids): return ''",
        "parser = t.ThinkingView(splits=True).parser(Words(), [], chat=True)",
        "assert tuple(parser.parse('<think>hmm</think>sunny')) == ('hmm', 'sunny')",
        "print(sorted(m for m in sys.modules",
        "             if m.startswith(('edgeprefill.server', 'starlette', 'uvicorn'))))",
    ])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
