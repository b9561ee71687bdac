"""A corpus job on jina-embeddings-v3: `--prompt-name` picks the task adapter too, as
`Model.embed` does (the job tokenizes ahead and embeds token ids)."""

from __future__ import annotations

import io

import numpy as np
from checkpoints import JINA_PROMPTS, add_jina_adapters, make_family_checkpoint
from corpus_util import make_texts, read_output, write_corpus

from trt_tei_runtime import Model
from trt_tei_runtime.corpus import JobOptions
from trt_tei_runtime.corpus.cli import execute
from trt_tei_runtime.corpus.progress import Progress


def test_prompt_name_picks_the_adapter(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_family_checkpoint(
        tmp_path / "jina", "JinaEmbeddingsV3Model", pooling="mean", prompts=JINA_PROMPTS
    )
    add_jina_adapters(folder)
    model = Model(folder)
    texts = make_texts(200, seed=4)
    path = write_corpus(tmp_path / "c.parquet", [{"text": t} for t in texts])
    for task in ("retrieval.passage", "separation"):
        out = tmp_path / task
        options = JobOptions(
            model=str(folder), input=path, output=out, prompt_name=task, shard_rows=64
        )
        execute(options, Progress(stream=io.StringIO(), json_lines=True), model=model)
        _, vectors, _ = read_output(out)
        expected = model.embed(texts, prompt_name=task)
        np.testing.assert_allclose(vectors, expected, atol=1e-5)
        # Not the base weights: the adapter changed the vectors.
        assert (
            np.abs(vectors - model.embed_ids(model.tokenize(texts, prompt_name=task))).max() > 1e-3
        )
