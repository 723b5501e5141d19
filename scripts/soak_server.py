"""Soak and abuse `edgeprefill serve` on loopback; print a markdown report.

    python scripts/soak_server.py build/tiny-recall            # ~2 minutes
    python scripts/soak_server.py build/tiny-recall --requests 500 --concurrency 16

Every phase is bounded in count and time and the script stops every server it starts:

1. load: mixed traffic at a given concurrency (whole and streamed completions, chat,
   clients that leave mid-stream, bad requests that must get a 4xx); counts 5xx and
   transport errors, then reads /metrics for KV slots still held (leaked) and compares
   the server's resident memory (with its prompt workers) before and after.
2. slow clients: idle sockets, half-sent headers and half-sent bodies; each must be
   closed (or answered 408) by the server's timeouts, not by us.
3. stall: the longest /health latency while big prompts are tokenized, at the default
   (context-derived) body limit and at the old flat 4 MB limit.
4. fds: a server under `ulimit -n 96` and 150 idle sockets: log lines written, and
   whether it answers again once its header timeout has closed them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server(NamedTuple):
    process: subprocess.Popen
    url: str
    port: int
    log: Path


CODE = [ROOT]  # the edgeprefill checkout to serve (--code), for A/B runs against another


@contextlib.contextmanager
def serving(bundle: Path, *flags: str, nofile: int | None = None, log: Path):
    """`edgeprefill serve` in a child process until the block ends (SIGTERM, then kill)."""
    port = free_port()
    prelude = ("import resource; resource.setrlimit(resource.RLIMIT_NOFILE, "
               f"({nofile}, {nofile})); " if nofile else "")
    command = [sys.executable, "-c", prelude + "from edgeprefill.cli.main import main; main()",
               "serve", str(bundle), "--port", str(port), "--model-name", "soak", *flags]
    env = {**os.environ, "PYTHONPATH": str(CODE[0])}
    with open(log, "w") as err:
        # cwd too: `python -c` puts it first on sys.path.
        process = subprocess.Popen(command, stderr=err, env=env, start_new_session=True,
                                   cwd=CODE[0])
    server = Server(process, f"http://127.0.0.1:{port}", port, log)
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start:\n{log.read_text()}")
            time.sleep(0.2)
        yield server
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children (the prompt workers), in MB."""
    total = 0
    for p in [pid, *_children(pid)]:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


