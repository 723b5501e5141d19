"""Checkpoints that are no decoder-only causal LM are refused for what they are: every model
type of transformers' causal-LM and image-text mappings is supported, refused by name
(REFUSED_TYPES) or refused for what its config.json says it is (families/not_causal.py),
none as an unknown name; and three of them whose language model is one of ours export: Fuyu
(Persimmon), MOSS Transcribe-Diarize (Qwen3) and Phi-4-multimodal (Phi-3; test_exactness
runs its logits)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
)

from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.families import FAMILIES, REFUSED_TYPES
from edgeprefill.export.families.image_text import FUYU_TEXT_KEYS
from edgeprefill.export.layer_attention import GLOBAL
from edgeprefill.export.model_config import ModelConfig
from tests.conftest import build_hf_model
from tests.test_cli_errors import assert_one_line_error, cli
from tests.test_exactness import prompt_ids
from tests.test_wrapped_image_text import (
    assert_chunks_match,
    build_wrapped,
    check_exports_as_transformers,
    export_flavor,
    reference,
)

SWEPT = sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
               | set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES))
UNKNOWN = "is not supported; `edgeprefill export --list-models`"

# What each of those types' default config says it is, as transformers' configs define them
ENCODER_DECODERS = ("bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "florence2",
                    "marian", "mbart", "mvp", "pegasus", "pix2struct", "plbart",
                    "pp_formulanet", "prophetnet", "t5gemma2", "udop",
                    "vision-encoder-decoder")
ENCODERS = ("bert", "big_bird", "camembert", "data2vec-text", "electra", "ernie",
            "megatron-bert", "rembert", "roberta", "roberta-prelayernorm", "roc_bert",
            "roformer", "xlm-roberta", "xlm-roberta-xl", "xmod")
AUDIO = ("moshi", "musicgen", "musicgen_melody", "whisper")
CLASSES = {**dict.fromkeys(ENCODER_DECODERS, "is an encoder-decoder model (seq2seq): "),
           **dict.fromkeys(ENCODERS, "is a BERT-like encoder model (token-type embeddings): "),
           **dict.fromkeys(AUDIO, "is an audio model (speech in, or audio codes out): ")}


def default_config(model_type: str, out: Path) -> Path:
    """transformers' default config of `model_type`, saved as save_pretrained saves it."""
    transformers.AutoConfig.for_model(model_type).save_pretrained(out)
    return out


def refusal_of(hf_dir: Path) -> str:
    with pytest.raises(ExportError) as err:
        ModelConfig.from_dir(hf_dir)
    return str(err.value)


def refusal_of_raw(raw: dict) -> str:
    with pytest.raises(ExportError) as err:
        ModelConfig.from_hf(raw)
    return str(err.value)


def test_every_causal_and_image_text_type_is_supported_or_refused_for_a_reason(tmp_path):
    unknown, wrong_class = [], []
    for model_type in SWEPT:
        if model_type in FAMILIES:
            continue
        if model_type in REFUSED_TYPES:  # whatever its config (some defaults do not build)
            message = refusal_of_raw({"model_type": model_type})
            assert message == f"model_type {model_type!r}: {REFUSED_TYPES[model_type]}"
            continue
        message = refusal_of(default_config(model_type, tmp_path / model_type))
        assert message.startswith(f"model_type {model_type!r}") and "\n" not in message
        if UNKNOWN in message:
            unknown.append(model_type)
        elif model_type in CLASSES and CLASSES[model_type] not in message:
            wrong_class.append((model_type, message))
        elif model_type not in CLASSES:
            wrong_class.append((model_type, message))  # refused by a class the test lacks
    assert not unknown and not wrong_class, (unknown, wrong_class)


def test_the_class_rules_read_config_json_whatever_the_model_type(tmp_path):
    """An unknown name (a fork, remote code) is refused for what its config says it is;
    a decoder's heads leave it to the unknown line."""
    base = {"model_type": "nonesuch", "hidden_size": 64}
    cases = [
        ({"is_encoder_decoder": True}, "is an encoder-decoder model (seq2seq)"),
        ({"text_config": {"is_encoder_decoder": True}}, "is an encoder-decoder model"),
        ({"encoder": {"model_type": "vit"}, "decoder": {"model_type": "gpt2"}},
         "is an encoder-decoder model"),
        ({"architectures": ["NonesuchForSequenceClassification"]},
         "is an encoder model (NonesuchForSequenceClassification): edgeprefill exports "
         "decoder-only causal LMs"),
        ({"architectures": ["NonesuchForMaskedLM", "NonesuchForCausalLM"]}, UNKNOWN),
        ({"architectures": ["NonesuchModel"]}, UNKNOWN),
        ({"num_mel_bins": 80}, "is an audio model"),
        ({"architectures": ["NonesuchForCTC"]}, "is an audio model"),
        ({"architectures": ["NonesuchForImageClassification"]}, "is an encoder model"),
    ]
    for keys, fragment in cases:
        with pytest.raises(ExportError) as err:
            ModelConfig.from_hf({**base, **keys})
        assert fragment in str(err.value), (keys, str(err.value))



