"""What `make demo` runs: the bundled tiny model recalls a value defined at the very start
of a 1,000+ token prompt. The prompt is prefilled in 64-token chunks, so the answer is
right only if every chunk's KV reached the decode.

    python samples/demo.py build/tiny-recall
"""

import sys
from pathlib import Path

from edgeprefill import EdgeprefillError, Engine, GenerationParams

bundle = sys.argv[1] if len(sys.argv) > 1 else "build/tiny-recall"
if bundle in ("-h", "--help"):
    sys.exit(__doc__)
model_dir = Path(__file__).resolve().parent.parent / "models" / "tiny-recall"
prompt = (model_dir / "demo_prompt.txt").read_text().strip()
expected = (model_dir / "demo_answer.txt").read_text().strip()

try:
    engine = Engine.load(bundle)
except EdgeprefillError as err:  # a wrong path, not a bundle: one line
    sys.exit(f"error: {err}")
with engine:
    if engine.manifest.task != "generate":  # an embedding or a score bundle: one line
        sys.exit(f"error: {bundle} generates no text (its task is {engine.manifest.task!r})")
    n_tokens = len(engine.tokenizer.encode(prompt))
    print(f"prompt: {n_tokens} tokens: {prompt[:70]} ... {prompt[-40:]}")
    stream = engine.generate(prompt, GenerationParams(max_new_tokens=16), chunk_size=64)
    print("answer: ", end="", flush=True)
    for event in stream:
        print(event.text, end="", flush=True)
    m = stream.metrics
    correct = stream.text.strip() == expected
    print(f"\nexpected: {expected}  ->  {'correct' if correct else 'WRONG'}")
    print(f"prefilled in {m.chunks} chunks of 64, TTFT {m.ttft * 1000:.0f} ms, "
          f"{len(stream.token_ids)} tokens generated")
    sys.exit(0 if correct else 1)
