"""Child processes: pinned thread pools, no network, output logged and echoed."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

from comparison.settings import REPO_DIR, Settings, StepError, say


def subprocess_env(threads: int, python: Path) -> dict[str, str]:
    """Environment for every child: its venv first on PATH, thread pools pinned, no network."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    env.update(
        {
            # Nothing can come from a model hub: fail fast instead of retrying.
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONNOUSERSITE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_logged(
    cmd: list[str], log_path: Path, env: dict[str, str], timeout_s: int, echo_all: bool
) -> str:
    """Run cmd, append its output to log_path, echo the runners' [bench] progress lines, and
    return stdout+stderr. Raises StepError on failure or timeout."""
    timed_out = threading.Event()
    lines: list[str] = []
    with log_path.open("a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO_DIR,
            errors="replace",
        )

        def kill() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                lines.append(line)
                if echo_all or line.startswith("[bench]"):
                    say("    " + line.rstrip()[:200])
            proc.wait()
        finally:
            timer.cancel()
    output = "".join(lines)
    if timed_out.is_set():
        raise StepError(f"timed out after {timeout_s} s (log: {log_path})")
    if proc.returncode != 0:
        raise StepError(f"exit code {proc.returncode} (log: {log_path}):\n{tail(output)}")
    return output


def run_step(cmd: list[str], log_path: Path, python: Path, settings: Settings) -> str:
    """run_logged with the run's thread count, timeout and verbosity, in python's venv."""
    env = subprocess_env(settings.threads, python)
    return run_logged(cmd, log_path, env, settings.timeout_s, settings.verbose)


def last_json_line(output: str) -> dict[str, Any]:
    """Libraries print to stdout too; the result is the last line that parses as a JSON object."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise StepError("no JSON result line in the output:\n" + tail(output))


# -------------------------------------------------------------------------------- venvs
