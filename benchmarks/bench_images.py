"""Images through HTTP against the vision tower's own rate (issue 42):

    python benchmarks/bench_images.py                  # a GPU machine (source device_prepare.sh)
    python benchmarks/bench_images.py --dry-run        # the CPU: a tiny shape, to check the script

For each shape (random weights: CLIP ViT-B/16 at 224 pixels, SigLIP so400m/14 at 384), in turn:
- **tower**: the vision tower's images/s on pre-decoded, preprocessed pixels already on the
  device (`Executor.embed_images`), in batches of the bulk lane's largest graphed batch and
  of a full token budget (`--max-batch-tokens`), the faster of the two;
- **transformers**: `get_image_features` in bf16 (SDPA) in-process on the same pixels, batches
  of 64;
- **HTTP**: `--clients` processes, each on one keep-alive connection, sending
  `/v1/embeddings` requests of `--images-per-request` JPEGs of 640x480 as data URLs
  (answers in base64); images/s over `--seconds`, and the router process's CPU use (cores
  busy: what decoding and resizing take, since the GPU side is the tower's);
- **queries**: a 10-word text `/embed` query every 20 ms (one connection, its own thread
  here while the image clients are processes), idle and under the image backfill; p50/p99.

Targets: HTTP ≥ 90 % of the tower; query p99 under the backfill ≤ 2x its idle p50. Reports
only.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import realistic_traffic as rt
import torch
from bench_engine import percentiles
from bench_router import serve, stop_router
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from checkpoints.vision import (  # noqa: E402
    preprocessor_config,
    text_tokenizer,
    tokenizer_config,
)

# (architecture, vision config, text config, projection) of each shape.
SHAPES: dict[str, dict[str, Any]] = {
    "clip-vit-b16": {
        "architecture": "CLIPModel",
        "image_size": 224,
        "vision": {"patch_size": 16},
        "text": {},
        "projection_dim": 512,
    },
    "siglip-so400m": {
        "architecture": "SiglipModel",
        "image_size": 384,
        "vision": {
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "num_hidden_layers": 27,
            "num_attention_heads": 16,
            "patch_size": 14,
        },
        "text": {
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "num_hidden_layers": 27,
            "num_attention_heads": 16,
            "max_position_embeddings": 64,
        },
    },
    "tiny-clip": {  # --dry-run
        "architecture": "CLIPModel",
        "image_size": 32,
        "vision": {
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "patch_size": 8,
        },
        "text": {
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
        },
        "projection_dim": 16,
    },
}
QUERY_INTERVAL_S = 0.020
QUERY = "a photo of a small dog running on the beach at sunset"


def write_checkpoint(shape: str, folder: Path) -> Path:
    """Random weights of `shape` (transformers' own initialization), with the tests' CLIP-
    or SigLIP-style tokenizer and the family's preprocessor config at the shape's size."""
    import transformers

    spec = SHAPES[shape]
    architecture = spec["architecture"]
    tok = text_tokenizer(architecture)
    end = tok.get_vocab_size() - 1
    text = dict(spec["text"], vocab_size=tok.get_vocab_size(), pad_token_id=0, eos_token_id=end)
    vision = dict(spec["vision"], image_size=spec["image_size"])
    if architecture == "CLIPModel":
        text["bos_token_id"] = 2
        config = transformers.CLIPConfig(
            text_config=text, vision_config=vision, projection_dim=spec["projection_dim"]
        )
    else:
        config = transformers.SiglipConfig(text_config=text, vision_config=vision)
    torch.manual_seed(0)
    # Initialized on the GPU and saved in bfloat16: so400m's 800 M parameters take minutes
    # to initialize on the CPU.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = getattr(transformers, architecture)(config).eval()
    if device == "cuda":
        model = model.to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    length = config.text_config.max_position_embeddings
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(length)))
    processor = preprocessor_config(architecture, spec["image_size"])
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    return folder


def photo_jpegs(count: int, width: int = 640, height: int = 480) -> list[bytes]:
    """JPEGs of photo size and photo-like content (smooth gradients, shapes and fine noise,
    so each compresses to a photo's tens of kilobytes), quality 90."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = []
    for _ in range(count):
        base = np.stack(
            [
                128 + 100 * np.sin(x / rng.uniform(20, 90) + rng.uniform(0, 6)),
                128 + 100 * np.cos(y / rng.uniform(20, 90) + rng.uniform(0, 6)),
                128 + 100 * np.sin((x + y) / rng.uniform(30, 120)),
            ],
            axis=-1,
        )
        base += rng.normal(0, 18, base.shape)
        image = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB")
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def data_url(jpeg: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()


def tower_rate(folder: Path, jpegs: list[bytes], seconds: float, device: str) -> dict:
    """The tower's images/s on preprocessed pixels on the device, and transformers' on the
    same pixels, each over about `seconds`."""
    import transformers

    from trt_tei_runtime import Model
    from trt_tei_runtime.images import ImagePreprocessor

    dtype = "bfloat16" if device == "cuda" else "float32"
    model = Model(folder, device=device, dtype=dtype)
    executor = model.executors[0]
    graphs = executor.bulk.image_graphs
    # The tower's own best: its largest graphed batch, or a full batch of the token budget
    # (eager), whichever runs more images a second. The router's bulk batches go up to the
    # latter.
    graphed = graphs.max_images if graphs is not None else 16
    full = executor.max_images(model.max_batch_tokens)
    preprocess = ImagePreprocessor.from_folder(folder)
    one = np.stack([preprocess.preprocess(j) for j in jpegs[: max(graphed, full)]])
    while len(one) < max(graphed, full):
        one = np.concatenate([one, one])[: max(graphed, full)]
    all_pixels = torch.from_numpy(one).to(device)
    rates = {}
    for size in sorted({graphed, full}):
        pixels = all_pixels[:size]
        rates[size] = _rate(lambda p=pixels: executor.embed_images(p), size, seconds, device)
    batch = max(rates, key=lambda size: rates[size])
    ours = rates[batch]
    pixels = all_pixels[:batch]
    del model

    config = json.loads((folder / "config.json").read_text())
    cls = getattr(transformers, config["architectures"][0])
    torch_dtype = torch.bfloat16 if device == "cuda" else torch.float32
    reference = cls.from_pretrained(folder, dtype=torch_dtype, attn_implementation="sdpa")
    reference = reference.to(device).eval()
    theirs_batch = min(64, batch)
    theirs_pixels = pixels[:theirs_batch].to(torch_dtype)

    def theirs_step() -> Any:
        with torch.inference_mode():
            return reference.get_image_features(pixel_values=theirs_pixels)

    theirs = _rate(theirs_step, theirs_batch, seconds, device)
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"batch": batch, "tower": ours, "tower_by_batch": rates, "transformers": theirs}


def _rate(step: Any, images: int, seconds: float, device: str) -> float:
    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        step()
    sync()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        done += images
    sync()
    return done / (time.perf_counter() - start)


def _client(
    port: int, body: bytes, images: int, go: Any, measure: Any, stop: Any, counts: Any
) -> None:
    """Sends `body` until `stop`; counts the images answered while `measure` is set."""
    conn = rt.RawConnection(port)
    sent = failed = 0
    go.wait()
    while not stop.is_set():
        ok = conn.post("/v1/embeddings", body) == 200
        if not ok:
            failed += 1
        elif measure.is_set():
            sent += images
    conn.close()
    counts.put((sent, failed))


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def image_backfill(
    port: int, pid: int, jpegs: list[bytes], args: argparse.Namespace, queries: Any = None
) -> dict:
    """Images/s through HTTP from `args.clients` processes over `args.seconds` (after a
    second's warm-up), the router's CPU cores busy meanwhile; `queries` (an `rt.Queries`)
    run on a thread here, starting with the measured window."""
    per = args.images_per_request
    bodies = [
        json.dumps(
            {
                "input": [
                    {"image": data_url(jpegs[(c * per + i) % len(jpegs)])} for i in range(per)
                ],
                "encoding_format": "base64",
                "model": "bench",
            }
        ).encode()
        for c in range(args.clients)
    ]
    context = multiprocessing.get_context("spawn")
    go, measure, stop = context.Event(), context.Event(), context.Event()
    counts = context.Queue()
    procs = [
        context.Process(
            target=_client, args=(port, bodies[c], per, go, measure, stop, counts), daemon=True
        )
        for c in range(args.clients)
    ]
    for p in procs:
        p.start()
    go.set()
    time.sleep(args.settle)
    stop_queries = threading.Event()
    thread = None
    if queries is not None:
        thread = threading.Thread(target=queries.run, args=(stop_queries,))
        thread.start()
    # A request answered just after the window counts whole: over a 12 s window of requests
    # of a few tens of ms, that is within a percent.
    measure.set()
    cpu0, t0 = process_cpu_seconds(pid), time.perf_counter()
    time.sleep(args.seconds)
    cpu1, t1 = process_cpu_seconds(pid), time.perf_counter()
    measure.clear()
    stop.set()
    stop_queries.set()
    if thread is not None:
        thread.join()
    sent = failed = 0
    for _ in procs:
        s, f = counts.get(timeout=300)
        sent, failed = sent + s, failed + f
    for p in procs:
        p.join(timeout=60)
    return {
        "images_per_s": sent / (t1 - t0),
        "failed": failed,
        "router_cores": (cpu1 - cpu0) / (t1 - t0),
    }


def run_shape(shape: str, root: Path, args: argparse.Namespace, device: str) -> dict:
    folder = write_checkpoint(shape, root / shape)
    jpegs = photo_jpegs(args.distinct_images)
    towers = tower_rate(folder, jpegs, args.tower_seconds, device)
    query = [json.dumps({"inputs": QUERY}).encode()]
    proc = serve(folder, args.port, ["--payload-limit", str(256 << 20)], pooling=None)
    try:
        idle = rt.Queries(args.port, query, QUERY_INTERVAL_S, raw=True, path="/embed")
        idle.run(seconds=1.0)
        idle = rt.Queries(args.port, query, QUERY_INTERVAL_S, raw=True, path="/embed")
        idle.run(seconds=args.seconds)
        alone = image_backfill(args.port, proc.pid, jpegs, args)
        under = rt.Queries(args.port, query, QUERY_INTERVAL_S, raw=True, path="/embed")
        mixed = image_backfill(args.port, proc.pid, jpegs, args, queries=under)
    finally:
        stop_router(proc)
    return {
        "shape": shape,
        **towers,
        "http": alone,
        "mixed": mixed,
        "idle": percentiles(idle.latencies),
        "under": percentiles(under.latencies) if under.latencies else None,
        "answered": len(under.latencies),
        "query_errors": idle.errors + under.errors,
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| shape | tower images/s (batch) | transformers | HTTP images/s | of tower "
        "| router cores busy | query idle p50 / p99 ms | under images p50 / p99 | p99 ÷ idle p50 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        # `percentiles`: (p50, p99) in milliseconds.
        idle, under = r["idle"], r["under"] or (float("nan"), float("nan"))
        lines.append(
            f"| {r['shape']} | {r['tower']:,.0f} ({r['batch']}) | {r['transformers']:,.0f} "
            f"| {r['http']['images_per_s']:,.0f} | {r['http']['images_per_s'] / r['tower']:.0%} "
            f"| {r['http']['router_cores']:.1f} "
            f"| {idle[0]:.2f} / {idle[1]:.2f} "
            f"| {under[0]:.2f} / {under[1]:.2f} ({r['answered']}) "
            f"| {under[1] / idle[0]:.1f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="clip-vit-b16,siglip-so400m")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--images-per-request", type=int, default=16)
    parser.add_argument("--distinct-images", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--settle", type=float, default=2.0)
    parser.add_argument("--tower-seconds", type=float, default=5.0)
    parser.add_argument("--port", type=int, default=18700)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--dry-run", action="store_true", help="a tiny shape on the CPU")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = args.shapes.split(",")
    if args.dry_run:
        shapes, device = ["tiny-clip"], "cpu"
        args.clients, args.images_per_request, args.distinct_images = 2, 4, 8
        args.seconds, args.settle, args.tower_seconds = 2.0, 0.5, 0.5
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(
        f"device: {name}; {args.clients} clients x {args.images_per_request} JPEGs of 640x480 "
        f"a request; queries one every {QUERY_INTERVAL_S * 1e3:.0f} ms; {args.seconds:.0f} s "
        f"windows; {os.cpu_count()} host cores",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            rows.append(run_shape(shape, Path(tmp), args, device))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
