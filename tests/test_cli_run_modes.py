"""`edgeprefill run --interactive` and concurrent requests, end to end through the CLI."""

from __future__ import annotations

import json

import pytest

from edgeprefill.cli.run_modes import read_requests
from edgeprefill.errors import RequestError
from edgeprefill.sdk import GenerationParams
from tests.test_cli_errors import cli


def test_interactive_chat_keeps_the_session_kv_between_turns(bundle):
    result = cli("run", bundle("llama"), "--interactive", "--max-new-tokens", "3", "--stats",
                 stdin="w5 w6\nw7\n\n")
    assert result.returncode == 0, result.stderr
    replies = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(replies) == 2 and all(len(r.split()) == 3 for r in replies)
    stats = [line for line in result.stderr.splitlines() if "TTFT" in line]
    assert len(stats) == 2
    assert "(0 reused)" in stats[0] and "(0 reused)" not in stats[1]


def test_prompts_file_runs_concurrent_requests_with_priorities(bundle, tmp_path):
    requests = tmp_path / "requests.jsonl"
    requests.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": " ".join(f"w{3 + i % 100}" for i in range(300)), "priority": 0},
        {"prompt": "w9 w10", "priority": 5, "max_new_tokens": 2},
        {"prompt": "w11 " * 700, "priority": 1},
    ]))
    result = cli("run", bundle("llama"), "--prompts", requests, "--max-new-tokens", "4",
                 "--stats")
    # The others ran and printed; the refused one makes the command fail, after them.
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1] == "error: 1 of 3 requests were rejected (see above)"
    out = result.stdout
    assert "--- request 0 (priority 0)" in out and "--- request 1 (priority 5)" in out
    assert "rejected: prompt (700 tokens)" in out  # too long for the context: refused alone
    assert "engine:" in result.stderr and "prefix hit rate" in result.stderr


def test_sessions_runs_the_prompt_concurrently(bundle):
    result = cli("run", bundle("llama"), "--prompt", "w5 w6 w7", "--sessions", "3",
                 "--max-new-tokens", "3")
    assert result.returncode == 0, result.stderr
    texts = [line for line in result.stdout.splitlines() if line and not line.startswith("---")]
    assert len(texts) == 3 and len(set(texts)) == 1  # greedy: the same reply three times


def test_the_prompt_can_follow_the_bundle_as_ollama_run_takes_it(bundle):
    given = cli("run", bundle("llama"), "w5 w6 w7", "--max-new-tokens", "3")
    option = cli("run", bundle("llama"), "--prompt", "w5 w6 w7", "--max-new-tokens", "3")
    assert given.returncode == 0, given.stderr
    assert given.stdout == option.stdout and len(given.stdout.split()) == 3


def test_ctrl_c_while_the_request_threads_start_still_prints_and_leaves_none_running(
        bundle, capsys, monkeypatch):
    # Ctrl-C can land before every request's thread has started (a short reply may be
    # done by then): what was generated is printed, and no started thread is left behind
    # waiting out its delay.
    import threading

    import pytest

    from edgeprefill.cli import run_modes
    from edgeprefill.sdk import Engine, GenerationParams

    short = GenerationParams(max_new_tokens=2, temperature=0.0)
    jobs = [run_modes.Job("w9", short, 0, 600.0), run_modes.Job("w5 w6", short, 0, 0.0)]
    starts = []

    class CtrlCOnSecondStart(threading.Thread):
        def start(self) -> None:
            starts.append(self)
            self.what = self._target.__name__  # (a thread forgets its target once run)
            if len(starts) == 2:
                raise KeyboardInterrupt
            super().start()

    with Engine.load(bundle("llama"), threads=1, kv_slots=4) as engine:
        monkeypatch.setattr(run_modes.threading, "Thread", CtrlCOnSecondStart)
        with pytest.raises(KeyboardInterrupt):
            run_modes.concurrent(engine, jobs, stats=False)
        monkeypatch.undo()
    assert [t.what for t in starts] == ["submit", "submit"]  # the requests' threads only
    starts[0].join(timeout=5)
    assert not starts[0].is_alive()  # its 600 s delay was cut short
    assert capsys.readouterr().out.splitlines() == [
        "--- request 0 (priority 0)", "not submitted (interrupted)",
        "--- request 1 (priority 0)", "not submitted (interrupted)"]


def test_ctrl_c_during_concurrent_requests_prints_what_was_generated(bundle, capsys,
                                                                      monkeypatch):
    # A real SIGINT once the first reply is done: that reply is printed whole, the running
    # one as far as it got, the one still waiting for its delay as never submitted; then
    # the command ends as interrupted. Nothing had been printed: the replies came at the end.
    import os
    import signal
    import threading
    import time

    import pytest

    from edgeprefill.cli import run_modes
    from edgeprefill.sdk import Engine, GenerationParams

    short = GenerationParams(max_new_tokens=2, temperature=0.0)
    long = GenerationParams(max_new_tokens=500, temperature=0.0, ignore_eos=True)
    jobs = [run_modes.Job("w5 w6", short, 0, 0.0), run_modes.Job("w7 w8", long, 0, 0.0),
            run_modes.Job("w9", short, 0, 600.0)]
    with Engine.load(bundle("llama"), threads=1, kv_slots=4) as engine:
        whole_short = engine.generate("w5 w6", short).result().text
        whole_long = engine.generate("w7 w8", long).result().text
        submitted = []
        submit = engine.submit
        monkeypatch.setattr(engine, "submit", lambda *a, **k: submitted.append(
            submit(*a, **k)) or submitted[-1])

        def ctrl_c_after_the_first_reply() -> None:
            while not (submitted and submitted[0].done):
                time.sleep(0.005)
            os.kill(os.getpid(), signal.SIGINT)

        # A shell starts a background job (`make test &`, nohup) with SIGINT ignored and
        # Python keeps that: the signal was lost and the test waited out the 600 s delay.
        # Ctrl-C in a terminal raises KeyboardInterrupt: that handler, for this test only.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            threading.Thread(target=ctrl_c_after_the_first_reply, daemon=True).start()
            started = time.perf_counter()
            with pytest.raises(KeyboardInterrupt):
                run_modes.concurrent(engine, jobs, stats=False)
        finally:
            signal.signal(signal.SIGINT, previous)
        assert time.perf_counter() - started < 60  # the 600 s delay was not waited out
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "--- request 0 (priority 0)" and out[1] == whole_short
    assert out[2] == "--- request 1 (priority 0)" and whole_long.startswith(out[3])
    assert out[4:] == ["--- request 2 (priority 0)", "not submitted (interrupted)"]


def test_a_prompts_line_is_an_object_a_json_string_or_plain_text():
    jobs = read_requests(['{"prompt": "w5 w6"}', '"w7 \\"quoted\\""', "w8 [w9]", "[w10"],
                         GenerationParams())
    assert [job.prompt for job in jobs] == ["w5 w6", 'w7 "quoted"', "w8 [w9]", "[w10"]


@pytest.mark.parametrize("line, fragment", [
    ("42", "JSON 42 is no request: give a JSON object"),
    ('["w5", "w6"]', r'JSON \["w5", "w6"\] is no request'),
    ("null", "JSON null is no request"),
    ('"  "', "the prompt is empty"),
])
def test_a_prompts_line_of_other_json_is_an_error_naming_its_line(line, fragment):
    with pytest.raises(RequestError, match=rf"^--prompts line 2: {fragment}"):
        read_requests(['{"prompt": "w5"}', line], GenerationParams())
