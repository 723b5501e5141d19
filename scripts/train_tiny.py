"""Train edgeprefill's own tiny default model: a Llama that recalls key -> value pairs.

The model ships in ``models/tiny-recall`` so that ``make demo`` runs with no download. It is a
standard ``LlamaForCausalLM`` (grouped-query attention, RoPE, RMSNorm, SwiGLU), small enough to
train on a laptop CPU in a few minutes, with a word-level tokenizer built here.

Task (every word is one token)::

    alice = red fox ; bob = blue owl ; ... ; zoe = tan cat ? alice =   ->   red fox </s>

The prompt lists a few hundred ``name = color animal`` pairs (every name once) and ends with
``? name =``; the model answers with that name's value and ``</s>``. The queried pair is drawn
from anywhere in the list, including the very first one, so a correct answer needs the KV cache
of every prefill chunk. A 1,500-token prompt holds about 300 pairs.

The value's second word cannot be found by copying the token after an earlier "red" (many
pairs share a color): it needs the key, so this is a two-step induction task.

Reproduce the shipped model (about 6-9 minutes on 2 CPU cores)::

    python scripts/train_tiny.py --out models/tiny-recall

Determinism: given ``--seed`` and the thread count (2), the data and the initialisation are
fixed; the training run is repeatable on the same machine and torch build.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

# --------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------

UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
SPECIALS = [UNK, BOS, EOS, PAD]  # ids 0..3, the Llama order for the first three
PUNCT = ["=", ";", "?"]

COLORS = (
    "red blue green gold gray pink black white brown tan teal navy orange purple silver cyan"
).split()
ANIMALS = (
    "fox owl cat dog cow pig bat bee elk yak ant emu hen ram eel ape "
    "rat crab wolf bear duck goat seal toad"
).split()
NAMES = """
aaron abby adam adrian aidan alan albert alex alice allen alma amos amy andre andrew angela
anita ann anna anne anton april arlo arthur ava axel bart basil beatrice becky ben bernard
beth betty bianca bill blake bob boris brad brenda brian bruce bruno bryan caleb calvin
camila carl carla carlos carmen carol caroline carter casey cecil cedric celia chad chance
charles charlie chen chloe chris claire clara clark claude cliff clyde colin connor cora craig
cyrus daisy dale damon dan dana daniel daphne darius dave dean debra delia denis derek diana
diego dina dirk dolly donald donna dora doris doug drew duncan dustin dylan earl eddie edgar
edith edna edwin elena eli elias eliza ella ellen elliot elmer elsa emil emily emma enzo eric
erica erin ernest esther ethan eva evan felix fern fiona floyd frank freda fred gabe gail
gary gavin gemma gene george gerald gia gideon gina glen gloria gordon grace greg greta gus
gwen hank hannah hans harold harry hazel heidi helen henry herman hilda holly homer hope
howard hugo ian ida igor ines ingrid irene iris isaac ivan ivy jack jacob jake james jamie
jane janet jared jason jasper jean jeff jenny jerry jesse jill jim joan joel john jonas
jordan jose joseph joy judy jules julia june justin karen karl kate katie keith ken kevin
kim kirk kurt kyle lana lars laura lea leah lena leo leon leroy lewis liam lila lily linda
lionel lisa lloyd logan lois lola lorna louis lucas lucy luis luke lydia lyle mabel mack
madge mae maggie malcolm mandy marco marcus margo maria marie mario mark marta martin mary
mason matt maud max maya megan mel mia mike miles milo mina miriam molly mona monty morgan
morris moses nadia nancy naomi nate neil nell nico nina noah noel nora norma norman olaf
oliver omar opal oscar otis otto owen pablo paige pam pat patrick paul paula pedro peggy
penny percy pete peter phil philip phoebe piper polly quentin quinn rachel rafael ralph
ramon randy raul ray reed rex rhea rick rita rob robert rodney roger roland rolf ron rosa
ross roy ruby rudy rufus russ ruth ryan sadie sally sam sandra sara saul scott sean selma
seth shane sharon sheila shirley sid silas simon sofia sonia stan stella steve stuart sue
susan sven sybil tara ted teresa terry tess thea theo thomas tim tina toby todd tom tony
tracy travis trent troy uma ursula val vera vernon vic victor vince viola wade walter wanda
ward warren wayne wendy wes will willa wilma xavier yara yusuf yvonne zach zane zara zelda
zeke zoe
""".split()

PROMPT_LEN_PAIRS = 5  # tokens per "name = color animal ;"


def vocabulary() -> list[str]:
    words = SPECIALS + PUNCT + COLORS + ANIMALS + NAMES
    if len(set(words)) != len(words):
        dupes = sorted({w for w in words if words.count(w) > 1})
        raise SystemExit(f"duplicate words in the vocabulary: {dupes}")
    return words


def build_tokenizer(words: list[str]) -> Tokenizer:
    """Word-level: one token per whitespace-separated word; decode joins words with spaces."""
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # The WordPiece decoder joins tokens with single spaces; cleanup=False keeps " ?" and " ;"
    # as they are so decode(encode(text)) == text for single-spaced text.
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, vocab[BOS])]
    )
    tok.add_special_tokens(SPECIALS)
    return tok


CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ message['content'] | trim }}"
    "{% elif message['role'] == 'assistant' %} = {{ message['content'] | trim }}{{ eos_token }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %} ={% endif %}"
)


# --------------------------------------------------------------------------------------------
# Synthetic data
# --------------------------------------------------------------------------------------------


class Task:
    """Generates prompts as word lists and training batches as token ids."""

    def __init__(self, words: list[str]):
        self.ids = {w: i for i, w in enumerate(words)}

    @staticmethod
    def pairs(rng: random.Random, n: int) -> list[tuple[str, str, str]]:
        keys = rng.sample(NAMES, n)
        return [(k, rng.choice(COLORS), rng.choice(ANIMALS)) for k in keys]

    @staticmethod
    def listing(pairs: list[tuple[str, str, str]]) -> list[str]:
        out: list[str] = []
        for i, (k, c, a) in enumerate(pairs):
            if i:
                out.append(";")
            out += [k, "=", c, a]
        return out

    @staticmethod
    def pairs_for_tokens(n_tokens: int) -> int:
        """How many pairs make a prompt of about n_tokens (BOS and '? key =' included)."""
        return max(1, min(len(NAMES), round((n_tokens - 3) / PROMPT_LEN_PAIRS)))

    def prompt(self, rng: random.Random, n_pairs: int, first: bool = False) -> tuple[str, str]:
        """One evaluation prompt and its answer. first=True queries the first pair."""
        pairs = self.pairs(rng, n_pairs)
        k, c, a = pairs[0] if first else rng.choice(pairs)
        return " ".join(self.listing(pairs) + ["?", k, "="]), f"{c} {a}"

    def batch(
        self, rng: random.Random, n_pairs: int, batch: int, n_queries: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Listing then n_queries blocks "? key = color animal </s>"; loss on the answers.

        The first block is exactly the inference format. Later blocks reuse the same list,
        which gives more supervised tokens per sequence. 0, 1 or 2 leading <s> (the same
        count across the batch) make the model indifferent to a doubled or missing BOS.
        """
        n_bos = rng.choice((0, 1, 1, 1, 1, 2))
        rows, labels = [], []
        for _ in range(batch):
            pairs = self.pairs(rng, n_pairs)
            words = [BOS] * n_bos + self.listing(pairs)
            lab = [-100] * len(words)
            for _ in range(n_queries):
                # A tenth of the queries ask for one of the first three pairs (the demo case).
                if rng.random() < 0.1:
                    k, c, a = pairs[rng.randrange(min(3, n_pairs))]
                else:
                    k, c, a = rng.choice(pairs)
                block = ["?", k, "=", c, a, EOS]
                words += block
                # Predict "=" after the key, then the two value words, then </s>.
                lab += [-100, -100] + [self.ids[w] for w in block[2:]]
            rows.append([self.ids[w] for w in words])
            labels.append(lab)
        # labels[t] is the target for position t-1 (transformers shifts them itself).
        return torch.tensor(rows), torch.tensor(labels)


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def model_config(vocab_size: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        dtype="float32",
    )


