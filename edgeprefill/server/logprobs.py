"""Token log-probabilities in OpenAI's two shapes (chat and legacy completions).

Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}]}], "refusal": null}. Completions: {"tokens", "token_logprobs", "top_logprobs":
[{token: logprob}], "text_offset"}. The values are the model's own distribution (before
penalties, constraints and temperature), as vLLM reports them by default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from edgeprefill.sdk.stream import TokenEvent


def logprobs_body(chat: bool, events: Sequence[TokenEvent], text_offset: int = 0,
                  token_bytes: Callable[[int], bytes] = lambda _: b"") -> dict:
    """`token_bytes`: a token id's exact bytes (BundleTokenizer.token_bytes)."""
    return _chat(events, token_bytes) if chat else _completion(events, text_offset)


def _entry(token_id: int | None, token: str, logprob: float,
           token_bytes: Callable[[int], bytes]) -> dict:
    raw = token.encode() if token_id is None else token_bytes(token_id)
    return {"token": token, "logprob": logprob, "bytes": list(raw)}


def _chat(events: Sequence[TokenEvent], token_bytes: Callable[[int], bytes]) -> dict:
    content = []
    for e in events:
        item = _entry(e.token_id, e.token_text or "", e.logprob, token_bytes)
        item["top_logprobs"] = [_entry(i, t, lp, token_bytes) for i, t, lp in e.top_logprobs or ()]
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
