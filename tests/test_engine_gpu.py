"""Tier 5 (device): CUDA graphs and engines on the GPU.

Graphs on vs off at every bucket boundary, the bulk graphs above MAX_GRAPH_TOKENS (their
segments and the gate between them), a batch that fills `max_num_tokens` exactly and one
token over (eager fallback), builder round trip and the FP8 gate on Hopper.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint

from trt_tei_runtime import Model
from trt_tei_runtime.backend import Backend
from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.engine import BuilderConfig
from trt_tei_runtime.engine.build import build_engine
from trt_tei_runtime.engine.calibration import CALIBRATION_TEXTS
from trt_tei_runtime.runtime import executor as executor_module
from trt_tei_runtime.runtime import load_executor
from trt_tei_runtime.runtime.executor import Executor
from trt_tei_runtime.runtime.graphs import MAX_GRAPH_TOKENS, bucket_ladder, bulk_ladder
from trt_tei_runtime.runtime.preemption import MIN_PART_TOKENS, BulkPlan
from trt_tei_runtime.runtime.staging import InputStaging

pytestmark = pytest.mark.gpu
MAX_TOKENS = 4096


def _batch(lengths: list[int], vocab: int, seed: int) -> PackedBatch:
    gen = torch.Generator().manual_seed(seed)
    return PackedBatch.from_sequences(
        [torch.randint(5, vocab, (n,), generator=gen).tolist() for n in lengths]
    )


def _lengths_for(total: int, longest: int = 128) -> list[int]:
    lengths = [longest] * (total // longest)
    if total % longest:
        lengths.append(total % longest)
    return lengths


@pytest.fixture(scope="module")
def models(tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = make_checkpoint(
        tmp_path_factory.mktemp("bert"), "BertModel", pooling="mean", hidden_size=64
    )
    # Bulk batches gated between whole layers, whatever this host measures: the plan follows
    # a layer's time measured at load, and a tiny model's eager layer is host-bound, so on a
    # slow host it can measure above WITHIN_LAYER_MS (the plan itself is tested below).
    graphs = load_executor(
        folder,
        device="cuda",
        dtype="bfloat16",
        max_num_tokens=MAX_TOKENS,
        max_batch_size=64,
        max_bulk_step_ms=0,
    )
    eager = load_executor(folder, device="cuda", dtype="bfloat16", cuda_graphs=False)
    assert graphs.bulk.graphs is not None and eager.bulk.graphs is None
    return graphs, eager


@pytest.mark.parametrize(
    "tokens",
    sorted({1, 15, 16, 17} | {b + d for b in bucket_ladder(MAX_TOKENS) for d in (-1, 0, 1)}),
)
def test_graphs_equal_eager_at_bucket_boundaries(models, tokens):  # type: ignore[no-untyped-def]
    graphs, eager = models
    batch = _batch(_lengths_for(tokens), graphs.model.network.vocab_size, seed=tokens)
    runner = graphs.bulk.graphs
    assert runner is not None
    # Beyond the graph limit (2,048 tokens) a batch runs eagerly on the warmed-up allocator.
    over = tokens > runner.max_num_tokens or batch.num_seqs > 64
    ours = graphs.embed(batch)
    ref = eager.embed(batch)
    # The graph runs GEMMs on the bucket's padded row count, so cuBLAS may pick other
    # kernels: equal within bf16 rounding, not bit for bit.
    cos = torch.nn.functional.cosine_similarity(ours.double(), ref.double(), dim=-1)
    assert cos.min() >= 0.9999, cos.min()
    torch.testing.assert_close(ours, ref, rtol=3e-2, atol=3e-2)
    assert runner.can_run(batch) == (not over)


@pytest.mark.parametrize("sequences", [15, 16, 17, 32, 33, 64])
def test_graphs_with_as_many_sequences_as_tokens(models, sequences):  # type: ignore[no-untyped-def]
    """One-token sequences fill a bucket's sequence slots exactly (each graph has only as
    many as its tokens allow), and one more sequence moves the batch to the next bucket."""
    graphs, eager = models
    batch = _batch([1] * sequences, graphs.model.network.vocab_size, seed=sequences)
    ours, ref = graphs.embed(batch), eager.embed(batch)
    torch.testing.assert_close(ours, ref, rtol=3e-2, atol=3e-2)


def test_interactive_lane_equals_bulk_lane(models):  # type: ignore[no-untyped-def]
    graphs, eager = models
    lane = graphs.interactive
    assert lane is not None and lane.stream.priority < 0  # the highest priority there is
    for lengths in ([24], [7, 100, 1], [128] * 20):  # the last beyond the lane's graphs
        batch = _batch(lengths, graphs.model.network.vocab_size, seed=len(lengths))
        with lane.active():
            ours = graphs.embed(batch, lane).cpu()
        torch.testing.assert_close(ours, eager.embed(batch).cpu(), rtol=3e-2, atol=3e-2)


def test_lanes_run_concurrently_without_mixing_results(models):  # type: ignore[no-untyped-def]
    """A bulk thread and an interactive thread at once, as the router drives them: every
    result equals the same batch run alone."""
    graphs, eager = models
    vocab = graphs.model.network.vocab_size
    # 512 to 3,072 tokens: graph replays and eager batches (over 2,048) on the bulk lane.
    bulk = [_batch([128] * (4 + 4 * i), vocab, seed=100 + i) for i in range(6)]
    queries = [_batch([24 + i], vocab, seed=200 + i) for i in range(20)]
    expected_bulk = [eager.embed(b).cpu() for b in bulk]
    expected_queries = [eager.embed(q).cpu() for q in queries]
    results: dict[str, list[torch.Tensor]] = {"bulk": [], "queries": []}

    def run_bulk() -> None:
        for _ in range(3):
            results["bulk"] += [graphs.embed(b).cpu() for b in bulk]

    def run_queries() -> None:
        lane = graphs.lane(interactive=True)
        for q in queries:
            with lane.active():
                results["queries"].append(graphs.embed(q, lane).cpu())

    threads = [threading.Thread(target=run_bulk), threading.Thread(target=run_queries)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ours, ref in zip(results["bulk"], expected_bulk * 3, strict=True):
        torch.testing.assert_close(ours, ref, rtol=3e-2, atol=3e-2)
    for ours, ref in zip(results["queries"], expected_queries, strict=True):
        torch.testing.assert_close(ours, ref, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("bulk_graphs", [True, False], ids=["bulk-graphs", "eager"])
def test_bulk_batches_pause_while_a_query_is_in_flight(models, bulk_graphs):  # type: ignore[no-untyped-def]
    graphs, eager = models
    lane = graphs.interactive
    assert lane is not None
    bulk = _batch([128] * 24, graphs.model.network.vocab_size, seed=7)  # 3,072 tokens
    expected = eager.embed(bulk).cpu()
    large, graphs.bulk.large_graphs = graphs.bulk.large_graphs, None
    try:
        if bulk_graphs:
            graphs.bulk.large_graphs = large
        results: list[torch.Tensor] = []
        thread = threading.Thread(target=lambda: results.append(graphs.embed(bulk).cpu()))
        with lane.gate.interactive():
            thread.start()
            thread.join(timeout=1.0)
            assert thread.is_alive(), "the bulk batch ran through while a query was in flight"
        thread.join(timeout=60)
        assert not thread.is_alive()
        torch.testing.assert_close(results[0], expected, rtol=3e-2, atol=3e-2)
        # It stopped before every layer: between graph segments as between eager layers.
        assert _count_steps(graphs, bulk) == len(graphs.model.network.layers)
    finally:
        graphs.bulk.large_graphs = large


@pytest.mark.parametrize("tokens", [2049, 3071, 3072, 3073, 4095, 4096])
def test_bulk_graphs_equal_eager_above_the_small_graphs(models, tokens):  # type: ignore[no-untyped-def]
    """Batches above MAX_GRAPH_TOKENS replay the bulk graphs of their bucket, captured in
    one segment per layer after the embeddings, and give an eager pass's embeddings."""
    graphs, eager = models
    runner = graphs.bulk.large_graphs
    assert runner is not None and sorted(runner.graphs) == bulk_ladder(MAX_TOKENS)
    layers = len(graphs.model.network.layers)
    assert all(len(segments) == layers + 1 for segments in runner.graphs.values())
    batch = _batch(_lengths_for(tokens, longest=100), graphs.model.network.vocab_size, seed=tokens)
    assert runner.can_run(batch)
    out = graphs.bulk.forward(batch)
    assert out.pooled is not None, "pooled inside the replay: the bulk graphs ran"
    ours, ref = graphs.embed(batch), eager.embed(batch)
    cos = torch.nn.functional.cosine_similarity(ours.double(), ref.double(), dim=-1)
    assert cos.min() >= 0.9999, cos.min()
    torch.testing.assert_close(ours, ref, rtol=3e-2, atol=3e-2)


