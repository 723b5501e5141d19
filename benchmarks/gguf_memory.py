"""Peak memory of reading a GGUF file: edgeprefill's conversion (export/gguf_input.py, one
tensor at a time into 512 MB shards) against transformers' from_pretrained(gguf_file=).

The model is SmolLM2-135M-shaped (random weights, tied embeddings, a 49,152-token
vocabulary padded as llama.cpp pads it), written as F32 and Q8_0 GGUFs the way llama.cpp's
converter writes them (tests/gguf_files.py). Each measurement runs in a fresh child
process whose peak RSS is the number reported: VmHWM, which starts afresh at exec (Linux's
ru_maxrss keeps the parent's peak across fork and exec, here the model that wrote the
files); `imports` is a child that only imports torch, transformers and gguf (the floor
both readers start from). Peak memory does
not depend on the machine's other load; the seconds do.

    python3 benchmarks/gguf_memory.py                        # F32 and Q8_0, both readers
    python3 benchmarks/gguf_memory.py --json benchmarks/work/gguf_memory.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
               num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
               head_dim=64, tie_word_embeddings=True, initializer_range=0.02)
READERS = ("imports", "edgeprefill", "transformers")
QUANTS = ("F32", "Q8_0")


def write_files(work: Path) -> dict[str, Path]:
    """The model's GGUF files (written once, kept in `work`)."""
    files = {quant: work / f"smollm2-135m-shape-{quant}.gguf" for quant in QUANTS}
    if all(f.exists() for f in files.values()):
        return files
    from tests.bpe_tokenizers import byte_level_bpe, install
    from tests.conftest import build_hf_model
    from tests.gguf_files import write_gguf

    hf = build_hf_model("llama", work / "hf", **SMOLLM2)
    install(byte_level_bpe(), hf)
    for quant, path in files.items():
        write_gguf(hf, path, quant, name="smollm2-135m-shape")
    return files


def child(reader: str, gguf: Path) -> None:
    """One reading of `gguf`; prints {"peak_rss_mib", "seconds"} as JSON."""
    import gguf as _gguf  # noqa: F401
    import torch  # noqa: F401
    import transformers

    start = time.perf_counter()
    if reader == "edgeprefill":
        from edgeprefill.export.gguf_input import converted

        with converted(gguf, gguf.parent / "bundle", show_progress=False):
            pass
    elif reader == "transformers":
        transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    seconds = time.perf_counter() - start
    print(json.dumps({"peak_rss_mib": peak_rss_mib(), "seconds": seconds}))


def peak_rss_mib() -> float:
    """This process's peak resident set since its exec (VmHWM, in kB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def measure(reader: str, gguf: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", reader, str(gguf)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"gguf_memory.py: the {reader} child stopped: {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks/work/gguf_memory")
    parser.add_argument("--json", type=Path, help="also write the table's numbers here")
    parser.add_argument("--child", nargs=2, metavar=("READER", "GGUF"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    files = write_files(args.work)
    rows = {quant: {reader: measure(reader, path) for reader in READERS}
            for quant, path in files.items()}
    print("| file | size | imports only | edgeprefill conversion | transformers "
          "from_pretrained |\n|---|---|---|---|---|")
    for quant, row in rows.items():
        size = files[quant].stat().st_size / 2**20
        cells = [f"{row[r]['peak_rss_mib']:.0f} MiB"
                 + ("" if r == "imports" else f", {row[r]['seconds']:.1f} s") for r in READERS]
        print(f"| {quant} | {size:.0f} MiB | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
