"""Structured output: a constraint becomes a token mask applied before sampling.

The masks come from llguidance (a grammar engine made for this: JSON schema, regex,
Lark grammars; a mask over a 152k vocabulary costs tens of microseconds, see
docs/design.md for the choice against xgrammar). Per generated token the sampler asks
for the allowed tokens, sets every other logit to -inf (greedy too), and the matcher
advances on the token sampled. When the grammar is complete the mask holds only EOS,
so output is valid by construction whatever the model's weights. A constraint marked
`after_thinking` holds only the answer after the reply's think block (sdk/think_first.py).

The constraint holds for the text the user sees. Where the tokenizer's decoder drops the
space that begins a text (Llama 2, Mistral: the reply's first token `▁jade` reads "jade"),
the grammar takes one space before the user's: the reply begins with a word-start token,
as the model's own replies do, and its text without that space is what the user's grammar
matched, a space the grammar itself begins with included. A first token the decoder reads
otherwise (a Metaspace decoder's `▁▁` reads "", not " ") may not open the reply.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeprefill import json_numbers
from edgeprefill.errors import EdgeprefillError, RequestError
from edgeprefill.sdk.token_bytes import TokenBytes

if TYPE_CHECKING:  # llguidance is imported when a constraint is first compiled
    from llguidance import LLMatcher, LLTokenizer

    from edgeprefill.sdk.tokenizer import BundleTokenizer


@dataclass(frozen=True)
class Constraint:
    """What the output must match. Build one with the constructors below."""

    kind: str  # a key of GRAMMARS
    source: str  # the schema (JSON text), pattern, options (JSON list) or grammar text
    # A lazy grammar leaves the text free until a trigger (strict tools under tool_choice
    # auto, server/strict_tools.py): a thinking budget may close the reasoning in that text.
    lazy: bool = False
    # The grammar holds the answer after the reply's think block, whose text is free
    # (sdk/think_first.py); the server sets it where it splits a reasoning model's reply.
    after_thinking: bool = False

    def __post_init__(self) -> None:
        if self.kind not in GRAMMARS:
            raise RequestError(f"unknown constraint kind {self.kind!r}; "
                               f"one of {', '.join(sorted(GRAMMARS))}")
        if not isinstance(self.source, str):
            raise RequestError("a constraint's source must be a string")

    @property
    def frees_reasoning(self) -> bool:
        """The reasoning's text is free under this grammar: a thinking budget may close
        it (the forced close is text the grammar takes)."""
        return self.lazy or self.after_thinking

    def thinking_first(self) -> Constraint:
        """This constraint held on the answer only, after the reply's think block."""
        return replace(self, after_thinking=True)

    @classmethod
    def json_schema(cls, schema: dict[str, Any], strict: bool = True) -> Constraint:
        """JSON matching `schema`. strict (OpenAI's meaning): no properties beyond those
        listed (llguidance always enforces the schema's own keywords)."""
        if not isinstance(schema, dict):
            raise RequestError("a JSON schema must be an object")
        if strict:
            schema = _no_extra_properties(schema)
        # A number a float cannot hold (a request's `1e400`) as written, never `Infinity`.
        return cls("json_schema", json_numbers.dumps_as_json(schema))

    @classmethod
    def json_object(cls) -> Constraint:
        """Any JSON object (OpenAI's `response_format: json_object`)."""
        return cls("json_schema", json.dumps({"type": "object"}))

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls("regex", _text(pattern, "regex"))

    @classmethod
    def choice(cls, options: Sequence[str]) -> Constraint:
        if isinstance(options, str) or not isinstance(options, Sequence):
            raise RequestError("choice needs a list of strings")
        options = list(options)
        if not options or not all(isinstance(o, str) and o for o in options):
            raise RequestError("choice needs a non-empty list of non-empty strings")
        return cls("choice", json.dumps(options))

    @classmethod
    def grammar(cls, text: str, lazy: bool = False) -> Constraint:
        """A grammar in llguidance's Lark syntax (`start: ...`); `lazy`: see the field."""
        return cls("grammar", _text(text, "grammar"), lazy)

    @classmethod
    def gbnf(cls, text: str) -> Constraint:
        """A llama.cpp GBNF grammar (`root ::= ...`), translated to Lark."""
        return cls("gbnf", _text(text, "grammar"))


