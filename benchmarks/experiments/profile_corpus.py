"""Where `Model.embed` on texts spends host time: runs it on the varied-text corpus in a
loop, to be sampled by py-spy (its threads: the caller, the tokenizing/packing feeder,
one worker per device).

    py-spy record --threads --format raw -o stacks.txt -- \\
        python3 benchmarks/experiments/profile_corpus.py --tokenizer-from DIR --seconds 20
    python3 benchmarks/experiments/profile_corpus.py --summarize stacks.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

# The helpers these experiments share with the maintained scripts live in benchmarks/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import collections
import tempfile
import time
from pathlib import Path


def run(shape: str, tokenizer: Path, seconds: float) -> None:
    from corpus_text import corpus
    from shapes import with_tokenizer, write_random_checkpoint

    from trt_tei_runtime import Model

    texts = corpus(2048)
    with tempfile.TemporaryDirectory() as tmp:
        folder = with_tokenizer(write_random_checkpoint(shape, Path(tmp) / shape), tokenizer)
        model = Model(folder, device="cuda", dtype="bfloat16", pooling="mean")
        model.embed(texts[:256])
        start, passes = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            model.embed(texts)
            passes += 1
        print(f"{passes} passes in {time.perf_counter() - start:.1f} s")


def summarize(stacks: Path, top: int) -> None:
    """Per thread: samples, and the leaf functions (own time) that took the most."""
    per_thread: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in stacks.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        thread = frames[0]
        per_thread[thread][frames[-1] if len(frames) > 1 else "(no frame)"] += int(count)
    for thread, leaves in sorted(per_thread.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(leaves.values())
        print(f"\n{thread}: {total} samples")
        for leaf, n in leaves.most_common(top):
            print(f"  {n / total:6.1%}  {leaf}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="bert-large")
    parser.add_argument("--tokenizer-from", type=Path)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--summarize", type=Path, help="py-spy raw output to summarize")
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize, args.top)
    else:
        run(args.shape, args.tokenizer_from, args.seconds)


if __name__ == "__main__":
    main()
