"""Score bundles (rerankers, reward models): a supported family's
*ForSequenceClassification exports with --task score, its `score` head applied by the
runtime, and Engine.score's rows are transformers' logits of that class; a causal LM with
--score-tokens and --score-template (Qwen3-Reranker's no,yes) gives transformers' logits
of those tokens at the last position, Engine.rerank sigmoid(yes - no). The server's routes:
tests/test_serve_score.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from edgeprefill.bundle import load_manifest
from edgeprefill.contract import HIDDEN, LOGITS
from edgeprefill.errors import ExportError, RequestError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.score_head import HEAD_FILE, ScoreOptions
from edgeprefill.sdk import Engine
from tests.conftest import build_hf_model
from tests.test_embed import assert_edits_refused

CHUNK = 16
CONTEXT = 128
TEMPLATE = "w3 w4 {query} w8 {document} w9"  # a token reranker's pair format
LONG = " ".join(f"w{10 + i % 80}" for i in range(40))  # three chunks, with the template
QUERY = "w20 w21"
DOCUMENTS = ["w22 w23", LONG, "w50", "w61 w62 w63 w64"]


def as_classifier(hf_dir: Path, out: Path, family: str, labels: int) -> Path:
    """`hf_dir`'s decoder as transformers' <Family>ForSequenceClassification with
    `labels` outputs (its own id2label names where more than one), a random score head."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(hf_dir)
    config.num_labels = labels
    if labels > 1:
        config.id2label = {i: f"grade{i}" for i in range(labels)}
        config.label2id = {f"grade{i}": i for i in range(labels)}
    cls = getattr(transformers, f"{type(config).__name__.removesuffix('Config')}"
                                f"ForSequenceClassification")
    torch.manual_seed(1)
    model = cls(config)
    base = transformers.AutoModel.from_pretrained(hf_dir, dtype=torch.float32)
    model.model.load_state_dict(base.state_dict())
    with torch.no_grad():
        model.score.weight.normal_(0, 0.3)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (hf_dir / name).is_file():
            shutil.copyfile(hf_dir / name, out / name)
    assert json.loads((out / "config.json").read_text())["architectures"] == [cls.__name__]
    return out


def export_score(hf: Path, out: Path, tokens: tuple[str, ...] = (),
                 template: str | None = None) -> Path:
    export(hf, out, ExportOptions(chunks=(CHUNK,), max_context=CONTEXT, show_progress=False,
                                  overwrite=True, task="score",
                                  score=ScoreOptions(tokens, template)))
    return out


@pytest.fixture(scope="module")
def classifiers(tmp_path_factory):
    """(family, labels) -> (checkpoint, bundle), each built once."""
    made: dict[tuple[str, int], tuple[Path, Path]] = {}

    def get(family: str, labels: int) -> tuple[Path, Path]:
        if (family, labels) not in made:
            base = build_hf_model(family, tmp_path_factory.mktemp(f"{family}-lm"))
            hf = as_classifier(base, tmp_path_factory.mktemp(f"{family}-cls{labels}"),
                               family, labels)
            made[family, labels] = hf, export_score(
                hf, tmp_path_factory.mktemp(f"bundle-{family}-cls{labels}"))
        return made[family, labels]

    return get


@pytest.fixture(scope="module")
def reranker(tmp_path_factory) -> tuple[Path, Path]:
    """A causal LM exported as a token reranker of w5 ("no") and w6 ("yes")."""
    hf = build_hf_model("qwen3", tmp_path_factory.mktemp("qwen3-reranker"))
    return hf, export_score(hf, tmp_path_factory.mktemp("bundle-reranker"), ("w5", "w6"),
                            TEMPLATE)


def classifier_logits(hf: Path, ids_list: list[list[int]]) -> np.ndarray:
    """transformers' AutoModelForSequenceClassification logits of each text alone."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(hf, dtype=torch.float32)
    with torch.no_grad():
        return np.stack([model(torch.tensor([ids])).logits[0].numpy() for ids in ids_list])


def token_logits(hf: Path, ids_list: list[list[int]], tokens: list[int]) -> np.ndarray:
    """transformers' CausalLM logits of `tokens` at each text's last position."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    with torch.no_grad():
        return np.stack([model(torch.tensor([ids])).logits[0, -1, tokens].numpy()
                         for ids in ids_list])


