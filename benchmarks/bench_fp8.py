"""What a user of the server gets from FP8 engines (issue 39), per shape, on one GPU:

    source benchmarks/device_prepare.sh
    python3 benchmarks/bench_fp8.py --tokenizer-from .carry/minilm-xz --minilm $TRT_TEI_MINILM_DIR

For each shape (a random-weight checkpoint of benchmarks/shapes.py given DIR's tokenizer, as
bench_router.py does), `trt-tei-build` builds a bf16 engine and an FP8 engine from builder
YAMLs like release_matrix_cfg/'s (`quantization_type: fp8`, the quality gate and its
fallback at their defaults). The FP8 build runs with `--force`, so that an engine under the
gate is still written and measured; its row says so. From the FP8 engine's manifest.json
(`quantization.quality`): the gate's min cosine, whether it passed and the linears kept in
bf16. Then `text-embeddings-router` serves each engine folder in turn on one device and
bench_router.py's realistic traffic measures, through HTTP: the idle query p50/p99 (a
24-token query every 20 ms for `--idle-seconds`) and the backfill's tokens/s alone (8
connections, 32 documents a request, base64; whole passes over the corpus lasting about
`--seconds`). The builds and the router's start-up are timed too. Last, a markdown table
per shape with the FP8/bf16 ratios and issue 39's targets (met / not met).

On random weights the gate may fail even with the fallback's linears kept (bert-large's
gave a min cosine of 0.991 with every linear in FP8, emulated on a CPU): the FP8 row then
measures that mix, and a note says so. `--fp8-fallback none` builds the shapes' FP8
engines with every linear in FP8, for the all-FP8 speed (the gate's figure is then that
engine's).

`--minilm DIR` also builds the real all-MiniLM-L6-v2's FP8 engine (its own pooling, the gate
and fallback at their defaults) and prints its gate figures and the linears it kept. A
shape that fails prints its error and the others still run. Reports only.

A CPU smoke run (FP8 emulated; the tiny `minilm` shape; a small workload):

    python benchmarks/bench_fp8.py --device cpu --shapes minilm --tokenizer-from DIR \\
        --seconds 3 --idle-seconds 2 --docs 64 --max-tokens 128 --clients 2 --passes 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import realistic_traffic as rt
import torch
import yaml
from bench_engine import percentiles
from bench_router import (
    DOCS_PER_REQUEST,
    add_traffic_arguments,
    idle_queries,
    realistic_inputs,
    serve,
    solo_backfill,
    stop_router,
)
from shapes import with_tokenizer, write_random_checkpoint

from trt_tei_runtime.engine import MANIFEST
from trt_tei_runtime.models import architecture_class

SHAPES = "bert-large,qwen3-0.6b,qwen3-8b"
# Issue 39's targets, on an H200: FP8 backfill ÷ bf16 backfill, and the FP8 idle query p50.
BACKFILL_RATIO_TARGETS = {"qwen3-8b": 1.5, "bert-large": 1.3, "qwen3-0.6b": 1.3}
QUERY_P50_TARGETS_MS = {"qwen3-8b": 3.0}
FIRST_PORT = 18500


class BenchError(Exception):
    """A step of one shape failed; the message says which and why."""


@dataclass
class Build:
    """An engine `trt-tei-build` wrote: its folder, manifest, and wall time of the command
    (process start, imports and CUDA initialization included)."""

    folder: Path
    manifest: dict[str, Any]
    wall_s: float

    @property
    def quality(self) -> dict[str, Any] | None:
        return self.manifest["quantization"].get("quality")

    def gate(self) -> str:
        """The gate's figure: min cosine, and whether it passed."""
        q = self.quality
        if not q:
            return "–"
        verdict = (
            "passed"
            if q["passed"]
            else f"under {q['min_cosine_required']:g}: refused without --force"
        )
        return f"{q['min_cosine']:.5f} ({verdict})"

    def kept(self) -> str:
        """How many of the quantizable linears stayed in bf16."""
        q = self.quality
        if not q:
            return "–"
        kept = len(q["kept_linears"])
        return f"{kept} of {kept + q['quantized_linears']}"

    def timing(self) -> str:
        return f"{self.wall_s:.1f} s ({self.manifest['build_seconds']:.1f} s in build_engine)"


