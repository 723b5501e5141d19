"""User-facing errors: the CLI prints the message as one line and exits non-zero."""


class EdgeprefillError(Exception):
    """Base of every error a user can cause and fix (bad input, missing file, bad bundle).
    `field`: the parameter (a GenerationParams, EngineConfig or export option field) it is
    about, where one is. The message names it by that keyword; a front end that takes it
    under another name renders it in its own (the server names the request field, the CLI
    the flag: cli/main.py)."""

    def __init__(self, message: str = "", field: str | None = None) -> None:
        super().__init__(message)
        # An attribute, not an argument: an exception pickles (bench's worker process) as
        # its message plus its __dict__.
        self.field = field


class ExportError(EdgeprefillError):
    """The checkpoint cannot be exported as asked."""


class BundleError(EdgeprefillError):
    """The bundle is missing, corrupt, of another format version, or unsafe to load."""


class BackendError(EdgeprefillError):
    """A backend cannot run here (missing library, device, or provider)."""


class RequestError(EdgeprefillError):
    """A generation request is invalid or can never be served (too long, bad parameters)."""


class SettingError(RequestError):
    """The engine's settings cannot work here (a KV cache beyond the memory). `problem`
    says what; `lower` names the EngineConfig fields that, lowered, fix it. The message
    advises in the SDK's keywords (and `sdk_also`, advice only the SDK can take); the CLI
    advises in its own flags instead (cli/main.py)."""

    def __init__(self, problem: str, lower: tuple[str, ...] = (), sdk_also: str = "") -> None:
        advice = f"; lower {' or '.join(lower)}" if lower else ""
        super().__init__(f"{problem}{advice}{sdk_also}")
        # Attributes, not arguments: an exception pickles (bench's worker process) as its
        # message plus its __dict__.
        self.problem, self.lower = problem, lower


class EngineClosedError(RequestError):
    """The engine was closed: nothing is wrong with the request, nothing will serve it."""


def one_line(err: object, limit: int = 300) -> str:
    """A library's error message (ONNX Runtime's and protobuf's run over several lines) as
    one line of at most `limit` characters, for a message of ours that quotes it."""
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
