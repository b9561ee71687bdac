"""Long documents embedded whole (`long_input: chunk`, docs/server.md "Long inputs").

A bert-large shape backfill of documents 4-16x the model's input limit, through HTTP on a
server started with `--long-input chunk` (the backfill client, baseten-performance-client,
sends OpenAI bodies, which then take the server's default), against the same tokens sent as
short documents: each long document cut into the windows the server would cut it into
(`limit - 2` tokens each, no overlap), on a server left at `--long-input error`. Target: the
chunked backfill ≥ 95 % of the short documents' tokens/s. Then 24-token queries (one every
`--query-interval-ms`, in a process of their own) idle and under the chunked backfill:
target p99 ≤ 2x idle.

Random weights (`bench_several_models.write_checkpoint`, mean pooling) with
all-MiniLM-L6-v2's tokenizer. Tokens are counted as the sequences run (special tokens
included), so both sides count the same tokens. `--dry-run`: a tiny shape on the CPU, a
second of each, to check the script end to end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import realistic_traffic as rt
import torch
from bench_engine import percentiles
from bench_router import DOCS_PER_REQUEST, serve, stop_router
from bench_several_models import backfill_rate, write_checkpoint
from corpus_text import corpus
from shapes import with_tokenizer
from tokenizers import Tokenizer

# Long documents are sent a few at a time: 16 x 512 tokens is ~40 KB of text each.
LONG_DOCS_PER_REQUEST = 4


def long_documents(
    tokenizer: Tokenizer, count: int, limit: int, min_times: int, max_times: int
) -> list[list[int]]:
    """`count` documents' token ids (no special tokens), `min_times`-`max_times` x `limit`."""
    rng = np.random.default_rng(0)
    targets = rng.integers(min_times * limit, max_times * limit + 1, size=count)
    # Words are ~1.3 WordPiece tokens: enough words for the longest.
    texts = corpus(count, min_words=max_times * limit, max_words=max_times * limit, seed=2)
    return [
        tokenizer.encode(t, add_special_tokens=False).ids[: int(n)]
        for t, n in zip(texts, targets, strict=True)
    ]


def fitting_text(tokenizer: Tokenizer, ids: list[int], window: int) -> str:
    """`ids` decoded, cut until the text tokenizes back to at most `window` tokens (decoding
    joins some word pieces that then tokenize differently)."""
    n = len(ids)
    while True:
        text = tokenizer.decode(ids[:n])
        if len(tokenizer.encode(text, add_special_tokens=False).ids) <= window:
            return text
        n -= 1


