"""RWKV-4 (rwkv): every layer a time mix (its WKV a recurrence per channel) and a channel
mix, each reading the token before, none attending (export/rwkv.py). The fixture
(conftest.FAMILIES "rwkv": 4 layers, the stream halved after every second) also runs in
test_exactness.py, test_state_runtime.py (batched rows, slot copies, turns, snapshots) and
the int4/int8 tests (test_quantize.py, test_int4_fp16.py, test_int8_fp16.py)."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import transformers

from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.sdk import Engine, GenerationParams
from tests.bpe_tokenizers import CORPUS
from tests.conftest import build_hf_model
from tests.state_models import assert_padded_chunks_match
from tests.test_exactness import check_together, prompt_ids, reference_greedy, reference_logits

# RWKV/rwkv-4-169m-pile's config.json as we know its shape (the Hub was not reachable
# here), and a raven's, whose widths are left to the config class (null).
HUB_169M = {
    "architectures": ["RwkvForCausalLM"], "model_type": "rwkv", "attention_hidden_size": 768,
    "bos_token_id": 0, "context_length": 1024, "eos_token_id": 0, "hidden_size": 768,
    "intermediate_size": 3072, "layer_norm_epsilon": 1e-05, "num_hidden_layers": 12,
    "rescale_every": 6, "tie_word_embeddings": False, "use_cache": True, "vocab_size": 50277,
}
HUB_RAVEN = {**HUB_169M, "hidden_size": 2048, "num_hidden_layers": 24,
             "attention_hidden_size": None, "intermediate_size": None, "context_length": 4096}


@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        flavor, hf_model, bundle):
    """Chunks of 1, 2, 3, 16 and 40 tokens, the last before the split padded: every call's
    logits are transformers' (its states carried across the calls, padding kept out)."""
    assert_padded_chunks_match(hf_model("rwkv"), bundle("rwkv", flavor))


@pytest.mark.parametrize("raw", (HUB_169M, HUB_RAVEN))
def test_a_hub_config_reads_as_transformers_reads_it(raw):
    ours = ModelConfig.from_hf(raw)
    hf = transformers.RwkvConfig.from_dict(raw)
    assert ours.hidden_size == hf.hidden_size == hf.attention_hidden_size
    assert ours.intermediate_size == hf.intermediate_size
    assert ours.max_positions == hf.context_length
    assert ours.rescale_every == hf.rescale_every
    assert ours.rwkv_layers == tuple(range(hf.num_hidden_layers)) and not ours.kv_layers
    assert ours.state_layers == ours.rwkv_layers
    assert ours.norm_eps == hf.layer_norm_epsilon
    assert ours.tie_embeddings == hf.tie_word_embeddings
    assert ours.eos_token_ids == (hf.eos_token_id,)


def test_a_negative_rescale_every_never_rescales():
    assert ModelConfig.from_hf({**HUB_169M, "rescale_every": -1}).rescale_every == 0


@pytest.mark.parametrize("change, message", (
    ({"attention_hidden_size": 512}, "attention_hidden_size 512 differs from hidden_size "
                                     "768, which transformers' RWKV cannot run"),
    ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon 1e-06 is not supported"),
))
def test_what_transformers_cannot_run_or_export_cannot_compute_is_refused_in_one_line(
        change, message):
    with pytest.raises(ExportError, match=f"^rwkv: {message}") as refused:
        ModelConfig.from_hf({**HUB_169M, **change})
    assert "\n" not in str(refused.value)


def test_prompts_of_different_lengths_generated_together_are_transformers_greedy(
        hf_model, bundle):
    engine = Engine.load(bundle("rwkv", "ort"), threads=2, background=False)
    assert engine.backend.kernels.described.startswith("no layer attends; ")
    check_together(engine, hf_model("rwkv"), new_tokens=8)
    engine.close()


