"""`--models FILE`: models served after the `--model-id`s, each with options of its own. One
tiny checkpoint is served three times: under the command line's flags, and twice from a
YAML file, once with its own pooling, prompt and batch limits and once with only a weight
and `auto_truncate`. Each model's /info shows its own options and its answers are those of a
one-model server given the same options as flags; a bad file stops the start-up naming the
entry and key."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkpoints import make_checkpoint
from test_several_models import run_router

pytestmark = pytest.mark.integration

TEXTS = ["the cat sat on the mat", "a river runs through paris", "search engine query"]
# What the command line gives every model, and what the file's first entry sets instead.
FLAGS = ("--pooling", "cls", "--max-batch-tokens", "2048")
OWN = ("--pooling", "mean", "--default-prompt-name", "query", "--max-batch-tokens", "512")
OWN_LONG = ("--long-input", "chunk", "--max-chunks", "3")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(
        tmp_path_factory.mktemp("models-file") / "tiny",
        seed=3,
        prompts={"query": "query: ", "passage": "passage: "},
    )


@pytest.fixture(scope="module")
def models_file(folder: Path) -> Path:
    path = folder.parent / "models.yaml"
    path.write_text(
        f"""
- name: own
  model_id: {folder}
  pooling: mean
  default_prompt_name: query
  max_batch_tokens: 512
  max_client_batch_size: 2
  long_input: chunk
  max_chunks: 3
- name: weighted
  model_id: {folder}
  auto_truncate: true
  weight: 3
"""
    )
    return path


@pytest.fixture(scope="module")
def served(start_server, folder, models_file):  # type: ignore[no-untyped-def]
    return start_server(f"plain={folder}", *FLAGS, "--models", str(models_file))


@pytest.fixture(scope="module")
def alone(start_server, folder):  # type: ignore[no-untyped-def]
    """Each model in a server of its own, its options given as flags."""
    return {
        "plain": start_server(folder, *FLAGS),
        "own": start_server(folder, *OWN, *OWN_LONG, "--max-client-batch-size", "2"),
        "weighted": start_server(folder, *FLAGS, "--auto-truncate"),
    }


def test_each_model_answers_as_a_server_with_its_options_as_flags(served, alone):  # type: ignore[no-untyped-def]
    names = [m["id"] for m in served.get("/v1/models").json()["data"]]
    assert names == ["plain", "own", "weighted"]
    answers = {}
    for name, server in alone.items():
        inputs = {"inputs": TEXTS[:2]}
        answers[name] = served.post("/embed", {**inputs, "model": name}).json()
        assert answers[name] == server.post("/embed", inputs).json(), name
        tokens = {"inputs": TEXTS[2], "add_special_tokens": True}
        got = served.post("/tokenize", {**tokens, "model": name}).json()
        assert got == server.post("/tokenize", tokens).json(), name
    # Mean pooling and a prompt give other vectors than the command line's CLS.
    assert answers["own"] != answers["plain"]
    assert answers["weighted"] == answers["plain"]
    # The default model is the `--model-id` one.
    assert served.post("/embed", {"inputs": TEXTS[:2]}).json() == answers["plain"]


def test_each_models_info_shows_its_own_options(served, alone):  # type: ignore[no-untyped-def]
    expected = {
        "plain": ("cls", 2048, 32, False, "error", 64),
        "own": ("mean", 512, 2, False, "chunk", 3),
        "weighted": ("cls", 2048, 32, True, "error", 64),
    }
    for name, (pooling, batch_tokens, client_batch, truncate, long, chunks) in expected.items():
        info = served.get("/info", params={"model": name}).json()
        assert info["model_type"] == {"embedding": {"pooling": pooling}}, name
        assert info["max_batch_tokens"] == batch_tokens, name
        assert info["max_client_batch_size"] == client_batch, name
        assert info["auto_truncate"] is truncate, name
        assert (info["long_input"], info["max_chunks"]) == (long, chunks), name
        one = alone[name].get("/info").json()
        keys = ("model_type", "max_batch_tokens", "max_client_batch_size", "prompts")
        for key in (*keys, "long_input", "max_chunks"):
            assert info[key] == one[key], (name, key)


def test_options_apply_to_their_model_alone(served, alone):  # type: ignore[no-untyped-def]
    three = {"inputs": TEXTS}
    assert served.post("/embed", {**three, "model": "own"}).status_code == 422
    assert served.post("/embed", {**three, "model": "plain"}).status_code == 200
    limit = served.get("/info", params={"model": "plain"}).json()["max_input_length"]
    too_long = " ".join(["word"] * (limit + 8))
    assert served.post("/embed", {"inputs": too_long, "model": "weighted"}).status_code == 200
    assert served.post("/embed", {"inputs": too_long, "model": "plain"}).status_code == 422
    # `own` embeds it whole (its `long_input: chunk`), as its own server does, and refuses
    # one of more than its 3 windows.
    long = " ".join(["the"] * (limit + 8))  # one token a word: two windows
    whole = served.post("/embed", {"inputs": long, "model": "own"})
    assert whole.status_code == 200, whole.text
    assert whole.json() == alone["own"].post("/embed", {"inputs": long}).json()
    assert served.post("/embed", {"inputs": long, "model": "plain"}).status_code == 422
    longer = " ".join(["the"] * (4 * limit))
    assert served.post("/embed", {"inputs": longer, "model": "own"}).status_code == 413


def test_a_bad_file_stops_the_start_up_naming_entry_and_key(folder, tmp_path):  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.yaml"
    cases = {
        f"- model_id: {folder}\n- model_id: {folder}\n  name: b\n  weight: 0\n": (
            "[1]: `weight` must be a positive number, got 0"
        ),
        f"- model_id: {folder}\n  poolng: mean\n": "[0]: unknown field `poolng`",
        "- name: x\n  pooling: mean\n": "[0]: missing field `model_id`",
    }
    for text, message in cases.items():
        bad.write_text(text)
        done = run_router("--models", str(bad))
        out = done.stdout + done.stderr
        assert done.returncode != 0, out
        assert f"'{bad}' for '--models <FILE>'" in out and message in out, out
    done = run_router("--models", str(tmp_path / "missing.yaml"))
    assert done.returncode != 0
    assert "cannot read it" in done.stdout + done.stderr
    # Names stay unique across the command line and the file.
    bad.write_text(f"- model_id: {folder}\n")
    done = run_router("--model-id", str(folder), "--models", str(bad))
    assert done.returncode != 0
    assert "two models are named `tiny`" in done.stdout + done.stderr
