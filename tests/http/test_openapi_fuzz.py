"""Schemathesis fuzzes every operation of the router's own OpenAPI document
(`/api-doc/openapi.json`) against the real server: no request may get a 5xx, every response
must carry a documented status code and match its documented schema, requests the spec calls
invalid must be refused, and requests it calls valid must be served (see `valid_data_served`
for the refusals the spec can only describe in words).

The seed is fixed, so a run is reproducible; a failure prints a curl command.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import httpx
import pytest
from checkpoints import make_checkpoint

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402 - schemathesis brings hypothesis
from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _import_tree(package: str) -> None:
    """Imports every module under `package` now, at collection.

    hypothesis and schemathesis import many modules lazily, in the middle of a test, and
    pytest rewrites their asserts on import (`ast.parse`). CPython 3.11.7 keeps the AST
    converter's recursion depth in per-interpreter state, so a parse that overlaps another
    thread's fails with "AST constructor recursion depth mismatch" (CPython gh-106905): CI
    saw it twice, once from `schemathesis.specs.openapi.schemas`, once from hypothesis'
    `st.randoms()`. Imported up front, nothing is parsed while the server's threads run."""
    root = importlib.import_module(package)
    for module in pkgutil.walk_packages(root.__path__, f"{package}."):
        importlib.import_module(module.name)


for _package in (
    "hypothesis.strategies._internal",
    "schemathesis.specs.openapi",
    "schemathesis.generation",
):
    _import_tree(_package)

# Cases per operation in the fuzzing phase; the examples and coverage phases add their own
# (one per documented example, and the boundary values of every constraint).
MAX_EXAMPLES = 40
SEED = 20260101  # a fixed seed: CI runs the same cases every time

# 422s that are not the spec's fault: the limits depend on the loaded model or on the server's
# flags, so the spec states them in prose (field descriptions, the 422's description), and
# `/info` tells a client the values.
RUNTIME_LIMITS = re.compile(
    "|".join(
        [
            r"token id \d+ is outside the vocabulary",  # the tokenizer's vocabulary
            r"must have at most \d+ tokens \(the model's limit\)",  # max_input_length
            r"batch size \d+ > maximum allowed batch size",  # --max-client-batch-size
            r"`prompt_name` .* is not a prompt of this model",  # /info `prompts`
            r"`prompt_name` cannot be used with token ids",  # a rule across two fields
            # `quantization_ranges`: rules across fields (the encoding, `normalize`), the
            # output's size (`dimensions` or the model's), and float32's range.
            r"of unnormalized embeddings needs `quantization_ranges`",
            r"`quantization_ranges` applies to the `int8` and `uint8` encodings only",
            r"`quantization_ranges` has \d+ minimums and \d+ maximums; the output has \d+",
            r"`quantization_ranges` minimum .* is over its maximum",
            r"`quantization_ranges` is empty in every dimension",
            r"`quantization_ranges` must be .* of finite numbers",
            # An image input: whether the model takes images, and whether the string is an
            # image file's base64 within --max-image-bytes/--max-image-pixels.
            r"`inputs?(\[\d+\])?` is refused: ",
        ]
    ),
    re.DOTALL,
)
DIMENSIONS = re.compile(r"`dimensions` must be between 1 and (\d+) .*got (\d+)", re.DOTALL)
U64_MAX = 2**64 - 1
# schemathesis' default answers to invalid data (negative_data_rejection).
REFUSALS = ["400", "401", "403", "404", "405", "406", "409", "415", "422", "428", "429", "5xx"]


# Request-body fields per path, filled from the served spec by `load_schema`.
DOCUMENTED_FIELDS: dict[str, set[str]] = {}


def _error_message(response) -> tuple[str, str]:
    """(error_type, message) of a TEI or OpenAI error body."""
    try:
        body = response.json()
    except ValueError:
        return "", response.text
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):  # OpenAI's shape
        return str(error.get("type", "")), str(error.get("message", ""))
    if isinstance(body, dict):
        return str(body.get("error_type", "")), str(error)
    return "", response.text


