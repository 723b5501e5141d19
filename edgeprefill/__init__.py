"""edgeprefill: on-device LLM inference with chunked prefill interleaved with decode."""

from edgeprefill.errors import EdgeprefillError

__version__ = "0.1.0"

__all__ = ["EdgeprefillError", "Engine", "GenerationParams", "__version__"]


def __getattr__(name: str) -> object:
    # The SDK is imported lazily so `edgeprefill export` never loads the runtime and the
    # runtime never loads the exporter.
    if name in ("Engine", "GenerationParams"):
        from edgeprefill import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'edgeprefill' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))  # the lazy names too
