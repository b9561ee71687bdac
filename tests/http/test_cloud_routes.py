"""The cloud platforms' routes through the real router: SageMaker's `POST /invocations` and
`GET /ping`, Vertex AI's `POST /vertex`, against the model's own routes."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(start_server, minilm_dir):
    return start_server(minilm_dir)


def close(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)


def test_sagemaker_invocations_and_ping(server):
    body = {"inputs": ["What is Deep Learning?", "Paris is in France"]}
    r = server.post("/invocations", body)
    assert r.status_code == 200, r.text
    close(r.json(), server.post("/embed", body).json())
    similarity = {"inputs": {"source_sentence": "a cat", "sentences": ["a cat", "a car"]}}
    assert (
        server.post("/invocations", similarity).json()
        == server.post("/similarity", similarity).json()
    )
    assert server.get("/ping").status_code == 200
    r = server.post("/invocations", {"query": "a", "texts": ["b"]})
    assert r.status_code == 424 and r.json()["error_type"] == "model_type"
    assert server.post("/invocations", {"inputs": ""}).status_code == 400


def test_vertex_predictions(server):
    instances = [{"inputs": "a query"}, {"inputs": ["two", "documents"], "normalize": False}]
    r = server.post("/vertex", {"instances": instances})
    assert r.status_code == 200, r.text
    predictions = r.json()["predictions"]
    # Batched together here, one at a time there: equal up to float rounding.
    close(predictions, [server.post("/embed", i).json() for i in instances])
    assert server.post("/vertex", {"instances": []}).status_code == 400
    assert server.post("/vertex", {"instance": [{"inputs": "a"}]}).status_code == 422
    bad = server.post("/vertex", {"instances": [{"inputs": "a"}, {"inputs": 7}]})
    assert bad.status_code == 422 and bad.json()["error_type"] == "validation"
