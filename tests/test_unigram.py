"""A bundle whose tokenizer.json is a SentencePiece Unigram model (XGLM's, mBART's kind:
`"vocab": [[piece, score], ...]`, a Metaspace pre-tokenizer and decoder, byte fallback),
end to end on a random XGLM: the streamed text, stop strings, logprobs' tokens, the
server's routes and `edgeprefill run` against `tokenizers`' decode of the reply's ids;
structured output's token table against the decoder's reading of each piece, and its
replies against the grammar. The reply is scripted (tests/conftest.py follow_tokens)
where its text is checked: "naïve café\\nÿ€𝄞東京😀", spaces inside pieces, characters
whole in pieces and split over byte tokens. (`/v1/completions` refuses `echo`.)"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("llguidance")
pytest.importorskip("starlette")

from edgeprefill.errors import RequestError  # noqa: E402
from edgeprefill.sdk import Engine, GenerationParams  # noqa: E402
from edgeprefill.sdk.constraints import Constraint, _ll_tokenizer, compile_constraint  # noqa: E402
from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from tests.bpe_tokenizers import install  # noqa: E402
from tests.conftest import build_hf_model, follow_tokens  # noqa: E402
from tests.test_serve import free_port  # noqa: E402
from tests.unigram_tokenizers import unigram  # noqa: E402

EOS = 2  # </s>
REPLY = "naïve café\nÿ€𝄞東京😀"  # ÿ, €, 𝄞 and the newline are not pieces: byte tokens
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 99}}}


def export_with(tok, root) -> object:
    """A random XGLM (XGLM's ids: <s> 0, <pad> 1, </s> 2) over `tok`, exported."""
    from edgeprefill.export.exporter import ExportOptions, export

    model = build_hf_model("xglm", root / "hf", vocab_size=tok.get_vocab_size(),
                           bos_token_id=0, pad_token_id=1, eos_token_id=EOS)
    install(tok, model)
    export(model, root / "bundle", ExportOptions(chunks=(16,), max_context=128,
                                                 show_progress=False, overwrite=True))
    return root / "bundle"


@pytest.fixture(scope="module")
def tok():
    return unigram()


@pytest.fixture(scope="module")
def bundle(tok, tmp_path_factory):
    return export_with(tok, tmp_path_factory.mktemp("unigram"))


@pytest.fixture(scope="module")
def reply_ids(tok) -> list[int]:
    ids = tok.encode(REPLY, add_special_tokens=False).ids
    assert len(set(ids)) == len(ids)  # follow_tokens scripts by the last token
    return ids


@pytest.fixture(scope="module")
def scripted(bundle, reply_ids) -> Iterator[Engine]:
    """Greedy replies are REPLY's tokens, then EOS (after any prompt not ending in one)."""
    with Engine.load(bundle, threads=1, kv_slots=2) as engine:
        following = dict(zip(reply_ids, [*reply_ids[1:], EOS], strict=True))
        follow_tokens(engine, following, reply_ids[0])
        yield engine


@pytest.fixture(scope="module")
def sampled(bundle) -> Iterator[Engine]:
    with Engine.load(bundle, threads=1, kv_slots=2) as engine:
        yield engine


def read_after(tok, token_id: int) -> str:
    """How the decoder reads `token_id` after a word (not first in a text, where a
    Metaspace decoder drops its `▁`)."""
    word = tok.token_to_id("▁ca")
    return tok.decode([word, token_id], skip_special_tokens=False)[len(tok.decode([word])):]


def test_the_tokenizer_is_unigram_and_the_reply_splits_characters(tok, reply_ids):
    # Otherwise the tests below would prove nothing about Unigram or split characters.
    model = json.loads(tok.to_str())["model"]
    assert model["type"] == "Unigram" and isinstance(model["vocab"], list)
    pieces = [tok.id_to_token(i) for i in reply_ids]
    assert "<0xC3>" in pieces and "▁café" in pieces and "東" in pieces
    assert tok.decode(reply_ids) == REPLY


def test_a_streamed_reply_is_the_decode_of_its_ids(scripted, tok, reply_ids):
    stream = scripted.generate("hello", GenerationParams(max_new_tokens=40))
    events = list(stream)
    ids = [e.token_id for e in events if e.token_id is not None]
    assert ids == reply_ids and stream.result().finish_reason == "stop"  # then EOS
    assert "".join(e.text for e in events) == tok.decode(ids) == REPLY
    assert all("\ufffd" not in e.text for e in events)  # never half a character
    assert any(e.text == "" for e in events)  # the byte tokens inside a character


def test_xglms_form_without_byte_fallback_streams_its_decode_unk_dropped(tmp_path):
    """XGLM's own vocabulary has no byte pieces: a character it lacks is <unk>, a special
    token the text drops. Sampled replies (<unk> made likely) stream as their decode."""
    tok = unigram(byte_fallback=False)
    unk = tok.token_to_id("<unk>")
    with Engine.load(export_with(tok, tmp_path), threads=1, kv_slots=1) as engine:
        for seed in range(3):
            stream = engine.generate("naïve 你好", GenerationParams(
                max_new_tokens=30, temperature=1.0, seed=seed, logit_bias={unk: 4.0},
                logprobs=0))
            events = list(stream)
            ids = [e.token_id for e in events if e.token_id is not None]
            assert unk in ids
            assert "".join(e.text for e in events) == tok.decode(ids)
            assert [e.token_text for e in events if e.token_id == unk][0] == "<unk>"


@pytest.mark.parametrize("stop", ["café\nÿ", "€𝄞", "ve ca", "京😀", "\n"])
def test_a_stop_string_across_tokens_ends_the_reply_where_it_begins(scripted, stop):
    out = scripted.generate("hello", GenerationParams(max_new_tokens=40, stop=(stop,))).result()
    assert (out.text, out.finish_reason) == (REPLY[:REPLY.index(stop)], "stop")


def test_logprobs_tokens_read_as_the_decoder_reads_each_token(scripted, tok, reply_ids):
    events = list(scripted.generate("hello", GenerationParams(max_new_tokens=40, logprobs=0)))
    texts = [e.token_text for e in events if e.token_id in reply_ids]
    assert texts == [read_after(tok, i) for i in reply_ids]
    # OpenAI's bytes: joined, the reply's bytes with the space its first token holds
    joined = b"".join(scripted.tokenizer.token_bytes(i) for i in reply_ids)
    assert joined == (" " + REPLY).encode()


@pytest.mark.parametrize("metaspace", [True, False], ids=["metaspace", "plain"])
def test_the_constraint_token_table_spells_each_piece_as_the_decoder_reads_it(metaspace):
    """Every piece's bytes in llguidance's table are what the decoder reads it as (a
    `▁` a space, <0x0A> a newline); the byte tokens of a character join to its bytes.
    Metaspace: the table is edgeprefill's (the decoder drops a reply's first space);
    plain: llguidance reads tokenizer.json's Unigram vocabulary itself."""
    tok = unigram(metaspace=metaspace)
    ll, _ = _ll_tokenizer(StandIn(tok), (EOS,))
    word = tok.token_to_id("▁ca")
    for i in range(4, tok.get_vocab_size()):  # past the special tokens
        read = read_after(tok, i)
        if "\ufffd" not in read:  # a byte token of a character reads as U+FFFD alone
            assert ll.decode_bytes([i]) == read.encode(), tok.id_to_token(i)
    for char in "ÿ€𝄞ß":
        ids = tok.encode(f"ca {char}", add_special_tokens=False).ids[1:]
        assert ll.decode_bytes(ids) == read_after_all(tok, word, ids).encode()
        assert len(ids) > 2  # `▁` and two or more byte tokens


def read_after_all(tok, word: int, ids: list[int]) -> str:
    return tok.decode([word, *ids])[len(tok.decode([word])):]


class StandIn:
    """What the constraint code reads of a BundleTokenizer."""

    def __init__(self, tok) -> None:
        self.tokenizer = tok
        self.vocab_size = tok.get_vocab_size()


@pytest.mark.parametrize("constraint,check", [
    (Constraint.json_schema(SCHEMA), lambda text: set(json.loads(text)) == {"name", "age"}),
    (Constraint.regex(r"[a-zé]{2,4} [0-9]{2}"),
     lambda text: re.fullmatch(r"[a-zé]{2,4} [0-9]{2}", text)),
    (Constraint.choice(["café", "你好 world", "ÿ€ 𝄞\n"]),
     lambda text: text in {"café", "你好 world", "ÿ€ 𝄞\n"}),
], ids=["json-schema", "regex", "choice"])
def test_structured_output_is_valid_and_reads_as_its_ids(sampled, tok, constraint, check):
    for seed in range(4):
        out = sampled.generate("hello", GenerationParams(
            max_new_tokens=60, temperature=1.0, seed=seed, constraint=constraint)).result()
        assert out.finish_reason == "stop", (seed, out.text, out.error)
        assert check(out.text), (seed, out.text)
        assert out.text == tok.decode(out.token_ids)


def test_a_forced_character_spelled_by_byte_tokens_is_the_reply(sampled, tok):
    out = sampled.generate("hello", GenerationParams(
        max_new_tokens=20, constraint=Constraint.regex("ÿ€𝄞\n東"))).result()
    assert (out.text, out.finish_reason) == ("ÿ€𝄞\n東", "stop")
    assert tok.decode(out.token_ids) == out.text


@pytest.fixture(scope="module")
def server(scripted, sampled):
    """The scripted engine as "scripted" and the sampled one as "sampled"."""
    servers = [ServerThread(create_app(engine, ServerConfig(model_name=name, max_pending=4)),
                            port=free_port()) for name, engine in
               (("scripted", scripted), ("sampled", sampled))]
    with servers[0] as one, servers[1] as two:
        yield {"scripted": one.url, "sampled": two.url}


def test_the_servers_routes_return_the_decoded_reply(server, tok, reply_ids):
    url = server["scripted"]
    chat = [{"role": "user", "content": "hi"}]
    with httpx.Client(base_url=url, timeout=60) as http:
        done = http.post("/v1/completions", json={
            "model": "scripted", "prompt": "hello", "max_tokens": 40, "logprobs": 1}).json()
        choice = done["choices"][0]
        assert choice["text"] == REPLY
        assert choice["logprobs"]["tokens"] == [read_after(tok, i) for i in reply_ids]
        chat_reply = http.post("/v1/chat/completions", json={
            "model": "scripted", "messages": chat, "max_tokens": 40}).json()
        assert chat_reply["choices"][0]["message"]["content"] == REPLY
        message = http.post("/v1/messages", json={
            "model": "scripted", "messages": chat, "max_tokens": 40}).json()
        assert message["content"] == [{"type": "text", "text": REPLY}]
        ollama = http.post("/api/generate", json={
            "model": "scripted", "prompt": "hi", "stream": False}).json()
        assert ollama["response"] == REPLY
        body = {"model": "scripted", "messages": chat}
        with http.stream("POST", "/api/chat", json=body) as lines:
            parts = [json.loads(line)["message"]["content"] for line in lines.iter_lines() if line]
        assert "".join(parts) == REPLY


def test_response_format_json_schema_through_the_server(server):
    with httpx.Client(base_url=server["sampled"], timeout=60) as http:
        for seed in range(3):
            done = http.post("/v1/chat/completions", json={
                "model": "sampled", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 60, "temperature": 1.0, "seed": seed,
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": "person", "schema": SCHEMA, "strict": True}}}).json()
            choice = done["choices"][0]
            assert choice["finish_reason"] == "stop", done
            person = json.loads(choice["message"]["content"])
            assert set(person) == {"name", "age"} and 0 <= person["age"] <= 99


def test_edgeprefill_run_prints_the_decode_of_the_reply(bundle, sampled, tok):
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli

    reply = sampled.generate("你好 世界", GenerationParams(max_new_tokens=30)).result()
    result = CliRunner().invoke(cli, ["run", str(bundle), "你好 世界", "--threads", "1",
                                      "--max-new-tokens", "30", "--temperature", "0"])
    assert any(tok.id_to_token(i).startswith("<0x") for i in reply.token_ids)  # bytes
    assert result.exit_code == 0, result.output
    assert result.stdout == tok.decode(reply.token_ids) + "\n"


# -- fixes ----------------------------------------------------------------------------------


def test_a_constraint_spelling_a_plain_added_token_runs_on_a_unigram_vocabulary(tmp_path):
    """A non-special added token (Qwen's <tool_call>) moves into the vocabulary llguidance
    reads, as a BPE's does: a Unigram vocabulary is a list, and was left as it was, so
    llguidance took the token for a special one and refused it (MatcherError: a 500) where
    the grammar forces its text. Here the decoder keeps the reply's first space, so
    llguidance reads the tokenizer.json itself."""
    tok = unigram(metaspace=False)
    tok.add_tokens(["<tool_call>"])
    with Engine.load(export_with(tok, tmp_path), threads=1, kv_slots=1) as engine:
        out = engine.generate("hello", GenerationParams(
            max_new_tokens=20, constraint=Constraint.regex("<tool_call> x"))).result()
    assert (out.text, out.finish_reason) == ("<tool_call> x", "stop"), out.error
    assert tok.id_to_token(out.token_ids[0]) == "<tool_call>"


@pytest.mark.parametrize("pattern,byte", [("a\nb", "0x0a"), ("ÿ", "0xc3")])
def test_text_a_vocabulary_without_byte_fallback_cannot_spell_is_refused_in_one_line(pattern,
                                                                                     byte):
    """XGLM's vocabulary has no byte pieces: a grammar that forces a byte no token spells
    is refused naming the byte; it had been llguidance's panic with a Python traceback.
    Where the grammar lets the model choose, it runs."""
    stand_in = StandIn(unigram(byte_fallback=False))
    with pytest.raises(RequestError) as err:
        compile_constraint(Constraint.regex(pattern), stand_in, [EOS])
    assert str(err.value).endswith(f"it needs the byte {byte}, which no token of this "
                                   "tokenizer spells (a vocabulary without byte fallback)")
    compile_constraint(Constraint.regex("[a-z]+ (ÿ|x)"), stand_in, [EOS])

