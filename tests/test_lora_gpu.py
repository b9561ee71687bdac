"""Device tier: LoRA adapters per request (`models.lora`) on CUDA in bfloat16, with CUDA
graphs and eager, against PEFT's model in float32: one batch mixing the base weights and
two adapters of different ranks and targets, inside one graph replay. Run with `make
test_gpu`; CI skips these."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from checkpoints.lora import make_lora_adapter, peft_hidden, peft_model
from reference import cosine
from test_lora import FAMILIES, TEXTS, _ids

from trt_tei_runtime import Model
from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.runtime import load_executor

pytestmark = pytest.mark.gpu

LENGTHS = [3, 70, 120, 1, 33]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    make, specs = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    base = make(root / "base")
    # Deltas nearer the size trained adapters have beside the base weights: the CPU tests'
    # (std 0.3) outweigh the random base model's weights a hundredfold, and bfloat16's
    # rounding grows with them through a decoder's layers (a token at a cosine of 0.995 with
    # the wide adapter). The small one (rank 4) needs larger factors to move the vectors
    # clearly past the rounding.
    std = {"small": 0.2, "wide": 0.07}
    adapters = {
        name: make_lora_adapter(base, root / name, seed=20 + i, std=std[name], **spec)
        for i, (name, spec) in enumerate(specs.items())
    }
    return base, adapters


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_mixed_adapters_bf16_match_peft(family, graphs):  # type: ignore[no-untyped-def]
    base, adapters = family
    executor = load_executor(
        base,
        device="cuda",
        dtype="bfloat16",
        cuda_graphs=graphs,
        max_num_tokens=512,
        lora_adapters=adapters,
    )
    assert (executor.bulk.graphs is not None) == graphs
    info = executor.info
    ids = _ids(LENGTHS, executor.model.network.vocab_size, seed=1)
    chosen = [0, 1, 2, 2, 1]
    stride = info.adapter_type_stride
    batch = PackedBatch.from_sequences(ids, [[a * stride] * len(s) for a, s in zip(chosen, ids)])
    if graphs:
        assert executor.bulk.graphs is not None and executor.bulk.graphs.can_run(batch)
    ours = executor.hidden_states(batch).float().cpu()
    names = {index: name for name, index in info.lora_adapters.items()}
    references = {
        (a, merged): peft_model(base, None if a == 0 else adapters[names[a]], merged=merged)
        for a in set(chosen)
        for merged in (False, True)
    }
    start = 0
    for seq, a in zip(ids, chosen):
        got = ours[start : start + len(seq)]
        start += len(seq)
        for merged in (False, True):
            expected = peft_hidden(references[a, merged], [seq])
            assert cosine(got, expected).min() >= 0.999, (a, merged)
        if a != 0:  # the adapter moves the vectors far more than the rounding does
            off_base = 1 - cosine(got, peft_hidden(references[0, False], [seq])).mean()
            off_reference = 1 - cosine(got, peft_hidden(references[a, False], [seq])).mean()
            assert off_base > 10 * off_reference, (a, off_base, off_reference)
    # The same sequences one adapter at a time: the mix changes nothing but rounding.
    alone = torch.cat(
        [
            executor.hidden_states(PackedBatch.from_sequences([s], [[a * stride] * len(s)]))
            .float()
            .cpu()
            for s, a in zip(ids, chosen)
        ]
    )
    assert cosine(ours, alone).min() >= 0.9999


def test_model_embed_with_adapters_on_cuda_graphs(family):  # type: ignore[no-untyped-def]
    """`Model.embed(adapter=)` in bf16 through CUDA graphs, against fp32 on the CPU."""
    base, adapters = family
    gpu = Model(base, device="cuda", dtype="bfloat16", cuda_graphs=True, lora_adapters=adapters)
    cpu = Model(base, device="cpu", lora_adapters=adapters)
    for name in (None, "small", "wide"):
        ours = gpu.embed(TEXTS, adapter=name)
        expected = cpu.embed(TEXTS, adapter=name)
        assert (np.sum(ours * expected, axis=1) >= 0.999).all(), name
