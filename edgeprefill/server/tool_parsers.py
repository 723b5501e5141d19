"""Tool calls in a model's reply text, per call format, whole or as the text streams in.

    hermes       `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number,
                 between ordinary text (ChatML / Hermes / Qwen2, Qwen2.5, Qwen3)
    llama3_json  the whole reply is `{"name": ..., "parameters": {...}}` (Llama 3.1-3.3;
                 several calls separated by `;`)
    mistral      `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, text may come
                 first; the marker, a special token in current tokenizers, stays in the
                 reply's text (sdk/tokenizer.py's KEPT_SPECIAL_TOKENS), and a reply that
                 is such a JSON list alone counts too
    forced_named, forced_required
                 what `tool_choice` forces through a JSON-schema constraint (as vLLM
                 does): the arguments object of the named function, or a JSON list of
                 `{"name", "parameters"}`

A parser never loses text: whatever does not parse as a call stays content.

Arguments are read and written by edgeprefill/json_numbers.py, so that they are always
JSON: a number a float cannot hold (`1e400`) keeps the text the model wrote, and `NaN` or
`Infinity`, not JSON, make a call whose arguments are parsed invalid as any other invalid
JSON would (it stays text; a Python or XML value spelled so is not a number: a pythonic
call stays text, an XML value is a string). So do arguments nested deeper than
json_numbers.MAX_DEPTH, in any format. Arguments that stream as they are generated
are the model's text as written (a call whose arguments are not JSON, for whatever reason,
does not end the reply with finish_reason `tool_calls`: server/responses.py).
"""

from __future__ import annotations

import ast
import json
import math
import re
import uuid
from abc import ABC, abstractmethod
from decimal import Decimal
from typing import Any, NamedTuple

from edgeprefill import json_numbers
from edgeprefill.json_numbers import WrittenNumber
from edgeprefill.sdk.reasoning_split import partial_suffix


class ToolCall(NamedTuple):
    name: str
    arguments: str  # a JSON object, as text (OpenAI's `function.arguments`)
    id: str

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class Parsed(NamedTuple):
    content: str  # the text around the calls (may be empty)
    calls: list[ToolCall]


class Piece(NamedTuple):
    """One step of a streamed reply: text to show, a whole tool call, the start of a call
    (its id and name; the arguments follow), or more arguments of the call begun last."""

    text: str = ""
    call: ToolCall | None = None
    begin: ToolCall | None = None  # arguments "" so far
    arguments: str = ""

    @property
    def empty(self) -> bool:
        return not (self.text or self.call or self.begin or self.arguments)


def assemble(pieces: list[Piece]) -> Parsed:
    """The content and calls the pieces of a reply add up to."""
    content: list[str] = []
    calls: list[ToolCall] = []
    for piece in pieces:
        if piece.call is not None or piece.begin is not None:
            calls.append(piece.call or piece.begin)  # type: ignore[arg-type]
        elif piece.arguments:
            calls[-1] = calls[-1]._replace(arguments=calls[-1].arguments + piece.arguments)
        else:
            content.append(piece.text)
    return Parsed("".join(content), calls)


def new_call(name: str, arguments: Any, short_id: bool = False,
             given_id: Any = None) -> ToolCall:
    """`short_id`: Mistral's templates refuse any id but 9 letters or digits (and its
    models write their own, kept when they are such)."""
    text = arguments if isinstance(arguments, str) else json_numbers.dumps(arguments)
    if short_id:
        valid = isinstance(given_id, str) and len(given_id) == 9 and given_id.isalnum()
        return ToolCall(name, text, given_id if valid else uuid.uuid4().hex[:9])
    return ToolCall(name, text, f"call_{uuid.uuid4().hex[:24]}")


