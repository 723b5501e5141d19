"""A score bundle's texts to scores: the parts around the engine's prefill.

A score bundle (manifest task "score", export/score_head.py) runs an embedding bundle's
graph, the final-normed hidden state of a text's last token, and its head here in numpy:
`weight` [labels, hidden] (plus `bias`), then the family's logit transforms (a scale, a
soft-cap), which gives transformers' logits of a sequence classifier or of a token
reranker's tokens. `relevance` makes one number in 0..1 of them: sigmoid of one label,
sigmoid(second - first) of two (Qwen3-Reranker's no,yes: softmax's "yes").

A (query, document) pair is read as the bundle says: its template with {query} and
{document} filled in, encoded as one text (the tokenizer's special tokens added, as
transformers' tokenizer(text) adds them); without a template (a classifier's default)
as the tokenizer's pair encoding, transformers' tokenizer(query, document), which is what
sentence-transformers' CrossEncoder gives the model. A classifier's trailing pad tokens
are left out: transformers pools the last token that is not the pad token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgeprefill.errors import BundleError, RequestError
from edgeprefill.values import is_int, plain

if TYPE_CHECKING:
    from edgeprefill.bundle import Manifest, ScoreInfo
    from edgeprefill.sdk.tokenizer import BundleTokenizer

PLACEHOLDER = re.compile(r"\{query\}|\{document\}")
# A text to score: one the model reads as it is, or a (query, document) pair
Item = str | tuple[str, str]


def score_only(manifest: Manifest) -> str:
    """The refusal of a generation or embedding call on a score bundle."""
    return (f"this bundle is a score model ({manifest.model.family}, a reranker or "
            "classifier): it generates no text and gives no embeddings; use Engine.score "
            "or Engine.rerank, or POST /v1/rerank or /score on `edgeprefill serve`")


def scoring_only(manifest: Manifest) -> str:
    """The refusal of a score call on a generation or embedding bundle. An embedding
    bundle does serve /score (the cosine of two texts' vectors, server/score.py): the
    refusal names it, on each kind, as the way to that route."""
    family = manifest.model.family
    reranker = ("export a reranker with --task score (a *ForSequenceClassification folder, "
                "or a causal LM with --score-tokens) for Engine.score, Engine.rerank and "
                "/v1/rerank")
    if manifest.task == "embed":
        return (f"this bundle is an embedding model ({family}): it gives no relevance "
                f"scores, only POST /score's cosine similarity of two texts; {reranker}")
    return (f"this bundle is a generation model ({family}): it gives no scores; {reranker}, "
            "or an embedding model (--task embed) for POST /score's cosine similarity")


@dataclass(frozen=True)
class ScoreHead:
    """The head of a score bundle, read from its file."""

    info: ScoreInfo
    weight: np.ndarray  # float32 [labels, hidden]
    bias: np.ndarray | None  # float32 [labels]

    @classmethod
    def load(cls, bundle_dir: Path, info: ScoreInfo, hidden: int) -> ScoreHead:
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        path = bundle_dir / info.head
        try:
            tensors = load_file(str(path))
        except (OSError, SafetensorError) as err:
            raise BundleError(f"the score head {path} is not readable: {err}") from None
        weight, bias = tensors.get("weight"), tensors.get("bias")
        labels = len(info.labels)
        if weight is None or weight.shape != (labels, hidden) or \
                (bias is not None and bias.shape != (labels,)):
            raise BundleError(f"the score head {path} is not weight [{labels}, {hidden}] "
                              f"(and bias [{labels}]) for the manifest's {labels} labels")
        return cls(info, weight.astype(np.float32), None if bias is None else
                   bias.astype(np.float32))

    def scores(self, rows: np.ndarray) -> np.ndarray:
        """float32 [n, labels]: the head's outputs for hidden `rows` [n, hidden]."""
        out = np.asarray(rows, np.float32) @ self.weight.T
        if self.bias is not None:
            out = out + self.bias
        if self.info.scale != 1.0:
            out = out * np.float32(self.info.scale)
        if self.info.softcap is not None:
            cap = np.float32(self.info.softcap)
            out = np.tanh(out / cap) * cap
        scores: np.ndarray = out.astype(np.float32, copy=False)
        return scores

    def relevance(self, scores: np.ndarray) -> np.ndarray:
        """float32 [n] in 0..1 from scores [n, labels]: sigmoid of `logit`."""
        return _sigmoid(self.logit(scores))

    def logit(self, scores: np.ndarray) -> np.ndarray:
        """float32 [n]: the one logit whose sigmoid is the relevance, from scores [n,
        labels]: the label of one, second - first of two (the one label vLLM makes of a
        token reranker's yes and no; what vLLM's use_activation=false and TEI's
        raw_scores give); refused for a head of more labels."""
        self.check_ranks()
        if self.info.relevance == "sigmoid":
            out = scores[:, 0]
        else:  # "sigmoid_difference"
            out = scores[:, 1] - scores[:, 0]
        return np.asarray(out, np.float32)

    def check_ranks(self) -> None:
        """Refuse a head with no one relevance (more than two labels) before any work."""
        if self.info.relevance == "none":
            raise RequestError(f"this score model has {len(self.info.labels)} labels "
                               f"({', '.join(self.info.labels)}), no one relevance to rank "
                               "by: use Engine.score for its scores")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    out: np.ndarray = (1.0 / (1.0 + np.exp(-x))).astype(np.float32)
    return out


def item_ids(tokenizer: BundleTokenizer, info: ScoreInfo, item: object,
             capacity: int, truncate: str | None = None) -> list[int]:
    """The token ids of a text to score (a string read as it is, or a (query, document)
    pair read as the bundle's template or the tokenizer's pair encoding); a classifier's
    trailing pad tokens left out; longer than the context: refused, or, a pair with
    `truncate` (a direction, "right" or "left"), cut to it as TEI cuts one (pair_ids)."""
    if isinstance(item, str):
        ids = tokenizer.encode(item)
    elif _is_pair(item):
        assert isinstance(item, tuple | list)
        ids = pair_ids(tokenizer, info, str(item[0]), str(item[1]))
        if len(ids) > capacity and truncate is not None and info.template is None:
            ids = pair_ids(tokenizer, info, str(item[0]), str(item[1]), (capacity, truncate))
    else:
        raise RequestError(f"a text to score is a string or a (query, document) pair of "
                           f"strings, got {type(item).__name__}")
    if info.pad_token_id is not None:
        while ids and ids[-1] == info.pad_token_id:
            ids = ids[:-1]
    if not ids:
        raise RequestError("the text to score is empty (no tokens)")
    if len(ids) > capacity:
        kept = " (a pair read through the bundle's template is not cut)" \
            if truncate is not None and info.template is not None else ""
        raise RequestError(f"a text of {len(ids)} tokens exceeds the context of {capacity} "
                           f"tokens{kept}; shorten it")
    return ids


def pair_ids(tokenizer: BundleTokenizer, info: ScoreInfo, query: str, document: str,
             cut: tuple[int, str] | None = None) -> list[int]:
    """A (query, document) pair's ids, as the bundle reads a pair; the tokenizer's pair
    encoding with `cut` (length, direction) truncated to that length as TEI truncates a
    pair: the longer text first (longest_first), its special tokens kept."""
    if info.template is not None:
        return tokenizer.encode(render(info.template, query, document))
    raw = tokenizer.tokenizer
    if raw is None:
        raise RequestError("this bundle's tokenizer cannot encode a pair")
    if cut is None:
        return list(raw.encode(query, document, add_special_tokens=True).ids)
    saved = raw.truncation  # the tokenizer's own setting, put back after
    raw.enable_truncation(cut[0], strategy="longest_first", direction=cut[1])
    try:
        return list(raw.encode(query, document, add_special_tokens=True).ids)
    finally:
        if saved is None:
            raw.no_truncation()
        else:
            raw.enable_truncation(**saved)


def render(template: str, query: str, document: str) -> str:
    """The template with {query} and {document} filled in, in one pass (a query holding
    "{document}" stays as it is)."""
    values = {"{query}": query, "{document}": document}
    return PLACEHOLDER.sub(lambda m: values[m.group(0)], template)


def _is_pair(item: object) -> bool:
    return (isinstance(item, tuple | list) and len(item) == 2
            and all(isinstance(text, str) for text in item))


def top_n(value: object) -> int | None:
    """A rerank's `top_n`, as Engine.rerank and the rerank routes take it: an integer >= 0
    (numpy's too), None (absent) or 0 ranking every document. 0 is vLLM's default, which
    clients written against it send (Cohere and Jina refuse it, llama.cpp returns none):
    read as vLLM reads it, the one server whose rerank route ours mirrors."""
    top = plain(value)
    if top is not None and not (is_int(top) and top >= 0):
        raise RequestError(f"top_n must be an integer >= 0 (0 or absent: every document), "
                           f"got {value!r}", "top_n")
    return top or None


def ranked(relevance: np.ndarray, top_n: int | None) -> list[tuple[int, float]]:
    """(index, relevance) best first (ties in input order), the first `top_n` of them."""
    order = sorted(range(len(relevance)), key=lambda i: (-float(relevance[i]), i))
    return [(i, float(relevance[i])) for i in order[:top_n]]
