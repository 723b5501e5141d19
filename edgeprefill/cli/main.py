"""The `edgeprefill` command: a click group whose commands live one per module.

Commands are imported on use, so `edgeprefill run` never imports the exporter and a
missing optional dependency (TensorRT, the HTTP stack) only matters to its own command.
"""

from __future__ import annotations

import errno
import importlib
import os
import re
import sys

import click

from edgeprefill import __version__
from edgeprefill.errors import EdgeprefillError, SettingError

# errnos only a write gets, of a device that took no more: full disk, quota, file size limit
DEVICE_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

# name -> "module:function"
COMMANDS = {
    "export": "edgeprefill.cli.export_cmd:export",
    "run": "edgeprefill.cli.run_cmd:run",
    "inspect": "edgeprefill.cli.inspect_cmd:inspect",
    "serve": "edgeprefill.cli.serve_cmd:serve",
    "bench": "edgeprefill.cli.bench_cmd:bench",
    "build": "edgeprefill.cli.build_cmd:build",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name].split(":")
        return getattr(importlib.import_module(module), attr)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and not ctx.resilient_parsing:
            # A user typing the program's name asks what it does: the help page on stdout
            # and exit 0, as pip and docker answer. click >= 8.2's no_args_is_help raises it
            # as a usage error instead (stderr, exit 2).
            click.echo(ctx.get_help(), color=ctx.color)
            ctx.exit(0)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except EdgeprefillError as err:
            flagged = _in_flags(err, self.get_command(ctx, ctx.invoked_subcommand or ""))
            if flagged == str(err):
                raise
            raise EdgeprefillError(flagged) from None
        except click.UsageError as err:
            if err.ctx is None and ctx.invoked_subcommand is not None:
                # click's parser raises some (`-p` without its value) without the command's
                # context: given it, the line points to that command's --help.
                command = self.get_command(ctx, ctx.invoked_subcommand)
                err.ctx = click.Context(command, parent=ctx, info_name=ctx.invoked_subcommand)
            _hint_a_dash_prompt(err, ctx.invoked_subcommand)
            raise
        except BrokenPipeError:
            # `edgeprefill run ... | head` closed the pipe: not an error. Handled here, as
            # click turns it into exit status 1 before main() could see it.
            _silence_stdout()
            raise click.exceptions.Exit(0) from None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgeprefill")
def cli() -> None:
    """edgeprefill: export a Hugging Face causal LM to a chunk-graph bundle and serve it on
    a small device, with long prompts split into chunks between other sessions' tokens.

    \b
    Example:
      edgeprefill export models/tiny-recall -o build/tiny-recall
      edgeprefill run build/tiny-recall --prompt "the secret is jade . what was the secret ?"
    """


def main() -> None:
    """Console entry point: user errors are one line on stderr, never a traceback."""
    _open_closed_streams()
    try:
        cli.main(standalone_mode=False)
    except EdgeprefillError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    except click.exceptions.Abort as err:  # click's wrapping of Ctrl-C (or EOF)
        click.echo(_interrupted(err.__cause__), err=True)
        sys.exit(130)
    except click.ClickException as err:
        click.echo(f"error: {_one_line(err)}", err=True)
        sys.exit(err.exit_code)  # click's own: 2 for a usage error
    except KeyboardInterrupt as err:
        click.echo(_interrupted(err), err=True)
        sys.exit(130)
    except OSError as err:
        if err.errno not in DEVICE_FULL:
            raise
        # The disk or device under the output failed (`run ... > /dev/full`, a full disk):
        # no bug of ours, nothing a traceback helps with.
        if err.filename is None:  # stdout's: its buffered rest would fail again at exit
            _silence_stdout()
        where = f" ({err.filename})" if err.filename is not None else ""
        click.echo(f"error: cannot write the output{where}: {err.strerror}", err=True)
        sys.exit(1)


def _open_closed_streams() -> None:
    """A standard stream the caller closed (`edgeprefill run B <&-`, `>&-`) is None in
    Python, and the first read or write of it an AttributeError. Each is /dev/null instead:
    a closed stdin reads as an empty one (end of input), a closed stdout is as a reader that
    left (the pipe closed early: no error)."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        if getattr(sys, name) is None:
            devnull = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: `fd`
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
            setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115 (process-long)


def _in_flags(err: EdgeprefillError, command: click.Command | None) -> str:
    """The error's message in the command's flags: a config field is the option of its name
    (cli/options.py). The field an error is about (`err.field`) is named as its flag where
    the command has one (else the message stays the SDK's); a SettingError's advice leaves
    out the fields the command has no flag for (the SDK's keywords mean nothing on a
    command line)."""
    options = _flags(command)
    if isinstance(err, SettingError):
        flags = [options[field] for field in err.lower if field in options]
        return err.problem + (f"; lower {' or '.join(flags)}" if flags else "")
    flag = options.get(err.field or "")
    if flag is None:
        return str(err)
    # The keyword as a word: `top_k`, not the `top_k` inside another name.
    return re.sub(rf"(?<![\w-]){re.escape(err.field or '')}(?![\w-])", flag, str(err))


def _flags(command: click.Command | None) -> dict[str, str]:
    """Each option's parameter name (its config field) -> its long flag."""
    options = [p for p in command.params if isinstance(p, click.Option)] if command else []
    return {p.name: next((o for o in p.opts if o.startswith("--")), p.opts[0])
            for p in options if p.name is not None}


def _hint_a_dash_prompt(err: click.UsageError, command: str | None) -> None:
    """`edgeprefill run B "-say hi"`: click reads a prompt that starts with "-" as options
    (No such option '-s'). Where the option is a short one like none of run's (click
    suggests none; `--bogus` is a mistyped option, not a prompt), the line says how to give
    such a prompt."""
    if command == "run" and isinstance(err, click.NoSuchOption) and not err.possibilities \
            and not err.option_name.startswith("--"):
        err.message += (' For a prompt that starts with "-", give it as --prompt "-..." or '
                        'after -- (edgeprefill run BUNDLE -- "-...").')


def _interrupted(cause: BaseException | None) -> str:
    """Ctrl-C's one line. A command that kept something raises KeyboardInterrupt with what
    (`after 3 of 8 runs; ...`), so the line says it instead of a second line before it."""
    if not isinstance(cause, KeyboardInterrupt):
        return "aborted"  # click's Abort of an EOF
    return " ".join(["interrupted", *map(str, cause.args)])


def _one_line(err: click.ClickException) -> str:
    """click's message, with the `--help` pointer of its three-line usage error kept at
    the end of the one line every other error of the project is."""
    message = " ".join(err.format_message().split())
    ctx = getattr(err, "ctx", None)
    if isinstance(err, click.UsageError) and ctx is not None:
        message += f" (see `{ctx.command_path} --help`)"
    return message


def _silence_stdout() -> None:
    """Points stdout at /dev/null, so the exit's flush of what is still buffered does not
    fail on the closed pipe too (Python's documented recipe for SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
