"""Build the benchmark checkpoint: a Llama with random fp32 weights and a synthetic tokenizer.

Run inside the torch venv by compare.py:  python build_model.py SPEC.json
SPEC.json holds {"out_dir": ..., "seed": ..., "config": {LlamaConfig kwargs}}.
Prints one JSON line describing what was written.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer over synthetic words: the prompts are fed as ids, so the
    tokenizer only has to exist, cover the vocabulary, and load everywhere."""
    words = SPECIAL_TOKENS + [f"w{i}" for i in range(len(SPECIAL_TOKENS), vocab_size)]
    vocab = {word: index for index, word in enumerate(words)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def add_legacy_config_keys(config_path: Path, rope_theta: float) -> None:
    """transformers 5 writes rope_theta only inside rope_parameters; transformers 4.x (the
    optimum venv) would silently fall back to rope_theta=10000. Write the legacy keys too."""
    config = json.loads(config_path.read_text())
    config["rope_theta"] = rope_theta
    config.setdefault("torch_dtype", "float32")
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def use_portable_tokenizer_class(tokenizer_config_path: Path) -> None:
    """transformers 5 names the class TokenizersBackend, which 4.x does not know; both
    versions load a tokenizer.json through PreTrainedTokenizerFast."""
    tokenizer_config = json.loads(tokenizer_config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config.pop("backend", None)
    tokenizer_config_path.write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out_dir = Path(spec["out_dir"])
    config_kwargs = spec["config"]
    start = time.perf_counter()

    torch.manual_seed(spec["seed"])
    config = LlamaConfig(bos_token_id=1, eos_token_id=2, **config_kwargs)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    build_tokenizer(config_kwargs["vocab_size"]).save_pretrained(out_dir)
    add_legacy_config_keys(out_dir / "config.json", config_kwargs["rope_theta"])
    use_portable_tokenizer_class(out_dir / "tokenizer_config.json")

    params = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    print(
        json.dumps(
            {
                "out_dir": str(out_dir),
                "params": params,
                "embedding_params": embedding,
                "build_s": time.perf_counter() - start,
            }
        )
    )


if __name__ == "__main__":
    main()
