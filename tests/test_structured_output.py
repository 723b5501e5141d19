"""Constrained decoding, logprobs and the request fields, in the SDK and through the
server with the official `openai` client on loopback. The model is a random llama with a
locally trained byte-level BPE tokenizer: its output is valid only by construction."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from typing import Literal

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

from edgeprefill.errors import RequestError  # noqa: E402
from edgeprefill.sdk import Engine, GenerationParams  # noqa: E402
from edgeprefill.sdk.constraints import Constraint  # noqa: E402
from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from tests.bpe_tokenizers import byte_level_bpe, install  # noqa: E402
from tests.bundle_variants import variant  # noqa: E402
from tests.conftest import build_hf_model  # noqa: E402
from tests.test_serve import free_port  # noqa: E402

VOCAB = 400


class Person(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=8)
    mood: Literal["calm", "glad", "sad"]
    age: int = pydantic.Field(ge=0, le=99)
    ok: bool


@pytest.fixture(scope="module")
def bpe_bundle(tmp_path_factory):
    from edgeprefill.export.exporter import ExportOptions, export

    model = build_hf_model("llama", tmp_path_factory.mktemp("bpe-llama"), vocab_size=VOCAB)
    install(byte_level_bpe(VOCAB), model)
    out = tmp_path_factory.mktemp("bpe-bundle")
    export(model, out, ExportOptions(chunks=(16, 64), max_context=512, show_progress=False,
                                     overwrite=True))
    return out


@pytest.fixture(scope="module")
def engine(bpe_bundle) -> Iterator[Engine]:
    engine = Engine.load(bpe_bundle, threads=2, kv_slots=4)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def client(engine) -> Iterator[openai.OpenAI]:
    app = create_app(engine, ServerConfig(model_name="bpe", max_pending=8))
    with ServerThread(app, port=free_port()) as server:
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


# -- the SDK ------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_is_valid_from_random_weights(engine, temperature):
    schema = Person.model_json_schema()
    for seed in range(3):
        params = GenerationParams(max_new_tokens=120, temperature=temperature, seed=seed,
                                  constraint=Constraint.json_schema(schema))
        out = engine.generate("hello", params).result()
        assert out.finish_reason == "stop", out.text
        Person.model_validate_json(out.text)


def test_regex_choice_and_grammar_constraints(engine):
    def run(constraint, seed=0):
        params = GenerationParams(max_new_tokens=40, temperature=1.0, seed=seed,
                                  constraint=constraint)
        return engine.generate("hello", params).result().text

    assert all(re.fullmatch(r"[0-9]{3}-[a-z]{2}", run(Constraint.regex(r"[0-9]{3}-[a-z]{2}"), s))
               for s in range(3))
    assert {run(Constraint.choice(["yes", "no way"]), s) for s in range(6)} <= {"yes", "no way"}
    assert run(Constraint.grammar('start: "a" B\nB: /[xy]{2}/')) in {"axx", "axy", "ayx", "ayy"}
    assert re.fullmatch(r"x[0-9]+", run(Constraint.gbnf('root ::= "x" [0-9]+')))
    assert run(Constraint.json_object()).startswith("{")


def test_bad_constraints_and_tokenizers_are_one_line_errors(engine, bundle):
    with pytest.raises(RequestError, match="invalid regex"):
        engine.generate("hello", GenerationParams(constraint=Constraint.regex("((")))
    # The test families' WordLevel tokenizer (words w0..wN) cannot spell `{`.
    with Engine.load(bundle("llama"), threads=1, background=False) as words:
        with pytest.raises(RequestError, match="byte-level or byte-fallback") as err:
            words.generate("w5", GenerationParams(constraint=Constraint.json_object()))
    assert "\n" not in str(err.value)


def test_a_grammar_without_a_first_token_is_refused_at_submit(engine):
    """It compiles, yet admits nothing: refused in one line at submit, not at the first
    step (where it had ended the request with llguidance's parser-state dump)."""
    for constraint in (Constraint.grammar("start: start"), Constraint.regex(r"[^\s\S]")):
        with pytest.raises(RequestError, match="fails at its first token") as err:
            engine.generate("hello", GenerationParams(max_new_tokens=3, constraint=constraint))
        assert "<state>" not in str(err.value) and err.value.field == "constraint"


# -- the server ---------------------------------------------------------------------------


def test_chat_completions_parse_returns_a_parsed_object(client):
    for temperature in (0.0, 1.0):
        done = client.chat.completions.parse(
            model="bpe", messages=[{"role": "user", "content": "hello"}],
            response_format=Person, max_tokens=120, temperature=temperature, seed=1)
        assert isinstance(done.choices[0].message.parsed, Person)


def test_json_object_and_vllm_guided_fields(client):
    reply = client.chat.completions.create(
        model="bpe", messages=[{"role": "user", "content": "hi"}], max_tokens=80,
        response_format={"type": "json_object"}, temperature=0)
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    done = client.completions.create(model="bpe", prompt="hi", max_tokens=10,
                                     extra_body={"guided_choice": ["red", "blue"]})
    assert done.choices[0].text in {"red", "blue"}
    done = client.completions.create(model="bpe", prompt="hi", max_tokens=10,
                                     extra_body={"guided_regex": "[ab]{4}"})
    assert re.fullmatch("[ab]{4}", done.choices[0].text)


def test_ollama_format_json_and_a_schema_constrain_the_reply(client):
    """Ollama's `format` is the chat route's structured output (server/ollama_request.py)."""
    ollama = pytest.importorskip("ollama")
    llama = ollama.Client(host=str(client.base_url).removesuffix("/").removesuffix("/v1"))
    for temperature in (0.0, 1.0):
        reply = llama.chat(model="bpe", messages=[{"role": "user", "content": "hello"}],
                           format=Person.model_json_schema(),
                           options={"temperature": temperature, "seed": 1})
        assert reply.done_reason == "stop"
        Person.model_validate_json(reply.message.content)
    said = llama.generate(model="bpe", prompt="hi", format="json",
                          options={"temperature": 0, "num_predict": 80})
    assert isinstance(json.loads(said.response), dict)


def test_logprobs_agree_with_greedy_choices(client):
    reply = client.chat.completions.create(
        model="bpe", messages=[{"role": "user", "content": "hello"}], max_tokens=8,
        temperature=0, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 8
    for item in content:
        best = item.top_logprobs[0]
        assert (best.token, best.logprob) == (item.token, pytest.approx(item.logprob))
        assert [t.logprob for t in item.top_logprobs] == sorted(
            (t.logprob for t in item.top_logprobs), reverse=True)
    assert "".join(i.token for i in content) == reply.choices[0].message.content

    streamed = client.chat.completions.create(
        model="bpe", messages=[{"role": "user", "content": "hello"}], max_tokens=8,
        temperature=0, logprobs=True, top_logprobs=3, stream=True,
        extra_body={"ignore_eos": True})
    items = [i for chunk in streamed if chunk.choices and chunk.choices[0].logprobs
             for i in chunk.choices[0].logprobs.content]
    assert [(i.token, round(i.logprob, 4)) for i in items] == \
        [(i.token, round(i.logprob, 4)) for i in content]


def test_logprob_bytes_are_each_tokens_own_and_join_to_the_reply(client, engine):
    # An emoji and a CJK character span several byte tokens: their `token` is U+FFFD,
    # their `bytes` the exact UTF-8 pieces, which OpenAI says to join.
    reply = client.chat.completions.create(
        model="bpe", messages=[{"role": "user", "content": "hi"}], max_tokens=12,
        temperature=0, logprobs=True, top_logprobs=2,
        extra_body={"guided_choice": ["\U0001F600 \u754c"]})
    text = reply.choices[0].message.content
    assert text == "\U0001F600 \u754c"
    content = reply.choices[0].logprobs.content
    assert b"".join(bytes(i.bytes) for i in content) == text.encode()
    assert any(i.token == "\ufffd" for i in content)  # a piece of a character
    for item in content:
        for top in item.top_logprobs:
            token_id = engine.tokenizer.tokenizer.token_to_id(top.token)
            if token_id is not None and top.token.isascii():
                assert bytes(top.bytes) == top.token.encode()


def test_completion_logprobs_in_the_legacy_shape(client):
    done = client.completions.create(model="bpe", prompt="hello", max_tokens=5,
                                     temperature=0, logprobs=2, extra_body={"ignore_eos": True})
    lp = done.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        # Greedy: the chosen token is the likeliest (two ids may share a text, so the
        # dict OpenAI's legacy shape uses can hold fewer entries).
        assert token in top and all(logprob >= v - 1e-5 for v in top.values())
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == done.choices[0].text


def test_sampling_fields_reach_the_sampler(client, engine):
    def text(**extra):
        return client.completions.create(
            model="bpe", prompt="hello", max_tokens=6,
            extra_body={"ignore_eos": True, **extra}).choices[0].text

    assert text(temperature=1.0, seed=5) == text(temperature=1.0, seed=5)
    h = engine.tokenizer.tokenizer.token_to_id("h")
    assert text(temperature=0, logit_bias={str(h): 100}) == "h" * 6
    assert text(temperature=1.0, seed=2, min_p=0.5, presence_penalty=1.0,
                frequency_penalty=0.5) is not None


@pytest.mark.parametrize("field,value", [
    ("n", 17), ("best_of", 3), ("echo", True), ("suffix", "x"), ("audio", {"voice": "x"}),
    ("modalities", ["audio"]), ("prediction", {"type": "content", "content": "x"}),
    ("web_search_options", {}), ("reasoning_effort", "extreme"), ("verbosity", "low"),
    ("functions", [{"name": "f"}]), ("guided_decoding_backend", "xgrammar"),
    ("structured_outputs", {"json": {}}), ("made_up_field", 1),
])
def test_each_unsupported_field_is_a_400_that_names_it(client, field, value):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="bpe", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            extra_body={field: value})
    assert field in err.value.body["message"] and err.value.body["param"] == field


@pytest.mark.parametrize("extra", [
    {"response_format": {"type": "xml"}}, {"guided_regex": "(("},
    {"response_format": {"type": "json_object"}, "guided_regex": "a"},
    {"logit_bias": {"9999": 5}}, {"top_logprobs": 3}, {"logprobs": True, "top_logprobs": 21},
    {"min_p": 2}, {"presence_penalty": 3},
    # beyond a float's range (had been 500s: OverflowError), digits that int() refuses
    {"temperature": 10**400}, {"frequency_penalty": -10**400}, {"logit_bias": {"5": 10**400}},
    {"logit_bias": {"\u00b2": 1}}, {"logit_bias": {"\u0661": 1}},
    # the stop strings' automaton is built at submit: bounded (45,000 had stalled others)
    {"stop": ["a"] * 257}, {"stop": ["ab" * 5000, "b"]},
    {"ignore_eos": True, "guided_regex": "[a-z]+"},
])
def test_bad_values_of_supported_fields_are_400s(client, extra):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="bpe", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            extra_body=extra)
    # The error names the field, also where the engine refused it at submit (a regex that
    # does not compile, a logit_bias id beyond the vocabulary).
    assert err.value.body["param"] in extra


