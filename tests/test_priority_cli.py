"""Priority where people type it: `run --priority`, the prompts file and the server's
`priority` field take names; anything else is refused in one line (or a 400)."""

from __future__ import annotations

import json

import pytest

from edgeprefill.server.errors import ApiError
from edgeprefill.server.schemas import parse_completion
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


@pytest.mark.parametrize("value, expected", [(None, 0), ("high", -1), ("low", 1), (-7, -7)])
def test_the_server_field_takes_integers_and_names(value, expected):
    body = {"prompt": "w5"} if value is None else {"prompt": "w5", "priority": value}
    assert parse_completion(body).priority == expected


@pytest.mark.parametrize("value", ["urgent", 1.5, True, 2**40])
def test_a_bad_server_priority_is_a_400_naming_the_field(value):
    with pytest.raises(ApiError) as raised:
        parse_completion({"prompt": "w5", "priority": value})
    assert raised.value.status == 400 and raised.value.param == "priority"
    assert "lower is served first" in raised.value.message or "must be in" in raised.value.message
