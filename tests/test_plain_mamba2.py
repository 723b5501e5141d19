"""Plain Mamba-2 (Mamba2ForCausalLM): every layer a Mamba-2 mixer after an RMS norm, none
attending, so a bundle has no KV at all and its slots hold recurrent states alone. The
fixture (conftest.FAMILIES "mamba2": 8 heads of 16 in 2 groups, biased projections, tied
embeddings) also runs in the generic suites (test_exactness.py) and in
test_state_runtime.py (batched rows, slot copies, prefix reuse and state snapshots)."""

from __future__ import annotations

import pytest
import transformers

from edgeprefill.errors import ExportError
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.sdk import Engine
from tests.state_models import GRAPHS, assert_padded_chunks_match
from tests.test_cli_errors import cli
from tests.test_exactness import prompt_ids, reference_greedy

# mistralai/Mamba-Codestral-7B-v0.1's config.json as we know its shape (the Hub was not
# reachable here): 64 layers of 128 heads of 64, 8 groups, a state of 128.
HUB_CODESTRAL = {
    "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "hidden_size": 4096,
    "num_hidden_layers": 64, "num_heads": 128, "head_dim": 64, "n_groups": 8,
    "state_size": 128, "expand": 2, "conv_kernel": 4, "chunk_size": 256, "use_bias": False,
    "use_conv_bias": True, "hidden_act": "silu", "layer_norm_epsilon": 1e-05,
    "residual_in_fp32": True, "time_step_limit": [0.0, float("inf")], "vocab_size": 32768,
    "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0,
}


@pytest.mark.parametrize("flavor, kernels", GRAPHS)
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        flavor, kernels, hf_model, bundle, monkeypatch):
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    assert_padded_chunks_match(hf_model("mamba2"), bundle("mamba2", flavor))


def test_a_hub_config_reads_as_transformers_reads_it():
    ours = ModelConfig.from_hf(HUB_CODESTRAL)
    hf = transformers.Mamba2Config.from_dict(HUB_CODESTRAL)
    assert ours.mamba_layers == tuple(range(hf.num_hidden_layers)) and not ours.kv_layers
    assert ours.mlp_less == ours.mamba_layers  # no MLP anywhere
    m = ours.mamba
    assert m is not None and (m.heads, m.head_dim, m.groups, m.state_size, m.conv_kernel) == (
        hf.num_heads, hf.head_dim, hf.n_groups, hf.state_size, hf.conv_kernel)
    assert (m.conv_bias, m.proj_bias, m.out_bias, m.norm) == (
        hf.use_conv_bias, hf.use_bias, hf.use_bias, "gate_first")  # MambaRMSNormGated
    assert ours.norm_eps == hf.layer_norm_epsilon and not ours.tie_embeddings


def test_a_convolution_activation_other_than_silu_is_refused_in_one_line():
    with pytest.raises(ExportError, match="^mamba2: hidden_act 'gelu' is not supported; "
                                          "the mixer's convolution takes silu only$"):
        ModelConfig.from_hf({**HUB_CODESTRAL, "hidden_act": "gelu"})


def test_the_load_runs_the_native_scan_and_says_no_layer_attends(bundle, monkeypatch):
    """No attention to choose: the recurrences' ops run (`require` loads, it does not fail
    for want of an attention node), and the steps fuse (no GroupQueryAttention)."""
    from edgeprefill.kernels.select import why_not

    monkeypatch.setenv("EDGEPREFILL_KERNELS", "require")
    if why_not("ort", "float32", "cpu") is not None:
        pytest.skip(f"the native kernels do not run here: {why_not('ort', 'float32', 'cpu')}")
    engine = Engine.load(bundle("mamba2", "ort"), threads=2, background=False)
    described = engine.backend.kernels.described
    assert described.startswith("no layer attends; native (") and "Mamba2Scan in 2" in described
    assert engine.backend.fuses_rows
    engine.close()
    # --compute bf16: the projections, and no word of an attention that is not there
    engine = Engine.load(bundle("mamba2", "ort"), threads=2, background=False, compute="bf16")
    assert engine.backend.compute.described.startswith("bf16 (MatMulBf16")
    assert "ttention" not in engine.backend.compute.described
    engine.close()


def test_export_run_and_serve_give_transformers_greedy_text(hf_model, tmp_path):
    """The CLI end to end (export, then run), and the server on the same bundle: the text
    is transformers' greedy continuation, decoded."""
    from starlette.testclient import TestClient

    from edgeprefill.server import ServerConfig, create_app

    hf_dir, out = hf_model("mamba2"), tmp_path / "bundle"
    exported = cli("export", hf_dir, "-o", out, "--chunks", "16", "--max-context", "128")
    assert exported.returncode == 0, exported.stderr
    inspected = cli("inspect", out).stdout.splitlines()
    assert "model       mamba2: 2 layers, hidden 64, no attention, vocab 128" in inspected
    assert any(line.startswith("kernels     no layer attends; ") for line in inspected)
    assert any(line.startswith("kv cache    none (no layer attends)") for line in inspected)
    assert any(line.startswith("steps       a prefill chunk and the decode rows in one call")
               for line in inspected)  # no GroupQueryAttention to keep them apart
    ids = prompt_ids(23)
    prompt = " ".join(f"w{i}" for i in ids)  # the fixture's word-level tokenizer
    want = " ".join(f"w{i}" for i in reference_greedy(hf_dir, ids))
    ran = cli("run", out, prompt, "--max-new-tokens", "8", "--ignore-eos", "--chunk-size", "16")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == want
    engine = Engine.load(out, threads=2, kv_slots=2)
    with TestClient(create_app(engine, ServerConfig(model_name="m"))) as http:
        body = {"model": "m", "prompt": prompt, "max_tokens": 8, "ignore_eos": True,
                "temperature": 0}
        replies = [http.post("/v1/completions", json=body).json() for _ in range(2)]
    engine.close()
    assert [r["choices"][0]["text"].strip() for r in replies] == [want, want]


def test_a_slot_of_a_bundle_without_kv_costs_its_states_alone(bundle):
    engine = Engine.load(bundle("mamba2", "ort"), threads=2, background=False)
    backend = engine.backend
    assert backend.kv_arrays() == [] and backend.kv_slot_bytes(128) == backend.state_bytes() > 0
    engine.close()