# -- n > 1 --------------------------------------------------------------------------------


def test_n_choices_share_one_prefill_of_the_prompt(bpe_bundle):
    with Engine.load(bpe_bundle, threads=2, kv_slots=4, background=False, trace=True) as eng:
        prompt = list(range(3, 43))  # 40 tokens: two whole 16-token chunks and a tail of 8
        streams = eng.submit_n(prompt, GenerationParams(
            max_new_tokens=6, temperature=1.0, seed=3, ignore_eos=True), 3)
        texts = [s.result().text for s in streams]
        prefilled = sum(t.tokens for t in eng.trace if t.kind == "prefill")
    assert all(s.finish_reason == "length" and len(s.token_ids) == 6 for s in streams)
    assert prefilled == 40  # once, not 3 x 40: the others start from a copy of its KV
    with Engine.load(bpe_bundle, threads=2, kv_slots=1, background=False, trace=True) as eng:
        streams = eng.submit_n(prompt, GenerationParams(max_new_tokens=3, ignore_eos=True), 2)
        assert all(len(s.result().token_ids) == 3 for s in streams)  # one slot: in turn
    assert len(set(texts)) > 1  # seed + i: the choices differ


def test_chat_n_choices_through_the_server(client):
    reply = client.chat.completions.create(
        model="bpe", messages=[{"role": "user", "content": "hello"}], max_tokens=5, n=3,
        temperature=1.0, seed=4, extra_body={"ignore_eos": True})
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert reply.usage.completion_tokens == 15
    streamed = client.chat.completions.create(
        model="bpe", messages=[{"role": "user", "content": "hello"}], max_tokens=5, n=3,
        temperature=1.0, seed=4, stream=True, extra_body={"ignore_eos": True})
    texts = {0: "", 1: "", 2: ""}
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert [texts[i] for i in range(3)] == [c.message.content for c in reply.choices]


