"""A multi-turn conversation: the session keeps its KV cache, so each turn prefills only
the new words and the model still sees the secret stated at the very start.

    python samples/chat.py build/tiny-recall
"""

import sys

from edgeprefill import EdgeprefillError, Engine, GenerationParams

bundle = sys.argv[1] if len(sys.argv) > 1 else "build/tiny-recall"
if bundle in ("-h", "--help"):
    sys.exit(__doc__)
turns = [
    "the secret is jade . kero bala musi . tin rapu . what was the secret ?",
    "lon sose duga . vimi kon . what was the secret ?",
    "bata nela . what was the secret ?",
]

try:
    engine = Engine.load(bundle)
except EdgeprefillError as err:  # a wrong path, not a bundle: one line
    sys.exit(f"error: {err}")
with engine:
    if engine.manifest.task != "generate":  # an embedding or a score bundle: one line
        sys.exit(f"error: {bundle} generates no text (its task is {engine.manifest.task!r})")
    session = engine.session()
    for text in turns:
        print(f"you>   {text}")
        print("model> ", end="", flush=True)
        stream = session.generate(text, GenerationParams(max_new_tokens=8))
        for event in stream:  # tokens arrive as they are produced
            print(event.text, end="", flush=True)
        m = stream.metrics
        print(f"\n       ({m.prompt_tokens} tokens in the conversation, {m.prefix_reused} "
              f"reused from the session's cache, TTFT {m.ttft * 1000:.0f} ms)")
