"""xLSTM (xlstm): every layer an mLSTM cell (a matrix memory with exponential gates) and a
SwiGLU feed-forward, none attending (export/mlstm.py). The fixture (conftest.FAMILIES
"xlstm": 2 layers, 4 heads, a gate cap and an eps that matter) also runs in
test_exactness.py, test_state_runtime.py (batched rows, slot copies, turns, snapshots)
and the int4/int8 tests (test_quantize.py, test_int4_fp16.py, test_int8_fp16.py).
transformers runs its own torch code (the `xlstm` package is not installed), its
recurrent step for every prompt (the fixture's chunk_size is above their lengths)."""

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
from tests.conftest import build_hf_model
from tests.state_models import assert_padded_chunks_match
from tests.test_exactness import check_together, prompt_ids, reference_greedy, reference_logits
from tests.test_rwkv import gpt_neox_style_tokenizer, run_graph

# NX-AI/xLSTM-7b's config.json as we know its shape (the Hub was not reachable here): the
# xlstm package's names for the widths and depth (embedding_dim, num_blocks) and its
# Triton kernels, which transformers' own code refuses to name without that package.
HUB_7B = {
    "architectures": ["xLSTMForCausalLM"], "model_type": "xlstm", "add_out_norm": True,
    "autocast_kernel_dtype": "bfloat16", "bos_token_id": 0, "chunk_size": 64,
    "chunkwise_kernel": "chunkwise--triton_xl_chunk", "embedding_dim": 4096,
    "eos_token_id": 2, "eps": 1e-06, "ffn_proj_factor": 2.667,
    "ffn_round_up_to_multiple_of": 64, "force_bos_token_insert": True, "gate_soft_cap": 15.0,
    "inference_state_dtype": "float32", "max_inference_chunksize": 16384,
    "mode": "inference", "norm_eps": 1e-06, "norm_reduction_force_float32": True,
    "num_blocks": 32, "num_heads": 8, "output_logit_soft_cap": 30.0, "pad_token_id": 1,
    "qk_dim_factor": 0.5, "return_last_states": True,
    "sequence_kernel": "native_sequence__triton", "step_kernel": "triton",
    "tie_word_embeddings": False, "use_bias": False, "use_cache": True,
    "v_dim_factor": 1.0, "vocab_size": 50304, "weight_mode": "single",
}
# ... with the kernels transformers' torch code names (what it reads of the rest)
NATIVE = {"chunkwise_kernel": "chunkwise--native_autograd",
          "sequence_kernel": "native_sequence__native", "step_kernel": "native"}


@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        flavor, hf_model, bundle):
    """Chunks of 1, 2, 3, 16 and 40 tokens, the last before the split padded: every call's
    logits are transformers' (the state carried across the calls, padding kept out)."""
    assert_padded_chunks_match(hf_model("xlstm"), bundle("xlstm", flavor))


def test_a_hub_config_reads_as_transformers_reads_it():
    ours = ModelConfig.from_hf(HUB_7B)
    hf = transformers.xLSTMConfig.from_dict({**HUB_7B, **NATIVE})
    assert ours.hidden_size == hf.hidden_size == hf.embedding_dim
    assert ours.num_layers == hf.num_blocks and not ours.kv_layers
    assert ours.state_layers == ours.mlstm_layers == tuple(range(hf.num_blocks))
    assert ours.mlstm is not None
    assert (ours.mlstm.heads, ours.mlstm.key_dim, ours.mlstm.value_dim) == (
        hf.num_heads, hf.qk_head_dim, hf.v_head_dim)
    assert (ours.mlstm.gate_cap, ours.mlstm.eps) == (hf.gate_soft_cap, hf.eps)
    assert ours.final_softcap == hf.output_logit_soft_cap
    assert ours.norm_eps == hf.norm_eps
    # xLSTMFeedForward's width; the Hub's ffn.proj_up weights are [10944, 4096]
    assert ours.intermediate_size == 10944
    assert ours.tie_embeddings == hf.tie_word_embeddings
    assert ours.eos_token_ids == (hf.eos_token_id,)