def _children(pid: int) -> list[int]:
    """Children started by any of the process's threads (workers start from a pool)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def gauge(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise SystemExit(f"/metrics has no {name}")


# -- 1. load ---------------------------------------------------------------------------------

BAD_BODIES = [
    b"{", b"[]", b'{"prompt": "\\ud800"}', b'{"prompt": "w", "max_tokens": -1}',
    b'{"messages": "hi"}', b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"prompt": "w", "temperature": "hot"}', b'{"prompt": [99999999]}',
]


def one_request(url: str, kind: str, rng: random.Random) -> str:
    """Returns the outcome: 'ok', '4xx', 'left' or an error description."""
    words = " ".join(f"w{rng.randrange(4, 100)}" for _ in range(rng.randrange(1, 60)))
    tokens = rng.randrange(1, 24)
    with httpx.Client(base_url=url, timeout=60) as client:
        if kind == "bad":
            path = rng.choice(["/v1/completions", "/v1/chat/completions"])
            status = client.post(path, content=rng.choice(BAD_BODIES)).status_code
            return "4xx" if 400 <= status < 500 else f"bad request got {status}"
        if kind == "leave":  # read one event of a stream, then hang up
            body = {"prompt": words, "max_tokens": 200, "stream": True}
            with client.stream("POST", "/v1/completions", json=body) as reply:
                for _ in reply.iter_lines():
                    break
            return "left"
        if kind == "chat":
            body = {"messages": [{"role": "user", "content": words}], "max_tokens": tokens}
            reply = client.post("/v1/chat/completions", json=body)
        elif kind == "stream":
            body = {"prompt": words, "max_tokens": tokens, "stream": True}
            with client.stream("POST", "/v1/completions", json=body) as reply:
                lines = [line for line in reply.iter_lines() if line]
            if reply.status_code == 200 and lines[-1:] != ["data: [DONE]"]:
                return "stream without [DONE]"
        else:
            reply = client.post("/v1/completions", json={"prompt": words, "max_tokens": tokens})
        if reply.status_code == 429:
            return "429"
        return "ok" if reply.status_code == 200 else f"{kind} got {reply.status_code}"


def load(server: Server, requests: int, concurrency: int, seed: int) -> dict:
    rng = random.Random(seed)
    kinds = rng.choices(["whole", "stream", "chat", "leave", "bad"], [4, 3, 2, 1, 1],
                        k=requests)
    one_request(server.url, "chat", rng)  # warm: the prompt worker has started
    rss_before = rss_mb(server.process.pid)
    began = time.monotonic()
    outcomes: Counter = Counter()
    with ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(one_request, server.url, k, random.Random(rng.random()))
                   for k in kinds]
        for f in futures:
            try:
                outcomes[f.result(timeout=300)] += 1
            except Exception as err:  # a transport failure is a finding, not a crash
                outcomes[f"transport: {type(err).__name__}"] += 1
    took = time.monotonic() - began
    deadline = time.monotonic() + 30  # cancelled requests free their slots promptly
    while gauge(server.url, "edgeprefill_kv_slots_active") and time.monotonic() < deadline:
        time.sleep(0.2)
    return {
        "requests": requests, "concurrency": concurrency, "seconds": round(took, 1),
        "outcomes": dict(outcomes),
        "errors": sum(n for o, n in outcomes.items() if o not in ("ok", "4xx", "left", "429")),
        "slots_leaked": gauge(server.url, "edgeprefill_kv_slots_active"),
        "running_after": gauge(server.url, "edgeprefill_requests_running"),
        "rss_before_mb": round(rss_before, 1), "rss_after_mb": round(rss_mb(server.process.pid), 1),
    }


# -- 2. slow clients -------------------------------------------------------------------------


def slow_clients(server: Server, count: int, header_timeout: float, body_timeout: float
                 ) -> dict:
    body = json.dumps({"prompt": "w5 w6", "max_tokens": 2}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    cases = {"idle": b"", "half header": head[:30], "half body": head + body[:5]}
    results = {}
    for name, sent in cases.items():
        socks = []
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(sent)
            socks.append(s)
        began = time.monotonic()
        closed, answered = 0, Counter()
        limit = (body_timeout if name == "half body" else header_timeout) + 10
        for s in socks:
            s.settimeout(max(0.1, limit - (time.monotonic() - began)))
            try:
                data = s.recv(4096)
                while data and not data.endswith(b"}"):
                    more = s.recv(4096)
                    if not more:
                        break
                    data += more
                answered[data[:12].decode(errors="replace") or "closed"] += 1
                closed += 1
            except (TimeoutError, OSError):
                pass
            finally:
                s.close()
        results[name] = {"sockets": count, "closed_by_server": closed,
                         "seconds": round(time.monotonic() - began, 1),
                         "replies": dict(answered)}
    return results


# -- 3. /health while big prompts are tokenized ---------------------------------------------


def health_stall(server: Server, prompt_bytes: int, rounds: int) -> dict:
    """Send `rounds` prompts of ~prompt_bytes one after another while probing /health."""
    stalls: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            while not stop.is_set():
                began = time.monotonic()
                client.get("/health")
                stalls.append(time.monotonic() - began)
                time.sleep(0.005)

    words = ("w7 " * (prompt_bytes // 3))[:prompt_bytes]
    # Encoded before probing starts: building 4 MB of JSON would hold this process's GIL
    # and stall the prober itself.
    body = json.dumps({"prompt": words, "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json"}
    statuses: Counter = Counter()
    prober = threading.Thread(target=probe)
    prober.start()
    rss_peak = rss_mb(server.process.pid)
    try:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for _ in range(rounds):
                reply = client.post("/v1/completions", content=body, headers=headers)
                statuses[reply.status_code] += 1
                rss_peak = max(rss_peak, rss_mb(server.process.pid))
    finally:
        stop.set()
        prober.join()
    return {"prompt_bytes": prompt_bytes, "rounds": rounds, "statuses": dict(statuses),
            "health_probes": len(stalls), "longest_health_ms": round(max(stalls) * 1000, 1),
            "rss_peak_mb": round(rss_peak, 1)}


# -- 4. file descriptors ---------------------------------------------------------------------


def fd_exhaustion(bundle: Path, log: Path, sockets: int, nofile: int) -> dict:
    with serving(bundle, "--header-timeout", "3", nofile=nofile, log=log) as server:
        socks = []
        for _ in range(sockets):
            with contextlib.suppress(OSError):
                socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        time.sleep(8)  # out of descriptors for a while; the header timeout frees them
        began, recovered = time.monotonic(), None
        while time.monotonic() - began < 20:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                    recovered = round(time.monotonic() - began, 1)
                    break
            time.sleep(0.2)
        for s in socks:
            s.close()
    text = log.read_text()
    return {"nofile": nofile, "idle_sockets": len(socks), "log_lines": len(text.splitlines()),
            "tracebacks": text.count("Traceback"), "answered_again_after_s": recovered}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--slow-sockets", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/work/soak"))
    parser.add_argument("--phases", default="load,slow,stall,stall4mb,fds",
                        help="comma-separated subset of load,slow,stall,stall4mb,fds")
    parser.add_argument("--code", type=Path, default=ROOT,
                        help="edgeprefill checkout to serve (default: this one); with "
                             "--phases stall4mb it may be one without the new flags")
    args = parser.parse_args()
    CODE[0] = args.code.resolve()
    phases = set(args.phases.split(","))
    args.out = args.out.resolve()
    args.bundle = args.bundle.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))  # our own sockets

    report: dict = {"cpu": _cpu(), "cores": os.cpu_count()}
    flags = ("--kv-slots", "4", "--max-pending", "64", "--header-timeout", "5",
             "--body-timeout", "10")
    if phases & {"load", "slow", "stall"}:
        with serving(args.bundle, *flags, log=args.out / "serve.log") as server:
            if "load" in phases:
                report["load"] = load(server, args.requests, args.concurrency, args.seed)
            if "slow" in phases:
                report["slow_clients"] = slow_clients(server, args.slow_sockets, 5, 10)
            if "stall" in phases:
                report["stall_default_limit"] = health_stall(server, 100_000, 5)
            report["after_all_phases_rss_mb"] = round(rss_mb(server.process.pid), 1)
            report["after_all_phases_slots_active"] = gauge(
                server.url, "edgeprefill_kv_slots_active")
    if "stall4mb" in phases:
        with serving(args.bundle, "--max-body-mb", "4", log=args.out / "serve-4mb.log") as s:
            report["stall_4mb_limit"] = health_stall(s, 3_800_000, 3)
    if "fds" in phases:
        report["fds"] = fd_exhaustion(args.bundle, args.out / "serve-fd.log", 150, 96)
    print(json.dumps(report, indent=2))


def _cpu() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