# DeepSeek-R1's way: the generation prompt opens a think block (and assistant turns
# carry theirs), so a free reply starts as reasoning.
THINKING_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {% if m.reasoning_content %}<think>"
    "{{ m.reasoning_content }}</think>{% endif %}{{ m['content'] }} ; {% endfor %}"
    "{% if add_generation_prompt %}assistant: <think>\n{% endif %}"
)
OK = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
      "additionalProperties": False}


def test_a_forced_call_is_content_though_the_prompt_opens_think(bpe_bundle, tmp_path):
    """A forced tool_choice's grammar governs the whole reply, so it is not split: JSON
    the prompt's open `<think>` would have made reasoning comes back as the call.
    response_format holds the answer only, after the block (sdk/think_first.py): this
    model never closes its block, so that reply is reasoning to max_tokens, and a thinking
    budget closes the block for the JSON."""
    thinking = variant(bpe_bundle, tmp_path / "thinking", chat_template=THINKING_TEMPLATE)
    with Engine.load(thinking, threads=1) as engine:
        app = create_app(engine, ServerConfig(model_name="bpe", max_pending=2))
        with ServerThread(app, port=free_port()) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)

            def ask(**extra):
                return client.chat.completions.create(
                    model="bpe", messages=[{"role": "user", "content": "hello"}],
                    temperature=0, **{"max_tokens": 40, **extra})

            # Free, the random model never writes </think>: all of its reply is reasoning.
            free = ask(max_tokens=8).choices[0].message
            assert free.content == "" and free.model_extra["reasoning_content"]
            schema = {"type": "json_schema", "json_schema": {"name": "ok", "schema": OK}}
            for stream in (False, True):
                reply = ask(response_format=schema, stream=stream)
                chunks = list(reply) if stream else []
                deltas = [c.choices[0].delta for c in chunks if c.choices]
                message = reply.choices[0].message if not stream else None
                content = "".join(d.content or "" for d in deltas) if stream else \
                    message.content
                reasoning = "".join((d.model_extra or {}).get("reasoning_content") or ""
                                    for d in deltas) if stream else \
                    message.model_extra["reasoning_content"]
                assert content == "" and reasoning.startswith(free.model_extra[
                    "reasoning_content"].rstrip("\ufffd"))
            capped = ask(response_format=schema, extra_body={"thinking_token_budget": 4})
            message = capped.choices[0].message
            assert json.loads(message.content)["ok"] in (True, False)
            assert message.model_extra["reasoning_content"]
            tool = {"type": "function", "function": {"name": "ping", "parameters": OK}}
            named = {"type": "function", "function": {"name": "ping"}}
            forced = ask(tools=[tool], tool_choice=named).choices[0].message
            assert forced.tool_calls[0].function.name == "ping"
            assert "reasoning_content" not in (forced.model_extra or {})


