"""Several models in one server, and LoRA adapters mixed in one backfill (docs/server.md,
"Several models"; the scoreboard's section 7).

1. **Two models, one GPU.** An embedder (bert-large shape) and a reranker (qwen3-0.6b shape,
   `Qwen3ForSequenceClassification`) in one router. The reranker's queries (`/rerank`, a
   24-token query against one 24-token text, one every 20 ms) idle, then under the
   embedder's realistic backfill (`realistic_traffic`); the backfill under those queries
   against the same backfill in a server of the embedder alone. Targets: query p99 ≤ 2× its
   idle p50; backfill ≥ 90 % of solo.
2. **Four adapters, one backfill.** bert-large with four rank-16 LoRA adapters on its
   attention projections: the realistic backfill split over four concurrent clients, each
   naming one adapter, against the same four clients all naming the base model. Target: ≥
   85 % of the base model's tokens/s.

Random weights (`shapes.write_random_checkpoint`) with all-MiniLM-L6-v2's tokenizer; the
adapters are written as PEFT saves them. `--dry-run`: tiny shapes on the CPU, a second of
each, to check the script end to end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import realistic_traffic as rt
import torch
from bench_engine import percentiles
from bench_router import DOCS_PER_REQUEST, serve, stop_router
from safetensors.torch import save_file
from shapes import make_config, with_tokenizer

RANK = 16
ADAPTERS = 4
ATTENTION = ("query", "key", "value")


def write_checkpoint(shape: str, folder: Path, architecture: str | None = None) -> Path:
    """A random-weight checkpoint of `shape` in bfloat16; `architecture` replaces the
    shape's (a sequence classifier gets one label). Embedders get mean pooling in
    sentence-transformers' files, so that no server-wide `--pooling` is needed."""
    import transformers

    config = make_config(shape)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if architecture is not None:
        config.architectures = [architecture]
        config.num_labels = 1
        config.pad_token_id = 0
        with torch.device(device):
            model = transformers.AutoModelForSequenceClassification.from_config(
                config, dtype=torch.bfloat16
            )
    else:
        with torch.device(device):
            model = transformers.AutoModel.from_config(config, dtype=torch.bfloat16)
        pooling = folder / "1_Pooling"
        pooling.mkdir(parents=True, exist_ok=True)
        (pooling / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {
                "idx": 1,
                "name": "1",
                "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling",
            },
        ]
        (folder / "modules.json").write_text(json.dumps(modules))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def write_adapter(base: Path, folder: Path, seed: int) -> Path:
    """A rank-`RANK` LoRA adapter of a BERT checkpoint's attention projections, as PEFT
    saves one (`adapter_config.json` + `adapter_model.safetensors`)."""
    config = json.loads((base / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        for projection in ATTENTION:
            name = f"base_model.model.encoder.layer.{layer}.attention.self.{projection}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(RANK, hidden, generator=generator) * 0.02
            tensors[f"{name}.lora_B.weight"] = torch.randn(hidden, RANK, generator=generator) * 0.02
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.to(torch.bfloat16) for k, v in tensors.items()},
        str(folder / "adapter_model.safetensors"),
    )
    adapter_config = {
        "peft_type": "LORA",
        "r": RANK,
        "lora_alpha": 2 * RANK,
        "target_modules": list(ATTENTION),
        "bias": "none",
        "base_model_name_or_path": base.name,
        "task_type": "FEATURE_EXTRACTION",
    }
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config))
    return folder


def rerank_bodies(query_bodies: list[bytes], model: str) -> list[bytes]:
    """`/rerank` bodies from `realistic_traffic.queries`' texts: each query against the
    next one's text."""
    texts = [json.loads(b)["input"] for b in query_bodies]
    return [
        json.dumps({"query": q, "texts": [texts[(i + 1) % len(texts)]], "model": model}).encode()
        for i, q in enumerate(texts)
    ]


def backfill_rate(backfill: rt.Backfill, seconds: float) -> tuple[float, int]:
    """A warm-up pass, then enough passes for about `seconds`: (tokens/s, passes)."""
    backfill.run(1)
    estimate = backfill.run(1)
    passes = max(1, round(seconds * estimate / backfill.tokens))
    return backfill.run(passes), passes


