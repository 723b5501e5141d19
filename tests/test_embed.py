"""Embedding bundles: a sentence-transformers folder of a causal LM with last-token pooling
(Qwen3-Embedding's layout: modules.json, 1_Pooling, Normalize; the base model's tensors
saved without `model.` and without an LM head; a tokenizer whose post-processor appends
the end token) exports a graph whose output is each row's last hidden state, and
Engine.embed's vectors are transformers' base model's last hidden state of the text's
last token, L2-normalized, computed here. The server's routes: tests/test_serve_embed.py.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from edgeprefill.bundle import load_manifest
from edgeprefill.contract import HIDDEN, LOGITS
from edgeprefill.errors import BundleError, ExportError, RequestError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.sdk import Engine
from tests.conftest import build_hf_model

CHUNK = 16
CONTEXT = 128
LAST_TOKEN = {"word_embedding_dimension": 64, "pooling_mode_cls_token": False,
              "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
              "pooling_mode_mean_sqrt_len_tokens": False,
              "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": True,
              "include_prompt": True}
TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type":
               "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type":
           "sentence_transformers.models.Pooling"}
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type":
             "sentence_transformers.models.Normalize"}
TEXTS = ["w5 w6 w7", "  w9 w10\n", " ".join(f"w{3 + i % 90}" for i in range(45))]
# config_sentence_transformers.json as Qwen3-Embedding's ("Instruct: ...\nQuery:" for
# queries, nothing for documents), its prompt in the fixture tokenizer's words
QUERY = "w40 w41 "
PROMPTS = {"prompts": {"query": QUERY, "document": ""}, "default_prompt_name": None,
           "similarity_fn_name": "cosine"}


def as_embedding_model(hf_dir: Path, pooling: dict | None = None,
                       modules: list | None = None) -> Path:
    """`hf_dir` (a saved causal LM) in Qwen3-Embedding-8B's layout: tensors without the
    `model.` prefix and no lm_head (its config unties the embeddings), sentence-
    transformers' modules, and a tokenizer that appends the end token w2."""
    from tokenizers import Tokenizer, processors

    path = hf_dir / "model.safetensors"
    stored = load_file(str(path))
    save_file({k.removeprefix("model."): v for k, v in stored.items()
               if not k.startswith("lm_head.")}, str(path), metadata={"format": "pt"})
    tokenizer = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A w2", pair="$A $B w2", special_tokens=[("w2", 2)])
    tokenizer.save(str(hf_dir / "tokenizer.json"))
    (hf_dir / "modules.json").write_text(json.dumps(
        modules if modules is not None else [TRANSFORMER, POOLING, NORMALIZE]))
    (hf_dir / "1_Pooling").mkdir(exist_ok=True)
    (hf_dir / "1_Pooling" / "config.json").write_text(json.dumps(pooling or LAST_TOKEN))
    (hf_dir / "2_Normalize").mkdir(exist_ok=True)
    return hf_dir


@pytest.fixture(scope="module")
def embed_model(tmp_path_factory) -> Path:
    hf = as_embedding_model(build_hf_model("qwen3", tmp_path_factory.mktemp("qwen3-embedding")))
    (hf / "config_sentence_transformers.json").write_text(json.dumps(PROMPTS))
    return hf