def test_the_shipped_tiny_model_answers_parse_with_a_parsed_object(tiny_bundle):
    """Its byte-fallback tokens are untrained, yet the constraint makes any output valid."""
    with Engine.load(tiny_bundle, threads=1) as tiny:
        app = create_app(tiny, ServerConfig(model_name="tiny", max_pending=2))
        with ServerThread(app, port=free_port()) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
            for temperature in (0.0, 1.0):
                done = client.chat.completions.parse(
                    model="tiny", messages=[{"role": "user", "content": "the secret is"}],
                    response_format=Person, max_tokens=80, temperature=temperature, seed=1)
                message = done.choices[0].message
                assert done.choices[0].finish_reason == "stop", message.content
                assert isinstance(message.parsed, Person)
                assert Person.model_validate_json(message.content) == message.parsed


def test_a_tokenizer_without_bytes_answers_structured_requests_with_a_clear_400(bundle):
    with Engine.load(bundle("llama"), threads=1) as words:
        app = create_app(words, ServerConfig(model_name="words", max_pending=2))
        with ServerThread(app, port=free_port()) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
            with pytest.raises(openai.BadRequestError) as err:
                client.chat.completions.parse(
                    model="words", messages=[{"role": "user", "content": "w5"}],
                    response_format=Person, max_tokens=20)
    assert "byte-level or byte-fallback" in err.value.body["message"]


