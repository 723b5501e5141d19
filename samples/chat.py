"""A multi-turn chat: the session keeps its KV cache, so each turn prefills only what is new.

    python samples/chat.py build/tiny-recall
"""

import sys

from edgeprefill import Engine, GenerationParams

bundle = sys.argv[1] if len(sys.argv) > 1 else "build/tiny-recall"
params = GenerationParams(max_new_tokens=16)

with Engine.load(bundle) as engine:
    session = engine.session()
    turns = ["alice=42 bob=7 carol=19 ; alice ?", "bob ?", "carol ?"]
    for text in turns:
        print(f"you> {text}")
        print("model> ", end="", flush=True)
        stream = session.generate(text if text is turns[0] else f" {text}", params)
        for event in stream:  # tokens arrive as they are produced
            print(event.text, end="", flush=True)
        m = stream.metrics
        print(f"\n   ({m.prompt_tokens} prompt tokens, {m.prefix_reused} reused from the "
              f"session's cache, TTFT {m.ttft * 1000:.0f} ms)")
