"""`edgeprefill export BASE --adapter ADAPTER`: a PEFT LoRA adapter merged into the base
weights as export reads them (export/lora.py). The reference is peft itself: the adapter
saved by `save_pretrained` and loaded back onto the base with `PeftModel.from_pretrained`,
its logits compared with the bundle's, prefilled in chunks. peft starts LoRA B at zero,
which would make any merge pass: every LoRA tensor (and every copy saved beside them) is
randomized before saving."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.quantize import QuantConfig
from tests.conftest import build_hf_model, load_hf_model
from tests.test_exactness import prompt_ids
from tests.test_qwen_vl import assert_chunks_match

LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
IDS = prompt_ids(40)


def trained_adapter(hf_dir, out, seed: int = 0, **lora) -> None:
    """An adapter of `hf_dir` saved to `out` as a fine-tune leaves it: its LoRA tensors,
    its modules_to_save copies and its saved biases all moved off their initial values."""
    model = get_peft_model(load_hf_model(hf_dir), LoraConfig(**lora))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:  # what training changes, and so what the adapter saves
                param.add_(torch.randn(param.shape, generator=generator) * 0.1)
    model.save_pretrained(out)


def peft_logits(hf_dir, adapter_dir, merged: bool = False) -> np.ndarray:
    """The logits of the base with the saved adapter loaded by peft (merged: after
    merge_and_unload, as the merged model is deployed)."""
    model = PeftModel.from_pretrained(load_hf_model(hf_dir), adapter_dir).eval()
    if merged:
        model = model.merge_and_unload()
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0].numpy()


def export_with(hf_dir, adapter_dir, out, flavor: str = "ort", **options):
    export(hf_dir, out, ExportOptions(flavor=flavor, chunks=(16, 64), max_context=128,
                                      show_progress=False, adapter=adapter_dir, **options))
    return out


def assert_merged_as_peft(tmp_path, family: str, flavor: str = "ort", **lora) -> None:
    hf_dir = build_hf_model(family, tmp_path / "hf")
    trained_adapter(hf_dir, tmp_path / "adapter", **lora)
    expected = peft_logits(hf_dir, tmp_path / "adapter")
    base = load_hf_model(hf_dir)
    with torch.no_grad():
        unchanged = base(torch.tensor([IDS])).logits[0].numpy()
    assert np.abs(expected - unchanged).max() > 0.1  # the adapter changes the model
    bundle_dir = export_with(hf_dir, tmp_path / "adapter", tmp_path / "b", flavor)
    assert_chunks_match(bundle_dir, IDS, expected)


def test_a_llama_adapter_on_every_projection_is_merged_as_peft_runs_it(tmp_path):
    assert_merged_as_peft(tmp_path, "llama", r=4, lora_alpha=8, target_modules=LLAMA_TARGETS)


def test_gpt2_conv1d_adapter_is_merged_in_its_stored_layout(tmp_path):
    # Conv1D stores [in, out]: peft's fan_in_fan_out delta is (B @ A)^T; c_proj is square,
    # so a delta left untransposed would still fit and be wrong. bias "all" saves every
    # bias, trained: they replace the base's.
    assert_merged_as_peft(tmp_path, "gpt2", r=4, lora_alpha=16, fan_in_fan_out=True,
                          target_modules=["c_attn", "c_proj", "c_fc"], bias="all")


def test_rslora_with_rank_and_alpha_patterns_scales_each_module_as_peft(tmp_path):
    assert_merged_as_peft(tmp_path, "llama", r=4, lora_alpha=8, target_modules=LLAMA_TARGETS,
                          use_rslora=True,
                          rank_pattern={"down_proj": 2, "layers.1.self_attn.q_proj": 8},
                          alpha_pattern={"v_proj": 3})


def test_embedding_lora_and_a_saved_head_replace_the_bases(tmp_path):
    # the embedding's LoRA is lora_embedding_A/B ((B @ A)^T); modules_to_save's head is a
    # whole trained copy saved in the adapter
    assert_merged_as_peft(tmp_path, "llama", r=4, lora_alpha=8,
                          target_modules=["embed_tokens", "q_proj"], modules_to_save=["lm_head"])


def test_a_tied_model_reads_the_merged_table_as_its_head_as_merged_peft_does(tmp_path):
    # peft's unmerged forward adds the LoRA to the embedding lookup only, its merge adds it
    # to the one table both read (and warns of the difference): the bundle is the merged
    # model, as merge_and_unload deploys it
    hf_dir = build_hf_model("llama", tmp_path / "hf", tie_word_embeddings=True)
    trained_adapter(hf_dir, tmp_path / "adapter", r=4, lora_alpha=8,
                    target_modules=["embed_tokens", "v_proj"])
    merged = peft_logits(hf_dir, tmp_path / "adapter", merged=True)
    assert np.abs(merged - peft_logits(hf_dir, tmp_path / "adapter")).max() > 0.1
    bundle_dir = export_with(hf_dir, tmp_path / "adapter", tmp_path / "b")
    assert_chunks_match(bundle_dir, IDS, merged)


def test_a_stored_head_tied_to_an_adapted_embedding_reads_the_merged_table(tmp_path):
    # a tied config over a checkpoint that stores its head equal to the embedding:
    # transformers ties the two at load, and peft's merge changes the one table
    from safetensors.torch import load_file, save_file

    hf_dir = build_hf_model("llama", tmp_path / "hf", tie_word_embeddings=True)
    path = hf_dir / "model.safetensors"
    tensors = load_file(path)
    assert "lm_head.weight" not in tensors
    save_file({**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"].clone()},
              path, metadata={"format": "pt"})
    trained_adapter(hf_dir, tmp_path / "adapter", r=4, lora_alpha=8,
                    target_modules=["embed_tokens", "v_proj"])
    bundle_dir = export_with(hf_dir, tmp_path / "adapter", tmp_path / "b")
    assert_chunks_match(bundle_dir, IDS, peft_logits(hf_dir, tmp_path / "adapter", merged=True))


def test_ensure_weight_tying_s_head_copies_are_the_tied_table_as_unmerged_peft(tmp_path):
    # ensure_weight_tying saves the head's LoRA as the embedding's, transposed, and a copy of
    # the table: the tied table gets the delta once, as in peft's unmerged forward (its
    # merge_and_unload adds it to the shared table twice, 0.21.2)
    hf_dir = build_hf_model("llama", tmp_path / "hf", tie_word_embeddings=True)
    trained_adapter(hf_dir, tmp_path / "adapter", r=4, lora_alpha=8,
                    target_modules=["embed_tokens", "v_proj"], ensure_weight_tying=True)
    bundle_dir = export_with(hf_dir, tmp_path / "adapter", tmp_path / "b")
    assert_chunks_match(bundle_dir, IDS, peft_logits(hf_dir, tmp_path / "adapter"))


def test_a_saved_head_over_a_tied_model_is_its_head_untied_without_a_warning(
        tmp_path, caplog):
    hf_dir = build_hf_model("llama", tmp_path / "hf", tie_word_embeddings=True)
    trained_adapter(hf_dir, tmp_path / "adapter", r=4, lora_alpha=8,
                    target_modules=["q_proj"], modules_to_save=["lm_head"])
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        bundle_dir = export_with(hf_dir, tmp_path / "adapter", tmp_path / "b")
    assert_chunks_match(bundle_dir, IDS, peft_logits(hf_dir, tmp_path / "adapter"))
    assert not caplog.records, caplog.text


def test_an_image_text_adapter_s_vision_tower_lora_is_left_out_with_the_tower(
        tmp_path, caplog):
    # transformers names Qwen2-VL's modules model.language_model.* and model.visual.*,
    # the fixture stores model.* and visual.*; on text the tower's LoRA changes nothing
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        assert_merged_as_peft(tmp_path, "qwen2_vl", r=4, lora_alpha=8,
                              target_modules=["q_proj", "o_proj", "qkv"])
    assert "the adapter's changes to 1 tensor the bundle leaves out" in caplog.text


def test_the_manifest_records_the_adapter_and_inspect_shows_it(tmp_path):
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli

    hf_dir = build_hf_model("llama", tmp_path / "hf")
    trained_adapter(hf_dir, tmp_path / "adapter", r=2, lora_alpha=4, target_modules=["q_proj"])
    bundle_dir = export_with(hf_dir, tmp_path / "adapter", tmp_path / "b")
    source = json.loads((bundle_dir / "edgeprefill.json").read_text())["source"]
    assert source["adapter"]["path"] == str((tmp_path / "adapter").resolve())
    assert len(source["adapter"]["sha256"]) == 64
    shown = CliRunner().invoke(cli, ["inspect", str(bundle_dir)]).output
    assert f"adapter     LoRA merged: {(tmp_path / 'adapter').resolve()}" in shown


@pytest.mark.parametrize("kind", [pytest.param("int8", marks=pytest.mark.slow), "int4"])
def test_a_quantized_export_quantizes_the_merged_weights(tmp_path, kind):
    # as the quantized export of the model peft merged and saved: the same weights in
    hf_dir = build_hf_model("llama", tmp_path / "hf")
    trained_adapter(hf_dir, tmp_path / "adapter", r=4, lora_alpha=8, target_modules=LLAMA_TARGETS)
    merged = PeftModel.from_pretrained(load_hf_model(hf_dir), tmp_path / "adapter")
    merged.merge_and_unload().save_pretrained(tmp_path / "merged")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "merged" / name).write_bytes((hf_dir / name).read_bytes())
    quant = QuantConfig(kind)
    ours = export_with(hf_dir, tmp_path / "adapter", tmp_path / "ours", quant=quant)
    theirs = export_with(tmp_path / "merged", None, tmp_path / "theirs", quant=quant)
    assert_same_logits(ours, theirs)


def assert_same_logits(a, b) -> None:
    from edgeprefill.engines import StepBatch
    from edgeprefill.sdk import Engine

    logits = []
    for bundle_dir in (a, b):
        engine = Engine.load(bundle_dir, threads=2, background=False)
        logits.append(engine.backend.run(StepBatch(
            np.array([IDS]), np.array([0], np.int32), np.array([len(IDS)], np.int32), 0)))
        engine.close()
    np.testing.assert_allclose(logits[0], logits[1], rtol=1e-5, atol=1e-5)


def test_an_adapter_saved_as_a_pytorch_pickle_is_read_too(tmp_path):
    hf_dir = build_hf_model("llama", tmp_path / "hf")
    model = PeftModel.from_pretrained(
        load_hf_model(hf_dir), _saved(hf_dir, tmp_path, ["q_proj", "down_proj"]))
    model.save_pretrained(tmp_path / "pickled", safe_serialization=False)
    assert (tmp_path / "pickled" / "adapter_model.bin").is_file()
    bundle_dir = export_with(hf_dir, tmp_path / "pickled", tmp_path / "b")
    assert_chunks_match(bundle_dir, IDS, peft_logits(hf_dir, tmp_path / "adapter"))


def _saved(hf_dir, tmp_path, targets):
    trained_adapter(hf_dir, tmp_path / "adapter", r=4, lora_alpha=8, target_modules=targets)
    return tmp_path / "adapter"


def edit_config(adapter_dir, **changes) -> None:
    path = adapter_dir / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize(("changes", "message"), [
    ({"use_dora": True}, "uses DoRA (use_dora), which export cannot merge"),
    ({"peft_type": "IA3"}, "is a IA3 adapter: export merges LoRA adapters only"),
    ({"r": 3}, "disagree with its rank r=3"),
])
def test_what_export_cannot_merge_is_refused(tmp_path, changes, message):
    hf_dir = build_hf_model("llama", tmp_path / "hf")
    edit_config(_saved(hf_dir, tmp_path, ["q_proj"]), **changes)
    with pytest.raises(ExportError, match=re.escape(message)):
        export_with(hf_dir, tmp_path / "adapter", tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_an_adapter_of_another_model_is_refused(tmp_path):
    hf_dir = build_hf_model("llama", tmp_path / "hf")
    other = build_hf_model("llama", tmp_path / "wide", hidden_size=128)
    _saved(other, tmp_path, ["q_proj"])
    with pytest.raises(ExportError, match=r"q_proj.weight has shape \(64, 64\), but its LoRA "
                                          r"delta .* has \(128, 128\)"):
        export_with(hf_dir, tmp_path / "adapter", tmp_path / "b")
    gpt2 = build_hf_model("gpt2", tmp_path / "gpt2")
    with pytest.raises(ExportError, match="LoRA on model.layers.0.self_attn.q_proj matches no "
                                          "tensor of the base model"):
        export_with(gpt2, tmp_path / "adapter", tmp_path / "b")


def test_another_base_model_name_is_only_a_warning(tmp_path, caplog):
    hf_dir = build_hf_model("llama", tmp_path / "hf")
    edit_config(_saved(hf_dir, tmp_path, ["q_proj"]), base_model_name_or_path="org/Other-1B")
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        export_with(hf_dir, tmp_path / "adapter", tmp_path / "b")
    assert "was trained on org/Other-1B, and is merged into" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ["ort", "standard"])
@pytest.mark.parametrize(("family", "lora"), [
    ("llama", {"target_modules": LLAMA_TARGETS}),
    ("gpt2", {"target_modules": ["c_attn", "c_proj", "c_fc"], "fan_in_fan_out": True,
              "bias": "lora_only"}),
    ("phi3", {"target_modules": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]}),
    ("qwen2", {"target_modules": ["q_proj", "k_proj", "v_proj"], "lora_bias": True}),
    ("llama", {"target_modules": ["embed_tokens", "o_proj"], "modules_to_save": ["lm_head"]}),
    ("llama", {"target_modules": LLAMA_TARGETS, "use_rslora": True,
               "rank_pattern": {"gate_proj": 2}, "alpha_pattern": {"k_proj": 5}}),
    ("mixtral", {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}),
])
def test_adapters_merge_as_peft_in_both_flavours(tmp_path, flavor, family, lora):
    assert_merged_as_peft(tmp_path, family, flavor, r=4, lora_alpha=8, **lora)


def test_the_command_line_says_each_refusal_in_one_line(tmp_path):
    from tests.test_cli_errors import assert_one_line_error, cli

    hf_dir = build_hf_model("llama", tmp_path / "hf")
    adapter = _saved(hf_dir, tmp_path, ["q_proj"])
    edit_config(adapter, base_model_name_or_path="org/Base-1B")
    assert_one_line_error(cli("export", adapter, "-o", tmp_path / "b"),
                          f"{adapter} is a PEFT adapter, not a model: export its base model "
                          f"(org/Base-1B) with --adapter {adapter}")
    (adapter / "config.json").write_bytes((hf_dir / "config.json").read_bytes())  # Unsloth's
    assert_one_line_error(cli("export", adapter, "-o", tmp_path / "b"), "is a PEFT adapter")
    assert_one_line_error(cli("export", hf_dir, "--adapter", hf_dir, "-o", tmp_path / "b"),
                          f"{hf_dir / 'adapter_config.json'} not found")
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, "quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True, "desc_act": False}}))
    assert_one_line_error(cli("export", hf_dir, "--adapter", adapter, "-o", tmp_path / "b"),
                          "is a gptq-quantized checkpoint: a LoRA adapter merges into float "
                          "weights only")
    assert not (tmp_path / "b").exists()


def test_a_bf16_adapter_over_a_bf16_base_is_merged_as_peft(tmp_path):
    # numpy reads bfloat16 once ml_dtypes registered it; merged in float32
    from safetensors.torch import load_file, save_file

    hf_dir = build_hf_model("llama", tmp_path / "hf", dtype=torch.bfloat16)
    adapter = _saved(hf_dir, tmp_path, ["q_proj", "embed_tokens"])
    path = adapter / "adapter_model.safetensors"
    save_file({k: t.to(torch.bfloat16) for k, t in load_file(path).items()}, path)
    bundle_dir = export_with(hf_dir, adapter, tmp_path / "b")
    assert_chunks_match(bundle_dir, IDS, peft_logits(hf_dir, adapter))


def test_a_bf16_adapter_is_read_without_torch(tmp_path):
    # The core install has no torch: a bf16 adapter is read as the checkpoint's bf16
    # tensors are (ml_dtypes), in a process where torch cannot be imported.
    from safetensors.torch import save_file

    path = tmp_path / "adapter_model.safetensors"
    values = torch.randn(4, 8)
    save_file({"base_model.model.x.lora_A.weight": values.to(torch.bfloat16)}, path)
    script = ("import sys; sys.modules['torch'] = None\n"
              "from pathlib import Path\n"
              "from edgeprefill.export.lora import _read_tensors\n"
              f"t = _read_tensors(Path({str(path)!r}))['base_model.model.x.lora_A.weight']\n"
              "print(t.astype('float32').tolist())")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    expected = values.to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(np.array(json.loads(done.stdout)), expected)


@pytest.mark.parametrize("family", [
    "exaone",  # transformer.h.N.attn.attention.q_proj is module model.layers.N.self_attn.q_proj
    pytest.param("lfm3_vl", marks=pytest.mark.slow),  # its language model's g_proj (gate_proj)
    pytest.param("phimoe", marks=pytest.mark.slow),  # block_sparse_moe.gate is mlp.router
])
def test_an_adapter_named_by_transformers_5_s_modules_merges_into_the_stored_tensors(
        tmp_path, family):
    """transformers 5 renames these checkpoints' tensors as it loads them (its conversion
    mapping), and peft names the LoRA by the loaded module: it merges into the tensor
    stored under the old name (export had refused it as another model's adapter)."""
    targets = {"exaone": "all-linear", "lfm3_vl": ["g_proj", "q_proj"],
               "phimoe": ["router", "q_proj"]}[family]
    hf_dir = build_hf_model(family, tmp_path / "hf")
    trained_adapter(hf_dir, tmp_path / "adapter", r=4, lora_alpha=8, target_modules=targets)
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["target_modules"]
    # the reference merged: transformers' PhiMoE router returns a tuple peft's unmerged
    # LoRA cannot wrap; merged or not, the same weights
    expected = peft_logits(hf_dir, tmp_path / "adapter", merged=True)
    assert_chunks_match(export_with(hf_dir, tmp_path / "adapter", tmp_path / "b"), IDS,
                        expected)


@pytest.mark.parametrize("family", [
    "qwen3_moe",  # stored per expert (experts.N.gate_proj/up_proj/down_proj)
    pytest.param("mixtral", marks=pytest.mark.slow),  # per expert as w1/w3/w2, under
    # block_sparse_moe. (the router's gate too), which transformers renames to mlp.
    pytest.param("olmoe", marks=pytest.mark.slow),
])
def test_an_all_linear_moe_adapter_merges_its_lora_on_the_experts_as_peft(tmp_path, family):
    """peft 0.21's "all-linear" on a transformers 5 MoE also targets the fused experts'
    gate_up_proj and down_proj and the router's gate.weight as parameters (nested
    ParamWrappers, gate_up_proj at its own rank): merged into the per-expert tensors the
    checkpoint stores, by transformers' reverse conversion."""
    hf_dir = build_hf_model(family, tmp_path / "hf")
    trained_adapter(hf_dir, tmp_path / "adapter", r=4, lora_alpha=8,
                    target_modules="all-linear")
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert sorted(saved["target_parameters"]) == ["down_proj", "gate.weight", "gate_up_proj"]
    merged = peft_logits(hf_dir, tmp_path / "adapter", merged=True)
    # peft's unmerged forward (the delta added as the experts run) agrees with its merge
    np.testing.assert_allclose(peft_logits(hf_dir, tmp_path / "adapter"), merged, atol=1e-4)
    assert_chunks_match(export_with(hf_dir, tmp_path / "adapter", tmp_path / "b"), IDS, merged)


@pytest.mark.parametrize(("family", "targets"), [
    ("qwen3_moe", ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]),
    # gpt-oss stores its experts fused as loaded, (experts, in, out) (is_transposed), and
    # export reads them one expert at a time; its router's weight a 2-D parameter
    # (the only proof of that path: not slow)
    ("gpt_oss", ["mlp.experts.gate_up_proj", "mlp.experts.down_proj", "router.weight"]),
])
def test_a_lora_on_parameters_alone_changes_what_the_bundle_computes(tmp_path, family,
                                                                     targets):
    # only parameters, no module: an export that dropped their deltas would be the base
    hf_dir = build_hf_model(family, tmp_path / "hf")
    trained_adapter(hf_dir, tmp_path / "adapter", r=2, lora_alpha=4, target_modules=[],
                    target_parameters=targets)
    expected = peft_logits(hf_dir, tmp_path / "adapter", merged=True)
    with torch.no_grad():
        base = load_hf_model(hf_dir)(torch.tensor([IDS])).logits[0].numpy()
    assert np.abs(expected - base).max() > 0.1
    assert_chunks_match(export_with(hf_dir, tmp_path / "adapter", tmp_path / "b"), IDS,
                        expected)