def test_a_constraint_spelling_an_added_token_runs(tmp_path):
    # Qwen's <tool_call> is a non-special added token: llguidance took it for a special
    # one, allowed only it for the text "<tool_call>", then refused it (a 500).
    from edgeprefill.export.exporter import ExportOptions, export

    model = build_hf_model("llama", tmp_path / "hf", vocab_size=VOCAB + 8)
    tok = byte_level_bpe(VOCAB)
    tok.add_tokens(["<tool_call>"])
    install(tok, model)
    export(model, tmp_path / "b", ExportOptions(chunks=(16,), max_context=128,
                                                show_progress=False))
    with Engine.load(tmp_path / "b", threads=1, kv_slots=1) as engine:
        params = GenerationParams(max_new_tokens=30, constraint=Constraint.regex("<tool_call> x"))
        reply = engine.generate("hello", params).result()
    assert reply.finish_reason == "stop", reply.error
    assert reply.text == "<tool_call> x"


CHOICES_PAST_LLGUIDANCE = [f"opt{i}" for i in range(5000)]  # it refuses them mid-reply


def test_a_constraint_refused_mid_reply_is_a_400_naming_its_field(client):
    """llguidance takes a 5,000-way choice, then refuses it at the reply's first tokens
    (its parser's row limit). That is the request's doing: a 400 naming the field, or in a
    stream an invalid_request_error event; it had been a 500 engine_error with a dump of
    the parser's state."""
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="bpe", prompt="pick", max_tokens=8,
                                  extra_body={"guided_choice": CHOICES_PAST_LLGUIDANCE})
    assert err.value.body["param"] == "guided_choice"
    assert "max is 2000" in err.value.body["message"]
    assert "<state>" not in err.value.body["message"]
    with httpx.stream("POST", f"{client.base_url}completions", timeout=60, json={
            "model": "bpe", "prompt": "pick", "max_tokens": 8, "stream": True,
            "guided_choice": CHOICES_PAST_LLGUIDANCE}) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    error = json.loads(events[-2])["error"]  # then [DONE]
    assert (error["type"], error["param"]) == ("invalid_request_error", "guided_choice")


def test_a_multi_word_literal_runs_on_a_sentencepiece_tokenizer(tiny_bundle):
    """The bytes a grammar forces after a word (" amber") must be tokenized with their
    space: through the tokenizer's encode (which drops a leading space here) llguidance had
    offered `a`, then refused it; with the leading space in front, every literal after the
    first word failed so."""
    with Engine.load(tiny_bundle, threads=1) as tiny:
        for constraint in (Constraint.choice(["jade amber"]), Constraint.regex("jade amber"),
                           Constraint.grammar('start: "jade amber"')):
            stream = tiny.generate("the secret is jade . what was the secret ?",
                                   GenerationParams(max_new_tokens=12, constraint=constraint))
            assert stream.result().text == "jade amber" and stream.finish_reason == "stop"
        words = tiny.generate("the secret is jade . what was the secret ?", GenerationParams(
            max_new_tokens=8, constraint=Constraint.regex("jade [a-z]+"))).result()
        assert words.finish_reason in ("stop", "length") and words.text.startswith("jade ")


