"""`strict: true` tools under `tool_choice: "auto"` in LFM2's pythonic call format: free
text, `<|tool_call_start|>[name(key=value), ...]<|tool_call_end|>`, free text again
(server/strict_pythonic.py).

The tiny random model of tests/strict_live.py behind an LFM2-style chat template and a
tokenizer with the two tags as special tokens (as LFM2's are); a bias on the open tag's
logit makes the greedy reply open a list of calls after some text. Without strict what
follows is the model's noise; with strict it is calls to listed tools whose arguments
validate against their schemas. The grammar itself is checked token by token, the tags
as special tokens and spelled in plain text, and each reply it takes is read back by the
server's PythonicParser."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

openai = pytest.importorskip("openai")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerThread  # noqa: E402
from tests import strict_live  # noqa: E402
from tests.strict_live import Live, follows, strict_engine, tool, valid  # noqa: E402

OPEN, CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"
BIAS = 3.0  # on the open tag's logit: the greedy reply opens calls after some text
# A question whose unconstrained greedy text before the tag is valid UTF-8, as the text
# before a special token must be under the grammar (strict_pythonic's docstring).
LIVE = Live(marker=OPEN, question=[{"role": "user", "content": "Hello"}])
# LFM2's shape: the tools listed between <|tool_list_start|> and <|tool_list_end|>.
TEMPLATE = (
    "{% if tools %}system: <|tool_list_start|>{% for t in tools %}{{ t.function.name }} "
    "{{ t.function.parameters | tojson }} {% endfor %}<|tool_list_end|> ; {% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }} ; {% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Iterator[Engine]:
    engine = strict_engine(tmp_path_factory, TEMPLATE, added=(), special=(OPEN, CLOSE),
                           biases={OPEN: BIAS})
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(engine) -> Iterator[ServerThread]:
    yield from strict_live.serve(engine)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return strict_live.connect(server)


def test_the_template_is_read_as_the_pythonic_format(engine):
    from edgeprefill.server.tools import call_format

    assert call_format(engine.manifest) == "pythonic"


@pytest.mark.parametrize("parallel", [False, True])
def test_a_strict_call_follows_its_schema_and_the_text_before_it_is_free(client, parallel):
    # Every call the reply holds: none dropped as cut short, as complete_calls would.
    strict_live.check_a_strict_call_then_free_text(client, LIVE, parallel,
                                                   calls_of=strict_live.all_calls)


def test_streamed_is_the_whole_reply(client):
    whole = strict_live.check_streamed_is_the_whole_reply(client, LIVE)
    assert whole.message.tool_calls


def test_a_strict_and_a_loose_tool_together(client):
    """Each call names a listed tool; a strict tool's arguments follow its schema, a
    loose tool's are any keywords with JSON values (the grammar tests below show one
    outside its schema pass)."""
    strict_live.check_a_strict_and_a_loose_tool_together(client, LIVE,
                                                         calls_of=strict_live.all_calls)


def test_the_messages_api_honours_strict_under_auto(server, client):
    strict_live.check_the_messages_api_text_then_a_strict_use(server, client, LIVE)


# -- the grammar, token by token -------------------------------------------------------

NOTE_SCHEMA = {  # optional keywords and JSON's true/false/null, read back by the parser
    "type": "object", "required": ["text"],
    "properties": {"text": {"type": "string"}, "pinned": {"type": "boolean"},
                   "due": {"type": ["string", "null"]},
                   "tags": {"type": "array", "items": {"type": "string"}}}}
PLACE_SCHEMA = {  # a nested object by $ref: closed to unlisted keys, its $defs carried
    "type": "object", "required": ["at"], "properties": {"at": {"$ref": "#/$defs/point"}},
    "$defs": {"point": {"type": "object", "required": ["lat"],
                        "properties": {"lat": {"type": "number"}}}}}
TOOLS = [tool("get_weather", True), tool("get_time", None),
         *({"type": "function", "function": {"name": name, "parameters": schema,
                                             "strict": True}}
           for name, schema in (("note", NOTE_SCHEMA), ("place", PLACE_SCHEMA)))]


def mask_for(engine, tools: list[dict], parallel: bool = True, special: bool = True):
    """strict_live.mask_for in this format."""
    return strict_live.mask_for(engine, "pythonic", tools, parallel, special)


def reply_ids(engine, text: str, tags: str = "token") -> list[int]:
    """Token ids of `text`, its open tags as their special token ("token") or spelled in
    plain text one byte a token ("text"). The close tag is its token: llguidance forces
    the canonical tokens of a fixed string, here the special token."""
    tokenizer, ids = engine.tokenizer, []
    for part in text.replace(OPEN, f"\0{OPEN}\0").replace(CLOSE, f"\0{CLOSE}\0").split("\0"):
        if part == CLOSE or (part == OPEN and tags == "token"):
            ids.append(tokenizer.tokenizer.token_to_id(part))
        elif part == OPEN:
            ids += [tokenizer.encode_plain(c)[0] for c in part]
        else:
            ids += tokenizer.encode_plain(part)
    assert tokenizer.decode(ids) == text
    return ids


def takes(engine, text: str, tags: str = "token", parallel: bool = True,
          tools: list[dict] = TOOLS) -> bool:
    """Whether the grammar takes `text` as a whole reply (the end of the turn next)."""
    vocab, eos = engine.tokenizer.vocab_size, min(engine.eos)
    mask = mask_for(engine, tools, parallel)
    return follows(mask, vocab, reply_ids(engine, text, tags)) and \
        bool(mask.allowed(vocab)[eos])


def read_back(text: str) -> list[tuple[str, dict]]:
    from edgeprefill.server.tool_parsers import PythonicParser

    parsed = PythonicParser().parse(text)
    return [(c.name, json.loads(c.arguments)) for c in parsed.calls]


def valid_note(arguments: dict) -> bool:
    """Whether `arguments` satisfy NOTE_SCHEMA, keyword by keyword."""
    kinds = {"text": str, "pinned": bool, "due": (str, type(None)), "tags": list}
    return "text" in arguments and set(arguments) <= set(kinds) and \
        all(isinstance(v, kinds[k]) for k, v in arguments.items()) and \
        all(isinstance(t, str) for t in arguments.get("tags", []))


GOOD = 'get_weather(city="Bern", days=2)'


@pytest.mark.parametrize("tags", ["token", "text"])
def test_the_grammar_takes_text_then_valid_calls_then_text(engine, tags):
    replies = {
        f"Sure, 好.{OPEN}[{GOOD}]{CLOSE} Done.": [("get_weather", {"city": "Bern", "days": 2})],
        f"{OPEN}[{GOOD}, get_time(zone=\"Mars\", extra=[1, {{\"a\": null}}])]{CLOSE}": [
            ("get_weather", {"city": "Bern", "days": 2}),  # the loose tool: any keywords
            ("get_time", {"zone": "Mars", "extra": [1, {"a": None}]})],
        f"A.{OPEN}[get_time()]{CLOSE}B.{OPEN}[note(text=\"x\", pinned=false, due=null, "
        f"tags=[\"a\"])]{CLOSE}": [
            ("get_time", {}), ("note", {"text": "x", "pinned": False, "due": None,
                                        "tags": ["a"]})],
        f"{OPEN}[note(text=\"\\\"q\\\" \\u0001\\n\", pinned=true)]{CLOSE}": [
            ("note", {"text": "\"q\" \u0001\n", "pinned": True})],
        f"{OPEN}[place(at={{\"lat\": -1.5e2}})]{CLOSE}": [("place", {"at": {"lat": -150.0}})],
        "No call.": [],
    }
    for text, calls in replies.items():
        assert takes(engine, text, tags), text
        assert read_back(text) == calls, text  # as the server's parser reads the reply
        for name, arguments in calls:  # get_time is loose: any arguments
            assert name in ("get_time", "place") or (valid_note(arguments) if name == "note"
                                                     else valid(name, arguments)), name


@pytest.mark.parametrize("tags", ["token", "text"])
def test_the_grammar_refuses_what_breaks_the_format(engine, tags):
    bad = {
        "an unlisted tool": "get_news()",
        "an unlisted keyword": 'get_weather(city="Bern", days=2, x=1)',
        "a required keyword missing": 'get_weather(city="Bern")',
        "a value of the wrong type": 'get_weather(city="Bern", days="2")',
        "a value off the schema": 'get_weather(city="Bern", days=9)',
        "a keyword twice": 'note(text="a", text="b")',
        "an unlisted key inside a $ref'd object": 'place(at={"lat": 1, "x": 2})',
        "a required key missing inside it": 'place(at={})',
        "keywords out of the schema's order": 'get_weather(days=2, city="Bern")',
        "a positional argument": 'get_weather("Bern", days=2)',
        "Python's True for JSON's true": 'note(text="a", pinned=True)',
        "a Python keyword as a loose tool's keyword": "get_time(class=1)",
    }
    for why, call in bad.items():
        assert not takes(engine, f"Sure.{OPEN}[{call}]{CLOSE}", tags), why
    assert not takes(engine, f"Sure.{OPEN}[]{CLOSE}", tags), "no call"
    assert not takes(engine, f"Sure.{OPEN}[{GOOD}]", tags), "no close tag"


def test_without_parallel_calls_a_list_holds_one(engine):
    two = f"{OPEN}[{GOOD}, {GOOD}]{CLOSE}"
    assert takes(engine, two)
    assert not takes(engine, two, parallel=False)
    assert takes(engine, f"{OPEN}[{GOOD}]{CLOSE}", parallel=False)


def test_a_grammar_that_knows_only_the_tags_text_leaves_the_token_free(engine):
    """Why the server passes the special tokens: llguidance matches a special token only
    as a token, never as the text of the tag."""
    vocab, unlisted = engine.tokenizer.vocab_size, f"Sure.{OPEN}[get_news()]{CLOSE}"
    assert follows(mask_for(engine, TOOLS, special=False), vocab,
                   reply_ids(engine, unlisted, "token"))
    assert not follows(mask_for(engine, TOOLS, special=False), vocab,
                       reply_ids(engine, unlisted, "text"))


def test_a_strict_tool_the_format_cannot_write_is_refused_in_one_line():
    from edgeprefill.server.errors import ApiError
    from edgeprefill.server.strict_tools import lazy_call_constraint

    def strict(name: str, parameters: dict) -> dict:
        return {"type": "function",
                "function": {"name": name, "parameters": parameters, "strict": True}}

    one = {"type": "object", "properties": {"x": {"type": "string"}}}
    for why, bad in {
        "a keyword Python cannot write": strict("f", {"type": "object", "properties": {
            "first-name": {"type": "string"}}}),
        "a Python keyword": strict("f", {"type": "object", "properties": {
            "class": {"type": "string"}}}),
        "a tool name Python cannot write": strict("get-weather", one),
        "a top-level anyOf": strict("f", {**one, "anyOf": [{"required": ["x"]}]}),
    }.items():
        with pytest.raises(ApiError) as err:
            lazy_call_constraint((bad,), "pythonic")
        assert err.value.status == 400 and "\n" not in err.value.message, why


def test_a_bundle_that_thinks_with_special_think_tags_refuses_strict_in_one_line(engine):
    """Its free text is valid UTF-8 (the open tag is a special token), which no special
    token is: a `</think>` token could never close the reasoning."""
    from edgeprefill.server.errors import ApiError
    from edgeprefill.server.strict_tools import lazy_call_constraint

    ids = engine.tokenizer.special_ids
    with pytest.raises(ApiError) as err:
        lazy_call_constraint(tuple(TOOLS), "pythonic", True, {**ids, "</think>": 3}, True)
    assert err.value.status == 400 and "\n" not in err.value.message
    lazy_call_constraint(tuple(TOOLS), "pythonic", True, ids, True)  # tags in plain text
