"""A damaged checkpoint (a download cut short, weights of another config or dtype, a tokenizer.json
that is not JSON) is refused in one line naming what is wrong, and leaves no bundle.
(Missing files, a garbage safetensors, a malformed or short shard index: test_cli_errors.)"""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from tests.test_cli_errors import assert_one_line_error, cli

OPTIONS = ExportOptions(chunks=(16,), max_context=64, show_progress=False)
WEIGHTS = "model.safetensors"


def cut(fraction: float):
    def edit(hf_dir):
        data = (hf_dir / WEIGHTS).read_bytes()
        (hf_dir / WEIGHTS).write_bytes(data[:int(len(data) * fraction)])
    return edit


def narrower_embedding(hf_dir):
    """The weights of a model of hidden 32 beside config.json's 64."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(hf_dir / WEIGHTS))
    tensors["model.embed_tokens.weight"] = np.zeros((128, 32), np.float32)
    save_file(tensors, str(hf_dir / WEIGHTS))


def mlp_tensor(name: str, edit):
    """The first layer's MLP weight `name` replaced by `edit` of it (a transposed or
    another model's tensor): the graph's MatMul would fail only at the bundle's first call."""
    def apply(hf_dir):
        from safetensors.numpy import load_file, save_file

        tensors = load_file(str(hf_dir / WEIGHTS))
        key = f"model.layers.0.mlp.{name}.weight"
        tensors[key] = np.ascontiguousarray(edit(tensors[key]))
        save_file(tensors, str(hf_dir / WEIGHTS))
    return apply


def header_shape(hf_dir):
    """A header whose shape disagrees with its own byte range (an edited or corrupt file)."""
    data = (hf_dir / WEIGHTS).read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + length])
    header["model.norm.weight"]["shape"] = [32]
    edited = json.dumps(header, separators=(",", ":")).encode().ljust(length)
    (hf_dir / WEIGHTS).write_bytes(data[:8] + edited + data[8 + length:])


def header_dtype(hf_dir):
    """A float32 weight's header saying int32 (same size): its bytes would be exported as
    integers, a graph that runs and answers garbage."""
    data = (hf_dir / WEIGHTS).read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + length])
    header["model.layers.0.mlp.down_proj.weight"]["dtype"] = "I32"
    edited = json.dumps(header, separators=(",", ":")).encode().ljust(length)
    (hf_dir / WEIGHTS).write_bytes(data[:8] + edited + data[8 + length:])


def tokenizer_text(text: bytes):
    def edit(hf_dir):
        (hf_dir / "tokenizer.json").write_bytes(text)
    return edit


@pytest.mark.parametrize("edit, fragment", [
    (cut(0.6), "model.safetensors is not a readable safetensors file"),  # data cut short
    (cut(0.0005), "model.safetensors is not a readable safetensors file"),  # in its header
    (narrower_embedding, "embed_tokens.weight has shape (128, 32), but config.json implies "
                         "(128, 64)"),
    (header_shape, "model.safetensors is not a readable safetensors file"),
    (mlp_tensor("down_proj", np.transpose), "model.layers.0.mlp.down_proj.weight has shape"),
    (mlp_tensor("up_proj", lambda w: w[:-8]), "model.layers.0.mlp.gate_proj.weight has shape"),
    (header_dtype, "model.layers.0.mlp.down_proj.weight is stored as int32, not as floats"),
    (tokenizer_text(b'{"version": "1.0", "model": '), "cannot read"),  # cut short
    (tokenizer_text(b"\x89PNG\r\n\x1a\n\x00\xff"), "cannot read"),  # not text
    (tokenizer_text(b"[1, 2]"), "cannot read"),  # JSON, but no tokenizer
], ids=["truncated", "truncated-header", "hidden-mismatch", "header-shape", "down-transposed",
        "up-narrower", "header-dtype", "tokenizer-truncated", "tokenizer-binary", "tokenizer-list"])
def test_a_damaged_checkpoint_is_refused_in_one_line(edit, fragment, hf_model, tmp_path):
    hf_dir = shutil.copytree(hf_model("llama"), tmp_path / "hf")
    edit(hf_dir)
    with pytest.raises(ExportError) as err:
        export(hf_dir, tmp_path / "out", OPTIONS)
    assert fragment in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no bundle, no staging


def layer_key(layer: int) -> str:
    return f"model.layers.{layer}.self_attn.o_proj.weight"


def transposed(tensors: dict, key: str) -> np.ndarray:
    return tensors[key].T


# Each attention kind's output projection, edited as a damaged checkpoint would have it: the
# graph multiplies the attention's output by it, so export would pass and the bundle fail at
# its first call. The original tensor's shape (the model's own) is what the message names.
@pytest.mark.parametrize("family, key, edit", [
    ("qwen3", layer_key(0), transposed),  # plain: 4 heads of 32, hidden 64
    ("qwen3_5_text", layer_key(2), transposed),  # its output gated before o_proj
    # MiMo-V2-Flash: heads of v_head_dim 16 values, not head_dim 32 (another model's tensor)
    ("mimo_v2_flash", layer_key(0), lambda tensors, key: np.zeros((64, 4 * 32), np.float32)),
    ("deepseek_v2", layer_key(0), transposed),  # latent attention: heads of v_head_dim
    ("laguna", layer_key(3), lambda tensors, key: tensors[layer_key(0)]),  # another layer's
    ("gemma4_text", layer_key(5), transposed),  # a layer reading an earlier layer's KV
    ("zamba2", "model.layers.1.shared_transformer.self_attn.o_proj.weight", transposed),
], ids=["plain", "gated", "value-heads", "latent", "layer-heads", "shared-kv", "shared-block"])
def test_an_attention_output_projection_that_disagrees_is_refused_in_one_line(
        family, key, edit, hf_model, tmp_path):
    from safetensors.numpy import load_file, save_file

    hf_dir = shutil.copytree(hf_model(family), tmp_path / "hf")
    tensors = load_file(str(hf_dir / WEIGHTS))
    own = tensors[key].shape
    tensors[key] = np.ascontiguousarray(edit(tensors, key))
    assert tensors[key].shape != own
    save_file(tensors, str(hf_dir / WEIGHTS))
    with pytest.raises(ExportError) as err:
        export(hf_dir, tmp_path / "out", OPTIONS)
    expected = f"{key} has shape {tensors[key].shape}, but config.json implies {own}"
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no bundle, no staging


