"""A chat reply's reasoning: what a model writes between `<think>` and `</think>` (Qwen3,
DeepSeek-R1 distills, SmolLM3, ...), split from the answer after
it, whole or as the reply streams in.

Which replies are split (`reply_reasoning` below, per request):
- the bundle's chat template (or its tokenizer) knows both tags, and decoding keeps them
  (as it does where they are special tokens: sdk/tokenizer.py's KEPT_SPECIAL_TOKENS);
- the server runs with `--reasoning-parser auto` (the default; `none` leaves the tags in
  `content`, as before);
- no grammar governs the whole reply: a forced tool_choice's does (the whole reply is
  the call), and so does structured output (response_format, the guided fields, Ollama's
  `format`, the Responses API's text.format) where the reply is not split (a bundle that
  does not think, `--reasoning-parser none`, or thinking off: `enable_thinking: false`).
  Elsewhere structured output holds only the answer, after the think block, which is
  free (sdk/think_first.py, app.py `_answer_grammar`): the thought is reasoning and the
  answer, which the grammar held, is content. Strict tools under auto leave the text free
  (server/strict_tools.py).

Where a reply starts is read from the prompt as rendered for the request, as llama.cpp's
server does, not from a list of models:
- the generation prompt ends inside an open `<think>` (DeepSeek-R1's template, Qwen3.5's):
  the reply begins as reasoning, and only `</think>` is in it;
- otherwise the reply is reasoning only if it begins with `<think>` (Qwen3 and SmolLM3
  with thinking on). With `enable_thinking: false` their templates render an empty,
  closed block into the prompt, so the reply is content.

A reply that never closes its block (max_tokens cut it) is all reasoning, as vLLM and
llama.cpp return it. Blanks are dropped at both ends of the reasoning and right after
`</think>` (as llama.cpp does; vLLM's generic parser keeps them): the model's "\\n\\n"
between its thoughts and its answer is layout, not answer. Text after the answer has
begun is content, whatever it holds.
"""

from __future__ import annotations

from collections.abc import Callable

# The parser itself is the SDK's (the CLI's chat splits replies with it too).
from edgeprefill.sdk.reasoning_split import Part as Part
from edgeprefill.sdk.reasoning_split import ReasoningParser as ReasoningParser
from edgeprefill.sdk.reasoning_split import Split as Split

# The tags, and how a bundle and a prompt are read for them, are the SDK's: its thinking
# budget (sdk/thinking_budget.py) reads replies the same way.
from edgeprefill.sdk.thinking_budget import bundle_thinks as bundle_thinks
from edgeprefill.sdk.thinking_budget import prompt_opens_think as prompt_opens_think

MODES = ("auto", "none")  # --reasoning-parser
# The reply's reasoning goes out under both names clients read: `reasoning_content`
# (DeepSeek's API, llama.cpp's server, SGLang, older vLLM) and `reasoning` (vLLM since
# vllm-project/vllm#27752, after OpenAI's guidance for gpt-oss; #33402 dropped the old
# name; OpenRouter). Each client reads one; the same text under both costs bytes only.
FIELDS = ("reasoning_content", "reasoning")


def reasoning_fields(text: str) -> dict[str, str]:
    """A message's or a delta's reasoning fields; none for no reasoning text, so replies
    without reasoning keep their old shape."""
    return {name: text for name in FIELDS} if text else {}


def reply_reasoning(
    enabled: bool, constrained: bool, opened: bool
) -> Callable[[], ReasoningParser] | None:
    """What makes the parser of each reply of a chat request (None: no split). `enabled`:
    the bundle thinks and the server splits; `constrained`: a grammar governs the whole
    reply; `opened`: the prompt opened the block."""
    if not enabled or constrained:
        return None
    return lambda: ReasoningParser(opened)
