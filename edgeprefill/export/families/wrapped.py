"""Image-text checkpoints that wrap any text family of ours (LLaVA and its kin): the
wrapper's model builds `AutoModel.from_config(text_config)` under one module name, applies
its own plain `lm_head` (none of the text family's CausalLM extras: no final soft-cap, no
logit scale), and keeps its vision tower and projector beside it. `Wrapper` declares one
such checkpoint type; `wrapped_spec` makes the FamilySpec of its language model from the
spec of the text family its text_config names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from edgeprefill.export.families.dense import IMAGE_TEXT_QUIRK
from edgeprefill.export.families.spec import SAVED_ALONE, FamilySpec

# The text families' logit multipliers (Cohere's logit_scale, Granite's logits_scaling),
# which their CausalLM applies and a wrapper's head does not.
_HEAD_KEYS = ("logit_scale", "logits_scaling")


@dataclass(frozen=True)
class Wrapper:
    # text_config's model_type where it names none (the config class's default)
    default_text: str
    # The outer config's tie_word_embeddings where config.json has none; None: the
    # language model's own (PerceptionLM's config class)
    tie: bool | None
    # Whether the language model's own tying (text_config's, else its config class's
    # default) ties the model too, whatever the outer key says (LlavaConfig's
    # __post_init__ forwards it, for configs saved with the key in text_config)
    either_ties: bool = False
    # The module holding the language model: `model.<lm>.` in transformers 5's saves,
    # `<lm>.model.` beside `<lm>.lm_head.` in the Hub's older LLaVA layout
    lm: str = "language_model"
    # The wrapper's other modules (and parameters), left out in either layout
    towers: tuple[str, ...] = ("vision_tower.", "multi_modal_projector.")
    # The language models it may hold (empty: any text family export can wrap)
    text_types: tuple[str, ...] = ()
    # (prefix, replacement) renames of its own, tried before the layouts' above
    renames: tuple[tuple[str, str], ...] = ()
    # Whether its head scales the logits as the text family's CausalLM does (HyperCLOVA X
    # Vision V2: times logits_scaling); else its lm_head alone
    head: bool = False
    # text_config model_types its config class reads as another family's (Kimi K2.5 reads
    # the Hub's "kimi_k2" as deepseek_v3): (stored, read as) pairs
    aliases: tuple[tuple[str, str], ...] = ()
    # The keys a config.json without text_config holds at its top level, which the config
    # class moves into the text_config it makes (Fuyu-8B's Hub config); empty: text_config
    # is required
    flat_text: tuple[str, ...] = ()
    # Whether its config class reads text_config as `default_text` whatever model_type it
    # names (Step3p7Config drops it: the Hub's is its remote code's)
    any_text_type: bool = False


def lm_renames(lm: str = "language_model") -> tuple[tuple[str, str], ...]:
    """The renames that read a language model held under `lm` as a causal LM's tensors:
    transformers 5's saves (`model.<lm>.`) and the Hub's older layout (`<lm>.model.` beside
    `<lm>.lm_head.`)."""
    return ((f"model.{lm}.", "model."), (f"{lm}.model.", "model."),
            (f"{lm}.lm_head.", "lm_head."))


def towers_left_out(towers: tuple[str, ...]) -> tuple[str, ...]:
    """The prefixes of an image-text checkpoint's other modules in either layout: under
    `model.` (transformers 5) and at the top (the Hub's older one)."""
    return tuple(prefix for tower in towers for prefix in (f"model.{tower}", tower))


def wrappable(spec: FamilySpec) -> bool:
    """Whether a text family's checkpoint names read under a wrapper's prefix: its tensors
    under `model.` beside `lm_head`, nothing nested nor renamed of its own (but
    SAVED_ALONE)."""
    names = spec.names
    under_model = (*names.embed, names.final_norm, names.layer)
    return (spec.nested is None and spec.unnest is None
            and not set(spec.renames) - set(SAVED_ALONE)
            and not spec.blocks and names.lm_head == ("lm_head",)
            and all(name.startswith("model.") for name in under_model))


def wrapped_spec(wrapper: Wrapper, text: FamilySpec) -> FamilySpec:
    """The FamilySpec of `text`'s language model as `wrapper` holds it."""
    spec = replace(
        text, nested="text_config", unnest=partial(_text_config, wrapper, text.tie_default),
        renames=(*wrapper.renames, *lm_renames(wrapper.lm)),
        left_out=towers_left_out(wrapper.towers),
        text_types=wrapper.text_types, quirks=(*text.quirks, IMAGE_TEXT_QUIRK),
    )
    if wrapper.head:
        return spec
    # the wrapper's head is its own lm_head alone
    return replace(
        spec, softcaps=tuple(cap for cap in text.softcaps if cap != "final"),
        ignores=(*text.ignores, *_HEAD_KEYS),
        defaults={k: v for k, v in text.defaults.items() if k not in _HEAD_KEYS},
    )


def _text_config(wrapper: Wrapper, text_tie: bool, raw: dict[str, Any]) -> dict[str, Any]:
    """config.json -> the language model's keys: text_config, tied as the wrapper's config
    class ties it, with the outer config's BOS and EOS ids where it has them."""
    inner = _inner(wrapper, raw)
    if not isinstance(inner, dict):
        got = "null" if inner is None else type(inner).__name__
        raise ValueError(f"text_config must be an object, got {got}")
    own = bool(inner.get("tie_word_embeddings", text_tie))
    outer = raw.get("tie_word_embeddings", wrapper.tie)
    tie = own if outer is None else bool(outer) or (wrapper.either_ties and own)
    ids = {k: raw[k] for k in ("bos_token_id", "eos_token_id") if raw.get(k) is not None}
    return {**inner, **ids, "tie_word_embeddings": tie}


def text_type_of(wrapper: Wrapper, raw: dict[str, Any], families: dict[str, FamilySpec]
                 ) -> str:
    """The text family of a wrapper's config.json; a ValueError says why it is not one."""
    inner = _inner(wrapper, raw)
    text_type = inner.get("model_type", wrapper.default_text) if isinstance(inner, dict) \
        else wrapper.default_text  # _text_config says what is wrong with it
    if wrapper.any_text_type:
        return wrapper.default_text
    if isinstance(text_type, str):  # anything else is refused below, never looked up
        text_type = dict(wrapper.aliases).get(text_type, text_type)
    taken = wrapper.text_types or tuple(sorted(
        name for name, spec in families.items() if wrappable(spec)))
    if text_type not in taken:
        raise ValueError(f"text_config model_type {text_type!r} is not a language model "
                         f"export supports in {raw.get('model_type')} checkpoints")
    return str(text_type)


def _inner(wrapper: Wrapper, raw: dict[str, Any]) -> Any:
    """config.json's text_config; where a wrapper takes a flat config and it has none, the
    top-level keys its config class moves into the one it makes."""
    if wrapper.flat_text and raw.get("text_config") is None:
        return {key: raw[key] for key in wrapper.flat_text if key in raw}
    return raw["text_config"]  # a KeyError names the missing key