def schedule(step: int, steps: int, rng: random.Random) -> tuple[int, int, int]:
    """Curriculum: (pairs per sequence, sequences per batch, queries per sequence).

    Lengths grow from ~60 to ~1,600 tokens over the first 60% of the steps; afterwards every
    batch is drawn from the whole range, with the long end favoured. About 6k tokens a step.
    """
    frac = step / max(1, steps)
    top = 320
    cap = 12 + (top - 12) * min(1.0, frac / 0.6)
    lo = 8
    if frac < 0.6:
        n_pairs = rng.randint(lo, max(lo, int(cap)))
    else:
        n_pairs = rng.randint(lo, top) if rng.random() < 0.4 else rng.randint(top // 2, top)
    n_queries = 16
    seq = n_pairs * PROMPT_LEN_PAIRS + 6 * n_queries
    batch = max(2, 6144 // seq)
    return n_pairs, batch, n_queries


def lr_at(step: int, steps: int, peak: float, warmup: int = 40) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def quick_eval(model, task: Task, rng: random.Random, n_pairs: int, n: int) -> float:
    """Greedy answer accuracy with a hand-rolled loop (4 new tokens) on n prompts."""
    model.eval()
    ok = 0
    for i in range(n):
        prompt, answer = task.prompt(rng, n_pairs, first=(i % 4 == 0))
        ids = torch.tensor([[task.ids[BOS]] + [task.ids[w] for w in prompt.split()]])
        out = model.generate(
            ids, max_new_tokens=4, do_sample=False, eos_token_id=task.ids[EOS],
            pad_token_id=task.ids[PAD],
        )
        want = [task.ids[w] for w in answer.split()] + [task.ids[EOS]]
        ok += out[0, ids.shape[1]:].tolist()[: len(want)] == want
    model.train()
    return ok / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="models/tiny-recall", help="output folder")
    ap.add_argument("--steps", type=int, default=600, help="optimizer steps")
    ap.add_argument("--seed", type=int, default=1234, help="seed for data and init")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    ap.add_argument("--layers", type=int, default=None, help="override num_hidden_layers")
    args = ap.parse_args()

    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    words = vocabulary()
    tokenizer = build_tokenizer(words)
    task = Task(words)

    cfg = model_config(len(words))
    if args.layers:
        cfg.num_hidden_layers = args.layers
    model = LlamaForCausalLM(cfg)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"vocab {len(words)}, params {n_params:,}, layers {cfg.num_hidden_layers}", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.98), eps=1e-8,
    )

    t0 = time.time()
    seen = 0
    loss_avg = acc_avg = None
    for step in range(args.steps):
        n_pairs, batch, n_queries = schedule(step, args.steps, rng)
        ids, labels = task.batch(rng, n_pairs, batch, n_queries)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr)
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        seen += ids.numel()

        with torch.no_grad():
            pred = out.logits[:, :-1].argmax(-1)
            tgt = labels[:, 1:]
            mask = tgt != -100
            acc = (pred[mask] == tgt[mask]).float().mean().item()
        loss = out.loss.item()
        loss_avg = loss if loss_avg is None else 0.9 * loss_avg + 0.1 * loss
        acc_avg = acc if acc_avg is None else 0.9 * acc_avg + 0.1 * acc
        if step % 20 == 0 or step == args.steps - 1:
            print(
                f"step {step:4d}  pairs {n_pairs:3d} (~{n_pairs * PROMPT_LEN_PAIRS} tok) x{batch:<3d}"
                f" loss {loss_avg:.3f}  answer-token acc {acc_avg:.3f}"
                f"  lr {opt.param_groups[0]['lr']:.1e}  {seen / 1e6:.2f}M tok"
                f"  {time.time() - t0:.0f}s",
                flush=True,
            )
    train_s = time.time() - t0
    print(f"trained {args.steps} steps in {train_s:.0f}s", flush=True)

    eval_rng = random.Random(args.seed + 1)
    for n_tok in (256, 1000, 1500):
        acc = quick_eval(model, task, eval_rng, Task.pairs_for_tokens(n_tok), 24)
        print(f"quick eval ~{n_tok} tokens: exact answer {acc:.3f}", flush=True)

    save(model, tokenizer, task, Path(args.out), args, train_s)


def save(model, tokenizer: Tokenizer, task: Task, out: Path, args, train_s: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.config.dtype = "float32"
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=task.ids[BOS], eos_token_id=task.ids[EOS], pad_token_id=task.ids[PAD],
        do_sample=False, max_new_tokens=8,
    ).save_pretrained(out)
    tokenizer.save(str(out / "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": PAD,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").unlink(missing_ok=True)

    # The demo prompt: ~1,200 tokens whose queried name is the first pair of the list.
    demo_rng = random.Random(args.seed + 7)
    prompt, answer = task.prompt(demo_rng, Task.pairs_for_tokens(1200), first=True)
    (out / "demo_prompt.txt").write_text(prompt + "\n")
    (out / "demo_answer.txt").write_text(answer + "\n")
    print(f"saved {out} (trained in {train_s:.0f}s)", flush=True)


if __name__ == "__main__":
    main()
