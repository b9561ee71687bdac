"""The snapshot suite on the GPU in half precision with CUDA graphs on: the same stored
transformers/sentence-transformers outputs as tests/test_snapshots.py, looser bounds."""

from __future__ import annotations

import numpy as np
import pytest
from snapshot_suite import all_checks, cosines, model_dir, run

from trt_tei_runtime import Model

pytestmark = pytest.mark.gpu

CHECKS = all_checks()
HALF = ["bfloat16", "float16"]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("check", CHECKS, ids=[c.id for c in CHECKS])
def test_snapshot_half_with_graphs(minilm_dir, check, dtype):  # type: ignore[no-untyped-def]
    model = Model(
        model_dir(check, minilm_dir), device="cuda", dtype=dtype, task=check.task, cuda_graphs=True
    )
    ours = run(model, check)
    assert ours.shape == check.expected.shape
    if check.kind in ("embed", "sparse", "embed_images", "multivector"):
        cos = cosines(ours, check.expected)
        assert cos.min() >= 0.999, list(zip(check.inputs, cos))
    else:
        bound = 0.05 * np.abs(check.expected).max() + 0.02
        assert np.abs(ours - check.expected).max() <= bound, (ours, check.expected)
    # Graph replays give what the first run gave.
    np.testing.assert_array_equal(run(model, check), ours)
