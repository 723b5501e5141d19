"""What the LM head's precision costs an int4 bundle: logit drift and decode speed.

    python benchmarks/lm_head.py drift
    python benchmarks/lm_head.py speed --rounds 10
    python benchmarks/lm_head.py share

`drift`: each family's random test fixture (tests/conftest.py) exported as fp32 and as int4
with the LM head at int4 (`--quantize int4`, the default), int8 and float (`--lm-head`);
prints max |logit - fp32 logit| / max |fp32 logit| over every position of a teacher-forced
prompt, and the head's share alone: each head against the float head on the same int4 body;
for a tied model, what `--embeddings all` (the table int4 too) adds. `speed`: a
SmolLM2-135M-shaped model (vocab 49152, hidden 576, 30 layers, tied: the head is 28 M of its
135 M weights) with random weights, int4 with each head; decode tokens/s (the median step of
each round, the median round and the best) after a 16-token prompt, the variants loaded side
by side and taking turns `--rounds` times (the machine's drift hits each alike), with the
bundle sizes. `share`: an int4 table of Gemma 3 1B's half height (131072 x 1152) read by
MatMulNBits and GatherBlockQuantized, as one shared initializer or two copies: file size and
resident memory after load, each in a fresh process (why export/quantize.py keeps a tied
table's quantized copy apart from the head's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HEADS = ("int4", "int8", "float")
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
               num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
               head_dim=64, tie_word_embeddings=True, initializer_range=0.02)


def export_bundle(hf: Path, out: Path, head: str | None, tied_embeddings: bool = False) -> Path:
    from edgeprefill.export.exporter import ExportOptions, export
    from edgeprefill.export.quantize import QuantConfig

    quant = None if head is None else QuantConfig("int4", head=head,
                                                  tied_embeddings=tied_embeddings)
    export(hf, out, ExportOptions(chunks=(16,), max_context=256, show_progress=False,
                                  quant=quant))
    return out


def teacher_forced(bundle: Path, ids: list[int]) -> np.ndarray:
    """Logits after every prefix, one decode step per token."""
    from edgeprefill.engines import StepBatch
    from edgeprefill.sdk import Engine

    with Engine.load(bundle, threads=2, background=False) as engine:
        return np.stack([engine.backend.run(StepBatch(
            np.array([[token]]), np.array([i], np.int32), np.array([1], np.int32), 0))[0].copy()
            for i, token in enumerate(ids)])


def drift(args, work: Path) -> None:
    from tests.conftest import build_hf_model

    print(f"{'family':22} {'vs fp32, head:':>14} {'int4':>6} {'int8':>6} {'float':>6}"
          f"   {'the head alone:':>15} {'int4':>6} {'int8':>6}   {'tied table int4:':>16}")
    for family in args.families.split(","):
        hf = build_hf_model(family, work / family / "hf")
        config = json.loads((hf / "config.json").read_text())
        ids = [int(t) for t in np.random.default_rng(0).integers(1, config["vocab_size"],
                                                                 args.tokens)]
        fp32 = teacher_forced(export_bundle(hf, work / family / "fp32", None), ids)
        logits = {head: teacher_forced(export_bundle(hf, work / family / head, head), ids)
                  for head in HEADS}
        total = [relative(logits[head], fp32) for head in HEADS]
        alone = [relative(logits[head], logits["float"]) for head in ("int4", "int8")]
        table = "(untied)"
        if config.get("tie_word_embeddings"):  # the table's own share: against int4's
            tied = teacher_forced(export_bundle(hf, work / family / "tied", "int4", True), ids)
            table = f"{relative(tied, logits['int4']):.3f}"
        print(f"{family:22} {'':14} " + " ".join(f"{e:6.3f}" for e in total)
              + f"   {'':15} " + " ".join(f"{e:6.3f}" for e in alone) + f"   {table:>16}",
              flush=True)


def relative(got: np.ndarray, reference: np.ndarray) -> float:
    """max |got - reference| / max |reference|: the drift's measure."""
    return float(np.abs(got - reference).max() / np.abs(reference).max())


def decode_steps(engine, steps: int) -> list[float]:
    """Seconds per decode step: `steps` one-token calls on slot 0 after a 16-token prompt
    (the backend's own call, the engine's scheduling left out)."""
    from edgeprefill.engines import StepBatch

    backend = engine.backend
    backend.run(StepBatch(np.array([list(range(5, 21))]), np.array([0], np.int32),
                          np.array([16], np.int32), 0))
    times = []
    for i in range(steps):
        began = time.perf_counter()
        backend.run(StepBatch(np.array([[7 + i]]), np.array([16 + i], np.int32),
                              np.array([1], np.int32), 0))
        times.append(time.perf_counter() - began)
    return times


