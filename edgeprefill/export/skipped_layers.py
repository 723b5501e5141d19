"""Layers a language model skips on text: Mllama's cross-attention layers attend to an
image's states only, and transformers runs past them when there is no image. Export
leaves them out and reads the layers it keeps under consecutive indices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SkippedLayers:
    kept: tuple[int, ...]  # the stored indices of the exported layers, in order
    renames: tuple[tuple[str, str], ...]  # (stored prefix, read as) of each kept layer
    left_out: tuple[str, ...]  # the stored prefixes of the skipped layers


def skip_layers(raw: dict[str, Any], key: str,
                bases: tuple[tuple[str, str], ...]) -> SkippedLayers:
    """The layers `raw[key]` lists left out of `num_hidden_layers`; `bases` are the
    (stored, read as) prefixes of the language model, each followed by `layers.{i}.`."""
    count = int(raw["num_hidden_layers"])
    # indices past the layers name none, as the model builds them (its config's default
    # lists 8 of Llama 3.2 Vision 11B's 40)
    skipped = {int(i) for i in raw.get(key) or ()} & set(range(count))
    kept = tuple(i for i in range(count) if i not in skipped)
    renames = tuple((stored + f"layers.{i}.", read + f"layers.{j}.")
                    for j, i in enumerate(kept) for stored, read in bases)
    left_out = tuple(stored + f"layers.{i}." for i in sorted(skipped) for stored, _ in bases)
    return SkippedLayers(kept, renames, left_out)
