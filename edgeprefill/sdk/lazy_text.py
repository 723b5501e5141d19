"""Free text up to a marker, in llguidance's Lark: the piece every lazy grammar opens with.

A lazy grammar leaves the reply's text free until a marker and constrains what follows
(strict tools under tool_choice auto: text, then `<tool_call>` or `[TOOL_CALLS]` and
calls, server/strict_tools.py; structured output after a think block: `<think>` text, then
`</think>` and the answer, sdk/think_first.py). llguidance calls such a rule lazy:
`head[lazy]: TEXT "<tool_call>"` ends at the first marker, wherever the tokens split it
(`<tool_` `call>{"`), so a marker spelled in plain text works as a special token's
would (llama.cpp's lazy grammars and vLLM's structural tags do the same).
"""

from __future__ import annotations

import json

# At most two blanks around a constrained part (Qwen writes one newline, and "\n\n"
# after `</think>`); unbounded blanks would let a random model pad forever.
BLANKS = r"/[ \n]{0,2}/"
REGEX_META = set("\\.+*?()|[]{}^$#&-~/")  # escaped where a marker has them (_regex_literal)


def text_until(rule: str, marker: str, text: str = "TEXT", utf8: bool = False) -> list[str]:
    """Lark lines: `rule` is free text ending at the first `marker` (the marker included),
    and `text` the lexeme of that free text (named so that two markers' texts may meet in
    one grammar). `utf8`: the text is valid UTF-8, which no special token is (llguidance
    spells one from a 0xFF byte on): a rule `TEXT <[id]>` then ends the text at that
    token, where any-bytes text takes the token in (text_until_either)."""
    # Any bytes. A positive regex must be UTF-8, a negated one need not: "not containing
    # the marker" is the nearest, and in effect it is any bytes (an invalid byte after a
    # marker makes the text match no `.*`). The lazy rule, not this exclusion, is what
    # ends the text at a marker.
    anything = f"~/(?s:.*){_regex_literal(marker)}(?s:.*)/"
    return [
        f"{rule}[lazy]: {text} {json.dumps(marker)}",
        f"{text}: /(?s:.*)/ & {anything}" if utf8 else f"{text}: {anything}",
    ]


def text_until_either(rule: str, marker: str, token_id: int | None,
                      text: str = "TEXT") -> list[str]:
    """text_until's lines where `marker` may also be a special token (`token_id`, None
    where the tokenizer has it as no such token): `rule` is free text ending at the marker
    spelled in text, or at the token. llguidance matches a special token only as
    `<[id]>`, never inside a lexeme, and a text of any bytes takes the token in: with the
    token the text is UTF-8, which no special token is, so the token ends it (the cost:
    a byte run that is not UTF-8 is masked there)."""
    if token_id is None:
        return text_until(rule, marker, text)
    return [f"{rule}: {rule}_text | {text} <[{token_id}]>",
            *text_until(f"{rule}_text", marker, text, utf8=True)]


def spelled(marker: str, token_id: int | None) -> str:
    """A Lark alternative: `marker` as text, or also as its special token (`token_id`)
    where the tokenizer has it as one."""
    return json.dumps(marker) + (f" | <[{token_id}]>" if token_id is not None else "")


def _regex_literal(text: str) -> str:
    """`text` matched literally inside a /.../ regex: its metacharacters escaped (not
    `<` and `>`, which escaped are word boundaries in the regex crate)."""
    return "".join(f"\\{c}" if c in REGEX_META else c for c in text)
