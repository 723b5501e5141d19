"""A tiny bundle for server and bench tests: the trained tiny-recall model when it is
there, else a random 2-layer Llama with a word-level tokenizer, exported once per run.

Imported by the test modules (not a conftest: the lead owns that file)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAINED = REPO / "models" / "tiny-recall"

WORDS = (
    "alice bob carol dave eve frank grace heidi ivan judy one two three four five six "
    "seven eight nine ten the a is and of to in hello world say count story once upon "
    "time there was cat dog sat on mat ran far away ; ? = ."
).split()
SPECIALS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def build_tiny_bundle(out_dir: Path) -> Path:
    """Export a tiny model into out_dir/bundle and return that path."""
    from edgeprefill.export.exporter import ExportOptions, export

    source = TRAINED if (TRAINED / "config.json").is_file() else _random_llama(out_dir / "hf")
    bundle = out_dir / "bundle"
    export(source, bundle, ExportOptions(chunks=(16, 64), max_context=512, show_progress=False))
    return bundle


def _random_llama(hf_dir: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = SPECIALS + WORDS
    _write_tokenizer(hf_dir, vocab)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        # Random weights would end some replies with EOS at once; a zero EOS row keeps
        # its logit at 0, below the largest of the other ~60 random logits.
        model.lm_head.weight[2].zero_()
    model.save_pretrained(hf_dir)
    return hf_dir


def _write_tokenizer(hf_dir: Path, vocab: list[str]) -> None:
    from tokenizers import Tokenizer, processors
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    hf_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    tok.save(str(hf_dir / "tokenizer.json"))
    config = {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE,
    }
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(config))


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