def _not_a_rust_integer(value: object) -> bool:
    """JSON Schema's `integer` admits integers of any size; the server reads them into 64-bit
    integers (`2.0` too: it is an integer for JSON Schema and for the server alike)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value > U64_MAX
    if isinstance(value, list):
        return any(_not_a_rust_integer(v) for v in value)
    if isinstance(value, dict):
        return any(_not_a_rust_integer(v) for v in value.values())
    return False


def valid_data_served(ctx, response, case) -> None:
    """Replaces schemathesis' `positive_data_acceptance`: a request the spec calls valid must
    get a 2xx, or 429 (load), unless it runs into one of the limits the spec documents in
    words (`RUNTIME_LIMITS`, `dimensions` over the model's `hidden_size`), the route does not
    fit the loaded model (424 `model_type`, documented), or a documented integer field holds
    one past 64 bits (`_not_a_rust_integer`: refused with 422, never a 5xx). A 400 or
    another 422 on valid data means the spec misses a constraint the server enforces."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return
    status = response.status_code
    if status < 300 or status == 429:
        return
    error_type, message = _error_message(response)
    # 424 on TEI's routes, 400 on the OpenAI-shaped ones (`/v1/...`, `/v2/rerank`).
    if status in (400, 424) and error_type == "model_type":
        return
    if status == 422 and error_type == "validation":
        if RUNTIME_LIMITS.search(message):
            return
        dims = DIMENSIONS.search(message)
        if dims and int(dims.group(2)) > int(dims.group(1)):
            return
        body = case.body if isinstance(case.body, dict) else {}
        documented = DOCUMENTED_FIELDS.get(case.operation.path, set())
        if message.startswith("Failed to parse the JSON body") and any(
            _not_a_rust_integer(v) for k, v in body.items() if k in documented
        ):
            return
    raise AssertionError(
        f"Schema-valid request refused with {status} {error_type}: {message}\n"
        "The spec should state this constraint (rust_router/src/http/types.rs)."
    )


def _documented_fields(spec: dict) -> dict[str, set[str]]:
    """The top-level body fields of each path's request schema (a `$ref`, or the union over
    the `anyOf` of `POST /` and `/invocations`, which take any route's body)."""
    schemas = spec["components"]["schemas"]

    def fields_of(schema: dict) -> set[str]:
        if "$ref" in schema:
            return fields_of(schemas[schema["$ref"].rsplit("/", 1)[1]])
        out = set(schema.get("properties", {}))
        for part in schema.get("anyOf", []):
            out |= fields_of(part)
        return out

    fields: dict[str, set[str]] = {}
    for path, item in spec["paths"].items():
        for op in item.values():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            if "schema" in body:
                fields[path] = fields_of(body["schema"])
    return fields


def load_schema(server):
    url = f"{server.url}/api-doc/openapi.json"
    DOCUMENTED_FIELDS.update(_documented_fields(httpx.get(url, timeout=30).json()))
    # What a schemathesis.toml would say; given here so no config file around changes the run.
    config = SchemathesisConfig.from_dict(
        {
            "seed": SEED,
            "base-url": server.url,
            "request-timeout": 60,
            "generation": {"max-examples": MAX_EXAMPLES},
            "checks": {
                # Replaced by `valid_data_served`, which knows the limits that depend on the
                # model (see there).
                "positive_data_acceptance": {"enabled": False},
                # Invalid data may also be refused with 424 when the route does not fit the
                # loaded model at all (/predict on an embedding model): the route is checked
                # before the body. Any other status on invalid data still fails.
                "negative_data_rejection": {"expected-statuses": [*REFUSALS, "424"]},
            },
        }
    )
    return schemathesis.openapi.from_url(url, config=config)


@pytest.fixture(scope="module")
def embedder(start_server, minilm_dir):
    return start_server(minilm_dir)


@pytest.fixture(scope="module")
def reranker(start_server, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz") / "reranker"
    return start_server(
        make_checkpoint(folder, "BertForSequenceClassification", num_labels=1, seed=3)
    )


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request):
    """schemathesis 4.32's `from_fixture` reads and rewrites `request.node._nodeid`, which
    pytest 9.2 no longer has (`AttributeError`); give it one. Harmless on older pytest."""
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


@pytest.fixture(scope="module")
def embedder_schema(embedder):
    return load_schema(embedder)


@pytest.fixture(scope="module")
def reranker_schema(reranker):
    return load_schema(reranker)


FUZZ = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)


