"""What a checkpoint is when it is no decoder-only causal LM, read from config.json alone:
an audio model, an encoder-decoder (seq2seq) or an encoder. It answers for any model_type,
one transformers knows that export does not, or one neither knows, so a BART, Whisper or
BERT folder is refused for what it is rather than as an unknown name. A supported
model_type is refused by `task_head` alone: a decoder whose LM head a task head replaced
(a sequence classifier's exports with --task score: export/score_head.py).
"""

from __future__ import annotations

from typing import Any

CAUSAL_ONLY = "edgeprefill exports decoder-only causal LMs"

# Keys only audio models' configs hold: a speech encoder's input (Whisper's mel bins) or an
# audio codec whose codes the model reads or writes (MusicGen, Moshi).
_AUDIO_KEYS = ("num_mel_bins", "audio_encoder", "audio_encoder_config", "audio_vocab_size")
# Heads of an audio model's checkpoint (transformers' class names end so: Wav2Vec2, HuBERT,
# SpeechT5, ...) and of an encoder's (BERT's, DistilBERT's, ViT's).
_AUDIO_HEADS = ("ForCTC", "ForAudioClassification", "ForAudioFrameClassification",
                "ForXVector", "ForSpeechSeq2Seq", "ForTextToSpeech", "ForTextToWaveform")
_ENCODER_HEADS = ("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
                  "ForQuestionAnswering", "ForMultipleChoice", "ForPreTraining",
                  "ForNextSentencePrediction", "ForImageClassification")

# transformers' task heads on a decoder (LlamaForSequenceClassification, Qwen2's reward
# models, ...): `score` or `qa_outputs` in place of the LM head, so no causal LM is left to
# export. (ShieldGemma 2's ForImageClassification keeps its Gemma 3 whole: not one.)
SEQUENCE_CLASSIFIER = "ForSequenceClassification"  # the one export --task score reads
_DECODER_TASK_HEADS = (SEQUENCE_CLASSIFIER, "ForTokenClassification",
                       "ForQuestionAnswering")


def task_head(raw: dict[str, Any]) -> str | None:
    """Why a supported model_type's config.json is no causal LM: its architectures are all
    task heads that replace the LM head; else None."""
    heads = _heads(raw, _DECODER_TASK_HEADS)
    if not heads:
        return None
    return (f"a classifier ({', '.join(heads)}: a task head in place of the LM head): "
            f"{CAUSAL_ONLY}")


def what_it_is(raw: dict[str, Any]) -> str | None:
    """Why config.json's model is none export takes, in words, where its keys say it is an
    audio model, an encoder-decoder or an encoder; None where they do not."""
    if any(key in raw for key in _AUDIO_KEYS) or _heads(raw, _AUDIO_HEADS):
        return f"an audio model (speech in, or audio codes out): {CAUSAL_ONLY} of text"
    if _encoder_decoder(raw):
        return f"an encoder-decoder model (seq2seq): {CAUSAL_ONLY}"
    if "type_vocab_size" in raw:  # BERT's token-type (segment) embeddings
        return f"a BERT-like encoder model (token-type embeddings): {CAUSAL_ONLY}"
    heads = _heads(raw, _ENCODER_HEADS)
    if heads:
        return f"an encoder model ({', '.join(heads)}): {CAUSAL_ONLY}"
    return None


def _encoder_decoder(raw: dict[str, Any]) -> bool:
    """is_encoder_decoder on the config or a sub-config (Florence-2's text_config, MusicGen's
    text encoder), or an encoder and a decoder config side by side (VisionEncoderDecoder)."""
    subs = [value for value in raw.values() if isinstance(value, dict)]
    return (raw.get("is_encoder_decoder") is True
            or any(sub.get("is_encoder_decoder") is True for sub in subs)
            or all(isinstance(raw.get(key), dict) for key in ("encoder", "decoder")))


def _heads(raw: dict[str, Any], kind: tuple[str, ...]) -> list[str]:
    """The architectures config.json names where each is a head of `kind` (a BERT
    fine-tune's BertForSequenceClassification); else none (one is a decoder's, say)."""
    names = raw.get("architectures")
    if not isinstance(names, list) or not names or \
            not all(isinstance(name, str) for name in names):
        return []
    return names if all(name.endswith(kind) for name in names) else []
