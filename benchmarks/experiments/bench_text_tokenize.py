"""The Python API's tokenization (`TextTokenizer.encode_ids`, what `Model.embed` and corpus
jobs use) on the realistic corpus and queries. CPU only.

    python benchmarks/experiments/bench_text_tokenize.py \
        [--model-id DIR] [--docs 2048] [--max-length 512]

Prints tokens per second (best of `--reps`), for whichever build of `trt_tei_runtime` is
first on the path: run it under two builds to compare them.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The helpers these experiments share with the maintained scripts live in benchmarks/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import os
import time
from pathlib import Path

from realistic_traffic import documents, minilm_folder, plain_tokenizer, queries

from trt_tei_runtime.tokenization import TextTokenizer


def _best_tokens_per_s(tokenizer: TextTokenizer, texts: list[str], reps: int) -> float:
    best = float("inf")
    tokens = 0
    for _ in range(reps):
        start = time.perf_counter()
        tokens = int(tokenizer.encode_ids(texts)[0].lengths.sum())
        best = min(best, time.perf_counter() - start)
    return tokens / best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-id", type=Path, help="default: the packaged all-MiniLM-L6-v2")
    p.add_argument("--docs", type=int, default=2048)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    model = minilm_folder(args.model_id)
    reference = plain_tokenizer(model)
    docs, _ = documents(reference, args.docs, 64, 512)
    query_texts = [json.loads(b)["input"] for b in queries(reference, 64)]
    tokenizer = TextTokenizer(model, args.max_length)
    rows = [
        (f"{len(docs)} documents of 64-512 tokens", _best_tokens_per_s(tokenizer, docs, args.reps)),
        (
            f"{len(query_texts) * 32} queries of 24 tokens",
            _best_tokens_per_s(tokenizer, query_texts * 32, args.reps),
        ),
    ]
    print(f"CPU ({os.cpu_count()} cores); model: {model.name}; max_length {args.max_length}")
    print("| texts | tokens/s |")
    print("|---|---|")
    for name, rate in rows:
        print(f"| {name} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