@pytest.mark.parametrize("change, message", (
    ({"embedding_dim": 256}, "embedding_dim 256 differs from hidden_size 4096, which "
                             "transformers' xLSTM cannot run"),
    ({"weight_mode": "fused"}, "weight_mode 'fused' is not supported"),
    ({"use_bias": True}, "use_bias=true"),
    ({"qk_dim_factor": 0.3}, "hidden_size 4096 x qk_dim_factor 0.3 = 1228 is not a multiple "
                             "of 64"),
))
def test_what_transformers_cannot_run_or_export_cannot_compute_is_refused_in_one_line(
        change, message):
    with pytest.raises(ExportError, match=f"^xlstm: {message}") as refused:
        ModelConfig.from_hf({**HUB_7B, **change})
    assert "\n" not in str(refused.value)


def test_prompts_of_different_lengths_generated_together_are_transformers_greedy(
        hf_model, bundle):
    """Decode rows of three prompts in shared calls (and the prompts' chunks where the
    graph takes them together): each reply is transformers' greedy decoding."""
    engine = Engine.load(bundle("xlstm", "ort"), threads=2, background=False)
    assert engine.backend.kernels.described.startswith("no layer attends; ")
    check_together(engine, hf_model("xlstm"), new_tokens=8)
    engine.close()


def test_the_state_carries_what_the_next_call_needs(hf_model, bundle):
    """The graph alone, a prompt in two calls: with the first call's state the second's
    logits are transformers'; with the state read as zeros instead (C, n and m) they are
    not. A runtime that dropped it between calls would compute another model."""
    ids = prompt_ids(20)
    expected = reference_logits(hf_model("xlstm"), ids)[-1]
    session = ort.InferenceSession(str(bundle("xlstm", "standard") / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    zeros = {i.name: np.zeros([1, *i.shape[1:]], np.float32) for i in session.get_inputs()
             if i.name.startswith(("past_conv.", "past_recurrent."))}
    assert sorted(zeros) == ["past_recurrent.0", "past_recurrent.1"]
    _, states = run_graph(session, ids[:12], 0, zeros)
    logits, _ = run_graph(session, ids[12:], 12, states)
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    logits, _ = run_graph(session, ids[12:], 12, {n: np.zeros_like(v) for n, v in states.items()})
    assert np.abs(logits - expected).max() > 1e-2


@pytest.mark.slow
def test_a_hub_shaped_checkpoint_exports_and_generates_from_text(tmp_path):
    """xLSTM-7b's layout: config.json as the Hub's (num_blocks, not num_hidden_layers; the
    xlstm package's Triton kernel names) beside a GPT-NeoX-style tokenizer. A text prompt
    generates transformers' greedy text (of the same weights under its own kernel names).
    (hidden_size is given beside embedding_dim: without it transformers reads 4096, the
    7b's width, and export refuses the disagreement.)"""
    hf = build_hf_model("xlstm", tmp_path / "hf", vocab_size=320)
    ours = json.loads((hf / "config.json").read_text())
    hub = {**HUB_7B, "embedding_dim": 128, "hidden_size": 128, "num_blocks": 2, "num_heads": 4,
           "vocab_size": 320, "chunk_size": ours["chunk_size"],
           "autocast_kernel_dtype": "float32"}
    gpt_neox_style_tokenizer(hf, 320)
    (hf / "config.json").write_text(json.dumps({**hub, **NATIVE}))
    text = "the quick brown fox jumps over the lazy dog"
    ids = transformers.AutoTokenizer.from_pretrained(hf)(text)["input_ids"]
    expected = reference_greedy(hf, ids)
    (hf / "config.json").write_text(json.dumps(hub))
    export(hf, tmp_path / "b", ExportOptions(chunks=(16,), show_progress=False))
    with Engine.load(tmp_path / "b", threads=2, background=False) as engine:
        assert engine.manifest.eos_token_ids == [2]
        assert engine.tokenizer.encode(text) == ids
        got = engine.generate(text, GenerationParams(max_new_tokens=8, ignore_eos=True),
                              chunk_size=16).result().token_ids
    assert got == expected
