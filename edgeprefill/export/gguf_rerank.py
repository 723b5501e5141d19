"""A GGUF reranker (`{arch}.pooling_type` RANK: Qwen3-Reranker converted by llama.cpp's
convert_hf_to_gguf.py) -> a sequence classifier in the staging folder, so the exporter
makes the score bundle it makes of a `*ForSequenceClassification` checkpoint
(export/score_head.py, its classifier path).

What the file holds (Qwen3Model, read at ggml-org/llama.cpp): the LM head's "yes" and "no"
rows stacked as `cls.output.weight` [yes, no], labels `["yes", "no"]` in
`{arch}.classifier.output_labels`, and the pair's format as the named chat template
`tokenizer.chat_template.rerank` with {query} and {document} (our --score-template's
format). An untied model's LM head is not written (no output.weight); a tied one's is the
token embeddings, as always, so the file does not say which it was: `--task generate`
needs an output.weight. llama-server's `/v1/rerank` (llama-graph.cpp build_pooling, RANK)
takes a qwen3 file's last token's hidden state times cls.output (+ its bias), then a
softmax, and returns its first output: sigmoid(row0 - row1), P(yes). The bundle's head is
those rows in the other order ([no, yes]), so that its relevance, sigmoid(second - first),
is that number. A one-label head is the classifier's sigmoid (llama.cpp's softmax of one
output is always 1).

Refused: another architecture's RANK file (llama.cpp pools its first token and returns
its raw first output; the graph gives the last token's hidden state), a file with a
pooler before the head (`cls.weight`: BERT's dense and tanh), more than two labels, no
template in the file and none given, a file whose tokenizer adds a BOS or an EOS to each
text (llama-server tokenizes the filled template with no special tokens added; Qwen3's
adds none).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeprefill.errors import ExportError

if TYPE_CHECKING:
    from edgeprefill.export.score_head import ScoreOptions

HEAD = "cls.output"  # llama.cpp's MODEL_TENSOR.CLS_OUT
POOLER = "cls.weight"  # MODEL_TENSOR.CLS: a dense layer (and tanh) before the head
LM_HEAD = "output.weight"
TEMPLATE_KEY = "tokenizer.chat_template.rerank"
# what the staged tokenizer adds to each text, which llama-server's rendered template has not
ADDED = ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token")
# llama.cpp's architectures whose RANK pooling is the last token with a softmax (qwen3vl's
# too, which transformers does not read) -> transformers' classifier of the family
CLASSIFIERS = {"qwen3": "Qwen3ForSequenceClassification"}
SCORE = "score"  # the staged classifier's head: score_head.CLASSIFIER_HEAD


@dataclass(frozen=True)
class RerankHead:
    """The file's head in the bundle's order (see the module docstring)."""

    weight: np.ndarray  # float32 [labels, hidden]
    bias: np.ndarray | None  # float32 [labels]
    labels: list[str]


def labels_key(metadata: dict[str, Any]) -> str:
    return f"{metadata['general.architecture']}.classifier.output_labels"


def check(metadata: dict[str, Any], tensors: Sequence[str], file: str, task: str,
          score: ScoreOptions) -> str | None:
    """Refuse, before any reading of weights, a RANK file that `task` cannot export; the
    pair template a score bundle of it takes (`score`'s, else the file's)."""
    arch = metadata["general.architecture"]
    if task == "generate":
        if LM_HEAD not in tensors:
            raise ExportError(f"{file} is a reranker (pooling rank) without an LM head "
                              f"({LM_HEAD}): llama.cpp's converter keeps only its rows "
                              f"({HEAD}), and a tied model's file looks the same; export "
                              "it with --task score, or the LM from its Hugging Face "
                              "checkpoint")
        return None
    if task == "embed":
        raise ExportError(f"{file} is a reranker (pooling rank), no embedding model: export "
                          "it with --task score (or auto)")
    if arch not in CLASSIFIERS:
        raise ExportError(f"{file} is a {arch} reranker (pooling rank): llama.cpp scores it "
                          "by its first token's hidden state and its raw first output, the "
                          "bundle's graph gives the last token's: only qwen3 rerankers "
                          "export (llama.cpp's last token and softmax)")
    if POOLER in tensors:
        raise ExportError(f"{file} has a pooler ({POOLER}) before its score head: not "
                          "supported (a decoder reranker's head is one matrix)")
    if f"{HEAD}.weight" not in tensors:
        raise ExportError(f"{file} says pooling rank but holds no {HEAD}.weight (the head "
                          "its scores come from)")
    if score.tokens:
        raise ExportError(f"--score-tokens reads rows of an LM head; {file}'s head is its "
                          f"{HEAD} (pooling rank): export it with --task score alone")
    template = score.template if score.template is not None else metadata.get(TEMPLATE_KEY)
    if not isinstance(template, str):
        raise ExportError(f"{file} is a reranker without a rerank template ({TEMPLATE_KEY}): "
                          "give the pair's format it was trained on with --task score "
                          "--score-template")
    added = [key for key in ADDED if metadata.get(key) is True]
    if added:  # the bundle encodes a pair as a text, the tokenizer's special tokens added
        raise ExportError(f"{file} says {' and '.join(added)}: llama-server tokenizes a "
                          "reranker's filled template without them, the bundle's tokenizer "
                          "would add them; not supported")
    return template


def read_head(gguf: Any, file: str, hidden_size: int) -> RerankHead:
    """The head of `gguf` (the file's gguf.GGUFReader), dequantized, in the bundle's order."""
    from gguf import dequantize

    found = {t.name: t for t in gguf.tensors}
    weight = _dequantized(found[f"{HEAD}.weight"], dequantize)
    if weight.ndim == 1:
        weight = weight[None, :]
    if weight.ndim != 2 or weight.shape[1] != hidden_size:
        raise ExportError(f"{file}: {HEAD}.weight is {list(weight.shape)}, not [labels, "
                          f"{hidden_size}] (the hidden size)")
    bias = found.get(f"{HEAD}.bias")
    bias_values = None if bias is None else _dequantized(bias, dequantize).reshape(-1)
    labels = _labels(gguf, file, weight.shape[0])
    if weight.shape[0] == 2:  # llama.cpp's score is softmax's first: the bundle's second
        weight, labels = weight[::-1], labels[::-1]
        bias_values = None if bias_values is None else bias_values[::-1]
    return RerankHead(np.ascontiguousarray(weight, np.float32), None if bias_values is None
                      else np.ascontiguousarray(bias_values, np.float32), labels)


def _dequantized(tensor: Any, dequantize: Any) -> np.ndarray:
    return np.asarray(dequantize(tensor.data, tensor.tensor_type), np.float32)


def _labels(gguf: Any, file: str, rows: int) -> list[str]:
    """`{arch}.classifier.output_labels`, read with gguf's reader (LABEL_i where the file
    names none, as transformers names a classifier's), one per row of the head."""
    arch = gguf.fields["general.architecture"].contents()
    field = gguf.fields.get(f"{arch}.classifier.output_labels")
    labels = [str(v) for v in field.contents()] if field is not None else \
        [f"LABEL_{i}" for i in range(rows)]
    if len(labels) != rows:
        raise ExportError(f"{file}: {HEAD}.weight has {rows} rows but the file names "
                          f"{len(labels)} labels ({', '.join(labels)})")
    if rows > 2:
        raise ExportError(f"{file}'s head has {rows} labels ({', '.join(labels)}): a GGUF "
                          "reranker exports with one or two (llama.cpp ranks by the first "
                          "of their softmax)")
    return labels


def write_classifier(folder: Path, arch: str, head: RerankHead) -> None:
    """Make the staged config.json the classifier's: transformers' architecture and
    id2label; no pad_token_id (llama.cpp pools the last token whatever it is, where the
    classifier path would leave trailing pad tokens out)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.pop("pad_token_id", None)
    config.update(architectures=[CLASSIFIERS[arch]],
                  id2label={str(i): name for i, name in enumerate(head.labels)},
                  label2id={name: i for i, name in enumerate(head.labels)})
    path.write_text(json.dumps(config, indent=2))


def head_tensors(head: RerankHead) -> dict[str, np.ndarray]:
    """The staged checkpoint's tensors of the head (score.weight, maybe score.bias)."""
    tensors = {f"{SCORE}.weight": head.weight}
    if head.bias is not None:
        tensors[f"{SCORE}.bias"] = head.bias
    return tensors
