"""What the bulk lane's CUDA graphs above `MAX_GRAPH_TOKENS` are built from, on the CPU:
their bucket ladder, the attention's block table and where their segments are cut. The
graphs themselves (replays equal eager passes, queries pass between segments) are in
test_engine_gpu.py; the block-table kernel against the grid one in test_kernels_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint, make_decoder_checkpoint

from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.layers.linear import Linear
from trt_tei_runtime.layers.triton_attention import (
    TABLE_BLOCK_M,
    block_table_capacity,
    fill_block_table,
)
from trt_tei_runtime.runtime import load_executor
from trt_tei_runtime.runtime.executor import bulk_graphs_enabled
from trt_tei_runtime.runtime.graphs import (
    BULK_BUCKET_STEP,
    BULK_TOP_STEP,
    MAX_GRAPH_TOKENS,
    bucket_slots,
    bulk_ladder,
)
from trt_tei_runtime.runtime.preemption import BulkPlan, LayerGate


def test_bulk_buckets_start_above_the_small_graphs_and_end_at_the_limit():
    assert bulk_ladder(16384) == [*range(3072, 15361, 1024), *range(15488, 16385, 128)]
    assert bulk_ladder(4096) == list(range(3072, 4097, 128))
    assert bulk_ladder(MAX_GRAPH_TOKENS + 1) == [MAX_GRAPH_TOKENS + 1]
    assert bulk_ladder(MAX_GRAPH_TOKENS) == [] and bulk_ladder(512) == []
    for limit in (2100, 3000, 5000, 16384, 40000):
        ladder = bulk_ladder(limit)
        assert ladder == sorted(set(ladder)) and ladder[-1] == limit
        assert ladder[0] > MAX_GRAPH_TOKENS
        gaps = np.diff([MAX_GRAPH_TOKENS, *ladder])
        assert gaps.max() <= BULK_BUCKET_STEP, limit
        # A full batch (the router fills them to within a document) pads little.
        top = [b for b in ladder if b >= limit - BULK_BUCKET_STEP]
        assert np.diff(top).max(initial=0) <= BULK_TOP_STEP, limit


def _entries(table: np.ndarray) -> list[tuple[int, int]]:
    """(sequence, query block) of each listed block."""
    return [(int(e) >> 16, int(e) & 0xFFFF) for e in table[1 : 1 + table[0]]]


def test_the_block_table_lists_every_query_block_longest_sequence_first():
    lengths = [64, 200, 1, 129, 0]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    table = np.full(block_table_capacity(int(cu[-1]), len(lengths) + 2), -7, np.int32)
    fill_block_table(cu, table)
    blocks_of = [-(-n // TABLE_BLOCK_M) for n in lengths]
    assert table[0] == sum(blocks_of) == 1 + 4 + 1 + 3 + 0
    # Sequence 1 (200 tokens), then 3 (129), then 0 and 2, each block once, in order.
    assert _entries(table) == [
        (1, 0),
        (1, 1),
        (1, 2),
        (1, 3),
        (3, 0),
        (3, 1),
        (3, 2),
        (0, 0),
        (2, 0),
    ]
    assert (table[1 + table[0] :] == -7).all()  # nothing written past the listed blocks


def test_the_block_table_of_a_full_bucket_fits_its_capacity():
    """Every sequence adds at most one partial block: tokens / 64 + sequences entries."""
    tokens, sequences = 16384, 256
    lengths = np.full(sequences, 1)
    lengths[0] += tokens - sequences  # one long sequence, the rest one token each
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    table = np.zeros(block_table_capacity(tokens, bucket_slots(tokens, sequences)), np.int32)
    fill_block_table(cu, table)
    assert table[0] == -(-(tokens - sequences + 1) // TABLE_BLOCK_M) + sequences - 1
    fill_block_table(np.array([0], np.int32), table)  # no sequences, no blocks
    assert table[0] == 0


def test_the_block_table_refuses_what_its_entries_cannot_hold():
    table = np.zeros(1 << 17, np.int32)
    with pytest.raises(ValueError, match="32,767 sequences"):
        fill_block_table(np.arange((1 << 15) + 1, dtype=np.int32), table)


@pytest.mark.parametrize("within_layers", [False, True])
def test_segments_are_cut_where_the_gate_stops(tmp_path, within_layers):  # type: ignore[no-untyped-def]
    """Before every layer; or before every linear inside them, and not also before the
    layer (its first linear comes first: the segment between would be empty)."""
    folder = make_checkpoint(tmp_path, "BertModel", pooling="mean")
    layers = load_executor(folder, device="cpu").model.network.layers
    stops = LayerGate(plan=BulkPlan(within_layers=within_layers)).stops(layers)
    linears = [m for layer in layers for m in layer.modules() if isinstance(m, Linear)]
    assert stops == (linears if within_layers else list(layers))


@pytest.mark.parametrize("family", ["bert", "qwen3"])
def test_a_pass_reaches_every_stop_once(tmp_path, family):  # type: ignore[no-untyped-def]
    """Each stop is a module the forward pass calls once, in order: a graph segment ends
    at each, and the gate counts on it (a linear run without its module call, as the GELU
    epilogue once was, would be a stop never reached)."""
    if family == "bert":
        folder = make_checkpoint(tmp_path, "BertModel", pooling="mean")
    else:
        folder = make_decoder_checkpoint(tmp_path, "Qwen3ForCausalLM")
    executor = load_executor(folder, device="cpu")
    stops = LayerGate(plan=BulkPlan(within_layers=True)).stops(executor.model.network.layers)
    reached: list[torch.nn.Module] = []
    for module in stops:
        module.register_forward_pre_hook(lambda module, args: reached.append(module))
    executor.hidden_states(PackedBatch.from_sequences([[5, 6, 7, 8], [9, 10]]))
    assert reached == stops


def test_bulk_graphs_follow_the_argument_else_the_environment(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("TRT_TEI_BULK_GRAPHS", raising=False)
    assert bulk_graphs_enabled(None)
    monkeypatch.setenv("TRT_TEI_BULK_GRAPHS", "0")
    assert not bulk_graphs_enabled(None)
    assert bulk_graphs_enabled(True) and not bulk_graphs_enabled(False)


class _FakeRunner:
    """Stands in for a bulk `CudaGraphRunner`: records how the lane called it."""

    def __init__(self, fits: bool) -> None:
        self.fits = fits
        self.calls: list[object] = []

    def can_run(self, batch: PackedBatch) -> bool:
        return self.fits

    def run(self, batch: PackedBatch, between: object = None) -> str:
        self.calls.append(between)
        return "replayed"


@pytest.mark.parametrize("gated", [False, True])
def test_the_bulk_lane_replays_its_large_graphs_where_they_fit(tmp_path, gated):  # type: ignore[no-untyped-def]
    """A batch the bulk graphs hold replays them, with the gate's step between segments
    where there is a gate; one they do not hold runs eagerly."""
    folder = make_checkpoint(tmp_path, "BertModel", pooling="mean")
    lane = load_executor(folder, device="cpu").bulk
    gate = LayerGate() if gated else None
    lane.gate = gate
    batch = PackedBatch.from_sequences([[5, 6, 7], [8, 9]])
    lane.large_graphs = _FakeRunner(fits=True)  # type: ignore[assignment]
    assert lane.forward(batch) == "replayed"
    assert lane.large_graphs.calls == [None if gate is None else gate.step]  # type: ignore[union-attr]
    lane.large_graphs = _FakeRunner(fits=False)  # type: ignore[assignment]
    out = lane.forward(batch)
    assert out.hidden.shape[0] == batch.num_tokens and lane.large_graphs.calls == []  # type: ignore[union-attr]
