"""Sampler, parameters, stop strings and chat templates."""

from __future__ import annotations

import numpy as np
import pytest

from edgeprefill.errors import RequestError
from edgeprefill.sdk import Engine, GenerationParams
from edgeprefill.sdk.sampler import Sampler
from edgeprefill.sdk.tokenizer import TextStreamer

LOGITS = np.log(np.array([0.05, 0.5, 0.3, 0.1, 0.05], np.float32))


def draws(params: GenerationParams, n: int = 2000) -> np.ndarray:
    sampler = Sampler(params)
    return np.array([sampler.sample(LOGITS, []) for _ in range(n)])


def test_greedy_takes_the_argmax():
    assert set(draws(GenerationParams(), 10)) == {1}


def test_top_k_and_top_p_cut_the_tail():
    assert set(draws(GenerationParams(temperature=1.0, top_k=2, seed=0))) == {1, 2}
    assert set(draws(GenerationParams(temperature=1.0, top_p=0.75, seed=0))) == {1, 2}
    counts = np.bincount(draws(GenerationParams(temperature=1.0, seed=0)), minlength=5) / 2000
    np.testing.assert_allclose(counts, np.exp(LOGITS), atol=0.04)


def test_seed_reproduces_and_temperature_sharpens():
    a = draws(GenerationParams(temperature=0.7, seed=3), 200)
    assert np.array_equal(a, draws(GenerationParams(temperature=0.7, seed=3), 200))
    cold = np.mean(draws(GenerationParams(temperature=0.2, seed=1)) == 1)
    hot = np.mean(draws(GenerationParams(temperature=2.0, seed=1)) == 1)
    assert cold > 0.9 > hot


def test_repetition_penalty_demotes_seen_tokens():
    sampler = Sampler(GenerationParams(repetition_penalty=10.0))
    assert sampler.sample(LOGITS, [1]) == 2


@pytest.mark.parametrize("bad", [
    dict(temperature=float("nan")), dict(temperature=-1), dict(top_p=0), dict(top_p=1.5),
    dict(top_k=-1), dict(max_new_tokens=0), dict(repetition_penalty=0), dict(stop=("",)),
    dict(seed=1.5),
])
def test_invalid_parameters_are_rejected(bad):
    with pytest.raises(RequestError):
        GenerationParams(**bad)


class WordTokenizer:
    def __init__(self, words):
        self.words = words

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)


def test_stop_strings_end_the_text_before_them_and_hold_back_partial_matches():
    streamer = TextStreamer(WordTokenizer(["hello", "wor", "ld", "stop", "here"]), ("ld st",))
    out = [streamer.push(i) for i in (0, 1, 2)]
    assert "".join(out) == "hello wor "  # "ld" could begin "ld st": held back
    assert streamer.push(3) == ""  # "hello wor ld stop": the text ends before "ld st"
    assert streamer.stopped
    assert streamer.flush() == ""


def test_generation_stops_at_a_stop_string(bundle):
    with Engine.load(bundle("llama"), threads=2, background=False) as engine:
        full = engine.generate("w5 w6 w7", GenerationParams(max_new_tokens=6)).result()
        words = full.text.split()
        stopped = engine.generate("w5 w6 w7", GenerationParams(
            max_new_tokens=6, stop=(words[2],))).result()
    assert stopped.finish_reason == "stop"
    assert stopped.text.split() == words[:2]


def test_chat_messages_go_through_the_bundle_template(bundle):
    with Engine.load(bundle("llama"), threads=2, background=False) as engine:
        rendered = engine.tokenizer.render_chat([{"role": "user", "content": "w9"}])
        assert rendered == "user: w9 ; assistant: "
        ids = engine.tokenizer.encode([{"role": "user", "content": "w9"}])
        assert ids == engine.tokenizer.encode_plain("user: w9 ; assistant:")
        with pytest.raises(RequestError, match="role"):
            engine.tokenizer.encode([{"content": "w9"}])
