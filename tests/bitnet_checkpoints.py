"""BitNet checkpoints as the Hub stores them, from a saved float BitNet model: its
projections made ternary (absmean, as BitNet trains them) and written in the layout a
`quantization_config` announces (transformers' integrations/bitnet.py reads them)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers.integrations.bitnet import pack_weights

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# quantization_config of each layout (the Hub's microsoft/bitnet-b1.58-2B-4T: "bitlinear")
LAYOUTS = {
    "bitlinear": {"quant_method": "bitnet", "linear_class": "bitlinear",
                  "quantization_mode": "offline"},
    "autobitlinear": {"quant_method": "bitnet", "linear_class": "autobitlinear",
                      "quantization_mode": "offline"},
    "online": {"quant_method": "bitnet", "linear_class": "autobitlinear",
               "quantization_mode": "online"},
}


def as_bitnet(hf_dir: Path, layout: str, packed: bool = True) -> None:
    """Rewrite the float checkpoint in `hf_dir` as a BitNet one of `layout`: "online" keeps
    the float master weights; the offline layouts store each projection's ternary weight
    (uint8-packed where `packed`) beside a weight_scale of its own."""
    config = json.loads((hf_dir / "config.json").read_text())
    config["quantization_config"] = LAYOUTS[layout]
    (hf_dir / "config.json").write_text(json.dumps(config))
    if layout == "online":
        return
    tensors = load_file(hf_dir / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    weights = tuple(f"{p}.weight" for p in PROJECTIONS)
    for name in [n for n in tensors if n.endswith(weights)]:
        weight = tensors[name].float()
        ternary = (weight / weight.abs().mean()).round().clamp(-1, 1)
        tensors[name] = pack_weights(ternary.clone()) if packed else ternary
        # about the float weight's size, each projection its own: BitLinear divides by
        # weight_scale, AutoBitLinear multiplies
        scale = weight.abs().mean() * torch.empty(1).uniform_(0.7, 1.3, generator=generator)
        tensors[name.removesuffix("weight") + "weight_scale"] = \
            1.0 / scale if layout == "bitlinear" else scale
    save_file(tensors, hf_dir / "model.safetensors", metadata={"format": "pt"})
