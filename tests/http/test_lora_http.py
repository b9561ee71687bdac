"""LoRA adapters through the real router (`--lora-adapter NAME=PATH`, `model: NAME`): a tiny
BERT with two random PEFT adapters (different ranks and targets). Each adapter's answers
equal the runtime's own `Model.embed(adapter=...)` (compared with PEFT in test_lora.py);
requests for both adapters and the base model in flight at once (so batched together)
answer as they do alone; `/v1/models` lists the adapters under their model; an adapter the
runtime refuses stops the start-up with the reason."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from checkpoints import make_checkpoint
from checkpoints.lora import make_lora_adapter
from router_harness import Server, cosine

from trt_tei_runtime import Model

pytestmark = pytest.mark.integration

TEXTS = [f"document {i} about " + "rivers and cities " * (i % 5 + 1) for i in range(12)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("lora-http")
    base = make_checkpoint(root / "base", "BertModel", pooling="mean")
    return {
        "base": base,
        "small": make_lora_adapter(base, root / "small", r=4, targets=["query", "value"], seed=1),
        "wide": make_lora_adapter(
            base,
            root / "wide",
            r=16,
            targets=["key", "output.dense", "intermediate.dense"],
            seed=2,
            use_rslora=True,
        ),
    }


@pytest.fixture(scope="module")
def server(start_server, folders):  # type: ignore[no-untyped-def]
    return start_server(
        folders["base"],
        "--lora-adapter",
        f"small={folders['small']}",
        "--lora-adapter",
        f"wide={folders['wide']}",
    )


@pytest.fixture(scope="module")
def expected(folders):  # type: ignore[no-untyped-def]
    adapters = {name: str(folders[name]) for name in ("small", "wide")}
    model = Model(folders["base"], device="cpu", lora_adapters=adapters)
    return {name: model.embed(TEXTS, adapter=name) for name in (None, "small", "wide")}


def embed(server, name):  # type: ignore[no-untyped-def]
    body = {"inputs": TEXTS, **({"model": name} if name else {})}
    r = server.post("/embed", body)
    assert r.status_code == 200, r.text
    return np.asarray(r.json())


def test_each_adapter_answers_as_the_runtime_with_that_adapter(server, expected):  # type: ignore[no-untyped-def]
    for name in (None, "small", "wide"):
        got = embed(server, name)
        for g, e in zip(got, expected[name]):
            assert cosine(g, e) > 0.9999, name
    # The adapters change the answers (a no-op adapter would pass the check above too).
    assert cosine(expected["small"][0], expected[None][0]) < 0.999
    assert cosine(expected["wide"][0], expected["small"][0]) < 0.999


def test_mixed_requests_in_flight_together_answer_as_alone(server, expected):  # type: ignore[no-untyped-def]
    names = [None, "small", "wide"] * 6
    with ThreadPoolExecutor(len(names)) as pool:
        answers = list(pool.map(lambda n: embed(server, n), names))
    for name, got in zip(names, answers):
        for g, e in zip(got, expected[name]):
            assert cosine(g, e) > 0.9999, name


def test_adapters_are_listed_under_their_model(server, folders):  # type: ignore[no-untyped-def]
    data = server.get("/v1/models").json()["data"]
    assert [m["id"] for m in data] == ["base", "small", "wide"]
    assert [m["parent"] for m in data] == [None, "base", "base"]
    assert data[1]["root"] == str(folders["small"])
    r = server.post("/embed", {"inputs": "x", "model": "nope"})
    assert r.status_code == 200  # one model: any other name is the model itself


def test_a_refused_adapter_stops_the_start_up_with_its_reason(folders, tmp_path):  # type: ignore[no-untyped-def]
    bad = make_lora_adapter(folders["base"], tmp_path / "dora", r=4, targets=["query"], seed=3)
    config = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(RuntimeError, match="use_dora=True is not supported"):
        Server(folders["base"], tmp_path, "--lora-adapter", f"dora={bad}")
    with pytest.raises(RuntimeError, match="cannot read .*adapter_config.json"):
        Server(folders["base"], tmp_path, "--lora-adapter", f"gone={tmp_path / 'missing'}")