@dataclass
class Measured:
    """One engine served: start-up to the first /health 200, idle queries, backfill alone."""

    start_s: float
    idle_ms: tuple[float, float]
    queries: int
    errors: int
    backfill_tokens_per_s: float
    passes: int
    docs: int
    tokens: int


@dataclass
class ShapeResult:
    shape: str
    checkpoint_s: float | None = None
    builds: dict[str, Build] = field(default_factory=dict)
    measured: dict[str, Measured] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # step → message


def builder_command() -> list[str]:
    """`trt-tei-build` where it is on PATH (the wheel's script), else its module."""
    found = shutil.which("trt-tei-build")
    return [found] if found else [sys.executable, "-m", "trt_tei_runtime.engine.cli"]


def builder_config(
    checkpoint: Path, quantization: str, device: str, pooling: str | None, fallback: str | None
) -> dict[str, Any]:
    """A builder YAML's fields, as release_matrix_cfg/'s (limits as the router's defaults:
    16,384 tokens, 256 sequences); the gate at its default, and the fallback too unless
    `fallback` names one."""
    config_json = json.loads((checkpoint / "config.json").read_text())
    config: dict[str, Any] = {
        "base_model": architecture_class(config_json["architectures"][0]).base_model,
        "checkpoint_repository": {"repo": str(checkpoint), "source": "local"},
        "quantization_type": quantization,
        "dtype": "bfloat16",
        "max_num_tokens": 16384,
        "max_batch_size": 256,
        "device": "cpu" if device == "cpu" else "cuda",
    }
    if pooling is not None:
        config["pooling"] = pooling
    if quantization == "fp8" and fallback is not None:
        config["fp8_fallback"] = fallback
    return config


def build(config: dict[str, Any], output: Path, logs: Path) -> Build:
    """Runs `trt-tei-build` on `config` into `output` (FP8: with --force); its output goes
    to a log file in `logs`, whose tail a failure shows."""
    name = output.name
    config_path = logs / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    command = [*builder_command(), str(config_path), "--output", str(output)]
    if config["quantization_type"] == "fp8":
        command.append("--force")
    log_path = logs / f"{name}.build.log"
    start = time.perf_counter()
    with log_path.open("wb") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - start
    if code != 0:
        tail = log_path.read_text(errors="replace").replace("\r", "\n")[-3000:]
        raise BenchError(f"trt-tei-build {name} exited with {code}:\n{tail}")
    manifest = json.loads((output / MANIFEST).read_text())
    return Build(output, manifest, wall)


def router_flags(args: argparse.Namespace) -> list[str]:
    """One device, then `--router-args` (serve() adds the port, loopback and mean pooling)."""
    return ["--device", args.device, *args.router_args.split()]


def measure(shape: str, engine: Path, port: int, args: argparse.Namespace, client: Any) -> Measured:
    """Serves `engine` on loopback and runs the idle queries, then the backfill alone."""
    start = time.perf_counter()
    proc = serve(engine, port, router_flags(args))
    start_s = time.perf_counter() - start
    try:
        count, docs, tokens, bodies = realistic_inputs(shape, engine, port, args)
        idle = idle_queries(port, bodies, args, args.idle_seconds)
        solo = solo_backfill(proc, port, client, docs, tokens, args)
    finally:
        stop_router(proc)
    if not idle.latencies:
        raise BenchError(f"no idle query answered ({idle.errors} errors)")
    return Measured(
        start_s=start_s,
        idle_ms=percentiles(idle.latencies),
        queries=len(idle.latencies),
        errors=idle.errors,
        backfill_tokens_per_s=solo.tokens_per_s,
        passes=solo.passes,
        docs=count,
        tokens=tokens,
    )


def failure(exc: BaseException) -> str:
    """An error's message; the traceback too for what is not a known failure."""
    if isinstance(exc, (BenchError, SystemExit)):
        return str(exc)
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()