def _call_from(obj: Any, argument_keys: tuple[str, ...], short_id: bool = False
               ) -> ToolCall | None:
    """`{"name": str, <one of argument_keys>: object}` -> a call; anything else -> None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = next((obj[k] for k in argument_keys if k in obj), {})
    if isinstance(arguments, str):  # some models double-encode: accept it if it is JSON
        try:
            arguments = json_numbers.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict) or too_deep(arguments):
        return None
    return new_call(obj["name"], arguments, short_id, obj.get("id"))


# Calls read as JSON text nest their arguments in a call object, in a list of calls (Mistral,
# a forced `required`): read so deep, then the arguments themselves are held to MAX_DEPTH.
CALLS_DEPTH = json_numbers.MAX_DEPTH + 2


def too_deep(arguments: dict[str, Any]) -> bool:
    """Arguments nested deeper than json_numbers.MAX_DEPTH (a Python literal's, an XML
    value's or inside a call object): no call, as a client sending them back would get a
    400 (server/history_arguments.py)."""
    return json_numbers.depth(arguments) > json_numbers.MAX_DEPTH


class ToolParser(ABC):
    """Parses one reply. `feed` takes text as it streams and returns the pieces now
    certain; `finish` returns the rest. `parse` does a whole text at once."""

    short_ids = False  # call ids as Mistral's templates require (tools.parser_factory)
    # tool name -> its parameters' JSON schema, for formats whose arguments are untyped
    # text (XmlParser); set by tools.parser_factory
    schemas: dict[str, Any] = {}

    def parse(self, text: str) -> Parsed:
        return assemble([*self.feed(text), *self.finish()])

    @abstractmethod
    def feed(self, text: str) -> list[Piece]: ...

    @abstractmethod
    def finish(self) -> list[Piece]: ...


class TaggedParser(ToolParser):
    """Calls wrapped in an open and a close tag, ordinary text around them (hermes).
    Blanks before a call and at the end of the reply are dropped.

    Streamed, a call that starts `{"name": "...", "arguments": {` is sent as soon as its
    name is known and its arguments follow as they are generated (as OpenAI streams
    them); any other call is sent whole at its close tag, or stays text if its JSON does
    not parse. A whole reply (`parse`) is parsed the same way, so that it is the streamed
    reply's sum: a call cut short (max_tokens) is a call with the arguments it got."""

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    argument_keys = ("arguments", "parameters")
    # The start of a call whose arguments can stream: the name, then an arguments object.
    head = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*'
                      r'"(?:arguments|parameters)"\s*:\s*(?=\{)')

    def __init__(self) -> None:
        self.buffer = ""  # text not yet returned
        self.inside = False  # between an open tag and its close tag
        self.scan: _ObjectScan | None = None  # the streaming call's arguments, once begun

    def feed(self, text: str) -> list[Piece]:
        self.buffer += text
        pieces: list[Piece] = []
        while self._inside_step(pieces) if self.inside else self._outside_step(pieces):
            pass
        if not self.inside:
            # Show the text up to its last non-blank character, keeping back what may
            # begin an open tag: blanks right before a call are dropped, wherever the
            # stream happens to be cut.
            cut = len(self.buffer) - partial_suffix(self.buffer, self.open_tag)
            end = len(self.buffer[:cut].rstrip())
            pieces.append(Piece(self.buffer[:end]))
            self.buffer = self.buffer[end:]
        return [p for p in pieces if not p.empty]

    def finish(self) -> list[Piece]:
        rest, self.buffer = self.buffer, ""
        if self.inside:  # the reply ended inside a call: a call if it is one, else text
            self.inside = False
            return [] if self.scan is not None else self._calls_or_text(rest, closed=False)
        return [Piece(rest)] if rest.strip() else []

    def _outside_step(self, pieces: list[Piece]) -> bool:
        """Take the text up to an open tag, if there is one; True if something changed."""
        at = self.buffer.find(self.open_tag)
        if at < 0:
            return False
        pieces.append(Piece(self.buffer[:at].rstrip()))
        self.buffer = self.buffer[at + len(self.open_tag):]
        self.inside, self.scan = True, None
        return True

    def _inside_step(self, pieces: list[Piece]) -> bool:
        """Inside a call: begin it, stream its arguments, or end it at the close tag."""
        if self.scan is None:
            match = self.head.match(self.buffer)
            if match:
                pieces.append(Piece(begin=new_call(json.loads(match.group(1)), "",
                                                   self.short_ids)))
                self.buffer, self.scan = self.buffer[match.end():], _ObjectScan()
                return True
        close = self.buffer.find(self.close_tag)
        if self.scan is not None and not self.scan.done:
            limit = close if close >= 0 else len(self.buffer)
            taken = self.scan.consume(self.buffer[:limit])
            if taken:
                pieces.append(Piece(arguments=self.buffer[:taken]))
                self.buffer = self.buffer[taken:]
                return True
        if close < 0:
            return False
        body, self.buffer = self.buffer[:close], self.buffer[close + len(self.close_tag):]
        if self.scan is None:
            pieces.extend(self._calls_or_text(body, closed=True))
        self.inside, self.scan = False, None
        return True

    def _calls_or_text(self, body: str, closed: bool) -> list[Piece]:
        calls = self.calls(body)
        if calls is None:
            return [Piece(f"{self.open_tag}{body}{self.close_tag if closed else ''}")]
        return [Piece(call=call) for call in calls]

    def calls(self, body: str) -> list[ToolCall] | None:
        """The calls between one open and close tag, or None if it is not calls."""
        try:
            call = _call_from(json_numbers.loads(body, CALLS_DEPTH), self.argument_keys,
                              self.short_ids)
        except ValueError:
            return None
        return None if call is None else [call]