def speed(args, work: Path) -> None:
    from edgeprefill.sdk import Engine
    from tests.conftest import build_hf_model

    hf = build_hf_model("llama", work / "hf", **SMOLLM2)
    bundles = {head: export_bundle(hf, work / head, head) for head in HEADS}
    bundles["int4, tied table int4"] = export_bundle(hf, work / "tied", "int4", True)
    engines = {name: Engine.load(bundle, threads=2, kv_slots=1, prefix_reuse=False,
                                 background=False) for name, bundle in bundles.items()}
    rounds: dict[str, list[float]] = {name: [] for name in bundles}  # per round: median step
    for _ in range(args.rounds):  # taking turns: the machine's drift hits each alike
        for name, engine in engines.items():
            rounds[name].append(statistics.median(decode_steps(engine, args.tokens)))
    base = 1 / statistics.median(rounds["int4"])
    print(f"{'head':24} {'tok/s median':>12} {'best round':>10} {'vs int4':>8} "
          f"{'bundle MB':>10}")
    for name, bundle in bundles.items():
        size = sum(f.stat().st_size for f in bundle.iterdir()) / 1e6
        rate, best = 1 / statistics.median(rounds[name]), 1 / min(rounds[name])
        print(f"{name:24} {rate:12.1f} {best:10.1f} {rate / base:8.2f}x {size:10.1f}")
    for engine in engines.values():
        engine.close()
    print(f"({args.rounds} rounds of {args.tokens} decode steps after a 16-token prompt, "
          f"2 threads; {time.strftime('%Y-%m-%d %H:%M')}; load average "
          f"{Path('/proc/loadavg').read_text()[:14]})")


def share_probe(mode: str, work: Path) -> None:
    """One graph: MatMulNBits over an int4 [rows, blocks, 16] initializer and
    GatherBlockQuantized over it (`shared`) or over a copy (`copy`); prints the data file's
    size and the RSS a session adds at load and after one run."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rows, width, block = 131072, 1152, 32
    blocks = width // block
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, (rows, blocks, block // 2), dtype=np.uint8)
    scales = rng.random((rows, blocks), dtype=np.float32)
    weights = [numpy_helper.from_array(data, "w"), numpy_helper.from_array(scales.ravel(), "s"),
               numpy_helper.from_array(scales.reshape(rows, blocks, 1), "s3")]
    if mode == "copy":
        weights.append(numpy_helper.from_array(data, "w2"))
    nodes = [helper.make_node("MatMulNBits", ["x", "w", "s"], ["y"], domain="com.microsoft",
                              K=width, N=rows, bits=4, block_size=block, accuracy_level=4),
             helper.make_node("GatherBlockQuantized", ["w2" if mode == "copy" else "w", "ids",
                                                       "s3"], ["e"], domain="com.microsoft",
                              gather_axis=0, quantize_axis=2, block_size=block, bits=4)]
    graph = helper.make_graph(
        nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width]),
                         helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "e")],
        weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    path = work / f"{mode}.onnx"
    onnx.save(model, path, save_as_external_data=True, location=f"{mode}.data",
              size_threshold=1024)
    del data, weights, model, graph

    def rss_mb() -> float:
        return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) / 1024

    before = rss_mb()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    loaded = rss_mb() - before
    session.run(None, {"x": np.ones((1, width), np.float32), "ids": np.array([3, 7])})
    size = (work / f"{mode}.data").stat().st_size / 1e6
    print(f"{mode:7} file {size:6.1f} MB, RSS +{loaded:.0f} MB after load, "
          f"+{rss_mb() - before:.0f} MB after a run", flush=True)


def share(args, work: Path) -> None:
    import subprocess

    for mode in ("copy", "shared"):
        subprocess.run([sys.executable, __file__, "share-probe", "--mode", mode,
                        "--work", str(work)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("drift", "speed", "share", "share-probe"))
    parser.add_argument("--mode", default="copy")  # share-probe's (one process per mode)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--families", default="llama,qwen3,gemma3_text,lfm2,qwen3_5_text,"
                                                "gpt2,llama-tied-llama3rope,starcoder2")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    if args.what == "share-probe":
        share_probe(args.mode, args.work)
        return
    with tempfile.TemporaryDirectory() as tmp:
        {"drift": drift, "speed": speed, "share": share}[args.what](args, Path(tmp))


if __name__ == "__main__":
    main()
