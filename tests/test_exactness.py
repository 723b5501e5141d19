"""The bundle computes what transformers computes, whatever the chunking."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import pytest
import torch

from edgeprefill.sdk import Engine, GenerationParams
from tests.conftest import FAMILIES, FAST_FAMILIES, VOCAB, load_hf_model

FLAVORS = ("ort", "standard")
PROMPT_LENGTHS = (1, 15, 16, 17, 100, 333)
CHUNK_SIZES = (1, 16, 64, None)  # None: the whole prompt in one chunk
# The default suite: fewer lengths and chunk sizes (still crossing every test window
# several times, with chunks that straddle it); the full matrix runs under `slow`.
QUICK_LENGTHS = (1, 17, 100)
QUICK_CHUNKS = (16, None)
# the families whose fixture slides
WINDOWED = ("mistral", "qwen2", "qwen2_5_vl", "gemma2", "gemma3_text", "cohere2", "gemma4_text")
NEW_TOKENS = 8


def prompt_ids(length: int, seed: int = 1) -> list[int]:
    rng = np.random.default_rng(seed + length)
    return [1] + [int(t) for t in rng.integers(3, VOCAB, size=length - 1)]


@contextmanager
def recurrent_delta_rule():
    """Qwen3.5's Gated DeltaNet (and Qwen3.5-MoE's, Qwen3-Next's, Lara Mini's, OLMo
    Hybrid's; Kimi Linear's and Bailing hybrid's KDA) in transformers' recurrent form (its
    decode steps') for a prompt too, as the bundle runs it. transformers runs a prompt in
    its chunked form, which equals it up to rounding; on the fixtures the two differ by up
    to 2e-4 over 100 tokens, more than the comparisons' 1e-4 (test_qwen3_5.py compares the
    chunked form over 40). Other families never call it."""
    from transformers.models.bailing_hybrid import modeling_bailing_hybrid
    from transformers.models.kimi_linear import modeling_kimi_linear
    from transformers.models.lara_mini import modeling_lara_mini
    from transformers.models.olmo_hybrid import modeling_olmo_hybrid
    from transformers.models.qwen3_5 import modeling_qwen3_5
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe
    from transformers.models.qwen3_next import modeling_qwen3_next

    modules = (modeling_qwen3_5, modeling_qwen3_5_moe, modeling_qwen3_next, modeling_lara_mini,
               modeling_olmo_hybrid)
    # (module, its chunked rule's name, its recurrent rule's name)
    rules = [(m, "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
             for m in modules]
    rules += [(module, "chunk_kimi_delta_attention", "recurrent_kimi_delta_attention")
              for module in (modeling_kimi_linear, modeling_bailing_hybrid)]  # KDA
    chunked = [getattr(module, name) for module, name, _ in rules]
    for module, name, recurrent_name in rules:
        recurrent = getattr(module, recurrent_name)
        setattr(module, name,
                lambda *args, chunk_size=None, _rule=recurrent, **kwargs: _rule(*args, **kwargs))
    try:
        yield
    finally:
        for (module, name, _), rule in zip(rules, chunked, strict=True):
            setattr(module, name, rule)


def checkpoint_key(hf_dir) -> tuple:
    """What identifies a saved checkpoint for the reference caches: its folder and each
    file's size and mtime (a test that rewrites its config.json gets a new key)."""
    path = Path(hf_dir)
    return (str(path.resolve()),
            tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns)
                  for f in sorted(path.iterdir()) if f.is_file()))


# transformers' outputs per (checkpoint_key, ids, ...): the families' tests ask for the
# same references in both flavours and in several modules; transformers' side was most of
# their time (its Qwen3.5 recurrent form and its greedy decoding above all).
LOGITS_CACHE: dict[tuple, np.ndarray] = {}
GREEDY_CACHE: dict[tuple, list[int]] = {}


def reference_logits(hf_dir, ids: list[int], chunked_delta_rule: bool = False) -> np.ndarray:
    """transformers' logits [len(ids), vocab] of the checkpoint in `hf_dir` (cached)."""
    key = (checkpoint_key(hf_dir), tuple(ids), chunked_delta_rule)
    if key not in LOGITS_CACHE:
        model = load_hf_model(hf_dir)
        with torch.no_grad(), nullcontext() if chunked_delta_rule else recurrent_delta_rule():
            LOGITS_CACHE[key] = model(torch.tensor([ids])).logits[0].numpy()
    return LOGITS_CACHE[key].copy()


def reference_greedy(source, ids: list[int]) -> list[int]:
    """transformers' NEW_TOKENS greedy tokens after `ids`. `source`: a checkpoint folder
    (the reply is cached), or a loaded model (never cached: the test may have changed it)."""
    if not isinstance(source, (str, Path)):
        return model_greedy(source, ids)
    key = (checkpoint_key(source), tuple(ids))
    if key not in GREEDY_CACHE:
        GREEDY_CACHE[key] = model_greedy(load_hf_model(source), ids)
    return list(GREEDY_CACHE[key])


