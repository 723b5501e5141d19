"""An Ollama model's SYSTEM message (its Modelfile's SYSTEM, the manifest's system layer) ->
the bundle's default system message (the manifest's `tokenizer.default_system`).

Ollama puts it first in every chat and generate request that brings no system message of
its own (server/routes.go); the bundle's tokenizer does the same for every chat it renders
(sdk/chat_template.with_default_system): `run --chat`, the server's chat routes, SDK
sessions. It is kept only where the bundle's chat template renders it: a template that
refuses a system turn (some of Gemma's and Mistral's) would fail every chat with it, so
there it is left out, with a warning, as a model without a template has no chat to put
it in.
"""

from __future__ import annotations

import logging
from pathlib import Path

from edgeprefill.errors import BundleError, RequestError
from edgeprefill.sdk.chat_template import (
    SAMPLE_CONVERSATION,
    ChatTemplate,
    special_tokens,
    template_source,
)

log = logging.getLogger(__name__)


def kept_system(system: str | None, folder: Path, shown: str) -> str | None:
    """`system` where the chat template of `folder` (the converted GGUF's) renders it
    before a sample conversation, else None with a warning; `shown` names the model."""
    if not system:
        return None
    why = _why_not_rendered(system, folder)
    if why is None:
        return system
    log.warning("%s: its SYSTEM message is left out of the bundle (%s): give it per "
                "conversation (run --system, a system message): %.60r", shown, why, system)
    return None


def _why_not_rendered(system: str, folder: Path) -> str | None:
    try:
        source = template_source(folder)
        if source is None:
            return "the model has no chat template"
        ChatTemplate(source, special_tokens(folder)).render(
            [{"role": "system", "content": system}, *SAMPLE_CONVERSATION])
    except (BundleError, RequestError) as err:
        return f"its chat template does not render it: {err}"
    return None