def run_shape(
    shape: str, index: int, work: Path, args: argparse.Namespace, client: Any
) -> ShapeResult:
    """Builds both engines, then serves each in turn; each step's failure is recorded and
    the steps that do not need it still run."""
    result = ShapeResult(shape)
    engines = args.keep_engines or work
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    checkpoint = work / f"{shape}-checkpoint"
    try:
        start = time.perf_counter()
        write_random_checkpoint(shape, checkpoint)
        with_tokenizer(checkpoint, args.tokenizer_from)
        result.checkpoint_s = time.perf_counter() - start
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the random weights' blocks: the builder needs them
        print(f"{shape}: random checkpoint written in {result.checkpoint_s:.1f} s", flush=True)
        for kind, quantization in (("bf16", "no_quant"), ("fp8", "fp8")):
            try:
                config = builder_config(
                    checkpoint, quantization, args.device, "mean", args.fp8_fallback
                )
                built = build(config, engines / f"{shape}-{kind}", logs)
            except (Exception, SystemExit) as exc:  # recorded; the other build still runs
                result.errors[f"{kind} build"] = failure(exc)
                print(f"{shape}: {kind} build failed: {failure(exc)}", flush=True)
                continue
            result.builds[kind] = built
            print(
                f"{shape}: {kind} engine built in {built.timing()}; gate {built.gate()}, "
                f"linears kept in bf16 {built.kept()}",
                flush=True,
            )
    except (Exception, SystemExit) as exc:  # shapes.py exits on an unknown shape
        result.errors["checkpoint"] = failure(exc)
        print(f"{shape}: checkpoint failed: {failure(exc)}", flush=True)
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    for offset, kind in enumerate(("bf16", "fp8")):
        built_engine = result.builds.get(kind)
        if built_engine is None:
            continue
        try:
            port = FIRST_PORT + 2 * index + offset
            m = measure(shape, built_engine.folder, port, args, client)
        except (Exception, SystemExit) as exc:  # serve() exits on a router that died
            result.errors[f"{kind} serve"] = failure(exc)
            print(f"{shape}: {kind} serving failed: {failure(exc)}", flush=True)
        else:
            result.measured[kind] = m
            print(
                f"{shape}: {kind} served (start-up {m.start_s:.1f} s): idle p50 "
                f"{m.idle_ms[0]:.2f} ms / p99 {m.idle_ms[1]:.2f} ms ({m.queries} queries, "
                f"{m.errors} errors); backfill {m.backfill_tokens_per_s:,.0f} tokens/s "
                f"({m.passes} passes of {m.docs} docs, {m.tokens:,} tokens)",
                flush=True,
            )
        finally:
            if args.keep_engines is None:
                shutil.rmtree(built_engine.folder, ignore_errors=True)
    return result


