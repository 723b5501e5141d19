"""Token log-probabilities in OpenAI's two shapes (chat and legacy completions).

Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}]}], "refusal": null}. Completions: {"tokens", "token_logprobs", "top_logprobs":
[{token: logprob}], "text_offset"}. The values are the model's own distribution (before
penalties, constraints and temperature), as vLLM reports them by default.
"""

from __future__ import annotations

from collections.abc import Sequence

from edgeprefill.sdk.stream import TokenEvent


def logprobs_body(chat: bool, events: Sequence[TokenEvent], text_offset: int = 0) -> dict:
    return _chat(events) if chat else _completion(events, text_offset)


def _entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def _chat(events: Sequence[TokenEvent]) -> dict:
    content = []
    for e in events:
        item = _entry(e.token_text or "", e.logprob)
        item["top_logprobs"] = [_entry(t, lp) for _, t, lp in e.top_logprobs or ()]
        content.append(item)
    return {"content": content, "refusal": None}


def _completion(events: Sequence[TokenEvent], text_offset: int) -> dict:
    tokens, offsets, offset = [], [], text_offset
    for e in events:
        tokens.append(e.token_text or "")
        offsets.append(offset)
        offset += len(e.text)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in events],
        "top_logprobs": [{t: lp for _, t, lp in e.top_logprobs or ()} or None
                         for e in events],
        "text_offset": offsets,
    }
