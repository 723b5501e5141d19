"""Logits a model sets to its dtype's minimum whatever its input (FamilySpec.masked_logits):
Chameleon's image tokens, which ChameleonForConditionalGeneration masks out of every
logits it returns, so that text generation never picks one. Which tokens (read from
config.json), and the graph's constant mask over the LM head's output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeprefill.export.graph import GraphBuilder

# ChameleonImageVocabularyMapping.image_tokens: the vocabulary's names of VQ codes
IMAGE_TOKEN_PREFIX = "IMGIMG"


def image_tokens(raw: dict[str, Any]) -> tuple[int, ...]:
    """The ids config.json's vocabulary_map gives the names starting IMGIMG, sorted. A
    ValueError (refused in one line) where the map is no object or an id is no token of
    vocab_size: transformers fails to build or index the model's logits on those."""
    vocabulary = raw.get("vocabulary_map")
    if not isinstance(vocabulary, dict):
        got = "absent" if vocabulary is None else type(vocabulary).__name__
        raise ValueError(f"vocabulary_map must be an object (token name -> id; the model "
                         f"masks its image tokens' logits by it), got {got}")
    ids = sorted(token for name, token in vocabulary.items()
                 if name.startswith(IMAGE_TOKEN_PREFIX))
    vocab = int(raw["vocab_size"])
    bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or
           not 0 <= t < vocab]
    if bad:
        raise ValueError(f"vocabulary_map gives image token {bad[0]!r}, not a token id "
                         f"below vocab_size {vocab}")
    return tuple(ids)


def masked(g: GraphBuilder, logits: str, tokens: tuple[int, ...], vocab: int,
           dtype: np.dtype) -> str:
    """logits [B, vocab] of `dtype` with the columns of `tokens` at dtype's minimum (what
    transformers writes there: the same number, not -inf, which a sampler's arithmetic
    could turn into NaN)."""
    mask = np.zeros(vocab, bool)
    mask[list(tokens)] = True
    lowest = g.const(float(np.finfo(dtype).min), dtype)
    return g.op("Where", [g.const(mask, np.bool_), lowest, logits])
