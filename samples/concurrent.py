"""Three sessions streaming at once with different priorities, a long document among them.

The long document is prefilled in chunks between the other sessions' decode steps, so
the interactive sessions keep streaming while it is read.

    python samples/concurrent.py build/tiny-recall
"""

import sys
import threading

from edgeprefill import Engine, GenerationParams

bundle = sys.argv[1] if len(sys.argv) > 1 else "build/tiny-recall"
document = " ".join(f"k{i}={i * 7 % 100}" for i in range(300)) + " ; k3 ?"
requests = {  # name: (prompt, priority)
    "chat-a": ("alice=42 bob=7 ; bob ?", 1),
    "document": (document, 0),
    "urgent": ("carol=19 dave=5 ; carol ?", 10),
}

with Engine.load(bundle, kv_slots=3) as engine:
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
        print(f"{name:9} priority {requests[name][1]:2}  TTFT {m.ttft * 1000:6.0f} ms  "
              f"chunks {m.chunks:2}  -> {stream.text.strip()!r}")
    print(f"max decode stall {engine.metrics().max_decode_stall_s * 1000:.0f} ms")
