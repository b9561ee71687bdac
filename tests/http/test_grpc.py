"""The gRPC API (`tei.v1`) of the real router process, through a client generated at test
time from rust_router/proto/tei.proto with grpcio-tools: every call answers as its HTTP
route does, on the HTTP port and on `--grpc-port`; health and reflection answer; bad input,
the API key, deadlines and a cancelled stream behave as docs/grpc.md says."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pytest
from checkpoints import make_checkpoint, make_splade_checkpoint
from grpc_stubs import PROTO, generate
from router_harness import free_port

grpc = pytest.importorskip("grpc")

pytestmark = pytest.mark.integration

TEXTS = [
    "What is Deep Learning?",
    "Paris is the capital of France.",
    "The quick brown fox jumps over the lazy dog.",
    "a",
]
KEY = "grpc-test-key"
AUTH = (("authorization", f"Bearer {KEY}"),)


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):  # type: ignore[no-untyped-def]
    return generate(tmp_path_factory.mktemp("tei_stubs"))


@pytest.fixture(scope="module")
def pb(stubs):  # type: ignore[no-untyped-def]
    return stubs[0]


@pytest.fixture(scope="module")
def minilm(start_server, minilm_dir):  # type: ignore[no-untyped-def]
    """all-MiniLM-L6-v2 alone, as a TEI user runs it."""
    return start_server(minilm_dir, "--max-client-batch-size", "32")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("grpc_models")
    return {
        "reranker": make_checkpoint(
            root / "reranker",
            "BertForSequenceClassification",
            num_labels=1,
            seed=2,
            max_position_embeddings=64,
        ),
        "classifier": make_checkpoint(
            root / "classifier", "BertForSequenceClassification", num_labels=3, seed=1
        ),
        "splade": make_splade_checkpoint(root / "splade", seed=4, max_seq_length=16),
    }


@pytest.fixture(scope="module")
def several(start_server, minilm_dir, folders):  # type: ignore[no-untyped-def]
    """MiniLM, a reranker, a classifier and a SPLADE model, chosen by the `model` extension;
    an API key, and gRPC on a port of its own too."""
    grpc_port = free_port()
    server = start_server(
        minilm_dir,
        "--model-id",
        f"rr={folders['reranker']}",
        "--model-id",
        f"cls={folders['classifier']}",
        "--model-id",
        f"sp={folders['splade']}",
        "--api-key",
        KEY,
        "--grpc-port",
        str(grpc_port),
    )
    server.grpc_port = grpc_port
    return server


class Client:
    """Stubs of every `tei.v1` service over one channel."""

    def __init__(self, stubs: Any, port: int) -> None:
        _, services = stubs
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.info = services.InfoStub(self.channel)
        self.embed = services.EmbedStub(self.channel)
        self.predict = services.PredictStub(self.channel)
        self.rerank = services.RerankStub(self.channel)
        self.tokenize = services.TokenizeStub(self.channel)


@pytest.fixture(scope="module")
def client(stubs, minilm):  # type: ignore[no-untyped-def]
    c = Client(stubs, minilm.port)
    yield c
    c.channel.close()


@pytest.fixture(scope="module")
def keyed(stubs, several):  # type: ignore[no-untyped-def]
    c = Client(stubs, several.port)
    yield c
    c.channel.close()


def metric(server: Any, series: str) -> float:
    for line in server.get("/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def test_info_is_the_http_info(client, minilm, pb) -> None:  # type: ignore[no-untyped-def]
    info = client.info.Info(pb.InfoRequest())
    http = minilm.get("/info").json()
    assert info.model_type == pb.MODEL_TYPE_EMBEDDING
    assert info.model_id == http["model_id"]
    assert info.max_input_length == http["max_input_length"]
    assert info.max_client_batch_size == 32
    assert info.version == http["version"]


@pytest.mark.parametrize("normalize", [True, False])
def test_embed_is_the_http_embedding(client, minilm, pb, normalize) -> None:  # type: ignore[no-untyped-def]
    http = minilm.post("/embed", {"inputs": TEXTS, "normalize": normalize}).json()
    for text, expected in zip(TEXTS, http):
        answer, call = client.embed.Embed.with_call(
            pb.EmbedRequest(inputs=text, normalize=normalize)
        )
        np.testing.assert_allclose(answer.embeddings, expected, rtol=1e-5, atol=1e-6)
        metadata = dict(call.initial_metadata())
        assert int(metadata["x-compute-tokens"]) == answer.metadata.compute_tokens
        assert answer.metadata.compute_chars == len(text)
        assert answer.metadata.total_time_ns >= answer.metadata.inference_time_ns > 0


def test_dimensions_and_priority_extensions(client, minilm, pb) -> None:  # type: ignore[no-untyped-def]
    http = minilm.post("/embed", {"inputs": TEXTS[0], "dimensions": 64}).json()[0]
    answer = client.embed.Embed(
        pb.EmbedRequest(inputs=TEXTS[0], normalize=True, dimensions=64, priority=pb.PRIORITY_HIGH)
    )
    assert len(answer.embeddings) == 64
    np.testing.assert_allclose(answer.embeddings, http, rtol=1e-5, atol=1e-6)


def test_embed_all_tokenize_and_decode_are_the_http_answers(client, minilm, pb) -> None:  # type: ignore[no-untyped-def]
    text = TEXTS[1]
    rows = client.embed.EmbedAll(pb.EmbedAllRequest(inputs=text)).token_embeddings
    http = minilm.post("/embed_all", {"inputs": text}).json()[0]
    np.testing.assert_allclose([r.embeddings for r in rows], http, rtol=1e-5, atol=1e-6)
    tokens = client.tokenize.Tokenize(pb.EncodeRequest(inputs=text, add_special_tokens=True)).tokens
    http = minilm.post("/tokenize", {"inputs": text}).json()[0]
    assert [(t.id, t.text, t.special) for t in tokens] == [
        (h["id"], h["text"], h["special"]) for h in http
    ]
    assert [t.start if t.HasField("start") else None for t in tokens] == [h["start"] for h in http]
    ids = [t.id for t in tokens]
    decoded = client.tokenize.Decode(pb.DecodeRequest(ids=ids, skip_special_tokens=True))
    assert decoded.text == minilm.post("/decode", {"ids": ids}).json()[0]


def test_streams_answer_in_order(client, minilm, pb) -> None:  # type: ignore[no-untyped-def]
    texts = [f"{TEXTS[i % len(TEXTS)]} number {i}" for i in range(30)]
    http = minilm.post("/embed", {"inputs": texts}).json()
    answers = list(
        client.embed.EmbedStream(pb.EmbedRequest(inputs=t, normalize=True) for t in texts)
    )
    assert len(answers) == len(texts)
    for answer, expected in zip(answers, http):
        np.testing.assert_allclose(answer.embeddings, expected, rtol=1e-5, atol=1e-6)
    rows = list(client.embed.EmbedAllStream(pb.EmbedAllRequest(inputs=t) for t in texts[:3]))
    assert [len(r.token_embeddings) for r in rows] == [
        len(x) for x in minilm.post("/embed_all", {"inputs": texts[:3]}).json()
    ]
    tokens = list(client.tokenize.TokenizeStream(pb.EncodeRequest(inputs=t) for t in texts))
    http = minilm.post("/tokenize", {"inputs": texts, "add_special_tokens": False}).json()
    assert [[t.id for t in a.tokens] for a in tokens] == [[t["id"] for t in h] for h in http]
    decoded = list(
        client.tokenize.DecodeStream(pb.DecodeRequest(ids=[t.id for t in a.tokens]) for a in tokens)
    )
    assert [d.text.strip() for d in decoded] == [t.lower().strip() for t in texts]


def test_bad_input_has_teis_codes_and_the_http_messages(client, minilm, pb) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as empty:
        client.embed.Embed(pb.EmbedRequest(inputs=""))
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert empty.value.details() == "`inputs` cannot be empty"
    long = "word " * 600
    with pytest.raises(grpc.RpcError) as too_long:
        client.embed.Embed(pb.EmbedRequest(inputs=long))
    assert too_long.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    http = minilm.post("/embed", {"inputs": long}).json()
    assert too_long.value.details() == http["error"]
    assert len(client.embed.Embed(pb.EmbedRequest(inputs=long, truncate=True)).embeddings) == 384
    with pytest.raises(grpc.RpcError) as wrong_model:
        client.rerank.Rerank(pb.RerankRequest(query="q", texts=["a"]))
    assert wrong_model.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (
        wrong_model.value.details()
        == minilm.post("/rerank", {"query": "q", "texts": ["a"]}).json()["error"]
    )
    trailers = dict(wrong_model.value.trailing_metadata())
    assert trailers["error-type"] == "model_type"
    # A bad message in a stream ends it with its status, after the answers before it.
    messages = [pb.EmbedRequest(inputs="fine"), pb.EmbedRequest(inputs="")]
    answers = client.embed.EmbedStream(iter(messages))
    assert len(next(answers).embeddings) == 384
    with pytest.raises(grpc.RpcError) as in_stream:
        next(answers)
    assert in_stream.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert metric(minilm, 'te_request_failure{err="empty"}') >= 2


def test_calls_count_as_http_requests(client, minilm, pb) -> None:  # type: ignore[no-untyped-def]
    before = metric(minilm, 'te_request_success{method="single"}')
    client.embed.Embed(pb.EmbedRequest(inputs="counted"))
    assert metric(minilm, 'te_request_success{method="single"}') == before + 1


def test_a_deadline_bounds_the_queue_wait(client, minilm, pb) -> None:  # type: ignore[no-untyped-def]
    """A call whose deadline passes behind a backfill is DEADLINE_EXCEEDED, and the server
    gives it up (answered on its own deadline, or dropped when the client left first)."""
    backfill = [f"{'document text ' * 100} {i}" for i in range(32)]
    given_up = ('te_request_failure{err="queue_timeout"}', 'te_request_failure{err="dropped"}')
    before = sum(metric(minilm, s) for s in given_up)
    futures = [
        client.embed.Embed.future(pb.EmbedRequest(inputs=t, priority=pb.PRIORITY_LOW))
        for t in backfill
    ]
    with pytest.raises(grpc.RpcError) as late:
        client.embed.Embed(pb.EmbedRequest(inputs="q", priority=pb.PRIORITY_LOW), timeout=0.05)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert all(len(f.result().embeddings) == 384 for f in futures)
    deadline = time.monotonic() + 5
    while sum(metric(minilm, s) for s in given_up) == before:
        assert time.monotonic() < deadline, "the server never gave the call up"
        time.sleep(0.05)
    assert metric(minilm, "te_queue_size") == 0


def test_a_cancelled_stream_frees_its_queued_work(client, minilm, pb) -> None:  # type: ignore[no-untyped-def]
    before = metric(minilm, 'te_request_failure{err="dropped"}')
    documents = (
        pb.EmbedRequest(inputs=f"{'long document text ' * 60} {i}", priority=pb.PRIORITY_LOW)
        for i in range(400)
    )
    answers = client.embed.EmbedStream(documents)
    next(answers)
    answers.cancel()
    deadline = time.monotonic() + 10
    while metric(minilm, 'te_request_failure{err="dropped"}') == before:
        assert time.monotonic() < deadline, "the stream's messages were never dropped"
        time.sleep(0.05)
    while metric(minilm, "te_queue_size") > 0:
        assert time.monotonic() < deadline, "the queue kept the stream's work"
        time.sleep(0.05)
    assert len(client.embed.Embed(pb.EmbedRequest(inputs="after")).embeddings) == 384


def test_health_and_reflection_answer(stubs, minilm) -> None:  # type: ignore[no-untyped-def]
    from google.protobuf import descriptor_pool, message_factory
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    channel = grpc.insecure_channel(f"127.0.0.1:{minilm.port}")
    health = health_pb2_grpc.HealthStub(channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    assert health.Check(health_pb2.HealthCheckRequest()).status == serving
    assert health.Check(health_pb2.HealthCheckRequest(service="tei.v1.Embed")).status == serving
    rerank = health_pb2.HealthCheckRequest(service="tei.v1.Rerank")
    assert health.Check(rerank).status == not_serving
    with pytest.raises(grpc.RpcError) as unknown:
        health.Check(health_pb2.HealthCheckRequest(service="nope.Service"))
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    watch = health.Watch(health_pb2.HealthCheckRequest())
    assert next(watch).status == serving
    watch.cancel()

    # A client that knows nothing but the address: every service and message from reflection.
    reflection = ProtoReflectionDescriptorDatabase(channel)
    services = set(reflection.get_services())
    assert {"tei.v1.Info", "tei.v1.Embed", "tei.v1.Predict", "tei.v1.Rerank"} <= services
    assert {"tei.v1.Tokenize", "grpc.health.v1.Health"} <= services
    pool = descriptor_pool.DescriptorPool(reflection)
    request_type = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tei.v1.EmbedRequest")
    )
    response_type = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tei.v1.EmbedResponse")
    )
    assert request_type.DESCRIPTOR.fields_by_name["normalize"].number == 3
    embed = channel.unary_unary(
        "/tei.v1.Embed/Embed",
        request_serializer=request_type.SerializeToString,
        response_deserializer=response_type.FromString,
    )
    answer = embed(request_type(inputs=TEXTS[0], normalize=True))
    http = minilm.post("/embed", {"inputs": TEXTS[0]}).json()[0]
    np.testing.assert_allclose(answer.embeddings, http, rtol=1e-5, atol=1e-6)
    channel.close()


def test_a_client_without_the_extensions_works(minilm, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A client generated from the proto without this server's fields and enum (TEI's own
    shape): in a process of its own, as protobuf keeps one `tei.proto` per process."""
    lines = PROTO.read_text().splitlines()
    kept = []
    skipping = False
    for line in lines:
        if line.startswith("enum Priority"):
            skipping = True
        if not skipping and not any(f"= {n};" in line for n in range(100, 110)):
            kept.append(line)
        if skipping and line.startswith("}"):
            skipping = False
    (tmp_path / "proto").mkdir()
    (tmp_path / "proto" / "tei.proto").write_text("\n".join(kept))
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(PROTO.parents[2] / "tests")!r})
        import grpc, grpc_stubs
        from pathlib import Path
        grpc_stubs.PROTO = Path({str(tmp_path / "proto" / "tei.proto")!r})
        pb, services = grpc_stubs.generate(Path({str(tmp_path)!r}))
        assert not hasattr(pb, "PRIORITY_HIGH")
        assert "dimensions" not in pb.EmbedRequest.DESCRIPTOR.fields_by_name
        channel = grpc.insecure_channel("127.0.0.1:{minilm.port}")
        answer = services.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="hello", normalize=True))
        info = services.InfoStub(channel).Info(pb.InfoRequest())
        print(len(answer.embeddings), info.max_input_length)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["384", str(minilm.get("/info").json()["max_input_length"])]


