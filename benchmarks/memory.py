"""Peak memory of a long prefill: edgeprefill chunked (256) against a single chunk, and
against the comparators, each set against the least it could take (weights + KV cache).

Runs compare.py twice (same model, same prompt ids, fresh process per runtime): once for
every runtime with the chunk size of the run, once more for edgeprefill with the whole
prompt as one chunk. Each process measures one TTFT of a `--tokens` prompt and a short
decode; its peak RSS (ru_maxrss) is the number reported.

    python3 benchmarks/memory.py                       # 4,096 tokens, every runtime
    python3 benchmarks/memory.py --runtimes edgeprefill,ortgenai --tokens 2048
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
NEW_TOKENS = 2  # the decode part only has to run; its speed is not measured here


def run_compare(runtimes: str, tokens: int, chunk: int, extra: list[str], out: Path) -> dict:
    cmd = [
        sys.executable, str(BENCH_DIR / "compare.py"), "--runtimes", runtimes,
        "--lengths", str(tokens), "--repeats", "1", "--warmup", "0",
        "--new-tokens", str(NEW_TOKENS), "--decode-prompt", "16",
        "--chunk-size", str(chunk), "--json", str(out), "--no-ceilings", *extra,
    ]
    print("$ " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        sys.exit(f"memory.py: compare.py stopped with exit status {done.returncode} (its "
                 "message is above)")
    return json.loads(out.read_text())


def floor_mib(report: dict, tokens: int) -> tuple[float, float]:
    """fp32 weights held once, and the KV cache of the prompt (+ decode) at fp32."""
    c = report["model"]["config"]
    weights = 4.0 * report["model"]["params"]
    per_token = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * 4
    return weights / 2**20, per_token * (tokens + NEW_TOKENS) / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096, help="prompt length")
    parser.add_argument("--chunk-size", type=int, default=256, help="edgeprefill's chunk")
    parser.add_argument("--runtimes", default="edgeprefill,ortgenai,optimum,torch")
    parser.add_argument("--json", type=Path, help="also write the table's numbers here")
    args, extra = parser.parse_known_args()  # anything else goes to compare.py
    if args.tokens < 1 or args.chunk_size < 1:
        parser.error("--tokens and --chunk-size must be positive")

    with tempfile.TemporaryDirectory() as tmp:
        chunked = run_compare(
            args.runtimes, args.tokens, args.chunk_size, extra, Path(tmp) / "a.json"
        )
        single = run_compare("edgeprefill", args.tokens, args.tokens, extra, Path(tmp) / "b.json")
    weights, kv = floor_mib(chunked, args.tokens)
    rows = [
        (f"{name} (chunk {args.chunk_size})" if name == "edgeprefill" else name, result)
        for name, result in chunked["runtimes"].items()
    ]
    rows.insert(1, (f"edgeprefill (one chunk of {args.tokens})", single["runtimes"]["edgeprefill"]))
    print(f"\npeak RSS, {args.tokens}-token prompt; floor = fp32 weights {weights:.0f} MiB + "
          f"KV cache {kv:.0f} MiB = {weights + kv:.0f} MiB")
    print(f"{'runtime':<34}{'peak RSS':>12}{'/ floor':>9}{'TTFT':>10}")
    table = []
    for label, result in rows:
        if "error" in result:
            print(f"{label:<34}  ERROR {result['error'].strip().splitlines()[-1][:80]}")
            continue
        peak = result["peak_rss_mib"]
        ttft = result["ttft"][str(args.tokens)]["median_s"]
        print(f"{label:<34}{peak:>8.0f} MiB{peak / (weights + kv):>8.2f}x{ttft:>9.2f} s")
        table.append({"runtime": label, "peak_rss_mib": peak, "ttft_s": ttft})
    if args.json:
        args.json.write_text(json.dumps({"weights_mib": weights, "kv_mib": kv, "rows": table}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
