"""Three requests streaming at once with different priorities, a long document among them.

The document is prefilled in chunks between the other requests' decode steps, and the
urgent request takes the next prefill turn as soon as it arrives.

    python samples/concurrent_sessions.py build/tiny-recall

(Not `concurrent.py`: run as a script, that name would shadow the standard library
package `concurrent` that asyncio imports.)
"""

import sys
import threading
from pathlib import Path

from edgeprefill import EdgeprefillError, Engine, GenerationParams

bundle = sys.argv[1] if len(sys.argv) > 1 else "build/tiny-recall"
if bundle in ("-h", "--help"):
    sys.exit(__doc__)
models = Path(__file__).resolve().parent.parent / "models"
requests = {  # name: (prompt, priority: lower is served first, like vLLM's)
    "document": ((models / "tiny-recall" / "demo_prompt.txt").read_text(), 0),
    "chat": ("the secret is amber . kero bala . what was the secret ?", 0),
    "urgent": ("the secret is storm . musi tin . what was the secret ?", -1),  # lower first
}

try:
    engine = Engine.load(bundle, kv_slots=3, chunk_size=32)
except EdgeprefillError as err:  # a wrong path, not a bundle: one line
    sys.exit(f"error: {err}")
with engine:
    if engine.manifest.task != "generate":  # an embedding or a score bundle: one line
        sys.exit(f"error: {bundle} generates no text (its task is {engine.manifest.task!r})")
    results = {}

    def run(name: str, prompt: str, priority: int) -> None:
        stream = engine.generate(prompt, GenerationParams(max_new_tokens=8), priority=priority)
        results[name] = stream.result()

    threads = [threading.Thread(target=run, args=(n, *r)) for n, r in requests.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, stream in results.items():
        m = stream.metrics
        print(f"{name:9} priority {requests[name][1]:2}  prompt {m.prompt_tokens:5} tokens  "
              f"TTFT {m.ttft * 1000:6.0f} ms  chunks {m.chunks:3}  -> {stream.text.strip()!r}")
    print(f"longest gap between decode steps: {engine.metrics().max_decode_stall_s * 1000:.0f} ms")