def pair_ids(hf: Path, query: str, document: str) -> list[int]:
    """The tokenizer's pair encoding, which transformers' fast tokenizer(query, document)
    (CrossEncoder's call) runs. (AutoTokenizer misreads the fixture's WordLevel
    tokenizer.json, so tokenizers' own Tokenizer is called.)"""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(hf / "tokenizer.json")).encode(query, document).ids


def words(text: str) -> list[int]:
    return [int(w[1:]) for w in text.split()]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x.astype(np.float64)))


# -- export ------------------------------------------------------------------------------


@pytest.mark.parametrize("family, labels", [("qwen3", 1), ("qwen3", 3), ("llama", 1)])
def test_a_classifier_exports_a_score_bundle_of_its_head(classifiers, family, labels):
    hf, out = classifiers(family, labels)
    manifest = load_manifest(out)
    assert manifest.task == "score" and manifest.score is not None
    assert manifest.graph.outputs[HIDDEN] == ["float32", ["batch", 64]]
    assert LOGITS not in manifest.graph.outputs
    assert HEAD_FILE in manifest.files
    score = manifest.score
    assert (score.kind, score.template, score.pad_token_id) == ("classifier", None, 0)
    assert score.labels == (["LABEL_0"] if labels == 1 else ["grade0", "grade1", "grade2"])
    assert score.relevance == ("sigmoid" if labels == 1 else "none")
    raw = json.loads((out / "edgeprefill.json").read_text())
    assert raw["task"] == "score" and "embedding" not in raw and raw["score"]["head"] == HEAD_FILE


def test_export_and_inspect_name_what_a_three_label_head_answers(classifiers, tmp_path):
    # Engine.rerank, /v1/rerank and run --query refuse a head of more than two labels (no
    # one relevance): export's and inspect's lines name Engine.score alone
    from tests.test_cli_errors import cli

    hf, out = classifiers("qwen3", 3)
    made = cli("export", hf, "-o", tmp_path / "b", "--chunks", "16", "--quiet", "--task",
               "score")
    assert made.returncode == 0, made.stderr
    assert made.stderr.splitlines()[0] == ("a score bundle (classifier: grade0, grade1, "
                                           "grade2; relevance none): Engine.score")
    shown = cli("inspect", out).stdout
    assert "task        score: a classifier head (score_head.safetensors), labels grade0, " \
        "grade1, grade2; relevance none: more than two labels (Engine.score only; `run` " \
        "prints the scores)\n" in shown
    with Engine.load(out, threads=1) as engine:  # what the lines leave out is refused
        with pytest.raises(RequestError, match="no one relevance to rank by"):
            engine.rerank(QUERY, DOCUMENTS)


def test_auto_still_refuses_a_classifier_and_names_task_score(classifiers, tmp_path):
    hf, _ = classifiers("qwen3", 1)
    with pytest.raises(ExportError, match="is a classifier .*`export --task score` exports "
                                          "it") as err:
        export(hf, tmp_path / "b", ExportOptions(chunks=(CHUNK,), show_progress=False))
    assert "\n" not in str(err.value) and not (tmp_path / "b").exists()


def test_score_options_refusals_are_one_line(classifiers, hf_model, tmp_path):
    cases = [
        (ExportOptions, dict(task="generate", score=ScoreOptions((), TEMPLATE)),
         "apply to --task score"),
        (ExportOptions, dict(task="score", score=ScoreOptions(("w5",), "w3 {query}")),
         "--score-template lacks \\{document\\}"),
        (ExportOptions, dict(task="score", score=ScoreOptions(("a", "b", "c"), TEMPLATE)),
         "one token or two"),
    ]
    for make, kwargs, said in cases:
        with pytest.raises(ExportError, match=said) as err:
            make(**kwargs)
        assert "\n" not in str(err.value)
    exports = [
        (hf_model("qwen3"), ScoreOptions(), "a \\*ForSequenceClassification folder"),
        (hf_model("qwen3"), ScoreOptions(("w5", "maybe"), TEMPLATE),
         "'maybe' is not one token"),
        # one token twice: every pair would score sigmoid(0) = 0.5
        (hf_model("qwen3"), ScoreOptions(("w5", "w5"), TEMPLATE),
         "'w5' and 'w5' are the same token"),
        (hf_model("qwen3"), ScoreOptions(("w5", "w6")), "--score-tokens needs --score-template"),
        (classifiers("qwen3", 1)[0], ScoreOptions(("w5",), TEMPLATE),
         "a classifier \\(Qwen3ForSequenceClassification\\) has not"),
        # a classifier's own reason, not the template a token reranker would need
        (classifiers("qwen3", 1)[0], ScoreOptions(("w5",)),
         "a classifier \\(Qwen3ForSequenceClassification\\) has not"),
    ]
    for hf, score, said in exports:
        with pytest.raises(ExportError, match=said) as err:
            export(hf, tmp_path / "b", ExportOptions(chunks=(CHUNK,), show_progress=False,
                                                     task="score", score=score))
        assert "\n" not in str(err.value) and not (tmp_path / "b").exists()