class PythonicParser(TaggedParser):
    """LFM2's calls: a Python list of calls with keyword arguments between its tags,
    `<|tool_call_start|>[get_weather(city="Paris"), get_time()]<|tool_call_end|>`, ordinary
    text around them (llama.cpp and sglang read it so). The tags are special tokens the
    detokenizer keeps (sdk/tokenizer.py, KEPT_SPECIAL_TOKENS). Python's arguments are not
    JSON as they stream, so each call is sent whole at the close tag. A list of JSON call
    objects between the tags, which these models also write, counts too."""

    open_tag = "<|tool_call_start|>"
    close_tag = "<|tool_call_end|>"
    head = re.compile(r"(?!)")  # never streams arguments

    source = ""  # the calls' text, where their literals are read (`_literal`)

    def calls(self, body: str) -> list[ToolCall] | None:
        self.source = body.strip()
        try:
            tree = ast.parse(self.source, mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        nodes = tree.elts if isinstance(tree, ast.List) else [tree]
        calls = [self._call(node) for node in nodes]
        return None if not calls or None in calls else calls  # type: ignore[return-value]

    def _call(self, node: ast.expr) -> ToolCall | None:
        try:
            if isinstance(node, ast.Dict):  # a JSON call object
                return _call_from(_literal(node, self.source), ("arguments", "parameters"))
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                return None
            names = [k.arg for k in node.keywords]
            if node.args or None in names or len(set(names)) != len(names):
                return None  # positional arguments, **kwargs, or a name twice
            arguments = {k.arg: _literal(k.value, self.source) for k in node.keywords}
            return None if too_deep(arguments) else new_call(node.func.id, arguments)
        except (TypeError, ValueError):  # not a literal, or one JSON cannot hold (a set)
            return None


class XmlParser(TaggedParser):
    """Qwen3.5's and Qwen3-Coder's calls: XML between hermes' tags, each argument's value
    as plain text,

        <tool_call>
        <function=get_weather>
        <parameter=city>
        Paris
        </parameter>
        </function>
        </tool_call>

    (vLLM's qwen3_xml / qwen3_coder). A value is typed by the tool's parameter schema, as
    vLLM types it: strings stay text, integers, numbers and booleans are read as such,
    objects and arrays as JSON (else a Python literal); `null` is null. A parameter the
    schema does not list stays text. Each call is sent whole at its close tag."""

    head = re.compile(r"(?!)")  # the arguments are not JSON as they stream

    def calls(self, body: str) -> list[ToolCall] | None:
        functions = list(XML_FUNCTION.finditer(body))
        if not functions or XML_FUNCTION.sub("", body).strip():
            return None  # not calls alone (or a call cut short)
        calls = [self._call(f[1].strip(), f[2]) for f in functions]
        return None if None in calls else calls  # type: ignore[return-value]

    def _call(self, name: str, inner: str) -> ToolCall | None:
        parameters = list(XML_PARAMETER.finditer(inner))
        if XML_PARAMETER.sub("", inner).strip():
            return None
        schema = self.schemas.get(name, {}).get("properties", {})
        arguments: dict[str, Any] = {}
        for parameter in parameters:
            key = parameter[1].strip()
            if key in arguments:
                return None
            value = parameter[2].removeprefix("\n").removesuffix("\n")
            arguments[key] = _typed(value, schema.get(key))
        return None if too_deep(arguments) else new_call(name, arguments, self.short_ids)


XML_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def _typed(value: str, schema: Any) -> Any:
    """An XML parameter's text as the value its schema's type says (vLLM's reading)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if value.strip().lower() == "null":
        return None
    if kind is None or kind == "string":
        return value
    text = value.strip()
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            return _xml_number(text)
        if kind == "boolean":
            return {"true": True, "false": False}[text.lower()]
        return json_numbers.loads(text)
    except (ValueError, KeyError):
        pass
    try:
        return _literal(ast.parse(text, mode="eval").body, text)
    except (ValueError, SyntaxError, RecursionError, MemoryError):
        return value


def _xml_number(text: str) -> Any:
    """A number parameter's value: JSON's number (a float cannot hold: kept as written),
    else Python's reading of it ("+5", "1_000"), finite; ValueError otherwise (`nan`,
    `inf`: JSON has no such number)."""
    try:
        return json_numbers.number(text)
    except ValueError:
        number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text!r} is not a JSON number")
    return int(number) if number.is_integer() and "." not in text and "e" not in \
        text.lower() else number


class _JsonValues(ast.NodeTransformer):
    """JSON's true, false and null as the Python constants the model meant, and a float
    literal a float cannot hold (`1e400`, read as inf) as the number it wrote
    (json_numbers.WrittenNumber) in JSON's spelling, its sign included."""

    VALUES = {"true": True, "false": False, "null": None}

    def __init__(self, source: str) -> None:
        self.source = source

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.VALUES:
            return ast.copy_location(ast.Constant(self.VALUES[node.id]), node)
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if not isinstance(node.value, float) or (math.isfinite(node.value) and node.value):
            return node  # a float that holds its literal (inf or 0.0 may not)
        text = ast.get_source_segment(self.source, node)
        if text is None:  # no position to read its text from: not a number kept as inf
            raise ValueError("a number a float cannot hold, its text unknown")
        written = json_numbers.loads(_json_spelling(text))
        return ast.copy_location(ast.Constant(written), node) \
            if isinstance(written, WrittenNumber) else node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        node = self.generic_visit(node)  # type: ignore[assignment]
        value = getattr(node.operand, "value", None)
        if not isinstance(value, WrittenNumber) or value.text.startswith("-") or \
                not isinstance(node.op, (ast.USub, ast.UAdd)):
            return node  # literal_eval reads it, or refuses it as it would a float
        sign = "-" if isinstance(node.op, ast.USub) else ""
        return ast.copy_location(ast.Constant(WrittenNumber(sign + value.text)), node)


