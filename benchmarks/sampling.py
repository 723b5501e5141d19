"""Per-token costs on the engine thread: sampler, detokenizer, constraint mask, and decode
tokens/s with and without a JSON-schema constraint.

    PYTHONPATH=. .venv/bin/python benchmarks/sampling.py                # all sections
    PYTHONPATH=. .venv/bin/python benchmarks/sampling.py --only sampler,detok
    PYTHONPATH=/tmp/xgr_only .venv/bin/python benchmarks/sampling.py --only mask  # + xgrammar
    PYTHONPATH=. .venv/bin/python benchmarks/sampling.py --only lazy,lazy_decode  # strict tools

"before" is main's code as of this change (a full sort per token; a full decode of the
reply per token), copied below so the comparison runs in one process. Tokenizers are
synthetic byte-level BPEs of the wanted vocabulary size, built here (nothing downloaded).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from comparison.report import cpu_name

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}


# -- main's code, for "before" ---------------------------------------------------------------


class MainSampler:
    def __init__(self, temperature, top_p, seed):
        self.t, self.top_p, self.rng = temperature, top_p, np.random.default_rng(seed)

    def sample(self, logits):
        scaled = logits.astype(np.float64) / self.t
        candidates = np.argsort(-scaled, kind="stable")
        e = np.exp(scaled[candidates] - scaled[candidates].max())
        probs = e / e.sum()
        keep = int(np.searchsorted(np.cumsum(probs), self.top_p) + 1)
        head = probs[:keep]
        return int(self.rng.choice(candidates[:keep], p=head / head.sum()))


class MainStreamer:
    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.emitted = tokenizer, [], 0

    def push(self, token_id):
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        new, self.emitted = text[self.emitted:], len(text)
        return new


# -- helpers ---------------------------------------------------------------------------------


def synthetic_tokenizer(vocab: int, seed: int = 0):
    """A byte-level BPE with `vocab` tokens: the 256 byte symbols, then tokens grown one
    character at a time (each with its merge), shaped like a real vocabulary (words with
    and without a leading space, digits, punctuation)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    rng = random.Random(seed)
    specials = ["<pad>", "<s>", "</s>"]
    tokens = specials + sorted(alphabet)
    known = set(tokens)
    merges = []
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    grow = [c for c in "Ġ" + letters + letters.upper() + "0123456789"]
    stems = [c for c in grow]
    while len(tokens) < vocab:
        stem = rng.choice(stems)
        new = stem + rng.choice(letters)
        if new in known or len(new) > 12:
            continue
        known.add(new)
        tokens.append(new)
        merges.append((stem, new[-1]))
        stems.append(new)
    model = models.BPE({t: i for i, t in enumerate(tokens)}, merges)
    tok = Tokenizer(model)
    tok.add_special_tokens(specials)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def per_call_ms(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def call_times_ms(fn, calls: int) -> list[float]:
    """Each call timed on its own (a median shrugs off the other processes' bursts)."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def peaked_logits(vocab: int, rng) -> np.ndarray:
    """A trained model's shape: Zipf-like, the top token ~30% likely."""
    ranks = rng.permutation(vocab) + 1
    return (-1.1 * np.log(ranks) + rng.normal(0, 0.3, vocab)).astype(np.float32)


def flat_logits(vocab: int, rng) -> np.ndarray:
    """A random-weight model's shape: nearly uniform."""
    return rng.normal(0, 1, vocab).astype(np.float32)


# -- sections --------------------------------------------------------------------------------


def bench_sampler(rows: list, calls: int) -> None:
    from edgeprefill.sdk import GenerationParams
    from edgeprefill.sdk.sampler import Sampler

    rng = np.random.default_rng(0)
    for vocab in (49152, 151936, 262144):
        for shape, make in (("peaked", peaked_logits), ("flat", flat_logits)):
            logits = make(vocab, rng)
            new = Sampler(GenerationParams(temperature=1.0, top_p=0.95, seed=0))
            old = MainSampler(1.0, 0.95, 0)
            after = call_times_ms(lambda s=new, x=logits: s.sample(x), calls)
            rows.append({
                "section": "sampler", "vocab": vocab, "logits": shape,
                "before_ms": per_call_ms(lambda o=old, x=logits: o.sample(x), max(3, calls // 10)),
                "after_median_ms": statistics.median(after), "after_p90_ms": _p90(after),
                "greedy_median_ms": statistics.median(
                    call_times_ms(lambda x=logits: int(np.argmax(x)), calls)),
            })
            print(rows[-1], flush=True)


def bench_detok(rows: list, tokens: int) -> None:
    from types import SimpleNamespace

    from edgeprefill.sdk.tokenizer import TextStreamer

    tok = synthetic_tokenizer(151936)
    text = " ".join(random.Random(1).choice(["hello", "world", "naïve", "你好", "😀", "json",
                                             "{\"a\": 1}", "café"]) for _ in range(tokens))
    ids = tok.encode(text).ids[:tokens]
    before, after = MainStreamer(tok), TextStreamer(SimpleNamespace(tokenizer=tok), ())
    t0 = time.perf_counter()
    a = "".join(before.push(i) for i in ids)
    t1 = time.perf_counter()
    b = "".join(after.push(i) for i in ids) + after.flush()
    t2 = time.perf_counter()
    assert a == b == tok.decode(ids), "streamed text differs from the whole decode"
    rows.append({"section": "detokenizer", "tokens": len(ids), "before_s": t1 - t0,
                 "after_s": t2 - t1})
    print(rows[-1], flush=True)


def bench_mask(rows: list, tokens: int) -> None:
    tok = synthetic_tokenizer(151936)
    rows.append(_llguidance_mask(tok, tokens))
    print(rows[-1], flush=True)
    try:
        rows.append(_xgrammar_mask(tok, tokens))
    except ImportError as err:
        rows.append({"section": "mask", "engine": "xgrammar", "error": str(err)})
    print(rows[-1], flush=True)


def bench_lazy(rows: list, tokens: int) -> None:
    """Free text under strict tools' lazy grammar (server/strict_tools.py) against the
    JSON-schema mask, per step, alternating three times (the machine is shared: read the
    ratio within a round)."""
    tok = synthetic_tokenizer(151936)
    for round_ in range(3):
        for row in (_llguidance_mask(tok, tokens), _lazy_mask(tok, tokens)):
            rows.append({**row, "round": round_})
            print(rows[-1], flush=True)
    for round_ in range(3):
        for kind in ("none", "json_schema", "lazy"):
            rows.append({**_greedy_step(tok, kind, tokens), "round": round_})
            print(rows[-1], flush=True)


def _greedy_step(tok, kind: str, tokens: int) -> dict:
    """The sampler's whole greedy step (Sampler.sample: mask, -inf where refused, argmax,
    advance) on random 152k logits: without a constraint, under the JSON schema (new
    document when complete), and under the lazy grammar's free text."""
    import llguidance

    from edgeprefill.sdk.constraints import Constraint, GrammarMask, _from_lark, _from_schema
    from edgeprefill.sdk.params import GenerationParams
    from edgeprefill.sdk.sampler import Sampler

    vocab = tok.get_vocab_size()
    ll_tok = llguidance.LLTokenizer(tok.to_str(), n_vocab=vocab, eos_token=[2])
    grammars = {"json_schema": lambda: _from_schema(Constraint.json_schema(SCHEMA).source),
                "lazy": lambda: _from_lark(_lazy_constraint().source)}

    def sampler() -> Sampler:
        mask = None if kind == "none" else \
            GrammarMask(llguidance.LLMatcher(ll_tok, grammars[kind](), log_level=0))
        return Sampler(GenerationParams(temperature=0.0), mask=mask)

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((64, vocab)).astype(np.float32)
    current, times = sampler(), []
    for step in range(tokens):
        start = time.perf_counter()
        current.sample(logits[step % 64])
        times.append(time.perf_counter() - start)
        if current.finished:
            current = sampler()
    return {"section": "greedy step", "constraint": kind, "vocab": vocab,
            "median_ms": statistics.median(times) * 1e3, "p90_ms": _p90(times) * 1e3}


def _lazy_constraint():
    """Strict tools' lazy grammar (server/strict_tools.py), SCHEMA as a strict tool's."""
    from edgeprefill.server.strict_tools import lazy_call_constraint

    tools = ({"type": "function", "function": {"name": "f", "strict": True,
                                                "parameters": SCHEMA}},)
    return lazy_call_constraint(tools, "hermes")


def _lazy_mask(tok, tokens: int) -> dict:
    """The mask per free-text step before a call: random allowed tokens, which never
    spell the 11-byte `<tool_call>` from a 152k vocabulary."""
    import llguidance

    from edgeprefill.sdk.constraints import GrammarMask, _from_lark

    vocab = tok.get_vocab_size()
    ll_tok = llguidance.LLTokenizer(tok.to_str(), n_vocab=vocab, eos_token=[2])
    grammar = _from_lark(_lazy_constraint().source)
    mask = GrammarMask(llguidance.LLMatcher(ll_tok, grammar, log_level=0))
    times, documents = _walk(lambda: mask.allowed(vocab), mask.accept,
                             lambda: mask.finished, mask.matcher.reset, tokens, vocab)
    return {"section": "mask", "engine": "llguidance lazy (free text)", "vocab": vocab,
            "documents": documents, "median_ms": statistics.median(times) * 1e3,
            "p90_ms": _p90(times) * 1e3}


def _walk(allowed_of, accept, done, reset, tokens: int, vocab: int) -> tuple[list[float], int]:
    """Generate by drawing random allowed tokens (a new document whenever one is
    complete) for `tokens` steps: the mask cost per step, accepting included."""
    rng = np.random.default_rng(0)
    times, documents = [], 1
    while len(times) < tokens:
        start = time.perf_counter()
        allowed = allowed_of()
        times.append(time.perf_counter() - start)
        token = int(rng.choice(np.flatnonzero(allowed[:vocab])))
        if done() or token == 2:
            reset()
            documents += 1
            continue
        start = time.perf_counter()
        accept(token)
        times[-1] += time.perf_counter() - start
    return times, documents


def _llguidance_mask(tok, tokens: int) -> dict:
    import llguidance

    from edgeprefill.sdk.constraints import Constraint, GrammarMask, _from_schema

    vocab = tok.get_vocab_size()
    start = time.perf_counter()
    ll_tok = llguidance.LLTokenizer(tok.to_str(), n_vocab=vocab, eos_token=[2])
    build = time.perf_counter() - start
    mask = GrammarMask(llguidance.LLMatcher(
        ll_tok, _from_schema(Constraint.json_schema(SCHEMA).source), log_level=0))
    times, documents = _walk(lambda: mask.allowed(vocab), mask.accept,
                             lambda: mask.finished, mask.matcher.reset, tokens, vocab)
    return {"section": "mask", "engine": f"llguidance {llguidance.__version__}"
            if hasattr(llguidance, "__version__") else "llguidance", "vocab": vocab,
            "tokenizer_build_s": build, "documents": documents,
            "median_ms": statistics.median(times) * 1e3, "p90_ms": _p90(times) * 1e3}


def _xgrammar_mask(tok, tokens: int) -> dict:
    import torch
    import xgrammar as xgr

    vocab = tok.get_vocab_size()
    encoded = [tok.id_to_token(i) for i in range(vocab)]
    start = time.perf_counter()
    info = xgr.TokenizerInfo(encoded, vocab_type=xgr.VocabType.BYTE_LEVEL, vocab_size=vocab,
                             stop_token_ids=[2])
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    build = time.perf_counter() - start
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, vocab)

    def allowed():
        matcher.fill_next_token_bitmask(bitmask)
        bits = bitmask[0].numpy().view(np.uint8)
        return np.unpackbits(bits, bitorder="little").view(bool)

    del torch
    times, documents = _walk(allowed, matcher.accept_token, matcher.is_terminated,
                             matcher.reset, tokens, vocab)
    return {"section": "mask", "engine": "xgrammar", "vocab": vocab,
            "tokenizer_build_s": build, "documents": documents,
            "median_ms": statistics.median(times) * 1e3, "p90_ms": _p90(times) * 1e3}


def _p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def bench_decode(rows: list, tokens: int) -> None:
    """A random llama with a 152k vocabulary (hidden 64, 2 layers: the vocabulary, not the
    layers, dominates), decoded greedily with and without the JSON-schema constraint."""
    from edgeprefill.sdk import Engine
    from edgeprefill.sdk.constraints import Constraint

    with Engine.load(_decode_bundle(tokens), threads=2, background=False) as engine:
        for label, extra in (("free", {"ignore_eos": True}),
                             ("json_schema", {"constraint": Constraint.json_schema(SCHEMA)})):
            for temperature in (0.0, 1.0):
                rows.append(_decode_row(engine, label, extra, temperature, tokens))
                print(rows[-1], flush=True)


def bench_lazy_decode(rows: list, tokens: int) -> None:
    """The same model's greedy decode, free against strict tools' lazy grammar before any
    call (the model never writes `<tool_call>`), alternating four times."""
    from edgeprefill.sdk import Engine

    with Engine.load(_decode_bundle(tokens), threads=2, background=False) as engine:
        for round_ in range(4):
            for label, extra in (("free", {"ignore_eos": True}),
                                 ("strict_tools_free_text", {"constraint": _lazy_constraint()})):
                rows.append({**_decode_row(engine, label, extra, 0.0, tokens),
                             "round": round_})
                print(rows[-1], flush=True)


def _decode_bundle(tokens: int) -> Path:
    import sys

    from edgeprefill.export.exporter import ExportOptions, export

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.conftest import CHAT_TEMPLATE, build_hf_model

    work = Path(tempfile.mkdtemp(prefix="sampling-bench-"))
    tok = synthetic_tokenizer(151936)
    model = build_hf_model("llama", work / "hf", vocab_size=151936)
    tok.save(str(model / "tokenizer.json"))
    (model / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}))
    export(model, work / "bundle", ExportOptions(chunks=(16,), max_context=tokens + 64,
                                                 show_progress=False, overwrite=True))
    return work / "bundle"


