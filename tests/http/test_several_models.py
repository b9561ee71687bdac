"""Several models in one router process (`--model-id` once per model): the real MiniLM as
the default, a tiny reranker and a tiny SPLADE model beside it. Every route answers with
and without `model` as each model's own one-model server does; unknown names are 404;
`/v1/models` and `/info?model=` describe them; a model that cannot load stops the start-up
with its name."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from checkpoints import make_checkpoint, make_splade_checkpoint
from router_harness import router_command

pytestmark = pytest.mark.integration

TEXTS = ["the cat sat on the mat", "a river runs through paris", "search engine query"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("several")
    return {
        "reranker": make_checkpoint(
            root / "reranker", "BertForSequenceClassification", num_labels=1, seed=2
        ),
        "splade": make_splade_checkpoint(root / "splade", seed=4, max_seq_length=16),
    }


@pytest.fixture(scope="module")
def several(start_server, minilm_dir, folders):  # type: ignore[no-untyped-def]
    return start_server(
        minilm_dir,
        "--model-id",
        f"rr={folders['reranker']}",
        "--model-id",
        str(folders["splade"]),  # named `splade`, its folder's name
    )


@pytest.fixture(scope="module")
def alone(start_server, minilm_dir, folders):  # type: ignore[no-untyped-def]
    """Each model in a server of its own."""
    return {
        "minilm": start_server(minilm_dir),
        "rr": start_server(folders["reranker"]),
        "splade": start_server(folders["splade"]),
    }


def test_every_route_answers_as_the_model_alone(several, alone):  # type: ignore[no-untyped-def]
    embed = {"inputs": TEXTS}
    expected = alone["minilm"].post("/embed", embed).json()
    # The default model: without `model`, by its name (its folder's) and by its full id.
    assert several.post("/embed", embed).json() == expected
    assert several.post("/embed", {**embed, "model": "model"}).json() == expected
    openai = {"input": TEXTS, "model": "model"}
    got = several.post("/v1/embeddings", openai).json()
    assert [d["embedding"] for d in got["data"]] == [
        d["embedding"] for d in alone["minilm"].post("/v1/embeddings", openai).json()["data"]
    ]

    rerank = {"query": "what is a cat", "texts": TEXTS}
    assert (
        several.post("/rerank", {**rerank, "model": "rr"}).json()
        == alone["rr"].post("/rerank", rerank).json()
    )
    predict = {"inputs": TEXTS[0]}
    assert (
        several.post("/predict", {**predict, "model": "rr"}).json()
        == alone["rr"].post("/predict", predict).json()
    )
    cohere = {"query": "cat", "documents": TEXTS, "model": "rr"}
    got = several.post("/v1/rerank", cohere).json()
    want = alone["rr"].post("/v1/rerank", cohere).json()
    assert got["results"] == want["results"]
    assert got["model"] == "rr"

    sparse = {"inputs": TEXTS}
    assert (
        several.post("/embed_sparse", {**sparse, "model": "splade"}).json()
        == alone["splade"].post("/embed_sparse", sparse).json()
    )
    tokens = {"inputs": TEXTS[1]}
    assert (
        several.post("/tokenize", {**tokens, "model": "splade"}).json()
        == alone["splade"].post("/tokenize", tokens).json()
    )
    # POST / by the named model's type: a reranker's body runs /predict.
    assert (
        several.post("/", {**predict, "model": "rr"}).json()
        == alone["rr"].post("/predict", predict).json()
    )


def test_routes_a_model_does_not_serve_and_unknown_names(several):  # type: ignore[no-untyped-def]
    assert several.post("/embed", {"inputs": "x", "model": "rr"}).status_code == 424
    assert several.post("/rerank", {"query": "q", "texts": ["a"]}).status_code == 424
    r = several.post("/embed", {"inputs": "x", "model": "nope"})
    assert r.status_code == 404
    assert r.json()["error_type"] == "model_not_found"
    assert "['model', 'rr', 'splade']" in r.json()["error"].replace('"', "'")
    r = several.post("/v1/embeddings", {"input": "x", "model": "text-embedding-3-small"})
    assert r.status_code == 404
    assert "served models" in r.json()["error"]["message"]


def test_models_are_listed_and_each_has_its_info(several, minilm_dir, folders):  # type: ignore[no-untyped-def]
    listed = several.get("/v1/models").json()
    assert listed["object"] == "list"
    names = [m["id"] for m in listed["data"]]
    assert names == ["model", "rr", "splade"]
    types = {m["id"]: m["model_type"] for m in listed["data"]}
    assert types == {"model": "embedding", "rr": "reranker", "splade": "sparse"}
    assert listed["data"][1]["root"] == str(folders["reranker"])
    assert several.get("/info").json()["model_id"] == str(minilm_dir)
    rr = several.get("/info", params={"model": "rr"}).json()
    assert rr["model_id"] == str(folders["reranker"])
    assert "reranker" in rr["model_type"]
    assert several.get("/info", params={"model": "nope"}).status_code == 404
    assert several.get("/health").status_code == 200


def tokenizer_threads(pid: int) -> list[str]:
    """The names of the process's tokenizer pool threads (`tokenizer-<i>`)."""
    names = (task.read_text().strip() for task in Path(f"/proc/{pid}/task").glob("*/comm"))
    return sorted(name for name in names if name.startswith("tokenizer-"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads Linux's /proc")
def test_the_models_share_one_tokenizer_pool(several):  # type: ignore[no-untyped-def]
    # Every model's large requests go through the pool (inputs over 2 KB in all).
    long_texts = [" ".join(TEXTS * 20)] * 4
    assert several.post("/embed", {"inputs": long_texts, "truncate": True}).status_code == 200
    rerank = {"query": "cat", "texts": long_texts, "model": "rr", "truncate": True}
    assert several.post("/rerank", rerank).status_code == 200
    sparse = {"inputs": long_texts, "model": "splade", "truncate": True}
    assert several.post("/embed_sparse", sparse).status_code == 200
    # The harness asks for two tokenizer threads: two in all, not two per model.
    assert tokenizer_threads(several.proc.pid) == ["tokenizer-0", "tokenizer-1"]
    assert several.get("/info", params={"model": "rr"}).json()["tokenization_workers"] == 2


def run_router(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*router_command(), *args, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", **_python_env()},
    )


def _python_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "VIRTUAL_ENV", "HOME")}