@pytest.fixture(scope="module")
def embed_bundle(embed_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle-embedding")
    export(embed_model, out, ExportOptions(chunks=(CHUNK,), max_context=CONTEXT,
                                           show_progress=False, overwrite=True))
    return out


@pytest.fixture(scope="module")
def embed_engine(embed_bundle):
    engine = Engine.load(embed_bundle, threads=1, kv_slots=2)
    yield engine
    engine.close()


def reference(hf_dir: Path, texts: list[str], normalize: bool = True) -> np.ndarray:
    """transformers' base model (AutoModel) on each text alone: the last token's hidden
    state (the final norm applied), L2-normalized in float64, as sentence-transformers'
    Transformer, Pooling(lasttoken) and Normalize modules compute it (without
    `normalize`, as the first two do)."""
    from tokenizers import Tokenizer
    from transformers import AutoModel

    model, info = AutoModel.from_pretrained(hf_dir, dtype=torch.float32,
                                            output_loading_info=True)
    assert not info["missing_keys"], info  # it read the base model's unprefixed tensors
    tokenizer = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    rows = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer.encode(text.strip()).ids  # sentence-transformers strips
            hidden = model(torch.tensor([ids])).last_hidden_state[0, -1].double().numpy()
            rows.append(hidden / np.linalg.norm(hidden) if normalize else hidden)
    return np.stack(rows)


# -- export ------------------------------------------------------------------------------


def test_a_sentence_transformers_folder_exports_an_embedding_bundle(embed_bundle):
    manifest = load_manifest(embed_bundle)
    assert manifest.task == "embed"
    assert manifest.embedding is not None
    assert (manifest.embedding.pooling, manifest.embedding.normalize) == ("lasttoken", True)
    assert manifest.graph.outputs[HIDDEN] == ["float32", ["batch", 64]]
    assert LOGITS not in manifest.graph.outputs
    raw = json.loads((embed_bundle / "edgeprefill.json").read_text())
    assert raw["task"] == "embed" and raw["embedding"] == {
        "pooling": "lasttoken", "normalize": True, "prompts": {"query": QUERY, "document": ""}}


def test_a_generation_manifest_says_no_task(bundle):
    raw = json.loads((bundle("llama") / "edgeprefill.json").read_text())
    assert "task" not in raw and "embedding" not in raw
    assert load_manifest(bundle("llama")).task == "generate"


def assert_edits_refused(bundle: Path, tmp_path: Path, edits) -> None:
    """Each (edit, said) of `edits` made to a copy of the bundle's manifest alone: loading
    it refuses in one line matching `said`."""
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    path = copy / "edgeprefill.json"
    raw = json.loads(path.read_text())
    for edit, said in edits:
        edited = json.loads(json.dumps(raw))
        edit(edited)
        path.write_text(json.dumps(edited))
        with pytest.raises(BundleError, match=said) as err:
            load_manifest(copy)
        assert "\n" not in str(err.value)


def test_the_manifest_must_agree_with_the_graph_s_output(embed_bundle, tmp_path):
    assert_edits_refused(embed_bundle, tmp_path, (
        (lambda r: r.pop("embedding"), "embedding"),
        (lambda r: r.update(task="vectors"), "task must be one of"),
        (lambda r: r.update(task="generate"), "embedding"),
        (lambda r: r.update(task="generate", embedding=None),
         "unexpected hidden"),
        (lambda r: (r.pop("task"), r.pop("embedding")), "unexpected hidden"),
        (lambda r: r["embedding"].update(pooling="mean"), "pooling"),
    ))


@pytest.mark.parametrize("pooling, named", [
    ({**LAST_TOKEN, "pooling_mode_lasttoken": False, "pooling_mode_mean_tokens": True},
     "by mean"),
    ({**LAST_TOKEN, "pooling_mode_lasttoken": False, "pooling_mode_cls_token": True}, "by cls"),
    ({**LAST_TOKEN, "pooling_mode_mean_tokens": True}, "by mean \\+ lasttoken"),
    ({"pooling_mode": "weightedmean"}, "by weightedmean"),
])
def test_other_poolings_are_refused_in_one_line(pooling, named, tmp_path):
    hf = as_embedding_model(build_hf_model("qwen3", tmp_path / "hf"), pooling)
    with pytest.raises(ExportError, match=named) as err:
        export(hf, tmp_path / "b", ExportOptions(chunks=(CHUNK,), max_context=CONTEXT,
                                                 show_progress=False))
    assert "\n" not in str(err.value) and not (tmp_path / "b").exists()


def test_a_module_other_than_pooling_and_normalize_is_refused(tmp_path):
    dense = {"idx": 2, "name": "2", "path": "2_Dense",
             "type": "sentence_transformers.models.Dense"}
    hf = as_embedding_model(build_hf_model("qwen3", tmp_path / "hf"),
                            modules=[TRANSFORMER, POOLING, dense])
    with pytest.raises(ExportError, match="models.Dense at 2_Dense is not exported"):
        export(hf, tmp_path / "b", ExportOptions(chunks=(CHUNK,), max_context=CONTEXT,
                                                 show_progress=False))


def test_task_generate_exports_the_lm_of_an_embedding_folder(tmp_path):
    # A tied checkpoint (Qwen3-Embedding-0.6B's) has its head: the embedding.
    hf = as_embedding_model(build_hf_model("qwen3", tmp_path / "hf", tie_word_embeddings=True))
    manifest = export(hf, tmp_path / "b", ExportOptions(
        chunks=(CHUNK,), max_context=CONTEXT, show_progress=False, task="generate"))
    assert manifest.task == "generate" and LOGITS in manifest.graph.outputs


def test_task_embed_without_modules_json_is_last_token_normalized(tmp_path, caplog):
    hf = build_hf_model("qwen3", tmp_path / "hf")  # stores its own lm_head
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        manifest = export(hf, tmp_path / "b", ExportOptions(
            chunks=(CHUNK,), max_context=CONTEXT, show_progress=False, task="embed"))
    assert manifest.embedding is not None and manifest.embedding.normalize
    assert "does not use" not in caplog.text  # the head is left out, as AutoModel does
    raw = json.loads((tmp_path / "b" / "edgeprefill.json").read_text())
    assert raw["embedding"] == {"pooling": "lasttoken", "normalize": True}  # no prompts
    with pytest.raises(ExportError, match="unknown task 'vectors'"):
        ExportOptions(task="vectors")


def test_an_untied_headless_checkpoint_still_refuses_generation(tmp_path):
    # Qwen3-Embedding-8B: tie_word_embeddings false and no lm_head
    hf = as_embedding_model(build_hf_model("qwen3", tmp_path / "hf"))
    with pytest.raises(ExportError, match="lacks the tensor 'lm_head.weight'"):
        export(hf, tmp_path / "b", ExportOptions(chunks=(CHUNK,), max_context=CONTEXT,
                                                 show_progress=False, task="generate"))


# -- Engine.embed --------------------------------------------------------------------------


def test_vectors_are_transformers_last_token_states_normalized(embed_engine, embed_model):
    got = embed_engine.embed(TEXTS)
    assert got.dtype == np.float32 and got.shape == (len(TEXTS), 64)
    # the third text is 46 tokens: three chunks of 16
    assert len(embed_engine.tokenizer.encode(TEXTS[2])) > 2 * CHUNK
    np.testing.assert_allclose(got, reference(embed_model, TEXTS), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_one_text_and_each_alone_give_the_same_rows(embed_engine):
    together = embed_engine.embed(TEXTS)
    for i, text in enumerate(TEXTS):
        np.testing.assert_allclose(embed_engine.embed(text)[0], together[i], atol=1e-6)
    embed_engine.check_integrity()


def test_dimensions_truncate_then_renormalize(embed_engine, embed_model):
    got = embed_engine.embed(TEXTS[:2], dimensions=16)
    full = reference(embed_model, TEXTS[:2])[:, :16]
    np.testing.assert_allclose(got, full / np.linalg.norm(full, axis=1, keepdims=True),
                               atol=1e-5)
    for bad in (0, 65, 1.5, True):
        with pytest.raises(RequestError, match="dimensions must be an integer in 1..64"):
            embed_engine.embed("w5", dimensions=bad)


def test_a_text_longer_than_the_context_is_refused(embed_engine):
    with pytest.raises(RequestError, match=f"texts\\[1\\]: a text of {CONTEXT + 1} tokens "
                       f"exceeds the context of {CONTEXT} tokens"):
        embed_engine.embed(["w5", " ".join(["w7"] * CONTEXT)])
    # the whole context may be the text: nothing is generated after it
    assert embed_engine.embed(" ".join(["w7"] * (CONTEXT - 1))).shape == (1, 64)


def test_an_empty_text_is_refused_as_the_embedding_routes_refuse_it(embed_engine):
    # It was embedded: the tokenizer's special tokens alone, a vector of no text.
    with pytest.raises(RequestError, match="^the text to embed is empty$"):
        embed_engine.embed("")
    with pytest.raises(RequestError, match="^texts\\[1\\]: the text to embed is empty$"):
        embed_engine.embed(["w5", ""])
    # stripped as sentence-transformers strips it: the same vector of no text
    with pytest.raises(RequestError, match="^the text to embed is only whitespace$"):
        embed_engine.embed(" \n ")


def test_numpy_dimensions_are_the_integer_they_hold(embed_engine):
    # np.int64(8) was refused: "dimensions must be an integer in 1..64, got np.int64(8)"
    np.testing.assert_array_equal(embed_engine.embed("w5", dimensions=np.int64(8)),
                                  embed_engine.embed("w5", dimensions=8))


def test_an_embedding_bundle_refuses_generation_in_one_line(embed_engine):
    for call in (lambda: embed_engine.generate("w5 w6"),
                 lambda: embed_engine.session().generate("w5")):
        with pytest.raises(RequestError, match="is an embedding model") as err:
            call()
        assert "\n" not in str(err.value)


def test_an_embedding_bundle_refuses_score_naming_its_cosine_route(embed_engine):
    # "it gives no scores" had hidden that POST /score serves an embedding bundle
    family = embed_engine.manifest.model.family
    for call in (lambda: embed_engine.score("w5"),
                 lambda: embed_engine.rerank("w5", ["w6"])):
        with pytest.raises(RequestError) as err:
            call()
        assert str(err.value) == (
            f"this bundle is an embedding model ({family}): it gives no relevance scores, "
            "only POST /score's cosine similarity of two texts; export a reranker with "
            "--task score (a *ForSequenceClassification folder, or a causal LM with "
            "--score-tokens) for Engine.score, Engine.rerank and /v1/rerank")


def test_a_generation_bundle_refuses_embed_in_one_line(bundle):
    with Engine.load(bundle("llama"), threads=1, kv_slots=1) as engine, \
            pytest.raises(RequestError, match="is a generation model") as err:
        engine.embed("w5")
    assert "\n" not in str(err.value)


def test_more_texts_than_the_engine_holds_at_once_keep_their_order(embed_engine, embed_model):
    # 2 KV slots: 4 requests in the engine at a time (Engine._embed_rows)
    texts = [f"w{5 + i} w{40 + 3 * i}" for i in range(9)]
    np.testing.assert_allclose(embed_engine.embed(texts), reference(embed_model, texts),
                               atol=1e-5)


# -- the command line ----------------------------------------------------------------------


def test_run_prints_each_text_s_vector_as_a_json_line(embed_bundle, embed_model, tmp_path):
    from tests.test_cli_errors import cli

    one = cli("run", embed_bundle, TEXTS[0], "--threads", "1")
    assert one.returncode == 0, one.stderr
    np.testing.assert_allclose([json.loads(one.stdout)], reference(embed_model, TEXTS[:1]),
                               atol=1e-5)
    lines = tmp_path / "texts.txt"
    lines.write_text(f"{TEXTS[1].strip()}\n\n{json.dumps(TEXTS[2])}\n")
    many = cli("run", embed_bundle, "--prompts", lines, "--dimensions", "8", "--threads", "1")
    assert many.returncode == 0, many.stderr
    rows = [json.loads(line) for line in many.stdout.splitlines()]
    full = reference(embed_model, TEXTS[1:])[:, :8]
    np.testing.assert_allclose(rows, full / np.linalg.norm(full, axis=1, keepdims=True),
                               atol=1e-5)


@pytest.mark.parametrize("args, option", [
    (["w5", "--temperature", "0.5"], "--temperature"),
    (["w5", "--chat"], "--chat"),
    (["--interactive"], "--interactive"),
])
def test_run_refuses_generation_options_on_an_embedding_bundle(embed_bundle, args, option):
    from tests.test_cli_errors import cli

    result = cli("run", embed_bundle, *args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {option} does not apply to an embedding bundle (it generates nothing): "
        "`run` prints each text's vector"]


def test_inspect_says_the_task(embed_bundle, bundle):
    from tests.test_cli_errors import cli

    embed = cli("inspect", embed_bundle).stdout
    assert "task        embed: lasttoken pooling, L2-normalized, 64 dimensions" in embed
    assert "task        generate" in cli("inspect", bundle("llama")).stdout
    refused = cli("run", bundle("llama"), "w5", "--dimensions", "4")
    assert refused.returncode == 2 and "applies to an embedding bundle only" in refused.stderr


@pytest.mark.parametrize("family, flavor, dtype, atol", [
    ("qwen2", "ort", "fp32", 1e-5),  # gte-Qwen2-instruct's family
    ("mistral", "ort", "fp32", 1e-5),  # e5-mistral-7b-instruct's, SFR-Embedding-Mistral's
    ("qwen3", "standard", "fp32", 1e-5),  # the flavour TensorRT builds from
    ("qwen3", "ort", "fp16", 2e-3),  # a GPU's dtype: `hidden` is float32 all the same
])
def test_other_families_flavours_and_dtypes_match_transformers(family, flavor, dtype, atol,
                                                               tmp_path):
    hf = as_embedding_model(build_hf_model(family, tmp_path / "hf"))
    out = tmp_path / "b"
    export(hf, out, ExportOptions(flavor=flavor, dtype=dtype, chunks=(CHUNK,),
                                  max_context=CONTEXT, show_progress=False))
    with Engine.load(out, threads=1, kv_slots=2) as engine:
        got = engine.embed(TEXTS)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, reference(hf, TEXTS), atol=atol)


def test_export_says_it_made_an_embedding_bundle(embed_model, tmp_path):
    from tests.test_cli_errors import cli

    args = ["export", embed_model, "--chunks", "16", "--max-context", "64", "--quiet"]
    made = cli(*args, "-o", tmp_path / "e")
    assert made.returncode == 0, made.stderr
    assert made.stderr.splitlines()[0] == (
        "an embedding bundle (lasttoken pooling, normalized, 64 dimensions): Engine.embed; "
        "on serve POST /v1/embeddings, /embed, /api/embed, /score")
    lm = cli(*args, "-o", tmp_path / "g", "--task", "generate")
    assert lm.returncode == 2 and "lacks the tensor 'lm_head.weight'" in lm.stderr


def test_a_config_that_says_bidirectional_is_warned_of(tmp_path, caplog):
    hf = as_embedding_model(build_hf_model("qwen3", tmp_path / "hf", is_causal=False))
    assert json.loads((hf / "config.json").read_text())["is_causal"] is False
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        export(hf, tmp_path / "b", ExportOptions(chunks=(CHUNK,), max_context=CONTEXT,
                                                 show_progress=False))
    assert "says is_causal false" in caplog.text


def test_add_eos_token_appends_the_pooled_eos_as_transformers_4_did(tmp_path, caplog):
    """e5-mistral-7b-instruct: tokenizer_config.json's add_eos_token, a tokenizer.json
    whose post-processor adds only BOS; the model pools `</s>` (its README appends it)."""
    from tokenizers import Tokenizer, processors
    from transformers import AutoModel

    hf = as_embedding_model(build_hf_model("mistral", tmp_path / "hf"))
    tokenizer = Tokenizer.from_file(str(hf / "tokenizer.json"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="w1 $A", pair="w1 $A $B", special_tokens=[("w1", 1)])  # BOS only
    tokenizer.save(str(hf / "tokenizer.json"))
    config = json.loads((hf / "tokenizer_config.json").read_text())
    (hf / "tokenizer_config.json").write_text(json.dumps(
        {**config, "add_bos_token": True, "add_eos_token": True}))
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        export(hf, tmp_path / "b", ExportOptions(chunks=(CHUNK,), max_context=CONTEXT,
                                                 show_progress=False))
    assert "appends w2 to each text" in caplog.text
    model = AutoModel.from_pretrained(hf, dtype=torch.float32)
    with Engine.load(tmp_path / "b", threads=1, kv_slots=1) as engine:
        assert engine.tokenizer.encode("w5 w6") == [1, 5, 6, 2]
        got = engine.embed(TEXTS[:2])
    for row, text in zip(got, TEXTS[:2], strict=True):
        ids = [*tokenizer.encode(text.strip()).ids, 2]  # as e5-mistral's README does
        with torch.no_grad():
            hidden = model(torch.tensor([ids])).last_hidden_state[0, -1].double().numpy()
        np.testing.assert_allclose(row, hidden / np.linalg.norm(hidden), atol=1e-5)


# -- prompts (config_sentence_transformers.json) -------------------------------------------


def test_a_named_prompt_goes_before_each_text(embed_engine, embed_model):
    # sentence-transformers' encode(prompt_name="query"): the prompt, then the text, stripped
    want = reference(embed_model, [QUERY + text for text in TEXTS])
    np.testing.assert_allclose(embed_engine.embed(TEXTS, prompt_name="query"), want, atol=1e-5)
    np.testing.assert_allclose(embed_engine.embed(TEXTS, prompt=QUERY), want, atol=1e-5)
    plain = reference(embed_model, TEXTS)
    np.testing.assert_allclose(embed_engine.embed(TEXTS, prompt_name="document"), plain,
                               atol=1e-5)
    np.testing.assert_allclose(embed_engine.embed(TEXTS), plain, atol=1e-5)  # no default


@pytest.mark.parametrize("kwargs, said", [
    ({"prompt_name": "passage"}, "prompt_name 'passage' is none of the model's prompts: "
                                 "'query', 'document'"),
    ({"prompt_name": "query", "prompt": "w3 "}, "give a prompt or a prompt_name, not both"),
    ({"prompt": 3}, "prompt must be a string, got int"),
])
def test_a_prompt_the_model_lacks_is_refused_in_one_line(embed_engine, kwargs, said):
    with pytest.raises(RequestError, match=said):
        embed_engine.embed(TEXTS, **kwargs)


def test_the_default_prompt_goes_before_every_text_unless_another_is_given(
        embed_bundle, embed_model, tmp_path):
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(embed_bundle, copy)
    path = copy / "edgeprefill.json"
    raw = json.loads(path.read_text())
    raw["embedding"]["default_prompt_name"] = "query"
    path.write_text(json.dumps(raw))
    with Engine.load(copy, threads=1, kv_slots=1) as engine:
        np.testing.assert_allclose(engine.embed(TEXTS[:2]),
                                   reference(embed_model, [QUERY + t for t in TEXTS[:2]]),
                                   atol=1e-5)
        np.testing.assert_allclose(engine.embed(TEXTS[:2], prompt=""),  # as ST's prompt=""
                                   reference(embed_model, TEXTS[:2]), atol=1e-5)
    raw["embedding"]["default_prompt_name"] = "passage"
    path.write_text(json.dumps(raw))
    with pytest.raises(BundleError, match="default_prompt_name 'passage' is none of"):
        load_manifest(copy)


@pytest.mark.parametrize("config, said", [
    ({"prompts": {"query": 3}}, "'prompts' must map names to prompt texts"),
    ({"prompts": ["query"]}, "'prompts' must map names to prompt texts"),
    ({"prompts": {"query": "q: "}, "default_prompt_name": "doc"},
     "default_prompt_name 'doc' is none of its prompts \\(query\\)"),
])
def test_malformed_prompts_are_refused_at_export(config, said, tmp_path):
    from edgeprefill.export.sentence_layout import embedding_head

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config_sentence_transformers.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match=said):
        embedding_head(hf, "embed")
    (hf / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "q: "}, "default_prompt_name": "query"}))
    head = embedding_head(hf, "embed")
    assert head is not None and (head.prompts, head.default_prompt_name) == (
        {"query": "q: "}, "query")
    assert embedding_head(hf, "generate") is None


def test_run_and_inspect_take_the_prompt_name(embed_bundle, embed_model, bundle):
    from tests.test_cli_errors import cli

    one = cli("run", embed_bundle, TEXTS[0], "--prompt-name", "query", "--threads", "1")
    assert one.returncode == 0, one.stderr
    np.testing.assert_allclose([json.loads(one.stdout)],
                               reference(embed_model, [QUERY + TEXTS[0]]), atol=1e-5)
    unknown = cli("run", embed_bundle, TEXTS[0], "--prompt-name", "passage")
    assert unknown.returncode == 2 and unknown.stderr.strip().splitlines() == [
        "error: --prompt-name 'passage' is none of the model's prompts: 'query', 'document'"]
    assert ("prompts     query (8 characters), document (0 characters); default: none"
            in cli("inspect", embed_bundle).stdout)
    refused = cli("run", bundle("llama"), "w5", "--prompt-name", "query")
    assert refused.returncode == 2 and "--prompt-name applies to an embedding bundle only" \
        in refused.stderr