def test_a_token_reranker_records_its_tokens_and_template(reranker):
    manifest = load_manifest(reranker[1])
    assert manifest.score is not None
    assert (manifest.score.kind, manifest.score.labels, manifest.score.relevance,
            manifest.score.template) == ("tokens", ["w5", "w6"], "sigmoid_difference",
                                         TEMPLATE)


def test_the_manifest_s_score_record_is_checked(reranker, tmp_path):
    assert_edits_refused(reranker[1], tmp_path, (
        (lambda r: r.pop("score"), "'score' record"),
        (lambda r: r.update(task="embed"), "'embedding' record"),
        (lambda r: r.update(task="embed", embedding={
            "pooling": "lasttoken", "normalize": True}), "'score' record"),
        (lambda r: r["score"].update(relevance="sigmoid"), "does not fit 2"),
        (lambda r: r["score"].update(kind="regressor"), "score.kind"),
        (lambda r: r["score"].update(head="other.safetensors"),
         "not one of the bundle's files"),
        (lambda r: r["score"].update(labels="w5"), "'labels' must be"),
    ))


# -- Engine.score and Engine.rerank ------------------------------------------------------


@pytest.mark.parametrize("family, labels", [("qwen3", 1), ("qwen3", 3), ("llama", 1)])
def test_classifier_scores_are_transformers_logits(classifiers, family, labels):
    hf, out = classifiers(family, labels)
    texts = ["w5 w6 w7", LONG, "w9 w0 w0"]  # the last ends in pad tokens (w0, id 0)
    with Engine.load(out, threads=1, kv_slots=2) as engine:
        got = engine.score(texts)
        pairs = engine.score([(QUERY, d) for d in DOCUMENTS])
    assert got.dtype == np.float32 and got.shape == (3, labels)
    ids = [engine.tokenizer.encode(t) for t in texts]
    assert len(ids[1]) > 2 * CHUNK and ids[2][-2:] == [0, 0]
    np.testing.assert_allclose(got, classifier_logits(hf, ids), atol=1e-5)
    # a pair without a template: the tokenizer's pair encoding, CrossEncoder's input
    want = classifier_logits(hf, [pair_ids(hf, QUERY, d) for d in DOCUMENTS])
    np.testing.assert_allclose(pairs, want, atol=1e-5)


def test_a_one_label_classifier_ranks_by_the_sigmoid(classifiers):
    hf, out = classifiers("qwen3", 1)
    want = sigmoid(classifier_logits(hf, [pair_ids(hf, QUERY, d) for d in DOCUMENTS])[:, 0])
    with Engine.load(out, threads=1, kv_slots=2) as engine:
        ranked = engine.rerank(QUERY, DOCUMENTS)
        top = engine.rerank(QUERY, DOCUMENTS, top_n=2)
        numpy_top = engine.rerank(QUERY, DOCUMENTS, top_n=np.int64(2))  # was refused
    assert [i for i, _ in ranked] == list(np.argsort(-want, kind="stable"))
    np.testing.assert_allclose([r for _, r in ranked], np.sort(want)[::-1], atol=1e-6)
    # The same documents, the same scores: but a later call may read an earlier one's
    # prompt from the prefix cache, and a token computed in another call is the same
    # number only to float32's last bits (docs/design.md), so scores are compared as such.
    for same in (top, numpy_top):
        assert [i for i, _ in same] == [i for i, _ in ranked[:2]]
        np.testing.assert_allclose([r for _, r in same], [r for _, r in ranked[:2]], atol=1e-6)