def test_start_up_names_the_model_that_fails_and_refuses_two_of_one_name(minilm_dir, tmp_path):  # type: ignore[no-untyped-def]
    missing = tmp_path / "not-a-model"
    missing.mkdir()
    done = run_router("--model-id", str(minilm_dir), "--model-id", f"broken={missing}")
    assert done.returncode != 0
    assert "model `broken`" in done.stdout + done.stderr
    done = run_router("--model-id", f"a/{minilm_dir.name}", "--model-id", str(minilm_dir))
    assert done.returncode != 0
    assert "two models are named" in done.stdout + done.stderr


def test_a_model_that_does_not_fit_its_device_stops_the_start_up_with_the_figures(
    minilm_dir, folders
):  # type: ignore[no-untyped-def]
    # A share of the host's memory far below what is in use already leaves no room.
    done = run_router(
        "--model-id",
        str(minilm_dir),
        "--model-id",
        f"rr={folders['reranker']}",
        "--memory-fraction",
        "0.001",
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert f"model `{minilm_dir.name}`" in output and "does not fit cpu" in output, output
    assert "weights 0.08 GiB" in output or "weights 0.09 GiB" in output, output
    done = run_router("--model-id", str(minilm_dir), "--memory-fraction", "1.5")
    assert done.returncode != 0
    assert "`--memory-fraction` must be more than 0 and at most 1" in done.stdout + done.stderr