def as_texts(tokenizer: Tokenizer, docs: list[list[int]], window: int) -> dict[str, Any]:
    """The long documents as texts, and their windows as short texts (each decoded from its
    window's ids), with the tokens each side runs, special tokens included."""
    long_texts = [tokenizer.decode(ids) for ids in docs]
    windows = [ids[s : s + window] for ids in docs for s in range(0, len(ids), window)]
    short_texts = [fitting_text(tokenizer, w, window) for w in windows]

    def tokens(texts: list[str]) -> int:
        return sum(len(e.ids) for e in tokenizer.encode_batch(texts))

    # The server cuts the re-tokenized long text: count its windows' tokens the same way.
    long_tokens = 0
    for text in long_texts:
        n = len(tokenizer.encode(text, add_special_tokens=False).ids)
        long_tokens += n + 2 * -(-n // window)
    return {
        "long": long_texts,
        "short": short_texts,
        "long_tokens": long_tokens,
        "short_tokens": tokens(short_texts),
        "windows": len(windows),
    }


def run(args: argparse.Namespace, root: Path, client: Any, minilm: Path) -> dict:
    folder = with_tokenizer(write_checkpoint(args.shape, root / "emb"), minilm)
    # The router's limit: the position table (no sentence-transformers max_seq_length here).
    limit = json.loads((folder / "config.json").read_text())["max_position_embeddings"]
    window = limit - 2
    tokenizer = rt.plain_tokenizer(minilm)
    docs = long_documents(tokenizer, args.docs, window, args.min_times, args.max_times)
    texts = as_texts(tokenizer, docs, window)
    flags = ["--payload-limit", str(64 << 20), "--max-chunks", str(args.max_times + 1)]
    interval = args.query_interval_ms / 1e3
    bodies = rt.queries(tokenizer)

    proc = serve(folder, args.port, flags, pooling=None)
    try:
        fill = rt.Backfill.connect(
            client, args.port, texts["short"], texts["short_tokens"], args.clients, DOCS_PER_REQUEST
        )
        short, _ = backfill_rate(fill, args.seconds)
    finally:
        stop_router(proc)

    proc = serve(folder, args.port, [*flags, "--long-input", "chunk"], pooling=None)
    try:
        rt.Queries(args.port, bodies, interval, raw=True).run(seconds=1.0)
        idle = rt.Queries(args.port, bodies, interval, raw=True)
        idle.run(seconds=args.seconds)
        fill = rt.Backfill.connect(
            client,
            args.port,
            texts["long"],
            texts["long_tokens"],
            args.clients,
            LONG_DOCS_PER_REQUEST,
        )
        chunked, passes = backfill_rate(fill, args.seconds)
        under = rt.Queries(args.port, bodies, interval, raw=True)
        mixed = rt.mixed(fill, under, max(passes, 2), settle_s=args.settle)
    finally:
        stop_router(proc)
    if not (idle.latencies and under.latencies):
        raise SystemExit(f"no query answered ({idle.errors} / {under.errors} errors)")
    return {
        "limit": limit,
        "windows": texts["windows"],
        "short": short,
        "chunked": chunked,
        "mixed": mixed,
        "idle": percentiles(idle.latencies),
        "under": percentiles(under.latencies),
        "answered": len(under.latencies),
        "errors": idle.errors + under.errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="bert-large")
    parser.add_argument("--docs", type=int, default=256)
    parser.add_argument("--min-times", type=int, default=4, help="shortest document ÷ limit")
    parser.add_argument("--max-times", type=int, default=16, help="longest document ÷ limit")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--settle", type=float, default=2.0)
    parser.add_argument("--query-interval-ms", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=18600)
    parser.add_argument("--minilm-dir", type=Path, default=None)
    parser.add_argument("--dry-run", action="store_true", help="a tiny shape on the CPU")
    args = parser.parse_args()
    if args.dry_run:
        args.shape, args.docs, args.min_times, args.max_times = "minilm", 4, 4, 5
        args.seconds, args.settle = 1.0, 0.2
    client = rt.ensure_client()
    minilm = rt.minilm_folder(args.minilm_dir)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        result = run(args, root, client, minilm)
        shutil.rmtree(root, ignore_errors=True)
    (i50, i99), (u50, u99) = result["idle"], result["under"]
    print(
        f"device: {device}; {args.shape}, limit {result['limit']} tokens; {args.docs} documents "
        f"of {args.min_times}-{args.max_times}x the limit ({result['windows']} windows); "
        f"baseten-performance-client, {args.clients} connections; queries one every "
        f"{args.query_interval_ms:g} ms; {args.seconds:g} s windows"
    )
    print(
        "| the windows as short documents | long documents, `long_input: chunk` | of short "
        "| chunked under queries | query idle p50 / p99 ms | under the backfill p50 / p99 "
        "| p99 ÷ idle p99 |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {result['short']:,.0f} tok/s | {result['chunked']:,.0f} tok/s "
        f"| {result['chunked'] / result['short']:.0%} | {result['mixed']:,.0f} tok/s "
        f"| {i50:.2f} / {i99:.2f} | {u50:.2f} / {u99:.2f} ({result['answered']} answered) "
        f"| {u99 / i99:.1f}x |"
    )
    if result["errors"]:
        print(f"{result['errors']} queries failed")


if __name__ == "__main__":
    main()