def _json_spelling(text: str) -> str:
    """A Python float literal (`1_0e400`, `.5e400`) as a JSON number's text."""
    text = text.replace("_", "")
    return text if json_numbers.JSON_NUMBER.fullmatch(text) else str(Decimal(text))


def _literal(node: ast.expr, source: str) -> Any:
    """A Python (or JSON) literal's value, `node` read from `source`; ValueError where it
    is not one."""
    try:
        return ast.literal_eval(_JsonValues(source).visit(node))
    except (SyntaxError, RecursionError, MemoryError) as err:
        raise ValueError("not a literal") from err


class _ObjectScan:
    """Finds where a JSON object ends in text that arrives in pieces (strings aware)."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.done = False

    def consume(self, text: str) -> int:
        """How many characters of `text` still belong to the object."""
        for i, char in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return i + 1
        return len(text)


def _blanks(text: str, at: int) -> int:
    """Past the blanks from `at`."""
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _closes(text: str) -> bool:
    """Whether the JSON object or list `text` opens with closes in it (strings aware): a
    reply that ends before it is cut short."""
    scan = _ObjectScan()
    scan.consume(text)
    return scan.done


class WholeReplyParser(ToolParser):
    """A reply that is entirely calls when it starts with one of `starts` (after blanks);
    otherwise plain text, streamed as it comes."""

    starts: tuple[str, ...] = ("{",)
    argument_keys: tuple[str, ...] = ("parameters", "arguments")
    separators = ";"  # between several calls

    def __init__(self) -> None:
        self.buffer = ""
        self.mode: str | None = None  # None: undecided; "text" or "calls"

    def feed(self, text: str) -> list[Piece]:
        if self.mode == "text":
            return [Piece(text)] if text else []
        self.buffer += text
        head = self.buffer.lstrip()
        if self.mode is None and head:
            if any(s.startswith(head) or head.startswith(s) for s in self.starts):
                if any(head.startswith(s) for s in self.starts):
                    self.mode = "calls"
                return []  # still possibly a call: hold the text
            self.mode = "text"
            rest, self.buffer = self.buffer, ""
            return [Piece(rest)]
        return []

    def finish(self) -> list[Piece]:
        rest, self.buffer = self.buffer, ""
        if self.mode == "text" or not rest:
            return [Piece(rest)] if rest else []
        calls = self.calls(rest.strip())
        if calls is None:
            calls = self.cut_short(rest.strip())
        if calls is None:
            return [Piece(rest)]
        return [Piece(call=c) for c in calls]

    def cut_short(self, text: str) -> list[ToolCall] | None:
        """The calls of a reply that is calls by construction (a forced tool_choice's) but
        ended early (max_tokens): those it holds, the last with the arguments it got, as a
        streamed call cut short (TaggedParser). None: the reply is text."""
        return None

    def calls(self, text: str) -> list[ToolCall] | None:
        """The calls of a whole reply, or None if it is not (entirely) calls."""
        objects = _json_values(text, self.separators)
        if objects is None:
            return None
        calls = [_call_from(o, self.argument_keys, self.short_ids) for o in objects]
        return None if not calls or None in calls else calls  # type: ignore[return-value]


class Llama3JsonParser(WholeReplyParser):
    starts = ("{", "<|python_tag|>")

    def calls(self, text: str) -> list[ToolCall] | None:
        return super().calls(text.removeprefix("<|python_tag|>").strip())


class MistralParser(WholeReplyParser):
    """Calls after `[TOOL_CALLS]`, also where text comes first ("Sure. [TOOL_CALLS] [...]",
    as vLLM parses it): the text is shown, the calls parsed at the end. A group of calls is
    a JSON list (Mistral's tokenizers before v11) or, from v11 on (Mistral Small 3.1+,
    Ministral 3, Devstral, Magistral), `name[ARGS]{...}` with an optional `[CALL_ID]id`
    before `[ARGS]`; groups follow each other, each after its marker, and text after the
    last group is content (it made the whole reply text)."""

    starts = ("[TOOL_CALLS]", "[{")
    argument_keys = ("arguments", "parameters")
    marker = "[TOOL_CALLS]"
    v11_head = re.compile(r"([A-Za-z0-9_.:-]{1,64})(?:\[CALL_ID\]([A-Za-z0-9]+))?\[ARGS\]")

    def feed(self, text: str) -> list[Piece]:
        if self.mode is None:
            pieces = super().feed(text)
            if self.mode != "text":
                return pieces
            text = "".join(p.text for p in pieces)  # known now not to open with a call
        if self.mode != "text":
            return super().feed(text)
        self.buffer += text
        at = self.buffer.find(self.marker)
        if at >= 0:  # the calls start here: what came before is the reply's text
            before, self.buffer, self.mode = self.buffer[:at], self.buffer[at:], "calls"
            return [Piece(before.rstrip())] if before.strip() else []
        # Up to the last non-blank, keeping back what may begin the marker: blanks right
        # before the calls are dropped, wherever the stream is cut (as TaggedParser).
        cut = len(self.buffer) - partial_suffix(self.buffer, self.marker)
        cut = len(self.buffer[:cut].rstrip())
        shown, self.buffer = self.buffer[:cut], self.buffer[cut:]
        return [Piece(shown)] if shown else []

    def finish(self) -> list[Piece]:
        rest, self.buffer = self.buffer, ""
        if self.mode == "text" or not rest:
            return [Piece(rest)] if rest else []
        found = self._calls_then_text(rest.strip())
        if found is None:  # no call: a forced reply cut short, else the reply is text
            calls = self.cut_short(rest.strip())
            return [Piece(rest)] if calls is None else [Piece(call=c) for c in calls]
        calls, after = found
        return [*(Piece(call=c) for c in calls), *([Piece(after)] if after else [])]

    def calls(self, text: str) -> list[ToolCall] | None:
        found = self._calls_then_text(text.strip())
        return None if found is None or found[1] else found[0]

    def _calls_then_text(self, text: str) -> tuple[list[ToolCall], str] | None:
        """The groups of calls the text opens with (the first may lack its marker: `[{`),
        and the text after the last; None where it opens with none."""
        calls: list[ToolCall] = []
        at = 0
        while True:
            start = at = _blanks(text, at)
            if text.startswith(self.marker, at):
                at = _blanks(text, at + len(self.marker))
            elif calls:
                break
            group = self._group(text, at)
            if group is None:  # a marker, or text, that no call follows
                if not calls:
                    return None
                at = start
                break
            found, at = group
            calls += found
        return calls, text[at:].strip()

    def _group(self, text: str, at: int) -> tuple[list[ToolCall], int] | None:
        """The calls of one group at `at`, and where it ends; None if none is there."""
        head = self.v11_head.match(text, at)
        try:
            value, end = json_numbers.raw_decode(text, head.end() if head else at,
                                                 CALLS_DEPTH)
        except ValueError:
            return None
        if head is not None:  # v11+: the arguments object alone
            if not isinstance(value, dict) or too_deep(value):
                return None
            return [new_call(head.group(1), value, self.short_ids, head.group(2))], end
        values = value if isinstance(value, list) else [value]
        calls = [_call_from(v, self.argument_keys, self.short_ids) for v in values]
        if not calls or None in calls:
            return None
        return calls, end  # type: ignore[return-value]


class ForcedNamedParser(WholeReplyParser):
    """`tool_choice` named a function: the whole reply is its arguments object."""

    starts = ("",)

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def calls(self, text: str) -> list[ToolCall] | None:
        try:
            arguments = json_numbers.loads(text)
        except ValueError:
            return None
        if not isinstance(arguments, dict):
            return None
        return [new_call(self.name, arguments, self.short_ids)]

    def cut_short(self, text: str) -> list[ToolCall] | None:
        """The function's call with the arguments the reply got before it ended (an object
        that closes but does not parse, NaN in it, is no call: text)."""
        if not text.startswith("{") or _closes(text):
            return None
        return [new_call(self.name, text, self.short_ids)]


class ForcedRequiredParser(MistralParser):
    """`tool_choice: "required"`: the whole reply is a JSON list of calls."""

    starts = ("",)
    argument_keys = ("parameters",)
    # A call of the list cut short: its name (whole), then its arguments as far as they got.
    head = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")(\s*,\s*"parameters"\s*:\s*)?')

    def cut_short(self, text: str) -> list[ToolCall] | None:
        """The list's whole calls, then the one it ended in, if its name is whole. A call
        that closes but is none (NaN or too deep in its arguments) makes the reply text,
        as a whole reply's would."""
        if not text.startswith("[") or _closes(text):
            return None
        calls, at = [], 1
        skip = re.compile(r"[\s,]*")
        while True:
            at = skip.match(text, at).end()  # type: ignore[union-attr]
            if at == len(text):
                return calls
            if not _closes(text[at:]):
                break  # the call the reply ended in
            try:
                value, at = json_numbers.raw_decode(text, at, CALLS_DEPTH)
            except ValueError:
                return None
            call = _call_from(value, self.argument_keys, self.short_ids)
            if call is None:
                return None
            calls.append(call)
        match = self.head.match(text, at)
        if match:  # its arguments: none yet unless their key is whole
            got = text[match.end():] if match.group(2) else ""
            calls.append(new_call(json.loads(match.group(1)), got, self.short_ids))
        return calls