@pytest.mark.parametrize("error, blamed", [
    ('Parser Error: token "t" doesn\'t satisfy the grammar; forced bytes: got \' \'', None),
    ("Parser Error: Current row has 5001 items; max is 2000", "constraint"),
])
def test_llguidance_refusing_its_own_offer_is_the_engines_fault(error, blamed):
    """A token from the matcher's own mask that it then refuses is a disagreement between
    llguidance and the tokenizer (a 500 engine_error, no field blamed); a limit of the
    grammar's own is the request's (a 400 naming its field)."""
    from edgeprefill.errors import RequestError
    from edgeprefill.sdk.constraints import GrammarMask, MatcherError

    class Matcher:
        failed = False

        def compute_bitmask(self):
            return b"\xff"

        def consume_token(self, token):
            self.failed = True

        def is_error(self):
            return self.failed

        def get_error(self):
            return error + " <state> a dump"

    mask = GrammarMask(Matcher())
    with pytest.raises(RequestError if blamed else MatcherError) as raised:
        mask.accept(3)
    assert getattr(raised.value, "field", None) == blamed and "<state>" not in str(raised.value)


# -- a tokenizer whose decoder strips the reply's first space ------------------------------
# The shipped tiny model's tokenizer is SentencePiece style (Llama 2, Mistral): Metaspace
# gives each word its space (`▁jade`: bytes " jade"), and the decoder drops the space that
# begins a text, so a reply whose first token is `▁jade` reads "jade". The constraint holds
# for that text; it had forbidden `▁jade` (bytes " jade" are no choice), so the model had
# to spell a reply from byte pieces and chose another.

SECRET = "the secret is jade . kero bala musi . what was the secret ?"


@pytest.fixture(scope="module")
def tiny(tiny_bundle) -> Iterator[Engine]:
    with Engine.load(tiny_bundle, threads=1, kv_slots=2) as engine:
        yield engine


def greedy(engine, constraint=None, max_new_tokens=8):
    params = GenerationParams(max_new_tokens=max_new_tokens, constraint=constraint)
    return engine.generate(SECRET, params).result()


def test_a_choice_gets_the_models_own_first_word(tiny):
    free = greedy(tiny)
    assert free.text == "jade" and tiny.tokenizer.token_bytes(free.token_ids[0]) == b" jade"
    for constraint in (Constraint.choice(["jade", "ruby"]), Constraint.choice(["ruby", "jade"]),
                       Constraint.grammar('start: "jade" | "ruby"'),
                       Constraint.gbnf('root ::= "jade" | "ruby"')):
        out = greedy(tiny, constraint)
        assert (out.text, out.token_ids) == (free.text, free.token_ids), constraint
        assert out.finish_reason == "stop"


def test_a_regex_gets_the_unconstrained_first_word(tiny):
    first_word = greedy(tiny).text.split()[0]
    assert greedy(tiny, Constraint.regex("[a-z]+")).text == first_word == "jade"


def test_a_json_reply_may_open_with_the_space_and_still_parses(tiny):
    schema = {"type": "object", "required": ["secret"],
              "properties": {"secret": {"type": "string", "maxLength": 8}}}
    out = greedy(tiny, Constraint.json_schema(schema), max_new_tokens=60)
    assert out.finish_reason == "stop", out.text
    assert set(json.loads(out.text)) == {"secret"}
    # The reply opens with a word-start space (the model's habit after the prompt, and
    # the grammar's on this tokenizer), and the text the user gets has it stripped.
    assert tiny.tokenizer.token_bytes(out.token_ids[0]).startswith(b" ")
    assert out.text == tiny.tokenizer.decode(out.token_ids) and out.text.startswith("{")


@pytest.mark.parametrize("pattern", [r".{5}", r"[ -~]{6}", r" jade", r"[a-z ]{4}",
                                     r"\s?[a-z]+ [a-z]+", r" *"])