def test_bulk_graphs_warm_up_once_per_kind_of_bucket(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """Bulk buckets share their warm-up pass: one for the buckets whose token counts are
    multiples of 16 and one for the others (Triton compiles per divisibility by 16), and
    every bucket of a ladder that mixes both replays an eager pass's embeddings."""
    from trt_tei_runtime.runtime.graphs import CudaGraphRunner

    folder = make_checkpoint(tmp_path, "BertModel", pooling="mean", hidden_size=64)
    warm_ups: list[int] = []
    capture_bucket = CudaGraphRunner._capture_bucket

    def counting(self, bucket, stream, pool, warm_up):  # type: ignore[no-untyped-def]
        if warm_up and self.inputs.block_table is not None:
            warm_ups.append(bucket)
        return capture_bucket(self, bucket, stream, pool, warm_up)

    monkeypatch.setattr(CudaGraphRunner, "_capture_bucket", counting)
    limit = 4100  # not a multiple of 16: its buckets are 3,072 and 4,100 - k * 128
    graphs = load_executor(
        folder, device="cuda", dtype="bfloat16", max_num_tokens=limit, max_batch_size=64
    )
    eager = load_executor(folder, device="cuda", dtype="bfloat16", cuda_graphs=False)
    runner = graphs.bulk.large_graphs
    assert runner is not None and sorted(runner.graphs) == bulk_ladder(limit)
    assert warm_ups == [limit, max(b for b in bulk_ladder(limit) if b % 16 == 0)]
    vocab = graphs.model.network.vocab_size
    for tokens in bulk_ladder(limit):
        batch = _batch(_lengths_for(tokens, longest=100), vocab, seed=tokens)
        assert graphs.bulk.forward(batch).pooled is not None, "the bulk graphs ran"
        ours, ref = graphs.embed(batch), eager.embed(batch)
        torch.testing.assert_close(ours, ref, rtol=3e-2, atol=3e-2)


def _router_arrays(lengths: list[int], vocab: int, seed: int) -> tuple[bytes, ...]:
    """A batch as the router sends it: four little-endian uint32 buffers."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, size=sum(lengths)).astype("<u4")
    positions = np.concatenate([np.arange(n) for n in lengths]).astype("<u4")
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype("<u4")
    return ids.tobytes(), np.zeros_like(ids).tobytes(), positions.tobytes(), cu.tobytes()


def test_launched_bulk_batches_equal_their_embed_while_several_are_in_flight(tmp_path):  # type: ignore[no-untyped-def]
    """The router's pipelined bulk thread: batches launched one after another before any is
    read back (bulk graphs twice in the same bucket, small graphs, an eager batch with more
    sequences than the graphs' slots) each read back the rows `embed` gives them."""
    folder = make_checkpoint(tmp_path, "BertModel", pooling="mean", hidden_size=64)
    backend = Backend(str(folder), dtype="bfloat16", max_batch_tokens=MAX_TOKENS)
    assert backend.pipelines()
    executor = backend.executors[0]
    assert executor.bulk.large_graphs is not None and executor.bulk.gate is not None
    vocab = executor.model.network.vocab_size
    batches = [
        _router_arrays([100] * 30, vocab, seed=1),
        _router_arrays([100] * 30, vocab, seed=2),
        _router_arrays([7, 50, 3], vocab, seed=3),
        _router_arrays([2] * 300, vocab, seed=4),
    ]
    expected = [backend.embed(*arrays) for arrays in batches]
    launched = [backend.launch("embed", *arrays) for arrays in batches]
    for pending, rows in zip(launched, expected, strict=True):
        np.testing.assert_array_equal(pending.result(), rows)


def test_graph_replays_do_not_leak_between_batches(models):  # type: ignore[no-untyped-def]
    graphs, eager = models
    big = _batch([100, 37, 5], graphs.model.network.vocab_size, seed=1)
    small = _batch([3], graphs.model.network.vocab_size, seed=2)
    graphs.embed(big)
    torch.testing.assert_close(graphs.embed(small), eager.embed(small), rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("pooling", ["cls", "mean", "lasttoken"])
def test_graphs_pool_inside_the_replay(tmp_path, pooling):  # type: ignore[no-untyped-def]
    """An embedding model's graphs pool (and run its Dense layer) themselves, over every
    sequence slot, empty ones included: the real rows equal an eager pass, whether the
    batch fills its bucket exactly (no junk sequence) or not, on both lanes."""
    folder = make_checkpoint(
        tmp_path / "ckpt", "BertModel", pooling=pooling, dense_out=48, hidden_size=64
    )
    graphs = load_executor(
        folder, device="cuda", dtype="bfloat16", max_num_tokens=512, max_batch_size=64
    )
    eager = load_executor(folder, device="cuda", dtype="bfloat16", cuda_graphs=False)
    vocab = graphs.model.network.vocab_size
    for lane in (graphs.bulk, graphs.interactive):
        assert lane is not None and lane.graphs is not None
        for lengths in ([24], [30, 2], [64, 64], [100, 27, 1], [1] * 16):
            batch = _batch(lengths, vocab, seed=len(lengths))
            with lane.active():
                out = lane.forward(batch)
                assert out.pooled is not None and out.pooled.shape == (len(lengths), 48)
                ours = graphs.embed(batch, lane).cpu()
            torch.testing.assert_close(ours, eager.embed(batch).cpu(), rtol=3e-2, atol=3e-2)


def test_engine_round_trip_on_gpu_with_fp8(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_checkpoint(
        tmp_path / "ckpt",
        "BertModel",
        pooling="cls",
        hidden_size=128,
        num_attention_heads=2,
        intermediate_size=256,
    )
    texts = ["the cat", "a dog in paris reads a book by the river " * 4, "blue"]
    base = {
        "base_model": "encoder",
        "checkpoint_repository": {"repo": str(folder), "source": "local"},
        "max_num_tokens": 2048,
        "max_batch_size": 32,
        "device": "cuda",
    }
    bf16 = build_engine(BuilderConfig.from_dict({**base, "dtype": "bfloat16"}), tmp_path / "bf16")
    assert bf16["built_with"]["device"].startswith("NVIDIA")
    fresh = Model(tmp_path / "bf16")
    again = Model(folder, device="cuda", dtype="bfloat16")
    np.testing.assert_array_equal(fresh.embed(texts), again.embed(texts))
    fp8 = build_engine(
        BuilderConfig.from_dict(
            {**base, "dtype": "bfloat16", "quantization_type": "fp8", "fp8_min_cosine": 0.99}
        ),
        tmp_path / "fp8",
    )
    quality = fp8["quantization"]["quality"]
    assert quality["passed"], quality
    loaded = Model(tmp_path / "fp8")
    cos = (loaded.embed(texts).astype(np.float64) * fresh.embed(texts)).sum(1)
    assert cos.min() >= 0.99
    # The gate's figure is what the written engine gives on the calibration set (graphs
    # captured before quantization once made the builder compare bf16 with itself: 1.0).
    ours = loaded.embed(CALIBRATION_TEXTS).astype(np.float64)
    ref = fresh.embed(CALIBRATION_TEXTS).astype(np.float64)
    measured = float((ours * ref).sum(1).min())
    assert quality["min_cosine"] < 1 - 1e-6, quality
    assert abs(quality["min_cosine"] - measured) < 2e-3, (quality, measured)


def test_model_has_no_interactive_lane_and_no_gate(tmp_path):  # type: ignore[no-untyped-def]
    """`Model` serves no queries: its bulk batches run ungated, launched ahead of the GPU."""
    folder = make_checkpoint(tmp_path, "BertModel", pooling="mean", hidden_size=64)
    executor = Model(folder, device="cuda", dtype="bfloat16").executors[0]
    assert executor.bulk.graphs is not None
    assert executor.interactive is None and executor.bulk.gate is None
    # Nothing to stop for: each bulk bucket is one graph.
    large = executor.bulk.large_graphs
    assert large is not None and all(len(s) == 1 for s in large.graphs.values())
    served = load_executor(folder, device="cuda", dtype="bfloat16")
    assert served.interactive is not None and served.bulk.gate is served.interactive.gate


def test_long_layers_gate_within_layers_and_run_bulk_batches_in_parts(models):  # type: ignore[no-untyped-def]
    """A step slower than `max_bulk_step_ms` (here any: 1 ns) makes the served executor gate
    before every linear too and cut its eager bulk batches into parts of MIN_PART_TOKENS;
    a bulk batch still waits at the gate for a query, and gives one pass's embeddings; 0
    keeps whole layers."""
    graphs, eager = models
    assert graphs.bulk.gate is not None and graphs.bulk.gate.plan == BulkPlan()
    folder = graphs.model.info.model_dir
    off = load_executor(folder, device="cuda", dtype="bfloat16", max_bulk_step_ms=0)
    assert off.bulk.gate is not None and off.bulk.gate.plan == BulkPlan()
    split = load_executor(
        folder, device="cuda", dtype="bfloat16", max_num_tokens=MAX_TOKENS, max_bulk_step_ms=1e-6
    )
    assert split.bulk.gate is not None
    assert split.bulk.gate.plan == BulkPlan(within_layers=True, max_part_tokens=MIN_PART_TOKENS)
    assert split.bulk.large_graphs is None, "a graph cannot stop inside a GEMM: parts are eager"
    bulk = _batch([128] * 20 + [77], graphs.model.network.vocab_size, seed=11)  # 2,637: 2 parts
    torch.testing.assert_close(split.embed(bulk), eager.embed(bulk), rtol=3e-2, atol=3e-2)
    results: list[torch.Tensor] = []
    thread = threading.Thread(target=lambda: results.append(split.embed(bulk).cpu()))
    with split.interactive.gate.interactive():  # type: ignore[union-attr]
        thread.start()
        thread.join(timeout=1.0)
        assert thread.is_alive(), "a bulk batch ran through while a query was in flight"
    thread.join(timeout=60)
    torch.testing.assert_close(results[0], eager.embed(bulk).cpu(), rtol=3e-2, atol=3e-2)
    # Queries pass between linears: the gate counts steps inside the layers.
    steps = _count_steps(split, bulk)
    assert steps > 2 * len(split.model.network.layers), steps


def test_bulk_graphs_stop_between_linears_where_layers_are_long(models, monkeypatch):  # type: ignore[no-untyped-def]
    """Where the plan gates before every linear but keeps batches whole (qwen3-8b's), the
    bulk graphs are cut there too, and a batch stops at each cut."""
    graphs, eager = models
    monkeypatch.setattr(Executor, "_bulk_plan", lambda *args: BulkPlan(within_layers=True))
    executor = load_executor(
        graphs.model.info.model_dir, device="cuda", dtype="bfloat16", max_num_tokens=MAX_TOKENS
    )
    gate, runner = executor.bulk.gate, executor.bulk.large_graphs
    assert gate is not None and runner is not None
    stops = gate.stops(executor.model.network.layers)
    assert len(stops) > 2 * len(executor.model.network.layers)  # the linears
    assert all(len(segments) == len(stops) + 1 for segments in runner.graphs.values())
    bulk = _batch([128] * 30, graphs.model.network.vocab_size, seed=12)  # 3,840 tokens
    assert _count_steps(executor, bulk) == len(stops)
    torch.testing.assert_close(executor.embed(bulk), eager.embed(bulk), rtol=3e-2, atol=3e-2)


def test_long_layers_run_bulk_batches_eagerly(models, monkeypatch):  # type: ignore[no-untyped-def]
    """Where a layer over a full bulk batch takes longer than BULK_GRAPHS_MAX_LAYER_MS
    (here any), graphs would save nothing and pad: bulk batches above the small graphs
    run eagerly, and the small graphs stay."""
    graphs, eager = models
    monkeypatch.setattr(executor_module, "BULK_GRAPHS_MAX_LAYER_MS", 0.0)
    executor = load_executor(
        graphs.model.info.model_dir, device="cuda", dtype="bfloat16", max_num_tokens=MAX_TOKENS
    )
    assert executor.bulk.large_graphs is None and executor.bulk.graphs is not None
    bulk = _batch([128] * 24, graphs.model.network.vocab_size, seed=13)  # 3,072 tokens
    assert executor.bulk.forward(bulk).pooled is None  # an eager pass
    torch.testing.assert_close(executor.embed(bulk), eager.embed(bulk), rtol=3e-2, atol=3e-2)


def _count_steps(executor, batch: PackedBatch) -> int:  # type: ignore[no-untyped-def]
    """How many times one bulk batch stopped at the gate (each stop waits for queries)."""
    gate = executor.bulk.gate
    no_queries = gate._no_queries
    seen = 0

    class Counting:
        def wait(self) -> bool:
            nonlocal seen
            seen += 1
            return no_queries.wait()

    gate._no_queries = Counting()
    try:
        executor.embed(batch)
    finally:
        gate._no_queries = no_queries
    return seen


def test_input_staging_sends_one_batch_after_another():  # type: ignore[no-untyped-def]
    """Each batch lands whole in the device buffers, the graph tail where asked, and the
    host buffer is refilled only after the copy out of it ran."""
    staging = InputStaging(torch.device("cuda"), max_tokens=64, slots=9)
    first = _batch([30, 2, 32], vocab=1000, seed=1)
    second = _batch([5], vocab=1000, seed=2)
    sent = staging.send(first, tail=64)
    for name in ("input_ids", "token_type_ids", "position_ids", "cu_seqlens"):
        torch.testing.assert_close(getattr(sent, name).cpu(), getattr(first, name))
    assert staging.cu_seqlens.cpu().tolist() == [0, 30, 32, 64, 64, 64, 64, 64, 64]
    sent = staging.send(second)
    assert sent.input_ids.cpu().tolist() == second.input_ids.tolist()
    assert staging.cu_seqlens.cpu().tolist()[:3] == [0, 5, 32]  # no tail: the rest as it was
    assert staging.fits(_batch([64], vocab=1000, seed=3))
    assert not staging.fits(_batch([65], vocab=1000, seed=3))
    assert not staging.fits(_batch([1] * 9, vocab=1000, seed=3))


def test_staged_eager_batches_launched_back_to_back_equal_unstaged(models):  # type: ignore[no-untyped-def]
    """Eager bulk batches share one staging buffer: batch k+1's inputs overwrite batch k's
    on the device, in stream order after batch k's work, so results launched back to back
    and read at the end equal those of batches copied as they are."""
    graphs, _ = models
    vocab = graphs.model.network.vocab_size
    batches = [
        _batch(lengths, vocab, seed=300 + i)
        for i, lengths in enumerate(([128] * 24, [100, 7, 128, 90] * 8, [3] * 1000, [128] * 31))
    ]
    lane = graphs.bulk
    assert lane.inputs is not None and all(lane.inputs.fits(b) for b in batches)
    assert all(b.num_tokens > MAX_GRAPH_TOKENS for b in batches)
    inputs, large, lane.large_graphs = lane.inputs, lane.large_graphs, None  # eager passes
    try:
        staged = [graphs.embed(b) for b in batches]  # no read-back in between
        staged_host = [s.cpu() for s in staged]
        lane.inputs = None
        unstaged = [graphs.embed(b).cpu() for b in batches]
    finally:
        lane.inputs, lane.large_graphs = inputs, large
    for ours, ref in zip(staged_host, unstaged, strict=True):
        torch.testing.assert_close(ours, ref, rtol=0, atol=0)
