"""Late interaction (ColBERT, issue 43) on one GPU: documents/s and the latency of reranking
100 documents for one query, ours (`Model.embed_multivector`, `Model.rerank`: MaxSim on the
device) against PyLate on the same GPU and dtype.

A ColBERTv2-shape checkpoint (bert-base: 12 layers of 768, a Dense to 128; queries of 32
tokens with hidden expansion, documents up to 300) with random weights, in PyLate's layout
(`tests/checkpoints/colbert.py`), documents from `corpus_text`. PyLate is `pylate.models.
ColBERT` where it imports and loads with the installed sentence-transformers (PyLate 1.6
needs sentence-transformers 5.3); else its `encode` rules on transformers' BertModel
(`checkpoints.colbert.PyLateRules`, which `tests/test_colbert.py` checks token for token),
and the table says which. Both encode documents in PyLate's default batches of 32; rerank
latency is query + 100 documents + MaxSim, p50/p99 over `--reps`; the server's is a
`POST /rerank` of those 100 documents to `text-embeddings-router` on the same checkpoint
(one kept-alive connection, nothing else running).

`--dry-run`: a tiny shape on the CPU, a few documents, to check the script end to end.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import realistic_traffic as rt
import torch
from bench_engine import percentiles
from bench_router import serve, stop_router
from corpus_text import corpus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from checkpoints.colbert import PyLateRules, make_colbert_checkpoint, pylate_maxsim  # noqa: E402

from trt_tei_runtime import Model  # noqa: E402

COLBERT_V2 = dict(
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    max_position_embeddings=512,
)
TINY = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=512,
)
RERANK_DOCUMENTS = 100


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], object]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def pylate_side(folder: Path, device: str, dtype: torch.dtype) -> tuple[str, Any]:
    """PyLate's own ColBERT where it loads, else its rules on transformers."""
    try:
        from pylate import models

        model = models.ColBERT(str(folder), device=device, model_kwargs={"dtype": dtype})

        def encode(texts: list[str], is_query: bool) -> list[torch.Tensor]:
            out = model.encode(texts, is_query=is_query, batch_size=32, convert_to_tensor=True)
            return list(out)

        return "pylate.models.ColBERT", encode
    except Exception as exc:  # not installed, or its sentence-transformers pin not met
        print(f"pylate unavailable ({type(exc).__name__}: {exc}); using its rules on transformers")
        rules = PyLateRules(folder, device, dtype)
        return "PyLate's rules on transformers", lambda texts, is_query: rules.encode(
            texts, is_query=is_query
        )


def server_rerank(
    folder: Path, port: int, dtype: str, query: str, docs: list[str], reps: int
) -> dict[str, float]:
    """p50/p99 of `POST /rerank` of `RERANK_DOCUMENTS` documents through the router."""
    # Documents over the model's 300 tokens are cut, as PyLate cuts them.
    body = json.dumps({"query": query, "texts": docs[:RERANK_DOCUMENTS], "truncate": True}).encode()
    flags = ["--dtype", dtype, "--max-client-batch-size", str(RERANK_DOCUMENTS)]
    proc = serve(folder, port, flags, pooling=None)
    try:
        first = rt.HttpClientConnection(port).conn
        first.request("POST", "/rerank", body, {"Content-Type": "application/json"})
        answer = first.getresponse()
        if answer.status != 200:
            raise SystemExit(f"POST /rerank: {answer.status} {answer.read().decode()[:500]}")
        conn = rt.RawConnection(port)
        for _ in range(3):
            assert conn.post("/rerank", body) == 200
        latencies = []
        for _ in range(reps):
            start = time.perf_counter()
            assert conn.post("/rerank", body) == 200
            latencies.append(time.perf_counter() - start)
        conn.close()
    finally:
        stop_router(proc)
    p50, p99 = percentiles(latencies)
    return {"rerank_100_p50_ms": p50, "rerank_100_p99_ms": p99}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--port", type=int, default=18800)
    args = parser.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    dtype_name = "float32" if args.dry_run else args.dtype
    dtype = getattr(torch, dtype_name)
    shape = TINY if args.dry_run else COLBERT_V2
    count = 64 if args.dry_run else args.documents
    reps = 3 if args.dry_run else args.reps
    docs = corpus(count, min_words=60, max_words=300, seed=3)
    query = "what did the official say about the trend in the survey data?"
    results: dict[str, Any] = {"device": device, "dtype": dtype_name, "documents": count}
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_colbert_checkpoint(
            Path(tmp), query_length=32, document_length=300, embedding_size=128, **shape
        )
        ours = Model(folder, device=device, dtype=dtype_name)
        name, theirs = pylate_side(folder, device, dtype)
        results["baseline"] = name
        sides: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
            "ours": (
                lambda: ours.embed_multivector(docs, input_type="document"),
                lambda: ours.rerank(query, docs[:RERANK_DOCUMENTS]),
            ),
            "pylate": (
                lambda: theirs(docs, False),
                lambda: pylate_maxsim(
                    theirs([query], True)[0], theirs(docs[:RERANK_DOCUMENTS], False)
                ).cpu(),
            ),
        }
        for side, (embed, rerank) in sides.items():
            embed()  # warm-up: kernels, allocator, graphs
            seconds = min(timed(embed) for _ in range(1 if args.dry_run else 3))
            for _ in range(3):
                rerank()
            p50, p99 = percentiles([timed(rerank) for _ in range(reps)])
            results[side] = {
                "documents_per_s": count / seconds,
                "rerank_100_p50_ms": p50,
                "rerank_100_p99_ms": p99,
            }
        results["server"] = server_rerank(folder, args.port, dtype_name, query, docs, reps)
    ratio = results["ours"]["documents_per_s"] / results["pylate"]["documents_per_s"]
    results["documents_per_s_ratio"] = ratio
    print(f"| side | documents/s | rerank 100 p50 ms | p99 ms |  ({device}, {dtype_name})")
    print("|---|---|---|---|")
    for side in ("ours", "pylate"):
        r = results[side]
        label = side if side == "ours" else f"{side} ({name})"
        print(
            f"| {label} | {r['documents_per_s']:.0f} | {r['rerank_100_p50_ms']:.2f} | "
            f"{r['rerank_100_p99_ms']:.2f} |"
        )
    server = results["server"]
    print(
        "| ours, `POST /rerank` through the router (MaxSim on the device) | — | "
        f"{server['rerank_100_p50_ms']:.2f} | {server['rerank_100_p99_ms']:.2f} |"
    )
    print(f"documents/s ours / pylate: {ratio:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
