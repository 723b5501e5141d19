"""Train the project's shipped tiny model: recall a secret word from the start of a long prompt.

    python scripts/train_tiny_recall.py            # ~4 minutes on 2 CPU cores -> models/tiny-recall

The prompt states a secret in its first few tokens, then 1,000+ tokens of filler words,
then asks for it:

    the secret is jade . kero bala musi . ... what was the secret ?  ->  jade </s>

The answer is right only if the KV of the prompt's first chunk reached the decode, which is
what edgeprefill's chunked prefill must guarantee. Secret words occur nowhere else, so one
attention head can find the secret by content at any distance; the model learns it in a few
hundred steps. A conversation may ask again ("... ? jade </s> what was the secret ?"), so a
multi-turn session that keeps its KV answers every turn.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM

SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
FRAME = ["the", "secret", "is", ".", "what", "was", "?"]
SECRETS = [
    "ruby", "amber", "jade", "onyx", "pearl", "topaz", "opal", "coral", "ivory", "slate",
    "cobalt", "indigo", "violet", "scarlet", "crimson", "silver", "golden", "copper", "bronze",
    "olive", "teal", "lemon", "mint", "plum", "rose", "sand", "smoke", "snow", "storm", "sun",
    "moon", "star", "comet", "river", "ocean", "forest", "desert", "canyon", "glacier", "meadow",
]
FILLER = [a + b for a in ("ba", "ke", "lo", "mu", "ti", "ra", "so", "ne", "vi", "du")
          for b in ("n", "ro", "la", "mi", "ta", "ko", "se", "pu", "di", "ga")]
WORDS = SPECIAL + FRAME + SECRETS + FILLER
IDS = {w: i for i, w in enumerate(WORDS)}
# After the words: a bare word boundary and the 256 byte-fallback tokens. The task never
# uses them; they let the model spell any text, which constrained output (JSON, regex)
# needs: a WordLevel vocabulary cannot write `{`.
SPACE = "\u2581"
BYTES = [SPACE] + [f"<0x{b:02X}>" for b in range(256)]
VOCAB = len(WORDS) + len(BYTES)
QUESTION = ["what", "was", "the", "secret", "?"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "{{ m['content'] }} {{ eos_token }} {% else %}{{ m['content'] }} {% endif %}{% endfor %}"
)


def filler(rng: random.Random, tokens: int) -> list[str]:
    words: list[str] = []
    while len(words) < tokens:
        words += [rng.choice(FILLER) for _ in range(rng.randint(3, 9))] + ["."]
    return words


def example(rng: random.Random, length: int) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 where no loss): one or two questions about one secret."""
    secret = rng.choice(SECRETS)
    words = ["<s>", "the", "secret", "is", secret, "."]
    words += filler(rng, length - len(words) - len(QUESTION)) + QUESTION
    labels = [-100] * len(words)
    for turn in range(rng.choice((1, 1, 2))):
        words += [secret, "</s>"]
        labels += [IDS[secret], IDS["</s>"]]
        if turn == 0:
            more = filler(rng, rng.randint(0, 40)) + QUESTION
            words += more
            labels += [-100] * len(more)
    ids = [IDS[w] for w in words]
    return ids[: len(labels)], labels


def batch(rng: random.Random, rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = [example(rng, length) for _ in range(rows)]
    width = max(len(ids) for ids, _ in pairs)
    ids = [x + [IDS["<pad>"]] * (width - len(x)) for x, _ in pairs]
    labels = [y + [-100] * (width - len(y)) for _, y in pairs]
    return torch.tensor(ids), torch.tensor(labels)


def model_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=IDS["<s>"], eos_token_id=IDS["</s>"], pad_token_id=IDS["<pad>"],
    )


