"""The SDK inside a small threaded app: a worker streams a reply into the UI's queue, and
the user cancels it half-way; the cancelled request's KV is freed at once.

    python samples/embed_in_app.py build/tiny-recall
"""

import queue
import sys
import threading

from edgeprefill import EdgeprefillError, Engine, GenerationParams

bundle = sys.argv[1] if len(sys.argv) > 1 else "build/tiny-recall"
if bundle in ("-h", "--help"):
    sys.exit(__doc__)
ui_events: queue.Queue = queue.Queue()


def worker(engine: Engine, prompt: str, cancel: threading.Event) -> None:
    stream = engine.generate(prompt, GenerationParams(max_new_tokens=200, ignore_eos=True))
    for event in stream:
        ui_events.put(("token", event.text))
        if cancel.is_set():
            stream.cancel()  # takes effect at the next step boundary
    ui_events.put(("done", stream.finish_reason))


try:
    engine = Engine.load(bundle)
except EdgeprefillError as err:  # a wrong path, not a bundle: one line
    sys.exit(f"error: {err}")
with engine:
    if engine.manifest.task != "generate":  # an embedding or a score bundle: one line
        sys.exit(f"error: {bundle} generates no text (its task is {engine.manifest.task!r})")
    cancel = threading.Event()
    prompt = "the secret is onyx . kero bala . what was the secret ?"
    threading.Thread(target=worker, args=(engine, prompt, cancel)).start()
    tokens = 0
    while True:  # the "UI loop"
        kind, value = ui_events.get()
        if kind == "done":
            print(f"\nfinished: {value} after {tokens} tokens")
            break
        tokens += 1
        print(value, end="", flush=True)  # the UI shows the text as it comes
        if tokens == 5:
            cancel.set()  # the user pressed "stop": a few more tokens may come first
    engine.check_integrity()
    print(f"KV slots in use after cancel: {engine.metrics().kv_active}")