def test_a_grammar_that_may_begin_with_a_space_holds_for_the_text(tiny, pattern):
    """The decoder drops the reply's first space: where the space in front of the user's
    grammar was optional, the bytes " jade" satisfied `.{5}` and the user got "jade"."""
    for seed in range(4):
        out = tiny.generate(SECRET, GenerationParams(
            max_new_tokens=12, temperature=1.5, seed=seed,
            constraint=Constraint.regex(pattern))).result()
        assert out.finish_reason == "stop", (pattern, seed, out.text)
        assert re.fullmatch(pattern, out.text, re.S), (pattern, seed, out.text)
        assert out.text == tiny.tokenizer.decode(out.token_ids)


def test_a_byte_level_tokenizer_gets_no_leading_space(engine, tiny):
    """Byte-level BPE keeps the reply's first space: its grammar is the user's as given,
    no token that begins with a space may open a choice of words. Where the decoder drops
    it, every first token begins with the space the decoder drops."""
    from edgeprefill.sdk.constraints import compile_constraint

    def first_tokens(eng, constraint):
        mask = compile_constraint(constraint, eng.tokenizer, sorted(eng.eos))
        allowed = mask.allowed(eng.tokenizer.vocab_size).nonzero()[0]
        return {eng.tokenizer.token_bytes(int(t)) for t in allowed}

    words = Constraint.choice(["the", "hello"])
    assert b" the" in first_tokens(tiny, words)
    assert all(b.startswith(b" ") for b in first_tokens(tiny, words))
    assert not any(b.startswith(b" ") for b in first_tokens(engine, words))
    assert not any(b.startswith(b" ") for b in first_tokens(engine, Constraint.json_object()))
    # and its output is what the user's grammar alone gives
    params = GenerationParams(max_new_tokens=10, constraint=words)
    assert engine.generate("hello", params).result().text in {"the", "hello"}


def test_a_byte_level_tokenizer_gets_llguidances_own_first_mask(engine):
    """No wrapper and no first-token ban where the decoder keeps every space: the first
    mask is what llguidance gives for the user's grammar over the tokenizer.json."""
    import numpy as np
    from llguidance import LLMatcher, LLTokenizer

    from edgeprefill.sdk.constraints import compile_constraint

    vocab, eos = engine.tokenizer.vocab_size, sorted(engine.eos)
    plain = LLTokenizer(engine.tokenizer.tokenizer.to_str(), n_vocab=vocab, eos_token=eos)
    for pattern in (r" [a-z]+", r".{5}", r"\s\w+", r"  x"):
        ours = compile_constraint(Constraint.regex(pattern), engine.tokenizer, eos)
        bits = LLMatcher(plain, LLMatcher.grammar_from_regex(pattern)).compute_bitmask()
        theirs = np.unpackbits(np.frombuffer(bits, np.uint8), bitorder="little")[:vocab]
        assert theirs.any() and (ours.allowed(vocab) == theirs.astype(bool)).all(), pattern


