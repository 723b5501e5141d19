"""`edgeprefill run --interactive`: a multi-turn chat in the terminal.

Lines starting with `/` are commands handled here and never sent to the model. Ctrl-C
while a reply is printed stops that reply (the request is cancelled and its KV slot
freed) and the chat goes on; Ctrl-C at the prompt clears the line; Ctrl-D or /exit
quits. On a terminal the line has readline's editing and a history kept across runs.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import click

from edgeprefill.cli.report import request_line
from edgeprefill.cli.thinking import ThinkingView, assistant_message, show_reply, think_kwargs
from edgeprefill.errors import RequestError
from edgeprefill.sdk import Engine, GenerationParams
from edgeprefill.sdk.session import Session
from edgeprefill.sdk.stream import TokenStream

HISTORY = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / \
    "edgeprefill" / "chat_history"
HISTORY_LINES = 1000


class Command(NamedTuple):
    handler: Callable[[ChatLoop, str], bool]  # False: leave the chat
    usage: str
    help: str


class ChatLoop:
    """Reads a line, answers it, repeats. `read` and `write` are injectable so the loop
    can be driven without a terminal (tests, embedding)."""

    def __init__(
        self, engine: Engine, params: GenerationParams, system: str | None = None,
        stats: bool = False, chat: bool = False,
        read: Callable[[], str] | None = None, write: Callable[[str], None] | None = None,
        view: ThinkingView | None = None, think: bool | None = None,
    ) -> None:
        """`view`: how a reasoning model's thinking is shown (default: apart, plain);
        `think`: the chat template's enable_thinking (None: the template's default)."""
        self.engine = engine
        self.params = params
        self.system = system
        self.stats = stats
        # Raw text turns only for a bundle without a template, and never with a system message.
        self.use_chat = chat or system is not None or \
            engine.manifest.tokenizer.chat_template is not None
        self.read = read or _terminal_reader()
        self.write = write or (lambda text: click.echo(text, nl=False))
        self.view = view or ThinkingView.of(engine.tokenizer, hide=False, styled=False)
        self.think = think
        self.session = self._new_session()
        self.first_turn = True
        self.ctrl_c = CtrlC()

    def run(self) -> None:
        _note("edgeprefill chat: type a message; /help lists the commands, /exit quits")
        previous = _handle_sigint(self.ctrl_c)
        try:
            while self._one_line():
                pass
        finally:
            self.session.close()
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _one_line(self) -> bool:
        try:
            self.ctrl_c.at_prompt = True
            text = self.read()
        except EOFError:
            return False
        except KeyboardInterrupt:  # at the prompt: drop the line, keep the chat
            _note("\n(/exit or Ctrl-D quits)")
            return True
        finally:
            self.ctrl_c.new_turn()
        if not text.strip():
            return True
        if text.startswith("/"):  # before the strip: " /x" sends "/x" to the model
            return self._command(text.strip())
        self._reply(text.strip())
        return True

    def _command(self, text: str) -> bool:
        name, _, argument = text.partition(" ")
        command = COMMANDS.get(name)
        if command is None:
            _note(f"unknown command {name}; /help lists them (start a message with a space "
                  "to send a '/' to the model)")
            return True
        return command.handler(self, argument.strip())

    def _reply(self, text: str) -> None:
        try:
            stream = self._submit(text)
        except RequestError as err:  # the conversation stays as it was: keep chatting
            _note(f"error: {err}" + ("; /reset starts a new conversation"
                                     if "context" in str(err) else ""))
            return
        self.ctrl_c.reply(stream)
        _note("model> ", newline=False)
        parser = self.view.parser(self.engine.tokenizer, self.session.last_prompt,
                                  self.use_chat)
        try:
            show_reply(stream, self.write, self.view, parser)
        except KeyboardInterrupt:  # raised by `write`, or off the main thread (no CtrlC)
            stream.cancel()
            stream.result()  # wait for the cancel, so the next turn can start
            self.write("\n")
        if stream.finish_reason == "cancelled":
            _note("(reply stopped)")
        if self.stats:
            _note(request_line(stream.metrics))

    def _submit(self, text: str) -> TokenStream:
        if not self.use_chat:
            return self.session.generate(text, self.params)
        messages = [{"role": "user", "content": text}]
        if self.first_turn and self.system is not None:
            messages.insert(0, {"role": "system", "content": self.system})
        self.first_turn = False
        return self.session.generate(messages, self.params)

    # -- commands ---------------------------------------------------------------------

    def help(self, argument: str) -> bool:
        width = max(len(c.usage) for c in COMMANDS.values())
        _note("\n".join(f"  {c.usage:<{width}}  {c.help}" for c in COMMANDS.values()))
        return True

    def reset(self, argument: str) -> bool:
        self._new_conversation()
        _note("(new conversation" + (" with the same system message)" if self.system else ")"))
        return True

    def set_system(self, argument: str) -> bool:
        if not self.use_chat:
            _note("this bundle has no chat template, so there is no system message")
            return True
        self.system = argument or None
        self._new_conversation()
        # One line: /reset's "with the same system message" read wrong right after a new one.
        _note("(new conversation " + ("with this system message)" if argument
                                      else self._without_system()))
        return True

    def _without_system(self) -> str:
        """Where /system clears the message: the bundle's default (an Ollama model's
        SYSTEM) takes its place, as in every chat that brings none."""
        if self.engine.tokenizer.info.default_system is None:
            return "without a system message)"
        return "with the model's default system message)"

    def set_think(self, argument: str) -> bool:
        return self._thinking(True)

    def set_nothink(self, argument: str) -> bool:
        return self._thinking(False)

    def _thinking(self, on: bool) -> bool:
        """Ollama's /set think and /set nothink: the template's enable_thinking from the
        next turn on (the conversation is kept; a template without the variable ignores
        it)."""
        if not self.use_chat:
            _note("this bundle has no chat template, so thinking cannot be switched")
            return True
        self.think = on
        self.session.template_kwargs = think_kwargs(on)
        _note("(thinking " + ("on)" if on else "off)"))
        return True

    def _new_session(self) -> Session:
        session = self.engine.session()
        session.template_kwargs = think_kwargs(self.think)
        session.reply_message = assistant_message(self.engine.tokenizer, self.view)
        return session

    def _new_conversation(self) -> None:
        self.session.close()
        self.session = self._new_session()
        self.first_turn = True

    def exit(self, argument: str) -> bool:
        return False


COMMANDS: dict[str, Command] = {
    "/help": Command(ChatLoop.help, "/help", "this list"),
    "/reset": Command(ChatLoop.reset, "/reset", "forget the conversation, start a new one"),
    "/system": Command(ChatLoop.set_system, "/system TEXT",
                       "start a new conversation with this system message (none: clear it)"),
    "/think": Command(ChatLoop.set_think, "/think",
                      "a reasoning model thinks before it answers (its template's "
                      "enable_thinking)"),
    "/nothink": Command(ChatLoop.set_nothink, "/nothink", "it answers without thinking"),
    "/exit": Command(ChatLoop.exit, "/exit", "leave (Ctrl-D too)"),
}
COMMANDS["/quit"] = COMMANDS["/exit"]._replace(usage="/quit", help="the same as /exit")


class CtrlC:
    """The chat's SIGINT handler. At the prompt it raises KeyboardInterrupt (the line is
    dropped); from a line's end to the next prompt it stops the turn's reply, now or as
    soon as it is submitted, and raises nothing. Raised wherever the main thread stood, a
    Ctrl-C between a reply's end and the next prompt had killed the chat."""

    def __init__(self) -> None:
        self.at_prompt = True
        self.pressed = False
        self.stream: TokenStream | None = None

    def new_turn(self) -> None:
        self.at_prompt, self.pressed, self.stream = False, False, None

    def reply(self, stream: TokenStream) -> None:
        self.stream = stream
        if self.pressed:  # pressed while the turn was being submitted
            stream.cancel()

    def __call__(self, signum: int, frame: object) -> None:
        if self.at_prompt:
            raise KeyboardInterrupt
        self.pressed = True
        if self.stream is not None:
            # On a thread of its own: cancel() takes the engine's wake-up lock, which the
            # interrupted main thread may hold.
            threading.Thread(target=self.stream.cancel, daemon=True).start()


