"""Bulk batches for large models (`runtime.preemption`): the plan from a layer's time, how
a batch is cut into parts, and that a batch run in parts gives what one pass gives. CPU;
the GPU side (the plan measured at start-up, gates inside layers, parts under the gate) is
in test_engine_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint

from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.layers.linear import Linear
from trt_tei_runtime.runtime import load_executor
from trt_tei_runtime.runtime.preemption import (
    MIN_PART_TOKENS,
    WITHIN_LAYER_MS,
    BulkPlan,
    LayerGate,
    largest_linear_share,
)


def _batch(lengths: list[int]) -> PackedBatch:
    return PackedBatch.from_sequences(
        [[5 + (i * 7 + j) % 50 for j in range(n)] for i, n in enumerate(lengths)],
        position_offset=2,
    )


@pytest.mark.parametrize(
    ("lengths", "count", "expected"),
    [
        ([3, 4, 5], 1, [[3, 4, 5]]),
        ([3, 4, 5], 2, [[3, 4], [5]]),
        ([3, 4, 5], 3, [[3], [4], [5]]),
        ([10, 1, 1], 2, [[10], [1, 1]]),  # a long sequence is a part of its own
        ([10, 1, 1], 3, [[10], [1, 1]]),  # ... and fewer parts where cuts coincide
        ([2, 2, 2, 2], 2, [[2, 2], [2, 2]]),
        ([5] * 9 + [1], 3, [[5, 5, 5], [5, 5, 5], [5, 5, 5, 1]]),
    ],
)
def test_parts_are_even_runs_of_whole_sequences(lengths, count, expected):  # type: ignore[no-untyped-def]
    batch = _batch(lengths)
    parts = batch.parts(count)
    assert [np.diff(p.cu_seqlens.numpy()).tolist() for p in parts] == expected
    # Laid end to end, the parts are the batch, positions and type ids included.
    for name in ("input_ids", "token_type_ids", "position_ids"):
        joined = torch.cat([getattr(p, name) for p in parts])
        assert torch.equal(joined, getattr(batch, name)), name
    for part in parts:
        assert part.cu_seqlens[0] == 0 and part.cu_seqlens.dtype == torch.int32
        assert part.max_seqlen == int(np.diff(part.cu_seqlens.numpy()).max())
    # Given the host's cu_seqlens, the same cut.
    again = batch.parts(count, batch.cu_seqlens.numpy())
    assert [p.num_tokens for p in again] == [p.num_tokens for p in parts]


def test_the_plan_follows_the_measured_layer_time():
    # Short layers, or no limit: the gate stands between layers, batches run whole.
    assert BulkPlan.for_layer(16384, WITHIN_LAYER_MS, 0.5, 2.0) == BulkPlan()
    assert BulkPlan.for_layer(16384, 0.2, 0.5, 0.1) == BulkPlan(within_layers=True)
    assert BulkPlan.for_layer(16384, 10.0, 0.5, None) == BulkPlan()
    assert BulkPlan.for_layer(16384, 10.0, 0.5, 0.0) == BulkPlan()
    # Layers longer than WITHIN_LAYER_MS are gated between their linears (free on the GPU),
    # even when the whole layer is within the step limit: a 0.8 ms bert-large layer.
    assert BulkPlan.for_layer(16384, 0.8, 0.33, 6.0) == BulkPlan(within_layers=True)
    # A 3 ms layer whose largest linear is 40 % of it: gates between linears suffice.
    assert BulkPlan.for_layer(16384, 3.0, 0.4, 2.0) == BulkPlan(within_layers=True)
    # A 10 ms layer, largest linear 50 %: a 5 ms step, 2 ms wanted: parts of 2/5 the batch.
    assert BulkPlan.for_layer(16384, 10.0, 0.5, 2.0) == BulkPlan(True, 6553)
    # Never below the floor where GEMMs stop filling the GPU.
    assert BulkPlan.for_layer(16384, 1000.0, 0.5, 1.0) == BulkPlan(True, MIN_PART_TOKENS)
    assert BulkPlan.for_layer(MIN_PART_TOKENS, 1000.0, 0.5, 1.0) == BulkPlan(True, None)


def test_the_largest_linear_share_of_a_layer(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_checkpoint(tmp_path, "BertModel", pooling="mean")
    layer = load_executor(folder, device="cpu").model.network.layers[0]
    sizes = [m.weight.numel() for m in layer.modules() if isinstance(m, Linear)]
    assert len(sizes) >= 3  # attention and MLP linears
    assert largest_linear_share(layer) == max(sizes) / sum(sizes)


def test_a_batch_in_parts_gives_the_embeddings_of_one_pass(tmp_path):  # type: ignore[no-untyped-def]
    folder = make_checkpoint(tmp_path, "BertModel", pooling="mean")
    executor = load_executor(folder, device="cpu")
    batch = _batch([17, 3, 40, 1, 25, 9, 30])
    whole = executor.embed(batch)
    executor.bulk.gate = LayerGate(plan=BulkPlan(max_part_tokens=45))
    in_parts = executor.embed(batch)
    torch.testing.assert_close(in_parts, whole, rtol=0, atol=1e-5)
    per_token = executor.embed_tokens(batch)
    executor.bulk.gate = None
    torch.testing.assert_close(per_token, executor.embed_tokens(batch), rtol=0, atol=1e-5)