def test_a_llama2_style_tokenizer_keeps_a_grammars_leading_space(tmp_path):
    """Llama 2's tokenizer has no pre-tokenizer: its normalizer puts `▁` in front and for
    every space, and the decoder strips the first. It must be recognised as stripping (as
    a grammar of its own, " jade amber" came back "jade amber") and the wrapper hold."""
    import shutil

    from edgeprefill.export.exporter import ExportOptions, export
    from tests.conftest import TINY_MODEL

    model = shutil.copytree(TINY_MODEL, tmp_path / "hf")
    spec = json.loads((model / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    spec["pre_tokenizer"] = None
    (model / "tokenizer.json").write_text(json.dumps(spec))
    export(model, tmp_path / "b", ExportOptions(show_progress=False, max_context=128))
    with Engine.load(tmp_path / "b", threads=1, kv_slots=1) as engine:
        for pattern, seed in itertools.product((r".{5}", r" jade amber", r"  two"), range(4)):
            out = engine.generate(SECRET, GenerationParams(
                max_new_tokens=12, temperature=1.5, seed=seed,
                constraint=Constraint.regex(pattern))).result()
            assert out.finish_reason == "stop" and re.fullmatch(pattern, out.text), out.text


# A Metaspace decoder drops every `▁` of the reply's first token and keeps a byte fallback
# space: with `▁▁` or `<0x20>` first, the text lost more or less than the one space the
# wrapper puts before the user's grammar (`[A-Z]` came back " Q", `\s   ` came back " ").


@pytest.fixture(scope="module")
def metaspace_bundles(tmp_path_factory):
    """A random llama over metaspace_bpe (pieces of several spaces and of two words), and
    the shipped tiny model with its decoder made Metaspace."""
    import shutil

    from edgeprefill.export.exporter import ExportOptions, export
    from tests.bpe_tokenizers import metaspace_bpe
    from tests.conftest import TINY_MODEL

    root = tmp_path_factory.mktemp("metaspace")
    tok = metaspace_bpe()
    random_model = build_hf_model("llama", root / "hf-random", vocab_size=tok.get_vocab_size())
    install(tok, random_model)
    tiny_model = shutil.copytree(TINY_MODEL, root / "hf-tiny")
    spec = json.loads((tiny_model / "tokenizer.json").read_text())
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    (tiny_model / "tokenizer.json").write_text(json.dumps(spec))
    options = ExportOptions(show_progress=False, max_context=128, overwrite=True)
    export(random_model, root / "random", options)
    export(tiny_model, root / "tiny", options)
    return {"random": root / "random", "tiny": root / "tiny"}


@pytest.mark.parametrize("model", ["random", "tiny"])
def test_a_metaspace_decoder_keeps_a_grammars_leading_space(metaspace_bundles, model):
    patterns = [r" [a-z]{1,6}", r".{5}", r".", r".{2}", r"[a-z][ -~]", r"\s[A-Za-z0-9]{1,5}",
                r"[A-Z]", r"\s   ", r" {0,4}", r"[a-z]{2,6}", r'\s{0,3}\{"a":[0-9]\}']
    with Engine.load(metaspace_bundles[model], threads=1, kv_slots=1) as engine:
        # The trained tiny model rarely opens with the byte fallback space: made likely.
        bias = {engine.tokenizer.tokenizer.token_to_id("<0x20>"): 5.0}
        for pattern, seed in itertools.product(patterns, range(4)):
            out = engine.generate(SECRET, GenerationParams(
                max_new_tokens=16, temperature=1.5, seed=seed, logit_bias=bias,
                constraint=Constraint.regex(pattern))).result()
            assert out.finish_reason == "stop", (pattern, seed, out.text)
            assert re.fullmatch(pattern, out.text, re.S), (pattern, seed, out.text)
            assert out.text == engine.tokenizer.decode(out.token_ids)


def test_a_vocabulary_without_a_bare_space_piece_refuses_at_submit(tmp_path):
    """Where no token that may open the reply reads as its bytes less the dropped space (a
    Metaspace vocabulary with `▁▁` and `<0x20>` but no bare `▁`), a grammar that must open
    with a plain space is refused at submit in one line; it failed mid-request with "the
    constraint allows no token here". A grammar that a word token opens still runs."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from edgeprefill.errors import RequestError
    from edgeprefill.export.exporter import ExportOptions, export

    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [chr(c) for c in range(33, 127)] + ["▁t", "he", "▁the", "▁▁"]
    vocab = {p: i for i, p in enumerate(dict.fromkeys(pieces))}
    tok = Tokenizer(models.BPE(vocab, [("h", "e")], unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always", split=False)
    tok.decoder = decoders.Sequence([decoders.Metaspace(prepend_scheme="always", split=False),
                                     decoders.ByteFallback(), decoders.Fuse()])
    model = build_hf_model("llama", tmp_path / "hf", vocab_size=tok.get_vocab_size())
    install(tok, model)
    export(model, tmp_path / "b", ExportOptions(show_progress=False, max_context=64))
    with Engine.load(tmp_path / "b", threads=1, kv_slots=1) as engine:
        for pattern in ("x", " x", r"\{\}"):
            with pytest.raises(RequestError, match=r"cannot begin a reply with this tokenizer"):
                engine.generate("hello", GenerationParams(
                    max_new_tokens=4, constraint=Constraint.regex(pattern)))
        out = engine.generate("hello", GenerationParams(
            max_new_tokens=4, temperature=1.0, seed=0, constraint=Constraint.regex("the"))
        ).result()
        assert (out.text, out.finish_reason) == ("the", "stop")
