"""Quantized embeddings (`encoding_format` int8/uint8/binary/ubinary) from all-MiniLM-L6-v2
through the router, against sentence-transformers' `quantize_embeddings` on the same vectors."""

from __future__ import annotations

import numpy as np
import pytest
from router_harness import openai_sdk

pytestmark = pytest.mark.integration

TEXTS = [
    "What is Deep Learning?",
    "Paris is the capital of France.",
    "The quick brown fox jumps over the lazy dog.",
    "a",
]
PRECISIONS = ["int8", "uint8", "binary", "ubinary"]
DTYPES = {"int8": np.int8, "uint8": np.uint8, "binary": np.int8, "ubinary": np.uint8}


@pytest.fixture(scope="module")
def server(start_server, minilm_dir):
    return start_server(minilm_dir)


def quantize(vectors, precision: str, ranges=None) -> np.ndarray:
    from sentence_transformers.util.quantization import quantize_embeddings

    vectors = np.asarray(vectors, dtype=np.float32)
    if ranges is None and precision.endswith("int8"):
        # The server's default for normalized vectors: [-1, 1] in every dimension.
        ranges = np.array([[-1.0], [1.0]], dtype=np.float32).repeat(vectors.shape[1], axis=1)
    return np.asarray(quantize_embeddings(vectors, precision=precision, ranges=ranges))


def embed(server, **fields) -> np.ndarray:
    r = server.post("/embed", {"inputs": TEXTS, **fields})
    assert r.status_code == 200, r.text
    return np.array(r.json())


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("dimensions", [None, 100])
def test_embed_matches_quantize_embeddings(server, precision, dimensions):
    extra = {} if dimensions is None else {"dimensions": dimensions}
    floats = embed(server, **extra)
    got = embed(server, encoding_format=precision, **extra)
    expected = quantize(floats, precision)
    dim = dimensions or 384
    assert got.shape == (len(TEXTS), dim if precision.endswith("int8") else (dim + 7) // 8)
    np.testing.assert_array_equal(got.astype(DTYPES[precision]), expected)
    # In range for the type: the values are the dtype's, not wrapped.
    info = np.iinfo(DTYPES[precision])
    assert got.min() >= info.min and got.max() <= info.max


def test_dimensions_then_normalize_then_quantize_as_sentence_transformers(server, minilm_dir):
    """The order sentence-transformers uses: truncate to `dimensions`, normalize, quantize.
    Its vectors differ from ours in the last float bits, so a value on a bucket's edge may
    land one bucket over (and a bit of a value at 0 may flip): almost all must be equal."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_dir), device="cpu").float()
    ref = st.encode(TEXTS, truncate_dim=64, normalize_embeddings=True, convert_to_numpy=True)
    for precision in PRECISIONS:
        got = embed(server, encoding_format=precision, dimensions=64).astype(np.int64)
        expected = quantize(ref, precision).astype(np.int64)
        if precision.endswith("int8"):
            assert np.abs(got - expected).max() <= 1, precision
            assert (got == expected).mean() > 0.99, precision
        else:
            assert (got == expected).mean() > 0.95, precision


def test_client_ranges(server):
    floats = embed(server, dimensions=8)
    lo = floats.min(axis=0) - 0.01
    hi = floats.max(axis=0) + 0.01
    per_dimension = np.vstack([lo, hi]).astype(np.float32)
    got = embed(
        server,
        dimensions=8,
        encoding_format="uint8",
        quantization_ranges=per_dimension.tolist(),
    )
    np.testing.assert_array_equal(got, quantize(floats, "uint8", ranges=per_dimension))
    shared = np.array([[-0.3] * 8, [0.3] * 8], dtype=np.float32)
    got = embed(server, dimensions=8, encoding_format="int8", quantization_ranges=[-0.3, 0.3])
    np.testing.assert_array_equal(got, quantize(floats, "int8", ranges=shared))


def test_unnormalized_needs_ranges(server):
    r = server.post("/embed", {"inputs": TEXTS, "normalize": False, "encoding_format": "int8"})
    assert r.status_code == 422 and "quantization_ranges" in r.json()["error"]
    floats = embed(server, normalize=False)
    ranges = [float(floats.min()), float(floats.max())]
    got = embed(server, normalize=False, encoding_format="int8", quantization_ranges=ranges)
    shared = np.array([[ranges[0]] * 384, [ranges[1]] * 384], dtype=np.float32)
    np.testing.assert_array_equal(got, quantize(floats, "int8", ranges=shared))
    # Binary needs no range.
    got = embed(server, normalize=False, encoding_format="binary")
    np.testing.assert_array_equal(got, quantize(floats, "binary"))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_openai_route_and_sdk(server, precision):
    r = server.post("/v1/embeddings", {"input": TEXTS, "dimensions": 32})
    floats = np.array([d["embedding"] for d in r.json()["data"]])
    expected = quantize(floats, precision)
    r = server.post(
        "/v1/embeddings", {"input": TEXTS, "dimensions": 32, "encoding_format": precision}
    )
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(np.array([d["embedding"] for d in r.json()["data"]]), expected)
    # The openai SDK passes the format through and returns the integers as they came.
    client = openai_sdk().OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    res = client.embeddings.create(
        model="m",
        input=TEXTS,
        dimensions=32,
        encoding_format=precision,  # type: ignore[arg-type]
    )
    np.testing.assert_array_equal(np.array([d.embedding for d in res.data]), expected)


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        ("/embed", {"inputs": "a", "encoding_format": "int4"}, "unknown variant `int4`"),
        ("/v1/embeddings", {"input": "a", "encoding_format": "fp8"}, "unknown variant `fp8`"),
        (
            "/embed",
            {"inputs": "a", "encoding_format": "binary", "quantization_ranges": [-1, 1]},
            "`int8` and `uint8` encodings only",
        ),
        (
            "/embed",
            {"inputs": "a", "encoding_format": "int8", "quantization_ranges": [1, -1]},
            "over its maximum",
        ),
        (
            "/v1/embeddings",
            {"input": "a", "encoding_format": "int8", "quantization_ranges": [[0, 0], [1, 1]]},
            "384 dimensions",
        ),
        (
            "/embed",
            {"inputs": "a", "encoding_format": "uint8", "quantization_ranges": "wide"},
            "`quantization_ranges` must be",
        ),
    ],
)
def test_bad_encodings(server, path, body, expected):
    r = server.post(path, body)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    message = error["message"] if isinstance(error, dict) else error
    assert expected in message
