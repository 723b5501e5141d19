"""Experts split by modality (ERNIE 4.5 VL): each sparse layer's list holds the text's
experts, then the vision's, routed by a router of their own (`gate.weight_1`). On text
every token takes the text experts, so export reads those and leaves the others out: their
stored names, counted among the tensors left out, never warned of as unused."""

from __future__ import annotations

from edgeprefill.export.experts import MoeConfig, MoeNames


def other_modalities(moe: MoeConfig, names: MoeNames,
                     bases: tuple[str, ...]) -> tuple[str, ...]:
    """The stored prefixes of the experts and routers past the text's, in each sparse layer
    under each stored `bases` prefix of the language model (followed by `layers.{i}.`)."""
    if names.modalities == 1:
        return ()
    router = names.router[0]
    return tuple(
        f"{base}layers.{i}.{part}"
        for i in moe.layers for base in bases
        for part in (*(names.expert.format(j=j) for j in
                       range(moe.experts, moe.experts * names.modalities)),
                     *(f"{router}_{m}" for m in range(1, names.modalities))))