def test_experts_stored_fused_as_transformers_loads_them_take_the_delta_as_is(tmp_path):
    # a Qwen3-MoE checkpoint written from the loaded model's state dict, its experts fused
    # under their loaded names (which transformers' conversion would save per expert)
    from safetensors.torch import save_file

    hf_dir = build_hf_model("qwen3_moe", tmp_path / "hf")
    trained_adapter(hf_dir, tmp_path / "adapter", r=4, lora_alpha=8,
                    target_modules="all-linear")
    expected = peft_logits(hf_dir, tmp_path / "adapter", merged=True)
    fused = {n: t.contiguous() for n, t in load_hf_model(hf_dir).state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in fused
    save_file(fused, hf_dir / "model.safetensors", metadata={"format": "pt"})
    assert_chunks_match(export_with(hf_dir, tmp_path / "adapter", tmp_path / "b"), IDS,
                        expected)


def test_a_lora_on_another_model_s_experts_is_refused_naming_the_parameter(tmp_path):
    hf_dir = build_hf_model("qwen3_moe", tmp_path / "hf")
    other = build_hf_model("qwen3_moe", tmp_path / "other", moe_intermediate_size=48)
    trained_adapter(other, tmp_path / "adapter", r=2, lora_alpha=4, target_modules=[],
                    target_parameters=["mlp.experts.down_proj"])
    with pytest.raises(ExportError, match=re.escape(
            "the adapter's LoRA on the parameter model.layers.0.mlp.experts.down_proj "
            "(8, 64, 32) has lora_A (16, 48)")) as err:
        export_with(hf_dir, tmp_path / "adapter", tmp_path / "b")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("family", "targets", "message"), [
    # Sarvam-MoE stores query_key_value, which transformers splits into q/k/v as it loads it
    ("sarvam_moe", ["k_proj"], "changes a part of the checkpoint's "
                               "model.layers.0.attention.query_key_value"),
    # Zamba applies its one stored shared block at several layers, a LoRA at each
    ("zamba", ["down_proj"], "changes a block the checkpoint stores once "
                             "(model.layers.1.shared_transf.feed_forward.down_proj)"),
])
def test_an_adapter_export_cannot_merge_into_one_stored_tensor_says_why(
        tmp_path, family, targets, message):
    hf_dir = build_hf_model(family, tmp_path / "hf")
    trained_adapter(hf_dir, tmp_path / "adapter", r=4, lora_alpha=8, target_modules=targets)
    with pytest.raises(ExportError, match=re.escape(message)) as err:
        export_with(hf_dir, tmp_path / "adapter", tmp_path / "b")
    assert "\n" not in str(err.value)