def split_backfill(
    module: Any,
    port: int,
    docs: list[str],
    tokenizer: Any,
    names: list[str],
    clients: int,
    seconds: float,
) -> float:
    """The corpus split over one client per name in `names`, all at once: total tokens/s."""
    parts = [docs[i :: len(names)] for i in range(len(names))]
    fills = []
    for name, part in zip(names, parts):
        tokens = sum(len(tokenizer.encode(d, add_special_tokens=False).ids) + 2 for d in part)
        fill = rt.Backfill.connect(
            module, port, part, tokens, max(1, clients // len(names)), DOCS_PER_REQUEST
        )
        fill.model = name
        fills.append(fill)
    for fill in fills:
        fill.run(1)  # warm-up: each adapter's path once
    estimate = sum(f.tokens for f in fills) / (time_all(fills, 1))
    passes = max(1, round(seconds * estimate / sum(f.tokens for f in fills)))
    return sum(f.tokens for f in fills) * passes / time_all(fills, passes)


def time_all(fills: list[rt.Backfill], passes: int) -> float:
    """Seconds for every backfill to run `passes`, each on a thread of its own."""
    threads = [threading.Thread(target=f.run, args=(passes,)) for f in fills]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def two_models(args: argparse.Namespace, root: Path, client: Any, minilm: Path) -> dict:
    embedder = with_tokenizer(write_checkpoint(args.embedder, root / "emb"), minilm)
    reranker = with_tokenizer(
        write_checkpoint(
            args.reranker,
            root / "rr",
            "Qwen3ForSequenceClassification"
            if args.reranker.startswith("qwen3")
            else "BertForSequenceClassification",
        ),
        minilm,
    )
    tokenizer = rt.plain_tokenizer(minilm)
    docs, tokens = rt.documents(tokenizer, args.docs, args.min_tokens, args.max_tokens)
    bodies = rerank_bodies(rt.queries(tokenizer), "rr")
    interval = args.query_interval_ms / 1e3

    proc = serve(embedder, args.port, [], pooling=None)
    try:
        fill = rt.Backfill.connect(client, args.port, docs, tokens, args.clients, DOCS_PER_REQUEST)
        solo, _ = backfill_rate(fill, args.seconds)
    finally:
        stop_router(proc)

    proc = serve(embedder, args.port, ["--model-id", f"rr={reranker}"], pooling=None)
    try:
        rt.Queries(args.port, bodies, interval, raw=True, path="/rerank").run(seconds=1.0)
        idle = rt.Queries(args.port, bodies, interval, raw=True, path="/rerank")
        idle.run(seconds=args.seconds)
        fill = rt.Backfill.connect(client, args.port, docs, tokens, args.clients, DOCS_PER_REQUEST)
        fill.model = "emb"
        beside, passes = backfill_rate(fill, args.seconds)
        under = rt.Queries(args.port, bodies, interval, raw=True, path="/rerank")
        mixed = rt.mixed(fill, under, max(passes, 2), settle_s=args.settle)
    finally:
        stop_router(proc)
    if not (idle.latencies and under.latencies):
        raise SystemExit(f"no rerank query answered ({idle.errors} / {under.errors} errors)")
    return {
        "idle": percentiles(idle.latencies),
        "under": percentiles(under.latencies),
        "answered": len(under.latencies),
        "errors": idle.errors + under.errors,
        "solo": solo,
        "beside": beside,
        "mixed": mixed,
        "tokens": tokens,
    }


def adapters(args: argparse.Namespace, root: Path, client: Any, minilm: Path) -> dict:
    base = with_tokenizer(write_checkpoint(args.embedder, root / "base"), minilm)
    names = [f"task{i}" for i in range(ADAPTERS)]
    flags = []
    for i, name in enumerate(names):
        flags += ["--lora-adapter", f"{name}={write_adapter(base, root / name, seed=i)}"]
    tokenizer = rt.plain_tokenizer(minilm)
    docs, _ = rt.documents(tokenizer, args.docs, args.min_tokens, args.max_tokens)
    clients = [base.name] * ADAPTERS

    def backfill(flags: list[str], names: list[str]) -> float:
        proc = serve(base, args.port, flags, pooling=None)
        try:
            return split_backfill(
                client, args.port, docs, tokenizer, names, args.clients, args.seconds
            )
        finally:
            stop_router(proc)

    alone = backfill([], clients)
    return {
        "alone": alone,
        "base": backfill(flags, clients),
        "mixed": backfill(flags, names),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--embedder", default="bert-large")
    parser.add_argument("--reranker", default="qwen3-0.6b")
    parser.add_argument("--tables", default="models,adapters")
    parser.add_argument("--docs", type=int, default=2048)
    parser.add_argument("--min-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--settle", type=float, default=2.0)
    parser.add_argument("--query-interval-ms", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=18500)
    parser.add_argument("--minilm-dir", type=Path, default=None)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    args = parser.parse_args()
    if args.dry_run:
        args.embedder, args.reranker = "minilm", "minilm"
        args.docs, args.seconds, args.settle, args.max_tokens = 64, 1.0, 0.2, 128
    client = rt.ensure_client()
    minilm = rt.minilm_folder(args.minilm_dir)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    tables = args.tables.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        models = two_models(args, root, client, minilm) if "models" in tables else None
        lora = adapters(args, root / "lora", client, minilm) if "adapters" in tables else None
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"device: {device}; backfill: baseten-performance-client, {args.clients} connections, "
        f"{DOCS_PER_REQUEST} documents per request, {args.docs} documents of "
        f"{args.min_tokens}-{args.max_tokens} tokens; queries one every "
        f"{args.query_interval_ms:g} ms; {args.seconds:g} s windows"
    )
    if models is not None:
        (i50, i99), (u50, u99) = models["idle"], models["under"]
        print(
            f"\nTwo models, one GPU: {args.embedder} embedder backfilling, {args.reranker} "
            "reranker queried (/rerank, 24-token query and text)"
        )
        print(
            "| rerank idle p50 / p99 ms | under the backfill p50 / p99 | p99 ÷ idle p50 "
            "| backfill alone in its own server | beside the reranker, idle "
            "| under the queries, of alone |"
        )
        print("|---|---|---|---|---|---|")
        print(
            f"| {i50:.2f} / {i99:.2f} | {u50:.2f} / {u99:.2f} ({models['answered']} answered) "
            f"| {u99 / i50:.1f}x | {models['solo']:,.0f} tok/s | {models['beside']:,.0f} tok/s "
            f"| {models['mixed']:,.0f} tok/s ({models['mixed'] / models['solo']:.0%}) |"
        )
        if models["errors"]:
            print(f"{models['errors']} queries failed")
    if lora is not None:
        print(f"\nFour rank-{RANK} LoRA adapters mixed in one {args.embedder} backfill")
        print(
            "| base model, no adapters loaded | base model, adapters loaded "
            "| one adapter per client | of the base model alone |"
        )
        print("|---|---|---|---|")
        print(
            f"| {lora['alone']:,.0f} tok/s | {lora['base']:,.0f} tok/s "
            f"| {lora['mixed']:,.0f} tok/s | {lora['mixed'] / lora['alone']:.0%} |"
        )
        print("(each column: the corpus split over four clients at once, two connections each)")


if __name__ == "__main__":
    main()