def model_greedy(model, ids: list[int]) -> list[int]:
    with torch.no_grad(), recurrent_delta_rule():
        out = model.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0,
        )
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_chunk_logits_match_transformers(family, flavor, hf_model, bundle):
    """Every chunk's last-token logits equal transformers' at that position."""
    ids = prompt_ids(100)
    expected = reference_logits(hf_model(family), ids)
    engine = Engine.load(bundle(family, flavor), threads=2, background=False)
    backend = engine.backend
    from edgeprefill.engines import StepBatch

    for chunk in (100, 16, 7):
        for start in range(0, len(ids), chunk):
            part = ids[start : start + chunk]
            logits = backend.run(StepBatch(
                np.array([part], np.int64), np.array([start], np.int32),
                np.array([len(part)], np.int32), first_slot=0,
            ))
            np.testing.assert_allclose(
                logits[0], expected[start + len(part) - 1], rtol=1e-4, atol=1e-4,
                err_msg=f"chunk {chunk} at {start}",
            )
    engine.close()


def check_greedy(hf_dir, bundle_dir, lengths, chunks) -> None:
    engine = Engine.load(bundle_dir, threads=2, background=False, prefix_reuse=False)
    params = GenerationParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    for length in lengths:
        ids = prompt_ids(length)
        expected = reference_greedy(hf_dir, ids)
        for chunk in chunks:
            got = engine.generate(ids, params, chunk_size=chunk or length).result()
            assert got.token_ids == expected, f"length {length}, chunk {chunk}"
            assert got.metrics.chunks == -(-length // (chunk or length))
    engine.close()


# Families whose greedy text the default suite checks in test_state_runtime.py (both
# flavours; chunks of 2, 16 and whole; alone and batched): their cells here run under slow.
STATE_FAMILIES = ("lfm2", "lfm3", "qwen3_5_text", "granitemoehybrid-mamba", "falcon_h1")
# Families whose decode steps the default suite checks elsewhere in both flavours: chunks
# of 1 token (each a decode step on the carried KV and states) against transformers'
# logits, and greedy text of the same code path. Their cells here were the default suite's
# costliest (transformers' greedy references of three prompts each), so they run under slow:
# - nemotron_h, bamba (test_nemotron_h, test_bamba): Mamba-2 hybrids, whose greedy text
#   test_state_runtime checks on granitemoehybrid-mamba and falcon_h1;
# - qwen3_5 (test_qwen3_5): qwen3_5_text with M-RoPE, whose greedy text test_state_runtime
#   checks;
# - qwen3_moe, lfm2_moe (test_moe): also their batched greedy text;
# - gemma4_text and gemma4 (its language model): test_gemma4's batched greedy text.
DECODE_CHECKED = ("nemotron_h", "bamba", "qwen3_5", "qwen3_moe", "lfm2_moe", "gemma4_text",
                  "gemma4")
QUICK_GREEDY = [pytest.param(family, marks=pytest.mark.slow)
                if family in STATE_FAMILIES + DECODE_CHECKED else family
                for family in FAST_FAMILIES]


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", QUICK_GREEDY)
def test_greedy_output_matches_transformers_for_some_lengths_and_chunks(
    family, flavor, hf_model, bundle
):
    check_greedy(hf_model(family), bundle(family, flavor), QUICK_LENGTHS, QUICK_CHUNKS)


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_output_is_identical_across_chunk_sizes_and_to_transformers(
    family, flavor, hf_model, bundle
):
    check_greedy(hf_model(family), bundle(family, flavor), PROMPT_LENGTHS, CHUNK_SIZES)


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", WINDOWED)
def test_second_turn_crosses_the_window_again(family, flavor, hf_model, bundle):
    """A session's second turn appends to a cache that already slid past the window; the
    reply equals transformers' greedy continuation of the whole conversation."""
    hf_dir = hf_model(family)
    engine = Engine.load(bundle(family, flavor), threads=2, background=False,
                         chunk_size=16)
    params = GenerationParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    session = engine.session()
    first, second = prompt_ids(45), prompt_ids(37, seed=7)[1:]
    reply = session.generate(first, params).result().token_ids
    assert reply == reference_greedy(hf_dir, first)
    conversation = first + reply + second
    got = session.generate(second, params).result()
    assert got.token_ids == reference_greedy(hf_dir, conversation)
    # Only the new turn (and the last reply token, never fed back) is prefilled.
    assert got.metrics.chunks <= -(-(len(second) + 1) // 16)
    engine.close()


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", ("mistral", "gemma2"))
def test_rows_of_different_lengths_decode_together_within_their_windows(
    family, flavor, hf_model, bundle
):
    """A decode batch holds rows at different positions: each row's window is its own."""
    engine = Engine.load(bundle(family, flavor), threads=2, background=False)
    check_together(engine, hf_model(family), NEW_TOKENS)
    engine.close()


# The dense families that declare what differs from a base family (BitNet's layers, xIELU,
# sinks, ...): their rows of different lengths batched, under `slow` (the default suite
# checks their chunk logits above).
DECLARED = ("bitnet", "bitnet-packed", "bitnet-online", "apertus", "apertus1p5_text",
            "vaultgemma", "cwm", "iquestcoder", "jais2", "olmo", "hyperclovax",
            "hyperclovax-pre", "granite_swa", "granitemoeshared", "granitemoe_swa", "nanochat",
            "doge")


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", DECLARED)
def test_rows_of_different_lengths_generate_together_as_transformers(
    family, flavor, hf_model, bundle
):
    engine = Engine.load(bundle(family, flavor), threads=2, background=False)
    check_together(engine, hf_model(family), NEW_TOKENS)
    engine.close()


def check_together(engine: Engine, hf_dir, new_tokens: int) -> None:
    """Three prompts (5, 30 and 61 tokens) generated at once by `engine` (their decode rows,
    and where the graph takes them a prompt's chunks, in shared calls): each reply is
    transformers' greedy decoding of its own prompt."""
    params = GenerationParams(max_new_tokens=new_tokens, ignore_eos=True)
    prompts = [prompt_ids(n, seed=n) for n in (5, 30, 61)]
    streams = [engine.generate(ids, params) for ids in prompts]
    for ids, stream in zip(prompts, streams, strict=True):
        assert stream.result().token_ids == reference_greedy(hf_dir, ids)


@pytest.mark.parametrize("family", ("llama", "mistral"))
def test_padded_last_chunk_is_masked(family, bundle, hf_model):
    """A fixed-shape backend pads the last chunk: padding must not change the logits,
    and later tokens must not see the padded positions (nor, with a window, see past it)."""
    from edgeprefill.engines import StepBatch

    ids = prompt_ids(40)
    expected = reference_logits(hf_model(family), ids)
    for flavor in FLAVORS:
        engine = Engine.load(bundle(family, flavor), threads=2, background=False)
        run = engine.backend.run
        run(StepBatch(np.array([ids[:16]]), np.array([0], np.int32),
                      np.array([16], np.int32), 0))
        padded = np.full((1, 16), 7, np.int64)
        padded[0, :10] = ids[16:26]  # 10 valid tokens, 6 of padding
        logits = run(StepBatch(padded, np.array([16], np.int32), np.array([10], np.int32), 0))
        np.testing.assert_allclose(logits[0], expected[25], rtol=1e-4, atol=1e-4)
        # The next chunk overwrites the padded positions and must not see the padding.
        logits = run(StepBatch(np.array([ids[26:40]]), np.array([26], np.int32),
                               np.array([14], np.int32), 0))
        np.testing.assert_allclose(logits[0], expected[39], rtol=1e-4, atol=1e-4)
        engine.close()


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", ("llama", "gemma2", "olmo2", "phi", "gpt_neox"))
def test_the_last_layer_runs_past_its_attention_on_the_rows_the_head_reads(
        family, flavor, bundle):
    """One family per block kind (pre, sandwich, post, shared, parallel): of the last
    layer's projections only the packed q/k/v reads every token of a chunk; the rest (output
    projection, MLP) come after the last-position gather with the LM head. The logits stay
    transformers' (the tests above), so the gather only takes work away."""
    import onnx

    from edgeprefill.bundle import load_manifest
    from edgeprefill.engines.ort.int4_prefill import after_gather

    path = bundle(family, flavor)
    manifest = load_manifest(path)
    graph = onnx.load(str(path / manifest.graph.file), load_external_data=False).graph
    weights = {t.name for t in graph.initializer}
    one_row = after_gather(graph)
    last = f"layers.{manifest.model.num_layers - 1}."
    after, before = [], []  # the projections' weights, after the gather or before it
    for i, node in enumerate(graph.node):
        if node.op_type in ("MatMul", "Gemm") and node.input[1] in weights:
            (after if i in one_row else before).append(node.input[1])
    assert [name for name in before if last in name] == [before[-1]]  # q/k/v, packed
    assert len([name for name in after if last in name]) >= 2  # output projection, MLP
    assert all(last in name or "lm_head" in name or "embed" in name for name in after)


def test_bf16_checkpoint_is_converted(tmp_path):
    """Most recent checkpoints ship bf16: export converts them to the graph dtype."""
    from edgeprefill.export.exporter import ExportOptions, export
    from tests.conftest import build_hf_model

    hf_dir = build_hf_model("llama", tmp_path / "hf", dtype=torch.bfloat16)
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=128,
                                                  show_progress=False))
    ids = prompt_ids(30)
    model = load_hf_model(hf_dir)
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    from edgeprefill.engines import StepBatch

    logits = engine.backend.run(StepBatch(np.array([ids]), np.array([0], np.int32),
                                          np.array([30], np.int32), 0))
    np.testing.assert_allclose(logits[0], expected, rtol=1e-4, atol=1e-4)
    engine.close()