def test_a_token_reranker_gives_transformers_token_logits(reranker):
    hf, out = reranker
    with Engine.load(out, threads=1, kv_slots=2) as engine:
        pairs = [(QUERY, d) for d in DOCUMENTS]
        got = engine.score(pairs)
        ranked = engine.rerank(QUERY, DOCUMENTS, top_n=3)
    ids = [words(TEMPLATE.replace("{query}", QUERY).replace("{document}", d))
           for d in DOCUMENTS]
    assert len(ids[1]) > 2 * CHUNK
    want = token_logits(hf, ids, [5, 6])
    np.testing.assert_allclose(got, want, atol=1e-4)
    relevance = sigmoid(want[:, 1] - want[:, 0])
    order = np.argsort(-relevance, kind="stable")[:3]
    assert [i for i, _ in ranked] == list(order)
    np.testing.assert_allclose([r for _, r in ranked], relevance[order], atol=1e-5)


@pytest.mark.parametrize("family", ["gemma2", "granite"])
def test_a_family_s_logit_transforms_are_applied(family, tmp_path):
    """Gemma 2's final soft-capping, Granite's logits_scaling: recorded, applied."""
    hf = build_hf_model(family, tmp_path / "hf",
                        **({"final_logit_softcapping": 0.5} if family == "gemma2" else {}))
    out = export_score(hf, tmp_path / "b", ("w7",), TEMPLATE)
    score = load_manifest(out).score
    assert score is not None and score.relevance == "sigmoid"
    if family == "gemma2":
        assert score.softcap == 0.5
    else:
        assert score.scale != 1.0
    with Engine.load(out, threads=1, kv_slots=1) as engine:
        got = engine.score([(QUERY, d) for d in DOCUMENTS[:2]])
    ids = [words(TEMPLATE.replace("{query}", QUERY).replace("{document}", d))
           for d in DOCUMENTS[:2]]
    np.testing.assert_allclose(got, token_logits(hf, ids, [7]), atol=1e-4)


def test_a_template_fills_its_placeholders_once(reranker):
    from edgeprefill.sdk.scoring import render

    assert render("a {query} b {document}", "{document}", "x") == "a {document} b x"
    with Engine.load(reranker[1], threads=1, kv_slots=1) as engine:
        from edgeprefill.sdk import scoring

        assert scoring.pair_ids(engine.tokenizer, engine.manifest.score, "w20", "w21") == \
            [3, 4, 20, 8, 21, 9]


def test_score_refusals_are_one_line(classifiers, reranker, bundle):
    _, three = classifiers("qwen3", 3)
    cases = []
    with Engine.load(three, threads=1, kv_slots=1) as engine:
        cases += [
            (lambda: engine.rerank(QUERY, DOCUMENTS), "has 3 labels \\(grade0, grade1, "
                                                      "grade2\\), no one relevance"),
        ]
        for call, said in cases:
            with pytest.raises(RequestError, match=said) as err:
                call()
            assert "\n" not in str(err.value)
    with Engine.load(reranker[1], threads=1, kv_slots=1) as engine:
        for call, said in (
                (lambda: engine.generate("w5"), "is a score model"),
                (lambda: engine.session().generate("w5"), "is a score model"),
                (lambda: engine.embed("w5"), "is a score model"),
                (lambda: engine.score(["w5", " ".join(["w7"] * (CONTEXT + 1))]),
                 f"texts\\[1\\]: a text of {CONTEXT + 1} tokens exceeds"),
                (lambda: engine.score([]), "texts must be"),
                (lambda: engine.score([("w5",)]), "a string or a \\(query, document\\) pair"),
                (lambda: engine.rerank(QUERY, []), "documents must be a non-empty list"),
                (lambda: engine.rerank(QUERY, ["w5", 3]), "documents must be"),
                (lambda: engine.rerank(QUERY, ["w5"], top_n=-1), "top_n must be"),
                (lambda: engine.rerank(None, ["w5"]), "query must be a non-empty string"),
                # "" was ranked against, as the rerank route refuses it
                (lambda: engine.rerank("", ["w5"]), "^query must be a non-empty string, "
                                                    "got ''$")):
            with pytest.raises(RequestError, match=said) as err:
                call()
            assert "\n" not in str(err.value)
        # the whole context may be the text
        assert engine.score(" ".join(["w7"] * CONTEXT)).shape == (1, 2)
    with Engine.load(bundle("llama"), threads=1, kv_slots=1) as engine:
        for call in (lambda: engine.score("w5"), lambda: engine.rerank("w5", ["w6"])):
            with pytest.raises(RequestError, match="is a generation model \\(llama\\): "
                                                   "it gives no scores") as err:
                call()
            assert "\n" not in str(err.value)


