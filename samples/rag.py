"""Retrieval-augmented answers in one process: an embedding bundle finds the passages
nearest the question, a reranker (optional) orders them, and a chat bundle answers from
the best one. Three engines share the device; each runs its own step loop.

    python samples/rag.py EMBEDDING_BUNDLE CHAT_BUNDLE [RERANK_BUNDLE]

The passages and the question are the tiny model's words (README, "Embeddings" and
"Reranking": export it with --task embed, and --task score); put your own here.
"""

import sys

import numpy as np

from edgeprefill import EdgeprefillError, Engine, GenerationParams

PASSAGES = ["the secret is jade . kero bala musi .", "the secret is onyx . lon sose duga .",
            "the secret is amber . tin rapu vimi .", "the secret is storm . bata nela ."]
QUESTION = "what was the secret ?"

bundles = sys.argv[1:]
if not 2 <= len(bundles) <= 3 or bundles[0] in ("-h", "--help"):
    sys.exit(__doc__)
try:
    engines = [Engine.load(bundle) for bundle in bundles]
except EdgeprefillError as err:  # a wrong path, not a bundle: one line
    sys.exit(f"error: {err}")
embedder, chat, reranker = (engines + [None])[:3]
try:
    with embedder, chat:
        vectors = embedder.embed(PASSAGES)  # L2-normalized: a dot product is the cosine
        prompts = embedder.manifest.embedding.prompts  # Qwen3-Embedding's "query" instruction
        query = embedder.embed(QUESTION, prompt_name="query" if "query" in prompts else None)
        nearest = [int(i) for i in np.argsort(-(vectors @ query[0]))[:3]]
        print("nearest:", nearest)
        if reranker is not None:
            with reranker:
                ranked = reranker.rerank(QUESTION, [PASSAGES[i] for i in nearest])
            nearest = [nearest[i] for i, _ in ranked]
            print("reranked:", nearest)
        context = PASSAGES[nearest[0]]
        if chat.tokenizer.chat_template is not None:  # a chat model: one user message
            prompt = [{"role": "user", "content": f"{context}\n\n{QUESTION}"}]
        else:  # the tiny model reads the passage and the question as one text
            prompt = f"{context} {QUESTION}"
        answer = chat.generate(prompt, GenerationParams(max_new_tokens=16)).result()
        print(f"answer from passage {nearest[0]}:", answer.text.strip())
except EdgeprefillError as err:  # a bundle of another kind in a place: one line
    sys.exit(f"error: {err}")