@pytest.mark.parametrize("model_type", [None, "absent"])
def test_a_config_without_a_model_type_is_one_line_saying_so(model_type):
    """The nearest-name search had raised a TypeError on a null or absent model_type (the
    slow config sweep's model_type=null and =removed edits)."""
    raw = {"hidden_size": 64} if model_type == "absent" else {"model_type": None}
    with pytest.raises(ExportError, match=r"^config.json has no model_type .*--list-models"):
        ModelConfig.from_hf(raw)

def test_export_of_a_bart_folder_is_one_line_saying_what_it_is(tmp_path):
    hf_dir = default_config("bart", tmp_path / "bart")
    assert_one_line_error(cli("export", hf_dir, "-o", tmp_path / "b"),
                          "model_type 'bart' is an encoder-decoder model (seq2seq): "
                          "edgeprefill exports decoder-only causal LMs")


@pytest.mark.parametrize("head", ["LlamaForSequenceClassification",
                                  "Qwen2ForSequenceClassification"])
def test_a_supported_familys_classifier_is_refused_for_what_it_is(head, tmp_path):
    """README: refused for what config.json says, whatever its model_type. A reward model
    (Qwen2ForSequenceClassification, tied) had exported without its `score` head as if it
    were the chat model; an untied one failed on the missing lm_head.weight."""
    family = head.removesuffix("ForSequenceClassification").lower()
    config = transformers.AutoConfig.for_model(
        family, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_labels=1,
        tie_word_embeddings=family == "qwen2", architectures=[head])
    config.save_pretrained(tmp_path / "hf")
    assert refusal_of(tmp_path / "hf") == (
        f"model_type {family!r} is a classifier ({head}: a task head in place of the LM "
        "head): edgeprefill exports decoder-only causal LMs; `export --task score` exports "
        "it as a score bundle (Engine.score, /v1/rerank)")


@pytest.mark.parametrize("outer, text_type, tower", [
    ("fuyu", "persimmon", "vision_embed_tokens"),  # its linear patch embedding
    ("moss_transcribe_diarize", "qwen3", "audio_tower"),
])
def test_a_wrapper_of_one_of_ours_exports_as_transformers_runs_it(
        outer, text_type, tower, tmp_path, caplog):
    check_exports_as_transformers(outer, text_type, tmp_path)
    # its tower left out as a tower, in the one text-only line (not as unread tensors)
    said = [r.getMessage() for r in caplog.records if "text-only" in r.getMessage()]
    assert said and all(tower in line for line in said), caplog.text
    assert "does not use" not in caplog.text


def test_phi4_multimodal_leaves_its_image_and_audio_embedders_out_as_a_tower(tmp_path, caplog):
    hf_dir = build_hf_model("phi4_multimodal", tmp_path / "hf")
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                  show_progress=False))
    said = [r.getMessage() for r in caplog.records if "text-only" in r.getMessage()]
    assert len(said) == 1 and "embed_tokens_extend" in said[0], caplog.text
    assert "does not use" not in caplog.text  # nothing else unread


def test_phi4_multimodal_keys_a_config_leaves_out_are_its_config_classs():
    ours = ModelConfig.from_hf({"model_type": "phi4_multimodal"})
    hf = transformers.Phi4MultimodalConfig()
    assert (ours.vocab_size, ours.hidden_size, ours.intermediate_size, ours.num_layers,
            ours.num_heads, ours.num_kv_heads, ours.max_positions, ours.tie_embeddings) == (
        hf.vocab_size, hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers,
        hf.num_attention_heads, hf.num_key_value_heads, hf.max_position_embeddings,
        hf.tie_word_embeddings)


def test_fuyus_flat_hub_config_exports_as_transformers_reads_it(tmp_path):
    """Fuyu-8B's config.json has no text_config: its Persimmon keys sit at the top level
    (rope_theta, not rope_parameters), and FuyuConfig moves them into one."""
    hf_dir, _ = build_wrapped("fuyu", "persimmon", tmp_path / "hf")
    config = json.loads((hf_dir / "config.json").read_text())
    text = config.pop("text_config")
    flat = {key: text[key] for key in FUYU_TEXT_KEYS if key in text}
    (hf_dir / "config.json").write_text(json.dumps({
        **config, **flat, "rope_theta": text["rope_parameters"]["rope_theta"] * 2}))
    hf = transformers.AutoConfig.from_pretrained(hf_dir).text_config
    ours = ModelConfig.from_dir(hf_dir)
    assert (ours.num_layers, ours.num_heads, ours.hidden_size, ours.ropes[GLOBAL].theta) == (
        hf.num_hidden_layers, hf.num_attention_heads, hf.hidden_size,
        hf.rope_parameters["rope_theta"])
    ids = prompt_ids(21)
    assert_chunks_match(export_flavor(hf_dir, tmp_path / "ort", "ort"),
                        reference(hf_dir, None, ids), ids)