# -- the command line ----------------------------------------------------------------------


def test_export_run_and_inspect_a_token_reranker(hf_model, tmp_path):
    """export --task score --score-tokens --score-template-file (its trailing newlines
    kept), inspect's task and pair lines, run --query's ranking and run's raw scores."""
    from tests.test_cli_errors import cli

    hf = hf_model("qwen3")
    template = tmp_path / "template.txt"
    template.write_text(TEMPLATE + "\n\n")  # a template that ends in newlines keeps them
    made = cli("export", hf, "-o", tmp_path / "b", "--chunks", "16", "--max-context", "128",
               "--quiet", "--task", "score", "--score-tokens", "w5, w6",
               "--score-template-file", template)
    assert made.returncode == 0, made.stderr
    assert made.stderr.splitlines()[0] == ("a score bundle (tokens: w5, w6; relevance "
                                           "sigmoid_difference): Engine.score, Engine.rerank; "
                                           "on serve POST /v1/rerank, /rerank, /score")
    score = load_manifest(tmp_path / "b").score
    assert score is not None and score.template == TEMPLATE + "\n\n"
    shown = cli("inspect", tmp_path / "b").stdout
    assert "task        score: a tokens head (score_head.safetensors), labels w5, w6; " \
        "relevance sigmoid(w6 - w5)" in shown
    assert f"pair        {json.dumps(TEMPLATE + chr(10) * 2)}" in shown
    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(DOCUMENTS) + "\n")
    ranked = cli("run", tmp_path / "b", "--query", QUERY, "--prompts", docs, "--threads", "1")
    assert ranked.returncode == 0, ranked.stderr
    ids = [words(TEMPLATE.replace("{query}", QUERY).replace("{document}", d))
           for d in DOCUMENTS]
    want = token_logits(hf, ids, [5, 6])
    relevance = sigmoid(want[:, 1] - want[:, 0])
    lines = [line.split() for line in ranked.stdout.splitlines()]
    assert [int(i) for i, _ in lines] == list(np.argsort(-relevance, kind="stable"))
    np.testing.assert_allclose([float(r) for _, r in lines], np.sort(relevance)[::-1],
                               atol=1e-5)
    raw = cli("run", tmp_path / "b", "w20 w21 w22", "--threads", "1")
    assert raw.returncode == 0, raw.stderr
    np.testing.assert_allclose([json.loads(raw.stdout)],
                               token_logits(hf, [[20, 21, 22]], [5, 6]), atol=1e-4)


@pytest.mark.parametrize("args, said", [
    (["w5", "--temperature", "0.5"], "error: --temperature does not apply to a score bundle "
                                     "(it generates nothing): `run` prints scores, or with "
                                     "--query a ranking"),
    (["w5", "--dimensions", "4"], "error: --dimensions applies to an embedding bundle only; "
                                  "this one scores texts"),
    (["--prompts", "{lines}", "--query", "w6"], "error: --prompts line 1: a score bundle "
                                                "reads one text a line (plain text or a "
                                                "JSON string)"),
])
def test_run_refuses_other_options_on_a_score_bundle(reranker, args, said, tmp_path):
    from tests.test_cli_errors import cli

    lines = tmp_path / "lines.jsonl"
    lines.write_text('{"prompt": "w5"}\n')  # a generation request's line
    result = cli("run", reranker[1], *[str(lines) if a == "{lines}" else a for a in args])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [said]


def test_query_is_refused_on_other_bundles(bundle):
    from tests.test_cli_errors import cli

    refused = cli("run", bundle("llama"), "w5", "--query", "w6")
    assert refused.returncode == 2
    assert refused.stderr.strip() == \
        "error: --query applies to a score bundle (a reranker) only"
