"""`serve`'s settings, checked once (`ServerConfig`), and the request body limit they
derive from the bundle's context."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgeprefill.errors import RequestError
from edgeprefill.server.cors import LOCAL, CorsPolicy, cors_policy
from edgeprefill.server.reasoning import MODES
from edgeprefill.values import is_int


@dataclass(frozen=True)
class ServerConfig:
    model_name: str  # the id clients send as `model`
    api_key: str | None = None  # None: no authentication
    max_pending: int = 64  # requests admitted at once, running or queued; more get 429
    # A bigger request body gets 413 before it is read whole, so an endless body cannot
    # fill the device's memory. None: derived from the context (body_limit below).
    max_body_bytes: int | None = None
    body_timeout_s: float = 30.0  # headers received -> whole body, else 408
    prompt_timeout_s: float = 10.0  # tokenizing + rendering one prompt, else 400
    prompt_workers: int = 1  # processes that tokenize and render (~50 MB each)
    # "auto": chat replies of a bundle whose template thinks carry their `<think>` block
    # apart from the content (server/reasoning.py); "none": the reply is all content.
    reasoning_parser: str = "auto"
    # llama.cpp's --reasoning-budget: the thinking budget (sdk/thinking_budget.py) of a
    # chat reply whose request sets none; -1: no cap, 0: the block is closed at once.
    reasoning_budget: int = -1
    # The web pages whose scripts may call the server (server/cors.py): the local ones.
    cors: CorsPolicy = field(default_factory=lambda: cors_policy(LOCAL))

    def __post_init__(self) -> None:
        if self.max_pending < 1:
            raise RequestError(f"max_pending must be >= 1, got {self.max_pending}")
        if self.max_body_bytes is not None and self.max_body_bytes < 1:
            raise RequestError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if self.prompt_workers < 1:
            raise RequestError(f"prompt_workers must be >= 1, got {self.prompt_workers}")
        for name in ("body_timeout_s", "prompt_timeout_s"):
            if not getattr(self, name) > 0:
                raise RequestError(f"{name} must be positive, got {getattr(self, name)}")
        if self.api_key is not None and not self.api_key:
            raise RequestError("the API key is empty; unset it to serve without a key")
        if self.reasoning_parser not in MODES:
            raise RequestError(f"reasoning_parser must be one of {', '.join(MODES)}, got "
                               f"{self.reasoning_parser!r}")
        if not is_int(self.reasoning_budget) or self.reasoning_budget < -1:
            raise RequestError(f"reasoning_budget must be an integer >= -1 (-1: no cap), got "
                               f"{self.reasoning_budget!r}")


# The derived body limit: a prompt filling the whole context, at a bound on JSON bytes per
# token no real text reaches (a token is ~4 characters; JSON escapes one non-ASCII
# character as 6 or 12 bytes; a token id is at most 7), plus room for the other fields.
BODY_BYTES_PER_TOKEN = 64
BODY_BASE_BYTES = 64 << 10
# An embedding or score bundle's requests carry batches (up to 2,048 texts, OpenAI's limit;
# 1,000 documents): room for texts filling this many contexts. One context's worth had
# refused a batch of 1,000 short texts (224 KB) at a 2,048-token context.
BATCH_CONTEXTS = 16


def body_limit(config: ServerConfig, context: int, batches: bool = False) -> int:
    """`batches`: the bundle embeds or scores (its routes take many texts a request)."""
    if config.max_body_bytes is not None:
        return config.max_body_bytes
    contexts = BATCH_CONTEXTS if batches else 1
    return BODY_BASE_BYTES + BODY_BYTES_PER_TOKEN * context * contexts
