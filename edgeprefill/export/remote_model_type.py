"""The model_type a config.json leaves out, read from the remote code it names.

Without model_type, transformers reads config.json with the class its `auto_map` names
(trust_remote_code), and that class's `model_type` is the model's. A remote class's name
does not always tell which: `configuration_decilm.DeciLMConfig` (architectures
`DeciLMForCausalLM`) is Deci's DeciLM ("deci": DeciLM-6B's config.json names no
model_type) and NVIDIA's Llama-Nemotron NAS ("nemotron-nas") alike, two files of one name.
What tells them apart is the key only one of the two classes takes. A config whose remote
class is in no entry, or whose keys name no one type of it, keeps the refusal of a config
without a model_type.
"""

from __future__ import annotations

from typing import Any

# A remote class's names (auto_map's entries, architectures) -> (key, model_type): the
# model type whose config class alone takes that key.
DECILM = (("num_key_value_heads_per_layer", "deci"), ("block_configs", "nemotron-nas"))
REMOTE_TYPES: dict[str, tuple[tuple[str, str], ...]] = {
    "configuration_decilm.DeciLMConfig": DECILM,
    "modeling_decilm.DeciLMForCausalLM": DECILM,
    "DeciLMForCausalLM": DECILM,
}


def with_model_type(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` with the model_type its remote class and keys name where it has none (absent or
    null) and they name exactly one; else `raw` as it is."""
    if raw.get("model_type") is not None:
        return raw
    found = {kind for name in _remote_names(raw) for key, kind in REMOTE_TYPES.get(name, ())
             if raw.get(key) is not None}
    return {**raw, "model_type": found.pop()} if len(found) == 1 else raw


def _remote_names(raw: dict[str, Any]) -> list[str]:
    """The class names auto_map's entries and architectures give, each without the
    `owner/repo--` prefix of a class from another repository's code."""
    auto_map = raw.get("auto_map")
    names = list(auto_map.values()) if isinstance(auto_map, dict) else []
    architectures = raw.get("architectures")
    names += architectures if isinstance(architectures, list) else []
    return [name.split("--")[-1] for name in names if isinstance(name, str)]