def test_the_api_key_guards_every_call_but_the_probes(keyed, several, pb) -> None:  # type: ignore[no-untyped-def]
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with pytest.raises(grpc.RpcError) as missing:
        keyed.embed.Embed(pb.EmbedRequest(inputs="x"))
    assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as wrong:
        keyed.info.Info(pb.InfoRequest(), metadata=(("authorization", "Bearer nope"),))
    assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert len(keyed.embed.Embed(pb.EmbedRequest(inputs="x"), metadata=AUTH).embeddings) == 384
    health = health_pb2_grpc.HealthStub(keyed.channel)
    check = health.Check(health_pb2.HealthCheckRequest(service="tei.v1.Rerank"))
    assert check.status == health_pb2.HealthCheckResponse.SERVING


def test_grpc_port_serves_the_same_api(stubs, several, pb) -> None:  # type: ignore[no-untyped-def]
    own_port = Client(stubs, several.grpc_port)
    answer = own_port.embed.Embed(pb.EmbedRequest(inputs="x", normalize=True), metadata=AUTH)
    http = several.post(
        "/embed", {"inputs": "x"}, headers={"authorization": f"Bearer {KEY}"}
    ).json()[0]
    np.testing.assert_allclose(answer.embeddings, http, rtol=1e-5, atol=1e-6)
    own_port.channel.close()


