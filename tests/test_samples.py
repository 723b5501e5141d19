"""The samples run, unmodified, on the shipped tiny model, and do what they say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_sample(name: str, bundle: Path) -> str:
    result = subprocess.run([sys.executable, str(ROOT / "samples" / name), str(bundle)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.parametrize(
    "name", ["chat.py", "concurrent_sessions.py", "embed_in_app.py", "demo.py", "rag.py"]
)
def test_samples_are_short(name):
    assert len((ROOT / "samples" / name).read_text().splitlines()) <= 60


def test_demo_answers_the_long_recall_prompt(tiny_bundle):
    out = run_sample("demo.py", tiny_bundle)
    assert "correct" in out and "WRONG" not in out


def test_chat_sample_reuses_the_session_cache(tiny_bundle):
    out = run_sample("chat.py", tiny_bundle)
    reused = [int(line.split(" reused")[0].split(",")[-1].split()[0])
              for line in out.splitlines() if "reused" in line]
    assert len(reused) == 3 and reused[0] == 0 and all(r > 0 for r in reused[1:])
    replies = [line.removeprefix("model> ").strip() for line in out.splitlines()
               if line.startswith("model> ")]
    assert replies == ["jade", "jade", "jade"]  # the secret from the first turn, every time


def test_concurrent_sample_serves_the_urgent_request_first(tiny_bundle):
    out = run_sample("concurrent_sessions.py", tiny_bundle)
    ttft = {line.split()[0]: float(line.split("TTFT")[1].split("ms")[0])
            for line in out.splitlines() if "TTFT" in line}
    assert set(ttft) == {"chat", "document", "urgent"}
    assert ttft["urgent"] < ttft["document"]
    answers = {line.split()[0]: line.split("->")[1].strip() for line in out.splitlines()
               if "->" in line}
    expected = (ROOT / "models" / "tiny-recall" / "demo_answer.txt").read_text().strip()
    assert answers == {"document": repr(expected), "chat": "'amber'", "urgent": "'storm'"}


def test_embed_in_app_sample_cancels_and_frees_the_kv(tiny_bundle):
    out = run_sample("embed_in_app.py", tiny_bundle)
    assert "finished: cancelled" in out
    assert "KV slots in use after cancel: 0" in out


@pytest.mark.parametrize(
    "name", ["chat.py", "concurrent_sessions.py", "embed_in_app.py", "demo.py"]
)
def test_samples_answer_help_and_a_wrong_path_in_a_line(name, tmp_path):
    """They had run `--help` as a bundle path, and a wrong path ended in a traceback."""
    sample = str(ROOT / "samples" / name)
    usage = subprocess.run([sys.executable, sample, "--help"], capture_output=True,
                           text=True, timeout=60, cwd=ROOT)
    assert usage.returncode != 0 and f"python samples/{name}" in usage.stderr
    wrong = subprocess.run([sys.executable, sample, str(tmp_path / "nowhere")],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert wrong.returncode != 0 and "Traceback" not in wrong.stderr
    assert wrong.stderr.strip() == f"error: {tmp_path / 'nowhere'} does not exist"


@pytest.mark.parametrize(
    "name", ["chat.py", "concurrent_sessions.py", "embed_in_app.py", "demo.py"]
)
def test_samples_refuse_a_bundle_that_generates_no_text_in_a_line(name, retrieval_bundles):
    """An embedding bundle: embed_in_app had hung (its worker died), the others printed
    tracebacks (concurrent_sessions then exited 0)."""
    embed = retrieval_bundles[0]
    result = subprocess.run([sys.executable, str(ROOT / "samples" / name), str(embed)],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"error: {embed} generates no text (its task is 'embed')"


@pytest.fixture(scope="module")
def retrieval_bundles(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny model as an embedding bundle and as a reranker of its words ivory/jade."""
    from edgeprefill.export.exporter import ExportOptions, export
    from edgeprefill.export.score_head import ScoreOptions
    from tests.conftest import TINY_MODEL

    embed, rerank = tmp_path_factory.mktemp("tiny-embed"), tmp_path_factory.mktemp("tiny-rr")
    export(TINY_MODEL, embed, ExportOptions(show_progress=False, overwrite=True, task="embed"))
    export(TINY_MODEL, rerank, ExportOptions(
        show_progress=False, overwrite=True, task="score",
        score=ScoreOptions(tokens=("ivory", "jade"), template="{document} {query}")))
    return embed, rerank


def test_rag_sample_answers_from_the_passage_it_retrieved(tiny_bundle, retrieval_bundles):
    """Its nearest passages are the embeddings' cosine order, its reranked ones the
    reranker's, and the chat model answers with the secret of the first of them."""
    from edgeprefill import Engine

    namespace: dict = {}  # the sample's passages and question: its lines before argv
    exec((ROOT / "samples" / "rag.py").read_text().split("bundles = sys.argv")[0], namespace)
    passages, question = namespace["PASSAGES"], namespace["QUESTION"]
    embed, rerank = retrieval_bundles
    with Engine.load(embed) as engine:
        vectors, query = engine.embed(passages), engine.embed(question)[0]
    nearest = [int(i) for i in np.argsort(-(vectors @ query))[:3]]
    with Engine.load(rerank) as engine:
        reranked = [nearest[i] for i, _ in engine.rerank(question, [passages[i] for i in
                                                                     nearest])]
    for bundles, order in (([embed, tiny_bundle], nearest),
                           ([embed, tiny_bundle, rerank], reranked)):
        result = subprocess.run([sys.executable, str(ROOT / "samples" / "rag.py"),
                                 *map(str, bundles)], capture_output=True, text=True,
                                timeout=300, cwd=ROOT)
        assert result.returncode == 0, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == f"nearest: {nearest}"
        secret = passages[order[0]].split()[3]  # "the secret is jade . ..."
        assert lines[-1] == f"answer from passage {order[0]}: {secret}"
    assert lines[1] == f"reranked: {reranked}" and reranked != nearest  # it reordered


def test_rag_sample_answers_help_and_a_wrong_path_in_a_line(tmp_path):
    sample = str(ROOT / "samples" / "rag.py")
    usage = subprocess.run([sys.executable, sample, "--help"], capture_output=True,
                           text=True, timeout=60, cwd=ROOT)
    assert usage.returncode != 0 and "python samples/rag.py" in usage.stderr
    wrong = subprocess.run([sys.executable, sample, str(tmp_path / "nowhere"), "x"],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert wrong.returncode != 0 and "Traceback" not in wrong.stderr
    assert wrong.stderr.strip() == f"error: {tmp_path / 'nowhere'} does not exist"