def run_graph(session, ids: list[int], start: int, states: dict[str, np.ndarray]
              ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One call of the bundle's graph on one row: its logits and its present states, keyed
    by their past names."""
    feeds = {"input_ids": np.array([ids], np.int64), "past_lens": np.array([start], np.int32),
             "valid_lens": np.array([len(ids)], np.int32), **states}
    names = [o.name for o in session.get_outputs()]
    out = dict(zip(names, session.run(names, feeds), strict=True))
    return out["logits"][0], {name.replace("present_", "past_"): value
                              for name, value in out.items() if name.startswith("present_")}


@pytest.mark.parametrize("kind", ("conv", "recurrent"))
def test_each_state_carries_what_the_next_call_needs(kind, hf_model, bundle):
    """The graph alone, a prompt in two calls: with the first call's states the second's
    logits are transformers'; with either kind of state read as zeros instead (the token
    shifts, or the WKV sums and their exponent) they are not. A runtime that dropped
    either between calls would compute another model."""
    ids = prompt_ids(20)
    expected = reference_logits(hf_model("rwkv"), ids)[-1]
    session = ort.InferenceSession(str(bundle("rwkv", "standard") / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    zeros = {i.name: np.zeros([1, *i.shape[1:]], np.float32) for i in session.get_inputs()
             if i.name.startswith(("past_conv.", "past_recurrent."))}
    assert sorted(zeros) == sorted(f"past_{k}.{i}" for k in ("conv", "recurrent")
                                   for i in range(4))
    _, states = run_graph(session, ids[:12], 0, zeros)
    logits, _ = run_graph(session, ids[12:], 12, states)
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    dropped = {name: np.zeros_like(value) if name.startswith(f"past_{kind}.") else value
               for name, value in states.items()}
    logits, _ = run_graph(session, ids[12:], 12, dropped)
    assert np.abs(logits - expected).max() > 1e-2


def gpt_neox_style_tokenizer(out, vocab_size: int) -> None:
    """A byte-level BPE tokenizer.json whose id 0 is <|endoftext|> (GPT-NeoX's, which the
    RWKV-4 Pile models ship) and GPTNeoXTokenizer's tokenizer_config.json: BOS, EOS and
    UNK all <|endoftext|>, none added to a prompt, no chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|padding|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPTNeoXTokenizer", "add_prefix_space": False,
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>"}))


def test_a_hub_shaped_checkpoint_exports_and_generates_from_text(tmp_path):
    """The Pile models' layout: config.json as the Hub's (its widths null: 4 x hidden and
    hidden; `context_length` its positions; BOS = EOS = 0) beside a GPT-NeoX-style
    tokenizer. The bundle's context is context_length, its EOS id 0, and a text prompt
    generates transformers' greedy text of the same ids."""
    hf = build_hf_model("rwkv", tmp_path / "hf", vocab_size=320, intermediate_size=256)
    hub = {**HUB_169M, "hidden_size": 64, "num_hidden_layers": 4, "rescale_every": 2,
           "vocab_size": 320, "intermediate_size": None, "attention_hidden_size": None,
           "context_length": 96}
    (hf / "config.json").write_text(json.dumps(hub))
    (hf / "generation_config.json").write_text(json.dumps({"bos_token_id": 0,
                                                           "eos_token_id": 0}))
    gpt_neox_style_tokenizer(hf, 320)
    export(hf, tmp_path / "b", ExportOptions(chunks=(16,), show_progress=False))
    with Engine.load(tmp_path / "b", threads=2, background=False) as engine:
        assert engine.manifest.max_context == 96
        assert engine.manifest.eos_token_ids == [0]
        text = "the quick brown fox jumps over the lazy dog"
        ids = engine.tokenizer.encode(text)
        assert ids and ids[0] != 0  # no BOS added
        got = engine.generate(text, GenerationParams(max_new_tokens=8, ignore_eos=True),
                              chunk_size=16).result().token_ids
    assert got == reference_greedy(hf, ids)