def _text(value: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise RequestError(f"a {what} must be a non-empty string")
    return value


def _no_extra_properties(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of the schema where every object without an explicit additionalProperties
    refuses unknown keys (OpenAI's strict mode requires that of the schema)."""
    def walk(node: Any) -> Any:  # JSON data
        if isinstance(node, dict):
            node = {k: walk(v) for k, v in node.items()}
            if node.get("type") == "object" and "additionalProperties" not in node:
                node["additionalProperties"] = False
            return node
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node
    closed: dict[str, Any] = walk(schema)  # a dict in, a dict out
    return closed


# -- constraint -> llguidance grammar, by kind ------------------------------------------------


def _from_schema(source: str) -> str:
    from llguidance import LLMatcher

    # Compact separators: a random-weight model would otherwise pad with whitespace.
    try:
        return LLMatcher.grammar_from_json_schema(
            source, defaults={"whitespace_flexible": False})
    except ValueError as err:  # the schema's JSON is not JSON llguidance reads (1e400)
        raise RequestError(f"invalid json schema constraint: {_one_line(err)}") from None


def _from_regex(source: str) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_regex(source)


def _from_choice(source: str) -> str:
    from llguidance import LLMatcher

    alternatives = " | ".join(json.dumps(o) for o in json.loads(source))
    return LLMatcher.grammar_from_lark(f"start: {alternatives}")


def _from_lark(source: str) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_lark(source)


def _from_gbnf(source: str) -> str:
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        return LLMatcher.grammar_from_lark(gbnf_to_lark(source))
    except Exception as err:  # noqa: BLE001 - the translator raises plain exceptions
        raise RequestError(f"invalid GBNF grammar: {_one_line(err)}") from None


GRAMMARS: dict[str, Callable[[str], str]] = {
    "json_schema": _from_schema,
    "regex": _from_regex,
    "choice": _from_choice,
    "grammar": _from_lark,
    "gbnf": _from_gbnf,
}


# -- the per-request matcher -------------------------------------------------------------------


class MatcherError(EdgeprefillError):
    """llguidance refused a token its mask had allowed (the engine's fault)."""


class GrammarMask:
    """A constraint's state during one request (the sampler's TokenMask)."""

    def __init__(self, matcher: LLMatcher, first_banned: np.ndarray | None = None) -> None:
        """`first_banned`: token ids the reply may not begin with, whatever the grammar
        says (see after_space)."""
        self.matcher = matcher
        # The first mask is computed here, at submit: a grammar that compiles but admits
        # no first token (`start: start`, an empty regex class) is refused in one line
        # then, instead of failing the request at its first step.
        self._next: bytes | None = self._bitmask()
        if first_banned is not None and first_banned.size:
            bits = np.unpackbits(np.frombuffer(self._next, np.uint8), bitorder="little")
            bits[first_banned[first_banned < bits.shape[0]]] = 0
            self._next = np.packbits(bits, bitorder="little").tobytes()

    @property
    def opens(self) -> bool:
        """Whether some token may begin the reply (before its first step)."""
        return self._next is None or any(self._next)

    def _bitmask(self) -> bytes:
        bits = self.matcher.compute_bitmask()
        self._check()
        return bits

    def allowed(self, vocab: int) -> np.ndarray:
        """bool [vocab]: the tokens the grammar accepts next."""
        first, self._next = self._next, None
        bits = np.frombuffer(first if first is not None else self._bitmask(), np.uint8)
        allowed = np.unpackbits(bits, bitorder="little").view(bool)
        if allowed.shape[0] < vocab:  # logits wider than the tokenizer (padded heads)
            allowed = np.concatenate([allowed, np.zeros(vocab - allowed.shape[0], bool)])
        return allowed[:vocab]

    def accept(self, token: int) -> None:
        self.matcher.consume_token(token)
        error = self.matcher.get_error() if self.matcher.is_error() else None
        if error is not None and "doesn't satisfy the grammar" in error:
            # The token came from this matcher's own mask: refusing it is a disagreement
            # between llguidance and the tokenizer (how it tokenizes the bytes it forces on
            # a SentencePiece tokenizer), not the request's fault: the engine's 500.
            raise MatcherError("constraint: llguidance refused a token its own mask "
                               f"allowed: {_one_line(error)}")
        self._check()  # a limit of the grammar's own (a 5,000-way choice): the request's

    def takes(self, tokens: list[int]) -> bool:
        return self.matcher.validate_tokens(tokens) == len(tokens)

    @property
    def finished(self) -> bool:
        return self.matcher.is_stopped()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise RequestError(f"constraint: {_one_line(self.matcher.get_error())}",
                               "constraint")


def compile_constraint(constraint: Constraint, tokenizer: BundleTokenizer,
                       eos_ids: Sequence[int], opened: bool = False) -> GrammarMask:
    """A fresh matcher for one request; raises RequestError (one line) for a grammar
    that does not compile or a tokenizer llguidance cannot use. `opened`: the prompt
    left a think block open (read only for an `after_thinking` constraint)."""
    from llguidance import LLMatcher

    grammar = GRAMMARS[constraint.kind](constraint.source)
    if constraint.after_thinking:
        from edgeprefill.sdk.think_first import think_first

        grammar = think_first(grammar, opened, tokenizer.special_ids)
    ll_tokenizer, first_banned = _ll_tokenizer(tokenizer, tuple(sorted(eos_ids)))
    if first_banned is not None:  # the decoder strips the reply's first space
        grammar = after_space(grammar)
    matcher = LLMatcher(ll_tokenizer, grammar, log_level=0)
    kind = constraint.kind.replace("_", " ")
    if matcher.is_error():
        raise RequestError(f"invalid {kind} constraint: {_one_line(matcher.get_error())}")
    try:
        mask = GrammarMask(matcher, first_banned)
    except RequestError:
        raise RequestError(f"{kind} constraint fails at its first token: "
                           f"{_one_line(matcher.get_error())}") from None
    if not mask.opens:  # every opening the grammar allows reads other than its bytes
        raise RequestError(
            f"{kind} constraint cannot begin a reply with this tokenizer: its decoder drops "
            "the reply's first space, and no token that could begin this grammar's text "
            "reads as its bytes less that space (a vocabulary without a bare '▁')")
    return mask


SPACE_GRAMMAR = "leading_space"  # the wrapper's name in the composed grammar


def after_space(grammar: str) -> str:
    """`grammar` (Lark text, or llguidance's JSON of named grammars) after one space,
    composed as llguidance composes grammars: `start: " " @inner`.

    The decoder drops exactly that space, so the text the user gets is what the inner
    grammar matched, whatever it begins with: the bytes " jade" read "jade" and satisfy
    `[a-z]+`; the bytes "  jade" read " jade" and satisfy `.{5}`. (With the space
    optional, " jade" also satisfied `.{5}` and the user got four characters.)
    It needs llguidance to tokenize the bytes a grammar forces byte for byte
    (`_ExactBytes`): through the tokenizer's encode, which drops a leading space on these
    tokenizers, its mask for a forced " amber" offered `a`, which it then refused.
    And it needs the reply's first token to read as its bytes less exactly that space:
    Llama 2's decoder (Strip(start=1) after Fuse) always does so; a Metaspace decoder drops
    every `▁` of the first token and keeps a byte fallback space (`▁▁` read "", so `.{5}`
    got "jade"; `<0x20>` read " ", so `[a-z]+` got " jade"). The tokens that read
    otherwise may not open the reply (_ExactBytes.first_banned): where the grammar wants
    two spaces, `▁` then `▁jade` spells them as well, and every token after the first reads
    as its bytes."""
    return compose(grammar, SPACE_GRAMMAR, lambda inner: f'start: " " @{inner}')


def compose(grammar: str, name: str, outer: Callable[[str], str]) -> str:
    """`grammar` (Lark text, or llguidance's JSON of named grammars) inside an outer Lark
    grammar called `name`: `outer(inner)` is its text, which refers to `grammar` as
    `@inner`. llguidance's JSON of several grammars starts at the first."""
    top: Any = None
    if grammar.lstrip().startswith("{"):
        try:
            top = json.loads(grammar)
        except ValueError:
            top = None
    if not isinstance(top, dict) or not isinstance(top.get("grammars"), list):
        top = {"grammars": [{"lark_grammar": grammar}]}
    inner = [dict(g) for g in top["grammars"]]  # grammar_from_* names at most one
    inner_name = inner[0]["name"] = inner[0].get("name") or "constraint"
    wrapper = {"name": name, "lark_grammar": outer(inner_name)}
    return json.dumps({**top, "grammars": [wrapper, *inner]})


# llguidance's tokenizer takes ~1 s to build at a 152k vocabulary: one per bundle tokenizer.
# With it, the tokens a reply may not begin with where the decoder drops its first space.
_TOKENIZERS: weakref.WeakKeyDictionary[
    BundleTokenizer, tuple[tuple[int, ...], LLTokenizer, np.ndarray | None]
] = weakref.WeakKeyDictionary()


def _ll_tokenizer(tokenizer: BundleTokenizer,
                  eos_ids: tuple[int, ...]) -> tuple[LLTokenizer, np.ndarray | None]:
    """llguidance's tokenizer for the bundle and, where decoding strips the space that
    begins a reply, the token ids the reply may not begin with (see after_space); None
    where it keeps that space."""
    cached = _TOKENIZERS.get(tokenizer)
    if cached is not None and cached[0] == eos_ids:
        return cached[1], cached[2]
    from llguidance import LLTokenizer

    backend = getattr(tokenizer, "tokenizer", None)
    if backend is None:
        raise RequestError("constrained output needs the bundle's tokenizer.json")
    text: str = backend.to_str()
    data = json.loads(text)
    spell = TokenBytes(backend, data)
    first_banned = None
    try:
        if spell.strips_first_space():
            from llguidance._tokenizer import TokenizerWrapper

            exact = _ExactBytes(spell, tokenizer.vocab_size, eos_ids)
            built = LLTokenizer(TokenizerWrapper(exact), n_vocab=tokenizer.vocab_size,
                                eos_token=list(eos_ids))
            first_banned = exact.first_banned
        else:
            built = LLTokenizer(_plain_added_tokens_in_vocab(text, data, spell),
                                n_vocab=tokenizer.vocab_size, eos_token=list(eos_ids))
    except ValueError as err:
        raise RequestError(
            "constrained output needs a byte-level or byte-fallback tokenizer; this "
            f"bundle's cannot spell arbitrary text ({_one_line(err)})") from None
    _TOKENIZERS[tokenizer] = (eos_ids, built, first_banned)
    return built, first_banned


class _ExactBytes:
    """The tokenizer llguidance sees where decoding strips a reply's first space
    (SentencePiece style): every token's own bytes, and text tokenized byte for byte,
    greedily by the longest token. llguidance tokenizes the bytes a grammar forces with
    it; the tokenizer's own encode drops a leading space (" amber" became `a m b e r`,
    which llguidance then refused), and its normalizer may rewrite whitespace. Greedy is
    not always the model's own split, but it spells exactly the bytes asked for.

    A text's first token is never one of first_banned: where the grammar forces the
    reply's first bytes, llguidance's mask offers only the first token of their
    tokenization (forced "   x" offered `▁▁▁` alone, forced " " then a letter `<0x20>`
    alone), which GrammarMask then refuses. `▁` then `▁▁` spells those bytes as well."""

    def __init__(self, spell: TokenBytes, vocab_size: int, eos_ids: tuple[int, ...]) -> None:
        self.eos_token_id = eos_ids[0] if eos_ids else None
        self.bos_token_id = None  # llguidance asks for it; constraints never use it
        self.special_token_ids = sorted(i for i, token in
                                        spell.tokenizer.get_added_tokens_decoder().items()
                                        if token.special)
        self.tokens = [spell(i) for i in range(vocab_size)]
        special = set(self.special_token_ids)
        # The tokens after_space's grammar may open with (bytes " ...") that the decoder
        # reads as other than those bytes less the one space it drops first in a text.
        banned = [i for i, piece in enumerate(self.tokens) if piece.startswith(b" ")
                  and i not in special and not spell.opens_one_space_short(i)]
        self.first_banned = np.array(banned, np.int64)
        self.by_bytes = self._by_bytes(special)
        self.opening = self._by_bytes(special | set(banned))  # for a text's first token
        self.longest = max(map(len, self.by_bytes), default=1)

    def _by_bytes(self, left_out: set[int]) -> dict[bytes, int]:
        """bytes -> the first token with them, of those not left out."""
        by_bytes: dict[bytes, int] = {}
        for i, piece in enumerate(self.tokens):
            if piece and i not in left_out:
                by_bytes.setdefault(piece, i)
        return by_bytes

    def __call__(self, text: bytes | str) -> list[int]:
        data = text.encode() if isinstance(text, str) else text
        ids: list[int] = []
        at = 0
        while at < len(data):
            token, n = self._longest(data, at, self.opening if at == 0 else self.by_bytes)
            if token is None and at == 0:  # no allowed opening spells it: any token
                token, n = self._longest(data, at, self.by_bytes)
            if token is None:  # a byte no token spells: llguidance refuses such a tokenizer
                raise ValueError(f"no token spells the byte {data[at]:#04x}")
            ids.append(token)
            at += n
        return ids

    def _longest(self, data: bytes, at: int,
                 by_bytes: dict[bytes, int]) -> tuple[int | None, int]:
        """The longest token of `by_bytes` that data[at:] begins with, and its length."""
        for n in range(min(self.longest, len(data) - at), 0, -1):
            token = by_bytes.get(data[at:at + n])
            if token is not None:
                return token, n
        return None, 0


def _plain_added_tokens_in_vocab(text: str, data: dict[str, Any], spell: TokenBytes) -> str:
    """The tokenizer as llguidance should see it. llguidance takes every added token for
    a special one, which no text spells; yet a non-special added token (Qwen's <tool_call>,
    <think>) is ordinary text, and tokenizing forced text yields it: its mask then allowed
    only that token and consuming it failed (a 500 for guided_regex "<tool_call>"). Such
    tokens move into the model's vocabulary, spelled as the model spells its pieces
    (TokenBytes.piece: the decoder's reading, reversed). A BPE or WordPiece vocabulary
    maps pieces to ids; a Unigram one (XGLM, mBART, T5) is a list whose index is the id."""
    vocab = (data.get("model") or {}).get("vocab")
    added = data.get("added_tokens") or []
    plain = [t for t in added if not t.get("special")]
    if not plain or not (isinstance(vocab, dict) or _extend_unigram(vocab, added, spell)):
        return text
    if isinstance(vocab, dict):
        for token in plain:
            vocab.setdefault(spell.piece(token["content"]), token["id"])
    data["added_tokens"] = [t for t in added if t.get("special")]
    return json.dumps(data)


def _extend_unigram(vocab: Any, added: list[dict[str, Any]], spell: TokenBytes) -> bool:
    """A Unigram vocabulary ([[piece, score], ...]) extended to hold every added token at
    its id: a plain one spelled as a piece, a special one as its content (it stays an
    added token, as XGLM's <s> is both). Score 0, SentencePiece's for user-defined pieces.
    False, the vocabulary unchanged, where it is no list or some id below the largest
    added one has no token (nothing could stand there)."""
    if not isinstance(vocab, list):
        return False
    by_id = {t["id"]: t for t in added}
    ids = range(len(vocab), max(by_id) + 1)
    if any(i not in by_id for i in ids):
        return False
    for i in ids:
        token = by_id[i]
        content = token["content"]
        vocab.append([content if token.get("special") else spell.piece(content), 0.0])
    return True


# _ExactBytes' refusal of text it cannot spell, as llguidance reports it: inside its panic
# message, with the Python traceback of the callback that raised it.
UNSPELLABLE = re.compile(r"no token spells the byte (0x[0-9a-f]{2})")


def _one_line(err: object) -> str:
    # llguidance appends a dump of its parser state after "<state>": not for the client.
    text = str(err).split("<state>")[0]
    unspellable = UNSPELLABLE.search(text)
    if unspellable is not None:  # a vocabulary without byte fallback (XGLM's)
        return (f"it needs the byte {unspellable.group(1)}, which no token of this "
                "tokenizer spells (a vocabulary without byte fallback)")
    return " ".join(text.split())[:300]
