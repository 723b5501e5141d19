"""The interactive chat (commands, Ctrl-C), `run`'s prompt options, `--prompts` checks,
samples/requests.jsonl and the README's commands on the shipped tiny model."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from edgeprefill.cli.chat import ChatLoop
from edgeprefill.sdk import Engine, GenerationParams
from edgeprefill.sdk.tokenizer import BundleTokenizer
from tests.test_cli_errors import assert_one_line_error, cli

ROOT = Path(__file__).resolve().parent.parent
PARAMS = GenerationParams(max_new_tokens=3, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(bundle) -> Iterator[Engine]:
    engine = Engine.load(bundle("llama"), threads=1, kv_slots=2)
    yield engine
    engine.close()


class Recorder:
    """Records the token lists the engine is asked to prefill."""

    def __init__(self, engine: Engine, monkeypatch) -> None:
        self.prompts: list[list[int]] = []
        submit = engine.submit

        def recording(tokens, *args, **kwargs):
            self.prompts.append(list(tokens))
            return submit(tokens, *args, **kwargs)

        monkeypatch.setattr(engine, "submit", recording)


def lines(*texts: str):
    """A fake terminal: returns the texts in turn, then EOF (Ctrl-D)."""
    pending = list(texts)

    def read() -> str:
        if not pending:
            raise EOFError
        item = pending.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    read.pending = pending  # type: ignore[attr-defined]
    return read


def test_chat_commands_are_handled_by_the_cli_never_sent_to_the_model(engine, monkeypatch,
                                                                      capsys):
    recorder = Recorder(engine, monkeypatch)
    out: list[str] = []
    read = lines("/help", "w5 w6", "/system w9", "w7", "/reset", "w8", "/bogus", "/exit",
                 "never read")
    ChatLoop(engine, PARAMS, read=read, write=out.append).run()
    encode = engine.tokenizer.encode
    assert recorder.prompts == [
        encode([{"role": "user", "content": "w5 w6"}]),
        encode([{"role": "system", "content": "w9"}, {"role": "user", "content": "w7"}]),
        # /reset keeps the system message and forgets the turns.
        encode([{"role": "system", "content": "w9"}, {"role": "user", "content": "w8"}]),
    ]
    assert read.pending == ["never read"]  # /exit left the loop
    replies = "".join(out).splitlines()
    assert len(replies) == 3 and all(len(r.split()) == 3 for r in replies)
    err = capsys.readouterr().err
    assert "/system TEXT" in err and "/reset" in err  # the /help text
    assert "unknown command /bogus" in err
    # Each command says once what it did.
    assert re.findall(r"\(new conversation[^)]*\)|\(system message[^)]*\)", err) == [
        "(new conversation with this system message)",
        "(new conversation with the same system message)"]


def test_a_cleared_system_message_gives_way_to_the_bundle_s_default(engine, monkeypatch,
                                                                    capsys):
    """A bundle with a default system message (an Ollama model's SYSTEM): a chat without
    one of its own starts with it, `/system TEXT` replaces it, `/system` brings it back."""
    info = engine.tokenizer.info
    monkeypatch.setattr(engine.tokenizer, "info", replace(info, default_system="w3"))
    recorder = Recorder(engine, monkeypatch)
    read = lines("w4", "/system w9", "w7", "/system", "w8", "/exit")
    ChatLoop(engine, PARAMS, read=read, write=lambda text: None).run()
    plain = BundleTokenizer(engine.bundle_dir, engine.manifest)  # no default
    assert recorder.prompts == [
        plain.encode([{"role": "system", "content": "w3"}, {"role": "user", "content": "w4"}]),
        plain.encode([{"role": "system", "content": "w9"}, {"role": "user", "content": "w7"}]),
        plain.encode([{"role": "system", "content": "w3"}, {"role": "user", "content": "w8"}]),
    ]
    assert re.findall(r"\(new conversation[^)]*\)", capsys.readouterr().err) == [
        "(new conversation with this system message)",
        "(new conversation with the model's default system message)"]


def test_a_line_starting_with_a_space_sends_its_slash_to_the_model(engine, monkeypatch,
                                                                  capsys):
    """What the unknown-command note tells the user to do, which had run the command."""
    recorder = Recorder(engine, monkeypatch)
    ChatLoop(engine, PARAMS, read=lines(" /bogus w5", " /exit"), write=[].append).run()
    encode = engine.tokenizer.encode
    assert recorder.prompts[0] == encode([{"role": "user", "content": "/bogus w5"}])
    assert len(recorder.prompts) == 2  # " /exit" was a message too, not the command
    assert "unknown command" not in capsys.readouterr().err


def test_ctrl_c_stops_the_reply_and_the_chat_goes_on(engine, monkeypatch):
    recorder = Recorder(engine, monkeypatch)
    out: list[str] = []
    interrupted = []

    def write(text: str) -> None:
        if text.strip() and not interrupted:  # Ctrl-C as the first word appears
            interrupted.append(text)
            raise KeyboardInterrupt
        out.append(text)

    long = GenerationParams(max_new_tokens=200, ignore_eos=True)
    loop = ChatLoop(engine, long, read=lines("w5", KeyboardInterrupt(), "w6"), write=write)
    loop.run()
    assert len(recorder.prompts) == 2  # Ctrl-C at the prompt sent nothing
    # The cut reply (1 token, or more before the cancel landed) is in the history, and it
    # was cut: the whole reply would have added its 200 tokens. On 2 cores the engine
    # thread and a spinning pool thread can keep this thread off the CPU for tens of this
    # tiny model's sub-millisecond steps, so "a few more" can be dozens (the likely cause of
    # one failure of this test in a full run with the old bound of 50).
    second = recorder.prompts[1]
    assert len(second) < len(recorder.prompts[0]) + 200
    assert len("".join(out).split()) == 200  # the second reply ran in full
    assert engine.metrics().kv_active == 0


def test_interactive_run_through_the_command(bundle):
    result = cli("run", bundle("llama"), "--interactive", "--max-new-tokens", "2",
                 "--ignore-eos", stdin="/help\nw5\n\n/exit\nw6\n")
    assert result.returncode == 0, result.stderr
    assert len([line for line in result.stdout.splitlines() if line.strip()]) == 1
    assert "/system TEXT" in result.stderr


def test_run_system_message_goes_through_the_template(bundle):
    path = bundle("llama")
    result = cli("run", path, "--system", "w9", "-p", "w5 w6", "--max-new-tokens", "4",
                 "--ignore-eos")
    assert result.returncode == 0, result.stderr
    with Engine.load(path, threads=1) as engine:
        messages = [{"role": "system", "content": "w9"}, {"role": "user", "content": "w5 w6"}]
        expected = engine.generate(messages, GenerationParams(max_new_tokens=4,
                                                              ignore_eos=True)).result()
    assert result.stdout.strip() == expected.text.strip()


def test_ignore_eos_runs_past_the_end_of_sequence(bundle):
    path = bundle("llama")
    with Engine.load(path, threads=1) as engine:
        stopped = [p for p in (f"w{i} w{i + 1}" for i in range(3, 60))
                   if engine.generate(p, GenerationParams(max_new_tokens=12)).result()
                   .finish_reason == "stop"]
    if not stopped:
        pytest.skip("no prompt of this random model reaches EOS within 12 tokens")
    plain = cli("run", path, "-p", stopped[0], "--max-new-tokens", "12")
    forced = cli("run", path, "-p", stopped[0], "--max-new-tokens", "12", "--ignore-eos")
    assert len(plain.stdout.split()) < 12
    assert len(forced.stdout.split()) == 12


def test_run_refuses_empty_prompts_in_one_line(tiny_bundle):
    # The shipped tokenizer adds <s>: an empty prompt would still generate.
    assert_one_line_error(cli("run", tiny_bundle, "-p", ""), "the prompt is empty")
    assert_one_line_error(cli("run", tiny_bundle, "-p", "  \n"), "the prompt is empty")


def test_two_prompts_are_refused_naming_the_two_that_were_given(tiny_bundle, tmp_path):
    text = tmp_path / "prompt.txt"
    text.write_text("w5 w6")
    assert_one_line_error(cli("run", tiny_bundle, "w5", "--prompt-file", text),
                          "give the prompt after BUNDLE or --prompt-file, not both")
    assert_one_line_error(cli("run", tiny_bundle, "-p", "w5", "--prompt-file", text),
                          "give --prompt or --prompt-file, not both")
    assert_one_line_error(cli("run", tiny_bundle, "w5", "-p", "w6"),
                          "give the prompt after BUNDLE or as --prompt, not both")


def test_an_unquoted_prompt_is_its_words_joined(tiny_bundle):
    """`edgeprefill run B why is it` as `ollama run M why is it`: one prompt of the words
    (click's own error named only "unexpected extra arguments")."""
    greedy = ("--max-new-tokens", "6", "--temperature", "0")
    prompt = "the secret is jade . what was the secret ?"  # the tiny model answers: jade
    words = cli("run", tiny_bundle, *prompt.split(), *greedy)
    quoted = cli("run", tiny_bundle, prompt, *greedy)
    assert words.returncode == 0, words.stderr
    assert words.stdout == quoted.stdout and words.stdout.strip()


@pytest.mark.parametrize("line, fragment", [
    ('{"prompt": "w5", "max_tokens": 3}', "unknown key 'max_tokens'; known keys: prompt,"),
    ('{"prompt": "w5", "temperature": -1}', "temperature"),
    ('{"prompt": ""}', "'prompt' must be a non-empty string"),
    ('{"prompt": "w5", "priority": "urgent"}', "priority"),
    ('{"prompt": "w5", "delay_s": "soon"}', "soon"),
    ('{"prompt": "w5"', "line 1"),
    ('{"prompt": "w5", "ignore_eos": "false"}', "ignore_eos must be true or false"),
    ('{"prompt": "w5", "stop": 5}', "stop must be a string or a list of strings"),
    ('{"prompt": "w5", "delay_s": 1e300}', "'delay_s' must be a number of seconds"),
    ('{"prompt": "w5", "logprobs": 3}', "unknown key 'logprobs'"),
])
def test_prompts_file_refuses_bad_lines_in_one_line(tmp_path, line, fragment):
    requests = tmp_path / "requests.jsonl"
    requests.write_text(line + "\n")
    # The bundle is never loaded: a bad line fails first (the path need not exist).
    assert_one_line_error(cli("run", tmp_path, "--prompts", requests), "--prompts line 1",
                          fragment)


def test_the_shipped_requests_file_runs_and_each_answer_is_its_secret(tiny_bundle):
    requests = ROOT / "samples" / "requests.jsonl"
    result = cli("run", tiny_bundle, "--prompts", requests, "--stats")
    assert result.returncode == 0, result.stderr
    secrets = [re.search(r"the secret is (\w+)", json.loads(line)["prompt"]).group(1)
               for line in requests.read_text().splitlines()]
    answers = [line for line in result.stdout.splitlines()
               if line and not line.startswith("---")]
    assert answers == secrets
    assert "engine:" in result.stderr


def readme_commands(section: str) -> list[str]:
    """The `edgeprefill ...` lines of a README section's first code block."""
    text = (ROOT / "README.md").read_text()
    block = text.split(section, 1)[1].split("```", 2)[1]
    return [line.split(" #")[0].strip() for line in block.splitlines()
            if line.startswith("edgeprefill ")]


def test_the_readme_commands_after_make_demo_work_as_shown(tiny_bundle):
    """`make demo` leaves build/tiny-recall; the README's next commands run on it."""
    commands = [c for c in readme_commands("## Use it")
                if c.startswith(("edgeprefill run", "edgeprefill inspect"))]
    assert len(commands) >= 4
    for command in commands:
        args = shlex.split(command)[1:]  # a quoted prompt is one argument, as in a shell
        args = [str(tiny_bundle) if a == "build/tiny-recall" else a for a in args]
        stdin = "what was the secret ?\n/exit\n" if "--interactive" in args else None
        result = cli(*args, stdin=stdin)
        assert result.returncode == 0, f"{command}: {result.stderr}"


def test_a_real_ctrl_c_in_the_chat_stops_the_reply_not_the_chat(tiny_bundle):
    """SIGINT while a reply streams stops that reply and the chat goes on. The signal races
    the reply's end (the tiny model writes its 1,500 tokens in ~0.5 s): where a busy
    machine delays this test past it, the signal lands at the prompt, which keeps the chat
    too and says so, and the test asks again (up to 5 times) rather than failing."""
    import queue
    import signal
    import subprocess
    import sys
    import threading

    command = [sys.executable, "-m", "edgeprefill", "run", str(tiny_bundle), "--interactive",
               "--max-new-tokens", "1500", "--ignore-eos", "--threads", "1"]
    chat = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    shown: queue.Queue[str] = queue.Queue()  # stdout, as it comes
    notes: queue.Queue[str] = queue.Queue()  # stderr lines
    readers = [threading.Thread(target=lambda: [shown.put(c) for c in iter(
                   lambda: chat.stdout.read(1), "")], daemon=True),
               threading.Thread(target=lambda: [notes.put(x) for x in chat.stderr], daemon=True)]
    for reader in readers:
        reader.start()
    err: list[str] = []

    def until(stream: queue.Queue[str], done, seen: list[str]) -> None:
        while not done("".join(seen)):
            seen.append(stream.get(timeout=60))

    try:
        text: list[str] = []
        for attempt in range(1, 6):
            chat.stdin.write("the secret is jade . what was the secret ?\n")
            chat.stdin.flush()
            # The answer comes first; with --ignore-eos the model then writes end tokens (no
            # text) for the rest of its 1,500: the reply is under way.
            until(shown, lambda t, n=attempt: t.count("jade") >= n, text)
            chat.send_signal(signal.SIGINT)
            until(notes, lambda t, n=attempt: t.count("(reply stopped)")
                  + t.count("(/exit or Ctrl-D") >= n, err)
            if "(reply stopped)" in "".join(err):
                break
        chat.stdin.write("/exit\n")
        chat.stdin.close()
        assert chat.wait(timeout=60) == 0, "".join(err)
    finally:
        chat.kill()
    for reader in readers:
        reader.join(timeout=10)
    while not notes.empty():  # what came after the last note waited for
        err.append(notes.get_nowait())
    assert "(reply stopped)" in "".join(err) and "Traceback" not in "".join(err)


def test_on_a_terminal_the_chat_reads_with_readline_and_its_saved_history(tmp_path,
                                                                          monkeypatch):
    readline = pytest.importorskip("readline")
    from edgeprefill.cli import chat

    history = tmp_path / "chat_history"
    history.write_text("w5 w6\n/system w9\n")
    monkeypatch.setattr(chat, "HISTORY", history)
    monkeypatch.setattr(chat.sys.stdin, "isatty", lambda: True, raising=False)
    saved = []
    monkeypatch.setattr("atexit.register", saved.append)  # not at this test's exit
    readline.clear_history()
    assert chat._terminal_reader() is chat._prompted_line  # input(): readline's editing
    assert [readline.get_history_item(i) for i in (1, 2)] == ["w5 w6", "/system w9"]
    readline.add_history("w7")
    (save,) = saved
    save()
    assert history.read_text().splitlines()[-3:] == ["w5 w6", "/system w9", "w7"]


def test_a_refused_turn_is_one_line_and_the_chat_goes_on(engine, capsys):
    out: list[str] = []
    too_long = " ".join(["w5"] * engine.capacity)
    ChatLoop(engine, PARAMS, read=lines(too_long, "w6 w7"), write=out.append).run()
    err = capsys.readouterr().err
    assert "error: prompt (" in err and f"exceeds the context of {engine.capacity}" in err
    assert "/reset" in err
    assert len("".join(out).split()) == 3  # the next turn was answered


def test_without_max_new_tokens_run_generates_to_the_end_of_a_small_context(bundle):
    path = bundle("llama")
    prompt = " ".join(["w5"] * 20)
    fits = cli("run", path, "-p", prompt, "--max-context", "32", "--ignore-eos", "--stats")
    assert fits.returncode == 0, fits.stderr
    # prompt + reply fill the context: 32 positions give the 20-token prompt 12 (the
    # most --max-new-tokens may ask for).
    assert "prompt 20 tok" in fits.stderr and "generated 12 " in fits.stderr
    assert "finish length" in fits.stderr and len(fits.stdout.split()) == 12
    # A limit the user gives is a promise: refused rather than cut short.
    assert_one_line_error(cli("run", path, "-p", prompt, "--max-context", "32",
                              "--max-new-tokens", "256"), "--max-new-tokens (256)",
                          "exceeds the context of 32")


def test_prompts_file_with_a_byte_order_mark_and_a_refused_line(tiny_bundle, tmp_path):
    requests = tmp_path / "requests.jsonl"
    requests.write_text(
        "\ufeff" + json.dumps({"prompt": "the secret is jade .", "max_new_tokens": 2,
                               "priority": "high"}) + "\n"
        + json.dumps({"prompt": "w", "max_new_tokens": 100000}) + "\n", encoding="utf-8")
    result = cli("run", tiny_bundle, "--prompts", requests)
    assert result.returncode == 2
    assert "--- request 0 (priority -1)" in result.stdout  # the JSON was read, not a prompt
    assert "rejected: prompt" in result.stdout
    assert result.stderr.strip().splitlines()[-1] == \
        "error: 1 of 2 requests were rejected (see above)"


def test_a_prompt_file_that_is_not_utf8_is_one_line(tiny_bundle, tmp_path):
    bad = tmp_path / "prompt.txt"
    bad.write_bytes(b"\xff\xfe the secret")
    assert_one_line_error(cli("run", tiny_bundle, "--prompt-file", bad), "--prompt-file",
                          "not UTF-8 text")


def test_runs_default_reply_length_is_generation_params_own():
    # run_cmd keeps its own copy (importing edgeprefill.sdk would load onnxruntime for
    # --help): the two must not drift apart.
    from edgeprefill.cli.run_cmd import DEFAULT_NEW_TOKENS

    assert DEFAULT_NEW_TOKENS == GenerationParams().max_new_tokens


def test_ctrl_c_at_any_moment_of_a_turn_keeps_the_chat(tiny_bundle):
    """Ctrl-C pressed at random moments of short turns: while a line is submitted, while
    the reply prints, between its end and the next prompt. It had raised wherever the
    main thread stood, and outside the two places that caught it the chat died (it died
    by the second turn here)."""
    import random
    import signal
    import subprocess
    import sys
    import threading
    import time

    command = [sys.executable, "-m", "edgeprefill", "run", str(tiny_bundle), "--interactive",
               "--max-new-tokens", "3", "--ignore-eos", "--threads", "1"]
    chat = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    err: list[str] = []
    ready = threading.Event()

    def read_stderr() -> None:
        for line in chat.stderr:
            err.append(line)
            ready.set()  # the greeting: the engine is loaded

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert ready.wait(120), "the chat never started"
        pick = random.Random(0)
        for _ in range(30):
            chat.stdin.write("the secret is jade . what was the secret ?\n")
            chat.stdin.flush()
            time.sleep(pick.uniform(0, 0.05))
            chat.send_signal(signal.SIGINT)
            time.sleep(0.02)
            assert chat.poll() is None, "".join(err)
        chat.stdin.write("/exit\n")
        chat.stdin.close()
        assert chat.wait(timeout=60) == 0, "".join(err)
    finally:
        chat.kill()
    reader.join(timeout=10)
    assert "Traceback" not in "".join(err) and "aborted" not in "".join(err)