def cell(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def shape_table(r: ShapeResult, device: str) -> list[str]:
    """The markdown table of one shape, its timings and its targets."""
    bf16, fp8 = r.measured.get("bf16"), r.measured.get("fp8")
    ratio = fp8.backfill_tokens_per_s / bf16.backfill_tokens_per_s if bf16 and fp8 else None
    p50_ratio = fp8.idle_ms[0] / bf16.idle_ms[0] if bf16 and fp8 else None
    corpus = next(iter(r.measured.values()), None)
    title = f"### {r.shape}" + (
        f" ({corpus.docs} docs, {corpus.tokens:,} tokens a pass; {device})" if corpus else ""
    )
    lines = [
        title,
        "",
        "| engine | idle p50 ms | idle p99 ms | backfill tok/s | FP8/bf16 backfill (p50) "
        "| gate cosine | linears kept bf16 |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in ("bf16", "fp8"):
        m, b = r.measured.get(kind), r.builds.get(kind)
        if m is None:
            why = (
                r.errors.get(f"{kind} build")
                or r.errors.get(f"{kind} serve")
                or next(iter(r.errors.values()), "not run")
            )
            first = why.strip().splitlines()[0] if why.strip() else "failed"
            gate, kept = (b.gate(), b.kept()) if b else ("–", "–")
            lines.append(f"| {kind} | failed: {first[:120]} | | | | {gate} | {kept} |")
            continue
        versus = "–"
        if kind == "fp8" and ratio is not None and p50_ratio is not None:
            versus = f"{ratio:.2f}× ({p50_ratio:.2f}×)"
        lines.append(
            f"| {kind} | {m.idle_ms[0]:.2f} | {m.idle_ms[1]:.2f} | "
            f"{m.backfill_tokens_per_s:,.0f} | {versus} | "
            f"{b.gate() if b else '–'} | {b.kept() if b else '–'} |"
        )
    lines.append("")
    timings = [f"random checkpoint {cell(r.checkpoint_s, '.1f')} s"]
    for kind in ("bf16", "fp8"):
        if kind in r.builds:
            timings.append(f"{kind} engine {r.builds[kind].timing()}")
    for kind, m in r.measured.items():
        timings.append(f"{kind} router start-up {m.start_s:.1f} s")
    lines.append("Times: " + "; ".join(timings) + ".")
    slow = slow_fp8_build(r)
    if slow:
        lines.append(slow)
    for target in targets(r, ratio):
        lines.append(target)
    forced = forced_note(r.builds.get("fp8"))
    if forced:
        lines.append(forced)
    for step, message in r.errors.items():
        lines.append(f"Error ({step}): " + message.strip().replace("\n", "\n    "))
    lines.append("")
    return lines


def slow_fp8_build(r: ShapeResult) -> str | None:
    """A note when the FP8 build took much longer than the bf16 one (the fallback's
    sensitivity pass runs the calibration set once per linear)."""
    bf16, fp8 = r.builds.get("bf16"), r.builds.get("fp8")
    if bf16 is None or fp8 is None or fp8.wall_s < 1.5 * bf16.wall_s:
        return None
    quality = fp8.quality or {}
    why = (
        "the gate failed with every linear in FP8, so the fallback ranked each linear by "
        "a calibration pass and kept "
        f"{len(quality.get('kept_linears', []))}"
        if quality.get("kept_linears")
        else "calibration and quantization"
    )
    return f"Note: the FP8 build took {fp8.wall_s / bf16.wall_s:.1f}× the bf16 build ({why})."


def forced_note(fp8: Build | None) -> str | None:
    """What the FP8 row measured when its engine is under the gate (written by --force)."""
    quality = (fp8.quality if fp8 else None) or {}
    if not quality or quality["passed"]:
        return None
    kept = len(quality["kept_linears"])
    if kept == 0:
        return (
            "Note: the FP8 engine is under the gate (written by --force): every linear in "
            "FP8, so the speed is FP8's but the builder would refuse this engine."
        )
    return (
        f"Note: the FP8 engine is under the gate even with {kept} linears kept in bf16 "
        "(written by --force): its row measures that mix, not every linear in FP8; "
        "`--fp8-fallback none` measures the all-FP8 engine."
    )


def targets(r: ShapeResult, ratio: float | None) -> list[str]:
    """Issue 39's targets of this shape, met or not (they are an H200's)."""
    lines = []
    wanted = BACKFILL_RATIO_TARGETS.get(r.shape)
    if wanted is not None:
        got = "no figure" if ratio is None else f"{ratio:.2f}×, " + met(ratio >= wanted)
        lines.append(f"Target (H200): FP8 backfill ≥ {wanted}× bf16: {got}.")
    limit = QUERY_P50_TARGETS_MS.get(r.shape)
    if limit is not None:
        fp8 = r.measured.get("fp8")
        got = (
            "no figure"
            if fp8 is None
            else f"{fp8.idle_ms[0]:.2f} ms, " + met(fp8.idle_ms[0] <= limit)
        )
        lines.append(f"Target (H200): FP8 idle query p50 ≤ {limit} ms: {got}.")
    return lines


def met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def minilm_gate(folder: Path, work: Path, args: argparse.Namespace) -> Build | str:
    """all-MiniLM-L6-v2's FP8 engine (its own pooling; the gate and fallback always at their
    defaults), for its gate figures; or the error."""
    engines = args.keep_engines or work
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        config = builder_config(folder.resolve(), "fp8", args.device, None, None)
        built = build(config, engines / "all-MiniLM-L6-v2-fp8", logs)
    except (Exception, SystemExit) as exc:
        print(f"all-MiniLM-L6-v2: FP8 build failed: {failure(exc)}", flush=True)
        return failure(exc)
    print(
        f"all-MiniLM-L6-v2: FP8 engine built in {built.timing()}; gate {built.gate()}, "
        f"linears kept in bf16 {built.kept()}",
        flush=True,
    )
    if args.keep_engines is None:
        shutil.rmtree(built.folder, ignore_errors=True)
    return built


def minilm_table(result: Build | str) -> list[str]:
    lines = ["### all-MiniLM-L6-v2 (real weights): the FP8 build's quality gate", ""]
    if isinstance(result, str):
        return [*lines, "Failed: " + result.strip().replace("\n", "\n    "), ""]
    quality = result.quality or {}
    lines += [
        "| gate min cosine | linears kept bf16 | calibration inputs | build |",
        "|---|---|---|---|",
        f"| {result.gate()} | {result.kept()} | {quality.get('calibration_inputs', '–')} "
        f"| {result.timing()} |",
        "",
    ]
    kept = quality.get("kept_linears") or []
    lines.append("Kept in bf16, most sensitive first: " + (", ".join(kept) or "none") + ".")
    lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default=SHAPES, help=f"comma-separated (default {SHAPES})")
    parser.add_argument(
        "--tokenizer-from",
        type=Path,
        required=True,
        help="a folder whose tokenizer.json the random shapes take (all-MiniLM-L6-v2's)",
    )
    parser.add_argument(
        "--minilm",
        type=Path,
        help="all-MiniLM-L6-v2's folder: also build its FP8 engine and print its gate figures",
    )
    parser.add_argument(
        "--seconds", type=float, default=20, help="the backfill's steady window (whole passes)"
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=5,
        help="idle queries, after a second of warm-up (5 s: as the README's idle figures, "
        "bench_router.py --seconds 5)",
    )
    parser.add_argument(
        "--keep-engines",
        type=Path,
        help="write the engines here and keep them (default: a temporary folder, removed)",
    )
    parser.add_argument(
        "--fp8-fallback",
        choices=("auto", "none"),
        help="the shapes' FP8 builds' fp8_fallback (default: the builder's, auto); none: "
        "every linear in FP8, written under the gate too (--force), for the all-FP8 speed "
        "(all-MiniLM-L6-v2's build keeps the default)",
    )
    parser.add_argument(
        "--device",
        help="the one device of the builds and the router (default cuda:0, else cpu; cpu "
        "is for a smoke run: FP8 is emulated there)",
    )
    add_traffic_arguments(parser)
    args = parser.parse_args()
    args.device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    if args.keep_engines is not None:
        args.keep_engines.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if args.device != "cpu" else "CPU"
    client = rt.ensure_client()
    began = time.perf_counter()
    print(
        f"device: {device}; torch {torch.__version__}; router flags: "
        f"{' '.join(router_flags(args))}; idle: a {rt.QUERY_TOKENS}-token query every "
        f"{args.query_interval_ms:g} ms for {args.idle_seconds:g} s ({args.query_client} "
        f"client); backfill alone: baseten-performance-client, {args.clients} connections, "
        f"{DOCS_PER_REQUEST} documents per request, base64, "
        f"{args.min_tokens}-{args.max_tokens} tokens, "
        f"~{args.seconds:g} s of whole passes; FP8 built with the gate at its default, "
        f"fp8_fallback {args.fp8_fallback or 'at its default (auto)'}, --force",
        flush=True,
    )
    # Each table as soon as its shape is done: a run cut short keeps what it measured.
    with tempfile.TemporaryDirectory(prefix="bench_fp8-") as tmp:
        work = Path(tmp)
        if args.minilm is not None:
            print("\n".join(["", *minilm_table(minilm_gate(args.minilm, work, args))]), flush=True)
        for index, shape in enumerate(s.strip() for s in args.shapes.split(",") if s.strip()):
            shape_start = time.perf_counter()
            try:
                result = run_shape(shape, index, work, args, client)
            except (Exception, SystemExit) as exc:  # the next shape still runs
                result = ShapeResult(shape, errors={"shape": failure(exc)})
            print(f"{shape}: {time.perf_counter() - shape_start:.0f} s in all", flush=True)
            print("\n".join(["", *shape_table(result, device)]), flush=True)
    print(f"{time.perf_counter() - began:.0f} s in all")


if __name__ == "__main__":
    main()
