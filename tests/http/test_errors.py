"""Every bad input gets its status and a message, in TEI's shape or OpenAI's, and the server
keeps serving."""

from __future__ import annotations

import httpx
import pytest
from router_harness import openai_sdk

pytestmark = pytest.mark.integration

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(start_server, minilm_dir):
    return start_server(
        minilm_dir,
        "--max-client-batch-size", "4",
        "--payload-limit", "20000",
        "--api-key", KEY,
    )  # fmt: skip


def post(server, path, body, headers=AUTH):
    return server.post(path, body, headers=headers)


def client(server, key=KEY):
    openai = openai_sdk()
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)


def tei_error(r: httpx.Response, status: int, error_type: str, *needles: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error_type"] == error_type, body
    for n in needles:
        assert n in body["error"], body


def test_api_key(server):
    r = post(server, "/embed", {"inputs": "a"}, headers={})
    tei_error(r, 401, "unauthorized", "missing")
    r = post(server, "/embed", {"inputs": "a"}, headers={"Authorization": "Bearer nope"})
    tei_error(r, 401, "unauthorized", "invalid")
    assert post(server, "/embed", {"inputs": "a"}).status_code == 200
    # Probes and scrapers need no key.
    assert server.get("/health").status_code == 200
    assert server.get("/metrics").status_code == 200


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"inputs": ""}, "`inputs` cannot be empty"),
        ({"inputs": []}, "`inputs` cannot be empty"),
        ({"inputs": ["a", ""]}, "`inputs[1]` cannot be empty"),
    ],
)
def test_empty_input_is_400(server, body, needle):
    tei_error(post(server, "/embed", body), 400, "empty", needle)


def test_too_long_is_422_with_limit_and_length(server):
    long = " ".join(["word"] * 300)
    tei_error(post(server, "/embed", {"inputs": long}), 422, "validation", "256", "Given: 302")


def test_client_batch_over_limit_is_422(server):
    r = post(server, "/embed", {"inputs": ["a"] * 5})
    tei_error(r, 422, "validation", "batch size 5 > maximum allowed batch size 4")


@pytest.mark.parametrize("dims", [0, 385])
def test_bad_dimensions_are_422(server, dims):
    r = post(server, "/embed", {"inputs": "a", "dimensions": dims})
    tei_error(r, 422, "validation", "between 1 and 384")


@pytest.mark.parametrize(
    "body",
    [
        {"inputs": 3},
        {"inputs": {"audio": "a"}},
        {"inputs": "a", "normalize": "yes"},
        {"inputs": "a", "truncation_direction": "middle"},
        {"text": "a"},
    ],
)
def test_wrong_json_types_are_422(server, body):
    tei_error(post(server, "/embed", body), 422, "validation", "JSON")


def test_malformed_json_and_unknown_route(server):
    r = httpx.post(f"{server.url}/embed", content=b"{nope", headers=AUTH)
    tei_error(r, 422, "validation")
    tei_error(post(server, "/nope", {}), 404, "not_found", "/nope")


def test_body_over_payload_limit_is_413(server):
    r = post(server, "/embed", {"inputs": ["word " * 5000]})
    tei_error(r, 413, "payload_too_large", "--payload-limit")


def test_routes_the_model_does_not_serve_are_424(server):
    r = post(server, "/rerank", {"query": "a", "texts": ["b"]})
    tei_error(r, 424, "model_type", "embedding model", "/embed")
    tei_error(post(server, "/predict", {"inputs": "a"}), 424, "model_type", "/embed")


def test_unknown_prompt_is_422(server):
    r = post(server, "/embed", {"inputs": "a", "prompt_name": "query"})
    tei_error(r, 422, "validation", "`query`")


@pytest.mark.parametrize(
    ("key", "kwargs", "error", "needle"),
    [
        ("nope", {"input": "a"}, "AuthenticationError", "invalid API key"),
        (KEY, {"input": []}, "BadRequestError", "`input` cannot be empty"),
        (KEY, {"input": " ".join(["word"] * 300)}, "UnprocessableEntityError", "Given: 302"),
        (KEY, {"input": ["a"] * 5}, "UnprocessableEntityError", "maximum allowed batch size 4"),
        (KEY, {"input": "a", "dimensions": 0}, "UnprocessableEntityError", "between 1 and 384"),
        (KEY, {"input": "a", "dimensions": 385}, "UnprocessableEntityError", "between 1 and 384"),
    ],
)
def test_openai_sdk_shows_the_message(server, key, kwargs, error, needle):
    openai = openai_sdk()
    with pytest.raises(getattr(openai, error)) as e:
        client(server, key=key).embeddings.create(model="m", **kwargs)
    assert needle in str(e.value)


def test_server_still_serves(server):
    r = post(server, "/embed", {"inputs": ["still", "alive"]})
    assert r.status_code == 200 and len(r.json()) == 2