def _handle_sigint(handler: CtrlC) -> signal.Handlers | Callable | int | None:
    """Installs `handler` for SIGINT; returns the one it replaced (None off the main
    thread, where Python takes no handler: there a KeyboardInterrupt still stops a reply)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, handler)


def _note(text: str, newline: bool = True) -> None:
    """Everything but the model's words goes to stderr, so stdout holds only replies."""
    click.echo(text, err=True, nl=newline)


def _terminal_reader() -> Callable[[], str]:
    """input() with readline's line editing and a saved history on a terminal; plain
    lines from stdin otherwise (a pipe, a test)."""
    if not sys.stdin.isatty():
        return _piped_line
    try:
        import readline
    except ImportError:  # Windows without pyreadline: no editing, still a chat
        return _prompted_line
    _load_history(readline)
    return _prompted_line


def _prompted_line() -> str:
    # The prompt goes through input() so readline redraws it while the line is edited;
    # on a terminal stdout is the screen anyway.
    return input("you> ")


def _piped_line() -> str:
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line


def _load_history(readline) -> None:
    import atexit

    try:
        readline.read_history_file(HISTORY)
    except OSError:
        pass  # first run, or no such folder yet
    readline.set_history_length(HISTORY_LINES)

    def save() -> None:
        try:
            HISTORY.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(HISTORY)
        except OSError:
            pass  # a read-only home must not break leaving the chat

    atexit.register(save)
