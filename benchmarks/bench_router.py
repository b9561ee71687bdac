"""End-to-end query latency through the HTTP router for BENCHMARKS.md's shapes.

    python benchmarks/bench_router.py --shapes bert-large,qwen3-0.6b --tokenizer-from DIR

Each shape is a random-weight checkpoint (benchmarks/shapes.py) given a real tokenizer:
DIR's tokenizer.json (all-MiniLM-L6-v2's WordPiece fits bert-large's 30,522-token vocab;
for the Qwen3 shapes any tokenizer whose ids fit the vocabulary serves for timing). The
router process is started on loopback and sent one 24-token `/v1/embeddings` request at a
time (`tests/http/loadgen.py`). Reports only; CUDA only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from shapes import write_random_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "http"))
from loadgen import run as load  # noqa: E402


def with_tokenizer(folder: Path, tokenizer_dir: Path) -> Path:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, folder / name)
    return folder


def serve(folder: Path, port: int) -> subprocess.Popen:
    cmd = ["text-embeddings-router", "--model-id", str(folder), "--port", str(port)]
    cmd += ["--hostname", "127.0.0.1", "--pooling", "mean"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"router exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("router did not start")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="bert-large")
    parser.add_argument("--tokenizer-from", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=5)
    args = parser.parse_args()
    text = " ".join(["hello"] * 22)  # 24 tokens with [CLS]/[SEP] in a BERT WordPiece vocabulary
    body = json.dumps({"input": text, "model": "bench"}).encode()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for port, shape in enumerate(args.shapes.split(","), start=18400):
            folder = with_tokenizer(
                write_random_checkpoint(shape, Path(tmp) / shape), args.tokenizer_from
            )
            proc = serve(folder, port)
            try:
                url = f"http://127.0.0.1:{port}"
                load(url, "/v1/embeddings", body, clients=1, seconds=2)  # warm-up
                rows.append(
                    (shape, load(url, "/v1/embeddings", body, clients=1, seconds=args.seconds))
                )
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            shutil.rmtree(folder)
    print(f"{'shape':<12} {'single request p50 ms':>22} {'p99 ms':>8} {'requests':>9}")
    for shape, r in rows:
        print(f"{shape:<12} {r['p50_ms']:>22.2f} {r['p99_ms']:>8.2f} {r['requests']:>9}")


if __name__ == "__main__":
    main()
