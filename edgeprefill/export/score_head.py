"""A score bundle's head: what turns the graph's `hidden` row into relevance scores.

A score bundle (manifest task "score") is an embedding bundle's graph, the final-normed
hidden state of each text's last token, plus a small head the runtime applies in numpy
(sdk/scoring.py), written to the bundle as HEAD_FILE (`weight` [labels, hidden] float32,
maybe `bias` [labels]). Two kinds of checkpoint give one:

- a supported family's `*ForSequenceClassification` (converted Qwen3-Reranker "seq-cls"
  checkpoints, reward models such as Skywork-Reward-V2): its `score.weight`. transformers
  pools the last token that is not the pad token, the last token itself once trailing pad
  tokens are left out (the runtime leaves them out: `pad_token_id`, recorded).
- a causal LM and `--score-tokens` (Qwen3-Reranker's `no,yes`, bge-reranker-v2-gemma's
  `Yes`): the LM head's rows of those tokens, so that the head gives exactly those
  tokens' logits; the family's transforms after its LM head (Cohere's logit_scale,
  Granite's and MiniCPM's logits_scaling, Gemma 2's final soft-capping) are recorded and
  applied by the runtime, as the graph builder applies them (decoder.py `_logits`).

A token reranker reads its pair in the format it was trained on: `--score-template` (with
{query} and {document}) is required with `--score-tokens`. A classifier without one reads
the pair as transformers' tokenizer(query, document) gives it, the tokenizer's own pair
encoding, which sentence-transformers' CrossEncoder passes to the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeprefill.bundle import ScoreInfo, relevance_of
from edgeprefill.errors import ExportError
from edgeprefill.export.checkpoint import Checkpoint
from edgeprefill.export.families.not_causal import task_head
from edgeprefill.export.lm_head import head_weight
from edgeprefill.export.model_config import ModelConfig

HEAD_FILE = "score_head.safetensors"
CLASSIFIER_HEAD = "score"  # transformers' *ForSequenceClassification: self.score
PLACEHOLDERS = ("{query}", "{document}")


@dataclass(frozen=True)
class ScoreOptions:
    """export's score options: `tokens` (the LM head's rows to keep, in order) and the
    pair's `template`."""

    tokens: tuple[str, ...] = ()
    template: str | None = None

    def check(self, task: str) -> None:
        """One line for options that cannot make a score bundle."""
        if task != "score" and (self.tokens or self.template is not None):
            raise ExportError("--score-tokens and --score-template apply to --task score")
        if len(self.tokens) > 2 or any(not t for t in self.tokens):
            raise ExportError(f"--score-tokens takes one token or two (no,yes), got "
                              f"{','.join(self.tokens)!r}")
        if self.template is not None:
            missing = [p for p in PLACEHOLDERS if p not in self.template]
            if missing:
                raise ExportError(f"--score-template lacks {' and '.join(missing)}")


def check_source(raw: dict[str, Any], options: ScoreOptions) -> None:
    """Refuse, before any weight is read, score options the checkpoint (config.json's
    object `raw`) cannot take: a classifier's head is its own, a causal LM's is rows of
    its LM head named by --score-tokens, read in the format --score-template gives. (A
    GGUF reranker's --score-tokens is refused before, by export/gguf_rerank.py.)"""
    if is_classifier(raw):
        if options.tokens:
            raise ExportError("--score-tokens reads rows of an LM head, which a classifier "
                              f"({', '.join(raw['architectures'])}) has not: export it with "
                              "--task score alone")
        return
    if not options.tokens:
        raise ExportError("--task score exports a *ForSequenceClassification folder (its "
                          "score head), or a causal LM's token logits with --score-tokens "
                          "(no,yes for Qwen3-Reranker) and --score-template")
    if options.template is None:
        raise ExportError("--score-tokens needs --score-template (the pair's format the "
                          "reranker was trained on, with {query} and {document}): "
                          "without it it scores text it never saw")


def is_classifier(raw: dict[str, Any]) -> bool:
    """Whether config.json's architectures are a decoder's task heads (not_causal)."""
    return task_head(raw) is not None


def score_head(ckpt: Checkpoint, cfg: ModelConfig, raw: dict[str, Any], tokenizer: Any,
               options: ScoreOptions, out: Path) -> ScoreInfo:
    """Write the head to out / HEAD_FILE; the manifest's record of it. `raw` is
    config.json's object, `tokenizer` the bundle's (tokenizers.Tokenizer)."""
    from safetensors.numpy import save_file

    if is_classifier(raw):
        weight, bias, info = _classifier(ckpt, cfg, raw, options)
    else:
        weight, bias, info = _token_rows(ckpt, cfg, tokenizer, options)
    tensors = {"weight": np.ascontiguousarray(weight, np.float32)}
    if bias is not None:
        tensors["bias"] = np.ascontiguousarray(bias, np.float32)
    save_file(tensors, str(out / HEAD_FILE))
    return info