def call_and_validate(case) -> None:
    # A schema-valid `X-Max-Queue-Ms` (say 1 ms) shorter than the request's wait is answered
    # 503 `queue_timeout` by design, which `not_a_server_error` would flag; the deadline is
    # tested in test_priority.py. Valid cases get the longest one, which no request here
    # waits out; invalid ones keep theirs (they must get 422).
    meta = case.meta
    headers = case.headers or {}
    if meta is not None and meta.generation.mode.is_positive and "X-Max-Queue-Ms" in headers:
        headers["X-Max-Queue-Ms"] = "3600000"
    # Every built-in check runs (not_a_server_error, status_code_conformance,
    # content_type_conformance, response_schema_conformance, negative_data_rejection, ...),
    # as configured in `load_schema`, plus `valid_data_served`.
    case.call_and_validate(additional_checks=[valid_data_served])


# Every documented operation, against all-MiniLM-L6-v2 (an embedding model): /predict,
# /rerank and /embed_sparse answer 424 here, /v1/rerank and /v2/rerank 400, as documented.
@schemathesis.pytest.from_fixture("embedder_schema").parametrize()
@FUZZ
def test_embedding_model_conforms_to_its_spec(case):
    call_and_validate(case)


# /predict and the rerank routes again, served this time, by a tiny random reranker. The other
# operations are left out here only because the embedding model's test above covers them.
@(
    schemathesis.pytest.from_fixture("reranker_schema")
    .include(path=["/predict", "/rerank", "/v1/rerank", "/v2/rerank"])
    .parametrize()
)
@FUZZ
def test_reranker_conforms_to_its_spec(case):
    call_and_validate(case)


# Refusals the fuzzing above never provokes, on a server with an API key and a small payload
# limit: each must be a documented status with a documented body. (408, a body that arrives
# too slowly, and 503, a server shutting down, are provoked, without the spec, in
# test_connections.py.)
KEY = "fuzz-key"
PUBLIC = {("GET", "/"), ("GET", "/health"), ("GET", "/metrics")}  # probes, scrapers: no key


@pytest.fixture(scope="module")
def guarded(start_server, minilm_dir):
    return start_server(minilm_dir, "--api-key", KEY, "--payload-limit", "2000")


def test_auth_and_payload_refusals_are_documented(guarded):
    schema = load_schema(guarded)
    checks = [status_code_conformance, content_type_conformance, response_schema_conformance]
    seen = set()
    for result in schema.get_all_operations():
        operation = result.ok()
        key = (operation.method.upper(), operation.path)
        seen.add(key)
        has_body = bool(operation.body)
        body = {"body": {}, "media_type": "application/json"} if has_body else {}
        case = operation.Case(**body)
        r = case.call()
        assert r.status_code == (200 if key in PUBLIC else 401), (key, r.text)
        case.validate_response(r, checks=checks)
        if has_body:
            case = operation.Case(body={"inputs": "word " * 1000}, media_type="application/json")
            r = case.call(headers={"Authorization": f"Bearer {KEY}"})
            assert r.status_code == 413, (key, r.text)
            case.validate_response(r, checks=checks)
    assert ("POST", "/v1/embeddings") in seen and ("GET", "/info") in seen
