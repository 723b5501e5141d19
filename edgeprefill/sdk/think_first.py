"""Structured output on a model that thinks: its think block free, the answer constrained.

A constraint over the whole reply leaves a reasoning model (Qwen3 with thinking on,
DeepSeek-R1 distills, SmolLM3) no room for its `<think>` block: the grammar rules from the
first token. As vLLM (a reasoning parser with structured outputs: the grammar starts after
the reasoning's end token) and Ollama (`format` with `think`) do, a constraint marked
`after_thinking` holds only the answer: the block's text is free up to the first `</think>`
(a lazy rule, sdk/lazy_text.py), then come at most two blanks, then the constraint's own
grammar. Where the block starts is read as server/reasoning.py and the thinking budget
read it (sdk/thinking_budget.py):
- the prompt leaves `<think>` open (DeepSeek-R1's template): free text, `</think>`,
  blanks, the answer;
- otherwise the reply may open a block first (`<think>` ... `</think>`: Qwen3 and SmolLM3
  with thinking on begin so) or go straight to the answer (with thinking off).

Where the tokenizer has the tags as special tokens, the block opens and closes with those
tokens too (llguidance matches a special token only as `<[id]>`, never as a literal's
text: the block could not open, and a close token ran on as free text), and the block's
text is then UTF-8 so that the close token ends it (sdk/lazy_text.py's utf8).

The block's text being free, a thinking budget's forced close (`\\n</think>\\n\\n`) is text
the grammar takes, so a budget combines with such a constraint as with strict tools' lazy
grammar. A reply cut inside its block (max_tokens) ends there, all reasoning.
"""

from __future__ import annotations

from collections.abc import Mapping

from edgeprefill.sdk.constraints import compose
from edgeprefill.sdk.lazy_text import BLANKS, spelled, text_until_either
from edgeprefill.sdk.thinking_budget import CLOSE, OPEN

THINK_GRAMMAR = "think_first"  # the wrapper's name in the composed grammar


def think_first(grammar: str, opened: bool, special_ids: Mapping[str, int]) -> str:
    """`grammar` (llguidance's) after a free think block; `opened`: the prompt opened it;
    `special_ids`: the tokenizer's special tokens, text -> id (the tags, where they are)."""
    return compose(grammar, THINK_GRAMMAR, lambda inner: _block_then(inner, opened,
                                                                     special_ids))


def _block_then(inner: str, opened: bool, special_ids: Mapping[str, int]) -> str:
    """The wrapper's Lark text: the block (its tags written as text, or as their special
    tokens where the tokenizer has them: llguidance matches a special token only as
    `<[id]>`, never inside text), blanks, then `@inner`."""
    opening = spelled(OPEN, special_ids.get(OPEN))
    block = f"think {BLANKS}" if opened else f"(({opening}) think {BLANKS})?"
    return "\n".join(["%llguidance {}", f"start: {block} @{inner}",
                      *text_until_either("think", CLOSE, special_ids.get(CLOSE))])