def _decode_row(engine, label: str, extra: dict, temperature: float, tokens: int) -> dict:
    from edgeprefill.sdk import GenerationParams

    params = GenerationParams(max_new_tokens=tokens, temperature=temperature, seed=0, **extra)
    engine.generate("hello", params).result()  # warm-up (and tokenizer build)
    out = engine.generate("hello", params).result()
    m = out.metrics
    seconds = m.token_times[-1] - m.token_times[0]
    return {"section": "decode", "constraint": label, "temperature": temperature,
            "tokens": len(out.token_ids), "tok_s": (len(m.token_times) - 1) / seconds}


SECTIONS = {"sampler": bench_sampler, "detok": bench_detok, "mask": bench_mask,
            "lazy": bench_lazy, "decode": bench_decode, "lazy_decode": bench_lazy_decode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated sections: {', '.join(SECTIONS)}")
    parser.add_argument("--calls", type=int, default=1000, help="sampler calls per setting")
    parser.add_argument("--tokens", type=int, default=2000, help="tokens per reply")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    print(f"CPU: {platform.processor() or platform.machine()} ({cpu_name()})", flush=True)
    rows: list = []
    for name in args.only.split(","):
        if name not in SECTIONS:
            parser.error(f"unknown section {name!r}; one of {', '.join(SECTIONS)}")
        SECTIONS[name](rows, args.calls if name == "sampler" else args.tokens)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