def train(steps: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = LlamaForCausalLM(model_config())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    start = time.time()
    for step in range(steps):
        # Short prompts first (fast steps), long ones at the end (the lengths that matter).
        lengths = (48, 96, 192, 384, 768) if step < 0.7 * steps else (384, 768, 1200)
        length = rng.choice(lengths)
        x, y = batch(rng, max(2, 4096 // length), length)
        loss = model(input_ids=x, labels=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if step % 50 == 0:
            print(f"step {step:5d}  length {length:5d}  loss {loss.item():.3f}  "
                  f"{time.time() - start:.0f}s", flush=True)
    return model.eval()


def accuracy(model: LlamaForCausalLM, length: int, n: int = 32) -> float:
    """Greedy answers (secret then </s>) correct on fresh prompts of about `length` tokens."""
    rng = random.Random(10_000 + length)
    correct = 0
    for _ in range(n):
        ids, labels = example(rng, length)
        prompt = ids[: labels.index(next(v for v in labels if v != -100))]
        out = model.generate(torch.tensor([prompt]), max_new_tokens=2, do_sample=False,
                             pad_token_id=IDS["<pad>"])
        correct += out[0, len(prompt):].tolist() == [ids[len(prompt)], IDS["</s>"]]
    return correct / n


def tokenizer() -> Tokenizer:
    """SentencePiece-style BPE with byte fallback: every task word is one token (`ignore_merges`
    takes a whole word found in the vocabulary), any other text falls back to bytes."""
    vocab = {w if w in SPECIAL else SPACE + w: i for w, i in IDS.items()}
    vocab.update({piece: len(WORDS) + i for i, piece in enumerate(BYTES)})
    tok = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True,
                               ignore_merges=True))
    # Any run of whitespace separates words, as the WordLevel tokenizer it replaces did.
    tok.normalizer = normalizers.Sequence([normalizers.Replace(Regex(r"\s+"), " "),
                                           normalizers.Strip()])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", IDS["<s>"])])
    tok.add_special_tokens(SPECIAL)
    return tok


def save(model: LlamaForCausalLM, out: Path, seed: int, results: dict[int, float]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
    }, indent=2) + "\n")
    rng = random.Random(seed + 1)
    secret = rng.choice(SECRETS)
    words = ["the", "secret", "is", secret, "."] + filler(rng, 1200) + QUESTION
    (out / "demo_prompt.txt").write_text(" ".join(words) + "\n")
    (out / "demo_answer.txt").write_text(secret + "\n")
    (out / "accuracy.json").write_text(json.dumps(
        {str(k): v for k, v in results.items()}, indent=2) + "\n")


def write_card(out: Path, command: str) -> None:
    """The model card: task, format, training command, measured accuracy."""
    results = json.loads((out / "accuracy.json").read_text())
    rows = "\n".join(f"| ~{n} tokens | {acc:.0%} |" for n, acc in results.items())
    params = sum(p.numel() for p in LlamaForCausalLM.from_pretrained(out).parameters())
    words = len(WORDS) - len(SPECIAL)
    (out / "README.md").write_text(f"""# tiny-recall

edgeprefill's own default model: a 2-layer Llama ({params / 1e3:.0f}K parameters, hidden 64,
4 heads / 2 KV heads, tied embeddings, a vocabulary of {words} words, {len(SPECIAL)}
special tokens and byte fallback), trained on a
2-core CPU by `{command}` in about 5 minutes.

**Task.** A prompt states a secret word in its first tokens, then 1,000+ tokens of filler
words, then asks for it; the model answers with the secret and `</s>`:

    the secret is jade . kero bala musi . ... what was the secret ?   ->   jade

The answer is right only if the KV cache of the prompt's first chunk reached the decode:
`make demo` prefills `demo_prompt.txt` in 64-token chunks and checks the answer against
`demo_answer.txt`. A conversation may ask again after more filler ("... ? jade </s> ...
what was the secret ?"); `samples/chat.py` does that in one session.

**Format.** `tokenizer.json` gives each of the {words} words one token (a BPE vocabulary
of whole words, SentencePiece-style) and spells anything else with {len(BYTES) - 1} byte-fallback
tokens, which the task never uses but constrained output (JSON, regex) needs; whitespace
separates words, and the post-processor adds `<s>`, so a raw text prompt needs no BOS. The
chat template joins the user messages' contents and ends assistant turns with `</s>`.
Ids: `<pad>` 0, `<s>` 1, `</s>` 2 (EOS), `<unk>` 3; the word boundary `{SPACE}`
{len(WORDS)}, the bytes after it.

**Accuracy** (greedy, fresh prompts, transformers, `accuracy.json`):

| prompt length | secret and `</s>` correct |
|---|---|
{rows}
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models/tiny-recall"))
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = train(args.steps, args.seed)
    results = {n: accuracy(model, n) for n in (256, 1000, 1500)}
    for n, acc in results.items():
        print(f"accuracy at ~{n} tokens: {acc:.0%}")
    save(model, args.out, args.seed, results)
    write_card(args.out, "python scripts/train_tiny_recall.py" + (
        f" --threads {args.threads}" if args.threads != 2 else ""))
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
