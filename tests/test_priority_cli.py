"""Priority where people type it: `run --priority` and the prompts file take names."""

from __future__ import annotations

import json

from tests.test_cli_errors import assert_one_line_error, cli


def test_prompts_file_takes_priority_names_and_run_priority_is_the_default(bundle, tmp_path):
    requests = tmp_path / "requests.jsonl"
    requests.write_text("\n".join([
        json.dumps({"prompt": "w5 w6", "priority": "high"}),
        json.dumps({"prompt": "w7 w8", "priority": "low"}),
        "w9 w10",  # a plain line takes --priority
    ]))
    result = cli("run", bundle("llama"), "--prompts", requests, "--priority", "-3",
                 "--max-new-tokens", "2")
    assert result.returncode == 0, result.stderr
    for i, priority in enumerate([-1, 1, -3]):
        assert f"--- request {i} (priority {priority})" in result.stdout


def test_an_unknown_priority_in_the_prompts_file_is_one_line(bundle, tmp_path):
    requests = tmp_path / "requests.jsonl"
    requests.write_text(json.dumps({"prompt": "w5", "priority": "urgent"}))
    result = cli("run", bundle("llama"), "--prompts", requests)
    assert_one_line_error(result, "--prompts line 1", "priority must be", "high (-1)")