def _classifier(ckpt: Checkpoint, cfg: ModelConfig, raw: dict[str, Any],
                options: ScoreOptions) -> tuple[np.ndarray, np.ndarray | None, ScoreInfo]:
    name = CLASSIFIER_HEAD + ".weight"
    if not ckpt.has(name):
        raise ExportError(f"the classifier's checkpoint lacks the tensor {name!r}")
    weight = ckpt.get(name, np.float32)
    if weight.ndim != 2 or weight.shape[1] != cfg.hidden_size:
        raise ExportError(f"{name} is {list(weight.shape)}, not [num_labels, "
                          f"{cfg.hidden_size}] (hidden_size)")
    bias_name = CLASSIFIER_HEAD + ".bias"
    bias = ckpt.get(bias_name, np.float32) if ckpt.has(bias_name) else None
    labels = _labels(raw, weight.shape[0])
    pad = raw.get("pad_token_id")
    info = ScoreInfo(head=HEAD_FILE, kind="classifier", labels=labels,
                     relevance=relevance_of(len(labels)), template=options.template,
                     pad_token_id=pad if isinstance(pad, int) else None)
    return weight, bias, info


def _labels(raw: dict[str, Any], rows: int) -> list[str]:
    """config.json's id2label in id order (transformers' LABEL_i where it has none)."""
    names = raw.get("id2label")
    if not isinstance(names, dict) or len(names) != rows:
        return [f"LABEL_{i}" for i in range(rows)]
    try:
        return [str(names[key]) for key in sorted(names, key=int)]
    except (ValueError, KeyError):
        return [f"LABEL_{i}" for i in range(rows)]


def _token_rows(ckpt: Checkpoint, cfg: ModelConfig, tokenizer: Any,
                options: ScoreOptions) -> tuple[np.ndarray, np.ndarray | None, ScoreInfo]:
    if cfg.embed_width is not None or cfg.head_activation is not None:
        raise ExportError(f"{cfg.family} projects its hidden state before the LM head: a "
                          "score bundle of it is not supported")
    ids = [_one_token(tokenizer, token) for token in options.tokens]
    if len(ids) == 2 and ids[0] == ids[1]:  # sigmoid(l - l): every pair would score 0.5
        raise ExportError(f"--score-tokens: {options.tokens[0]!r} and {options.tokens[1]!r} "
                          f"are the same token (id {ids[0]}); a relevance needs two "
                          "(no,yes)")
    name = head_weight(ckpt, cfg)
    rows = ckpt.get(name, np.float32)
    if rows.ndim != 2 or rows.shape[1] != cfg.hidden_size:
        raise ExportError(f"the LM head {name} is {list(rows.shape)}, not [vocab, "
                          f"{cfg.hidden_size}]")
    weight = rows[ids]
    if cfg.lm_head_normalized:  # Baichuan 2's NormHead, as decoder._head_rows
        norms = np.sqrt(np.einsum("vh,vh->v", weight, weight, dtype=np.float32))[:, None]
        weight = weight / np.maximum(norms, np.float32(1e-12))
    bias = None
    if cfg.lm_head_bias:
        bias_name = next((h + ".bias" for h in cfg.names.lm_head if ckpt.has(h + ".bias")),
                         None)
        if bias_name is None:
            raise ExportError("the checkpoint lacks the LM head's bias")
        bias = ckpt.get(bias_name, np.float32)[ids]
    info = ScoreInfo(head=HEAD_FILE, kind="tokens", labels=list(options.tokens),
                     relevance=relevance_of(len(ids)), template=options.template,
                     scale=cfg.logits_multiplier / cfg.logits_divisor,
                     softcap=cfg.final_softcap)
    return weight, bias, info


def _one_token(tokenizer: Any, token: str) -> int:
    """The id of `token`: a token of the vocabulary (transformers' convert_tokens_to_ids,
    as Qwen3-Reranker's card looks up "no" and "yes"), or a text that is one token
    (tokenizer(text, add_special_tokens=False), as bge-reranker-v2-gemma's "Yes")."""
    found = tokenizer.token_to_id(token)
    if found is not None:
        return int(found)
    ids = tokenizer.encode(token, add_special_tokens=False).ids
    if len(ids) != 1 or tokenizer.decode(ids).strip() != token.strip():  # not the unknown
        raise ExportError(f"--score-tokens: {token!r} is not one token of the tokenizer "
                          f"(it encodes to {len(ids)}: {ids[:4]})")
    return int(ids[0])