def test_rerank_and_predict_are_the_http_answers(keyed, several, pb) -> None:  # type: ignore[no-untyped-def]
    headers = {"authorization": f"Bearer {KEY}"}
    query, texts = "what is deep learning", ["deep learning is a model", "paris", "cat dog"]
    http = several.post(
        "/rerank",
        {"model": "rr", "query": query, "texts": texts, "return_text": True},
        headers=headers,
    ).json()
    answer = keyed.rerank.Rerank(
        pb.RerankRequest(model="rr", query=query, texts=texts, return_text=True), metadata=AUTH
    )
    assert [(r.index, r.text) for r in answer.ranks] == [(h["index"], h["text"]) for h in http]
    np.testing.assert_allclose([r.score for r in answer.ranks], [h["score"] for h in http], 1e-5)
    streamed = keyed.rerank.RerankStream(
        (pb.RerankStreamRequest(model="rr", query=query, text=t, return_text=True) for t in texts),
        metadata=AUTH,
    )
    assert [(r.index, r.text) for r in streamed.ranks] == [(h["index"], h["text"]) for h in http]
    top = keyed.rerank.Rerank(
        pb.RerankRequest(model="rr", query=query, texts=texts, top_n=1), metadata=AUTH
    )
    assert [r.index for r in top.ranks] == [http[0]["index"]]

    pairs = [["a text", "its pair"], ["another"]]
    http = several.post(
        "/predict", {"model": "cls", "inputs": pairs, "raw_scores": True}, headers=headers
    ).json()
    for pair, expected in zip(pairs, http):
        answer = keyed.predict.PredictPair(
            pb.PredictPairRequest(model="cls", inputs=pair, raw_scores=True), metadata=AUTH
        )
        assert [p.label for p in answer.predictions] == [e["label"] for e in expected]
        np.testing.assert_allclose(
            [p.score for p in answer.predictions], [e["score"] for e in expected], 1e-5
        )
    single = keyed.predict.Predict(pb.PredictRequest(model="cls", inputs="another"), metadata=AUTH)
    streamed = list(
        keyed.predict.PredictStream(
            iter([pb.PredictRequest(model="cls", inputs="another")] * 3), metadata=AUTH
        )
    )
    assert [s.predictions for s in streamed] == [single.predictions] * 3
    paired = list(
        keyed.predict.PredictPairStream(
            iter([pb.PredictPairRequest(model="cls", inputs=["a", "b"])] * 2), metadata=AUTH
        )
    )
    assert len(paired) == 2 and paired[0].predictions == paired[1].predictions


def test_sparse_is_the_http_answer(keyed, several, pb) -> None:  # type: ignore[no-untyped-def]
    texts = ["the cat", "a river in paris"]
    http = several.post(
        "/embed_sparse",
        {"model": "sp", "inputs": texts},
        headers={"authorization": f"Bearer {KEY}"},
    ).json()
    answers = list(
        keyed.embed.EmbedSparseStream(
            (pb.EmbedSparseRequest(model="sp", inputs=t) for t in texts), metadata=AUTH
        )
    )
    for answer, expected in zip(answers, http):
        assert [v.index for v in answer.sparse_embeddings] == [e["index"] for e in expected]
        np.testing.assert_allclose(
            [v.value for v in answer.sparse_embeddings], [e["value"] for e in expected], 1e-5
        )
    one = keyed.embed.EmbedSparse(pb.EmbedSparseRequest(model="sp", inputs=texts[0]), metadata=AUTH)
    assert one.sparse_embeddings == answers[0].sparse_embeddings
