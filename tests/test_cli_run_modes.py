"""`edgeprefill run --interactive` and concurrent requests, end to end through the CLI."""

from __future__ import annotations

import json

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
