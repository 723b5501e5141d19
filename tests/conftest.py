"""Shared fixtures: tiny random checkpoints of every supported family, built locally with
transformers (nothing is downloaded), and their exported bundles."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = ROOT / "models" / "tiny-recall"
VOCAB = 128
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} ; {% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

# family -> config overrides; each exercises one thing the exporter must get right.
FAMILIES: dict[str, dict] = {
    "llama": {},
    "llama-tied-llama3rope": {
        "tie_word_embeddings": True,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    },
    "mistral": {"sliding_window": None},
    "qwen2": {},  # q/k/v biases
    "qwen3": {"head_dim": 32},  # q/k norms, head_dim != hidden / heads
}


def write_tokenizer(path: Path, vocab: int = VOCAB) -> None:
    """A WordLevel tokenizer over words w0..w{vocab-1}; w1 is BOS, w2 is EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = {f"w{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "w1", "eos_token": "w2", "chat_template": CHAT_TEMPLATE}
    ))


def build_hf_model(family: str, out: Path, seed: int = 0, dtype=None, **overrides) -> Path:
    """Save a tiny random model of `family` (a key of FAMILIES) to `out`."""
    import torch
    import transformers

    model_type = family.split("-")[0]
    config_cls = {
        "llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
    }[model_type]
    kwargs = dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=1024,
        # Wide random weights give well separated logits, so greedy choices are stable
        # against float rounding differences between runtimes.
        initializer_range=0.2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    kwargs.update(FAMILIES.get(family, {}))
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config_cls(**kwargs))
    if model_type == "qwen2":  # biases start at zero: make them matter
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                             layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(out)
    write_tokenizer(out)
    return out


@pytest.fixture(scope="session")
def hf_model(tmp_path_factory):
    """family -> path of its saved tiny random checkpoint (built once per test run)."""
    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in cache:
            cache[family] = build_hf_model(family, tmp_path_factory.mktemp(family))
        return cache[family]

    return get


@pytest.fixture(scope="session")
def bundle(tmp_path_factory, hf_model):
    """(family, flavor) -> path of its exported bundle (exported once per test run)."""
    from edgeprefill.export.exporter import ExportOptions, export

    cache: dict[tuple[str, str], Path] = {}

    def get(family: str, flavor: str = "ort") -> Path:
        key = (family, flavor)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"bundle-{family}-{flavor}")
            export(hf_model(family), out, ExportOptions(
                flavor=flavor, chunks=(16, 64), max_context=512, show_progress=False,
                overwrite=True,
            ))
            cache[key] = out
        return cache[key]

    return get


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory):
    """The shipped tiny model (models/tiny-recall), exported once."""
    from edgeprefill.export.exporter import ExportOptions, export

    if not (TINY_MODEL / "config.json").is_file():
        pytest.fail(f"the shipped tiny model is missing from {TINY_MODEL}")
    out = tmp_path_factory.mktemp("tiny-recall")
    export(TINY_MODEL, out, ExportOptions(show_progress=False, overwrite=True))
    return out
