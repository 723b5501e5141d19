"""An embedding bundle's texts to vectors: the parts around the engine's prefill.

A text is tokenized as sentence-transformers tokenizes it: stripped of surrounding
whitespace, then encoded with the tokenizer's post-processor (Qwen3-Embedding's appends
`<|endoftext|>`, the token whose hidden state is the embedding). The engine prefills it
in chunks like any prompt and keeps the graph's `hidden` row of its last token
(Engine.submit_embedding); `vectors` then truncates (Matryoshka `dimensions`) and
L2-normalizes where the bundle says so (sentence-transformers' Normalize module).

A prompt goes before the text as sentence-transformers' `encode(prompt_name=, prompt=)`
puts it: a named one of the bundle's (its folder's config_sentence_transformers.json),
or one given as text, or else the bundle's default prompt, if it names one; the prompt
and the text are then stripped as one string.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from edgeprefill.errors import RequestError
from edgeprefill.values import is_int, plain

if TYPE_CHECKING:
    from edgeprefill.bundle import EmbeddingInfo, Manifest
    from edgeprefill.sdk.stream import TokenStream
    from edgeprefill.sdk.tokenizer import BundleTokenizer

# torch.nn.functional.normalize's floor on the norm (sentence-transformers' Normalize)
NORM_EPS = 1e-12


def generation_only(manifest: Manifest) -> str:
    """The refusal of an embedding call on a generation bundle."""
    return (f"this bundle is a generation model ({manifest.model.family}): it gives no "
            "embeddings; export an embedding model (a sentence-transformers folder with "
            "last-token pooling, or --task embed) for Engine.embed and /v1/embeddings")


def embedding_only(manifest: Manifest) -> str:
    """The refusal of a generation call on an embedding bundle."""
    return (f"this bundle is an embedding model ({manifest.model.family}): it generates "
            "no text; use Engine.embed, or POST /v1/embeddings on `edgeprefill serve`")


def normalizes(manifest: Manifest) -> bool:
    """Whether the bundle's vectors are L2-normalized (its Normalize module)."""
    return manifest.embedding is not None and manifest.embedding.normalize


def check_dimensions(dimensions: object, hidden: int) -> int | None:
    """`dimensions` as given (None: all), refused unless an int in 1..hidden."""
    dimensions = plain(dimensions)  # numpy's integers too
    if dimensions is None:
        return None
    if not is_int(dimensions) or not 1 <= dimensions <= hidden:
        raise RequestError(f"dimensions must be an integer in 1..{hidden} (the model's "
                           f"embedding size), got {dimensions!r}", "dimensions")
    return dimensions


def prompt_of(info: EmbeddingInfo | None, prompt_name: object = None,
              prompt: object = None) -> str:
    """The text put before each text: `prompt` as given, the bundle's prompt named
    `prompt_name`, or its default prompt ("" where it names none)."""
    if prompt is not None and prompt_name is not None:
        raise RequestError("give a prompt or a prompt_name, not both", "prompt_name")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise RequestError(f"prompt must be a string, got {type(prompt).__name__}",
                               "prompt")
        return prompt
    prompts = info.prompts if info is not None else {}
    if prompt_name is None:
        default = info.default_prompt_name if info is not None else None
        return prompts[default] if default is not None else ""
    if not isinstance(prompt_name, str) or prompt_name not in prompts:
        known = ", ".join(map(repr, prompts)) if prompts else "none (its folder named none)"
        raise RequestError(f"prompt_name {prompt_name!r} is none of the model's prompts: "
                           f"{known}", "prompt_name")
    return prompts[prompt_name]


def with_prompt(prompt: str, text: object) -> str:
    """The prompt, then the text (a string with more than whitespace, else refused: it is
    stripped (prepared), and an empty one would embed the tokenizer's special tokens, or
    the prompt, alone, as the embedding routes refuse it)."""
    if not isinstance(text, str):
        raise RequestError(f"a text to embed is a string, got {type(text).__name__}")
    if not text.strip():
        raise RequestError("the text to embed is empty" if not text else
                           "the text to embed is only whitespace")
    return prompt + text


def prepared(text: object) -> str:
    """The text sentence-transformers tokenizes: stripped of surrounding whitespace."""
    if not isinstance(text, str):
        raise RequestError(f"a text to embed is a string, got {type(text).__name__}")
    return text.strip()


def text_ids(tokenizer: BundleTokenizer, text: str, capacity: int,
             truncate: bool = False, direction: str = "right") -> list[int]:
    """A text's token ids as sentence-transformers gives them to the model; longer than
    the context: refused, or with `truncate` cut to it before the post-processor's
    tokens (which stay, as transformers' truncation keeps them), its end cut (or, with
    `direction` "left", its start: TEI's truncation_direction)."""
    ids = tokenizer.encode(prepared(text))
    if len(ids) <= capacity:
        return ids
    if not truncate:
        raise RequestError(f"a text of {len(ids)} tokens exceeds the context of {capacity} "
                           "tokens; shorten it")
    raw = tokenizer.tokenizer
    assert raw is not None, "encode read the text with it"
    encoding = raw.encode(prepared(text), add_special_tokens=False)
    encoding.truncate(max(0, capacity - raw.num_special_tokens_to_add(False)),
                      direction=direction)
    return list(raw.post_process(encoding).ids)[:capacity]


def prompted_ids(tokenizer: BundleTokenizer, prompt: str, text: object,
                 capacity: int) -> list[int]:
    """A text's ids (text_ids) with the prompt before it (with_prompt)."""
    return text_ids(tokenizer, with_prompt(prompt, text), capacity)


def vectors(rows: np.ndarray, normalize: bool, dimensions: int | None = None) -> np.ndarray:
    """float32 [n, dimensions or hidden]: the first `dimensions` of each row, then
    L2-normalized where the bundle normalizes (a truncated unit vector is normalized
    again: the vector OpenAI's and vLLM's `dimensions` give)."""
    out = np.asarray(rows, np.float32)[:, :dimensions]
    if normalize:
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = out / np.maximum(norms, NORM_EPS)
    return out.astype(np.float32, copy=False)


def row_of(stream: TokenStream) -> np.ndarray:
    """The hidden row of a finished embedding request; its error raised as it came."""
    if stream.finish_reason != "stop" or stream.embedding is None:
        raise RequestError(stream.error or f"the embedding request ended "
                           f"{stream.finish_reason or 'unfinished'}")
    return stream.embedding