def test_the_cli_refuses_a_truncated_download_in_one_line(hf_model, tmp_path):
    hf_dir = shutil.copytree(hf_model("llama"), tmp_path / "hf")
    cut(0.6)(hf_dir)
    assert_one_line_error(cli("export", hf_dir, "-o", tmp_path / "out"), "model.safetensors",
                          "not a readable safetensors file")
    assert not (tmp_path / "out").exists()


def resized(tensors: dict, key: str, change: int) -> None:
    """tensors[key], a bias, `change` values shorter (negative) or longer."""
    bias = tensors[key]
    tensors[key] = bias[:change].copy() if change < 0 else np.concatenate([bias, bias[:change]])


LAYER0 = "model.layers.0."


# Each kind of projection bias of the wrong length: the writer had read it only after the
# graph was built (naming a packed tensor the checkpoint has not), or never looked (a bias
# added by its own Add, the LM head's; a packed q/k/v whose parts' lengths summed right).
@pytest.mark.parametrize("family, changes, expected", [
    ("phi", {LAYER0 + "self_attn.dense.bias": -1},
     f"{LAYER0}self_attn.dense.bias has shape (63,), but {LAYER0}self_attn.dense.weight "
     "of shape (64, 64) implies (64,)"),
    ("phi", {LAYER0 + "mlp.fc1.bias": 1},
     f"{LAYER0}mlp.fc1.bias has shape (97,), but {LAYER0}mlp.fc1.weight of shape "
     "(96, 64) implies (96,)"),
    ("phi", {LAYER0 + "mlp.fc2.bias": -1},
     f"{LAYER0}mlp.fc2.bias has shape (63,), but {LAYER0}mlp.fc2.weight of shape "
     "(64, 96) implies (64,)"),
    ("phi", {"lm_head.bias": -1},
     "lm_head.bias has shape (127,), but lm_head.weight of shape (128, 64) implies (128,)"),
    ("qwen2", {LAYER0 + "self_attn.k_proj.bias": -1, LAYER0 + "self_attn.v_proj.bias": 1},
     f"{LAYER0}self_attn.k_proj.bias has shape (31,), but {LAYER0}self_attn.k_proj.weight"
     " of shape (32, 64) implies (32,)"),
    ("gpt_neox_japanese", {"gpt_neox_japanese.layers.1.attention.dense_bias": -1},
     "gpt_neox_japanese.layers.1.attention.dense_bias has shape (63,), but config.json's "
     "hidden_size 64 implies (64,)"),
], ids=["o", "mlp-up", "mlp-down", "lm-head", "packed-qkv", "extra-o"])
def test_a_projection_bias_of_the_wrong_length_is_refused_in_one_line(
        family, changes, expected, hf_model, tmp_path):
    from safetensors.numpy import load_file, save_file

    hf_dir = shutil.copytree(hf_model(family), tmp_path / "hf")
    tensors = load_file(str(hf_dir / WEIGHTS))
    for key, change in changes.items():
        resized(tensors, key, change)
    save_file(tensors, str(hf_dir / WEIGHTS))
    with pytest.raises(ExportError) as err:
        export(hf_dir, tmp_path / "out", OPTIONS)
    assert str(err.value) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no bundle, no staging


# A q/k norm weight of another width than config.json implies: per head (Qwen3's) or over the
# whole projection (OLMo 2's). The graph reads it as the norm's scale, which broadcasts only
# at the bundle's first call (a BackendError then), or, wider by a whole multiple, not at
# all. The message names what the config implies (qwen3's fixture: heads of 32; olmo2's:
# 4 heads and 2 KV heads of 16).
@pytest.mark.parametrize("family, key, width, implied", [
    ("qwen3", LAYER0 + "self_attn.q_norm.weight", 64, 32),
    ("qwen3", LAYER0 + "self_attn.k_norm.weight", 16, 32),
    ("olmo2", LAYER0 + "self_attn.q_norm.weight", 128, 64),
    ("olmo2", LAYER0 + "self_attn.k_norm.weight", 16, 32),
], ids=["head-q", "head-k", "full-q", "full-k"])
def test_a_q_k_norm_of_another_width_is_refused_in_one_line(
        family, key, width, implied, hf_model, tmp_path):
    from safetensors.numpy import load_file, save_file

    hf_dir = shutil.copytree(hf_model(family), tmp_path / "hf")
    tensors = load_file(str(hf_dir / WEIGHTS))
    assert tensors[key].shape == (implied,)
    tensors[key] = np.ones(width, np.float32)
    save_file(tensors, str(hf_dir / WEIGHTS))
    with pytest.raises(ExportError) as err:
        export(hf_dir, tmp_path / "out", OPTIONS)
    assert str(err.value) == (f"{key} has shape ({width},), but config.json implies "
                              f"({implied},) (the q/k norm over {implied} values)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no bundle, no staging