class FirstCallOnly(ToolParser):
    """`parallel_tool_calls: false`: the reply's first call, and its text; any later call
    is dropped, streamed or whole (OpenAI allows one call per reply then)."""

    def __init__(self, inner: ToolParser) -> None:
        self.inner = inner
        self.calls = 0

    def feed(self, text: str) -> list[Piece]:
        return self._first(self.inner.feed(text))

    def finish(self) -> list[Piece]:
        return self._first(self.inner.finish())

    def _first(self, pieces: list[Piece]) -> list[Piece]:
        kept = []
        for piece in pieces:
            if piece.call is not None or piece.begin is not None:
                self.calls += 1
            if self.calls > 1 and (piece.call or piece.begin or piece.arguments):
                continue
            kept.append(piece)
        return kept


PARSERS: dict[str, type[ToolParser]] = {
    "hermes": TaggedParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
    "pythonic": PythonicParser,
    "qwen3_xml": XmlParser,
}


def _json_values(text: str, separators: str) -> list[Any] | None:
    """JSON values one after another, optionally separated by `separators`; None if
    anything else is in the text."""
    values, at = [], 0
    skip = re.compile(rf"[\s{re.escape(separators)}]*")
    while True:
        at = skip.match(text, at).end()  # type: ignore[union-attr]
        if at == len(text):
            return values
        try:
            value, at = json_numbers.raw_decode(text, at, CALLS_DEPTH)
        except ValueError:
            return None
        values.append(value)
