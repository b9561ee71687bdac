"""A query's direct path through the interactive lane: numpy and five CUDA driver calls.

After the 20 ms a query stream idles between queries, the host's code is cold, and every
step of a query costs several times what it does back to back. Measured on an H200
(`benchmarks/experiments/bench_query_launch.py`, docs/journal/results-log.md), a 24-token MiniLM
query on the interactive lane took 0.69 ms after a 20 ms sleep: entering torch's device and stream
contexts 0.21 ms and the input copy 0.25 ms (0.03 and 0.04 ms back to back), the graph's launch 0.03
ms; its GPU work ~0.15 ms. The cost follows the amount of code a step runs.

So an embedding query that fits the lane's CUDA graphs takes this path, with no torch
operation in it: the router's arrays are checked and written into the pinned staging
buffer with numpy, then one copy to the device, the graph's launch (the graph torch
captured and instantiated, launched by the driver), one copy of the pooled rows into a
pinned host buffer, and a wait on the lane's stream. The rows are those of the torch path
bit for bit: the same graph runs on the same inputs.

Torch's `CUDAGraph.replay` also sets the random generators' seed and offset for graphs
that draw random numbers; a forward pass in inference draws none, so there is nothing to
set. `TRT_TEI_QUERY_PATH=torch` turns the path off (every query then takes torch's path).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from ..batch import HostArrays
from .cuda_driver import CudaDriver
from .graphs import CudaGraphRunner
from .preemption import LayerGate


class QueryPath:
    def __init__(
        self,
        graphs: CudaGraphRunner,
        stream: torch.cuda.Stream,
        gate: LayerGate,
        device: torch.device,
        driver: CudaDriver,
    ) -> None:
        """`graphs`: the interactive lane's, each bucket one segment with its pooled rows
        (`supports`)."""
        self._graphs = graphs
        self._gate = gate
        self._driver = driver
        self._stream = stream.cuda_stream
        self._context = driver.primary_context(device.index or 0)
        self._inputs = graphs.inputs.buffers
        self._launches = {
            b: segments[0].raw_cuda_graph_exec() for b, segments in graphs.graphs.items()
        }
        self._pooled = {b: rows.data_ptr() for b, rows in graphs.pooled.items()}
        width = next(iter(graphs.pooled.values())).shape[1]
        self._row_bytes = width * 4
        self._rows = torch.empty((graphs.max_batch_size, width), dtype=torch.float32).pin_memory()
        self._rows_ptr = self._rows.data_ptr()
        self._host_rows = self._rows.numpy()

    @staticmethod
    def supports(graphs: CudaGraphRunner) -> bool:
        """Graphs whose every bucket is one replay that leaves float32 pooled rows."""
        return (
            os.environ.get("TRT_TEI_QUERY_PATH", "driver") != "torch"
            and bool(graphs.graphs)
            and graphs.graphs.keys() == graphs.pooled.keys()
            and all(len(segments) == 1 for segments in graphs.graphs.values())
            and all(
                rows.dtype == torch.float32 and rows.is_contiguous()
                for rows in graphs.pooled.values()
            )
        )

    def fits(self, batch: HostArrays) -> bool:
        return self._graphs.can_run(batch)

    def embed(self, batch: HostArrays) -> np.ndarray:
        """Pooled rows `[n, D]` float32 of a batch that `fits`, checked by the caller
        against the model's limits. Each call waits for its stream before it returns, so
        the staging buffer is free whenever a call (this path's or torch's, which also
        reads its rows back before it returns) begins."""
        n = batch.num_seqs
        bucket = self._stage(batch)
        with self._gate.interactive():
            self._run(bucket, n, launch=True)
        return self._host_rows[:n].copy()

    def warm(self, batch: HostArrays) -> None:
        """`embed`'s host steps on a batch that `fits`, without the graph's launch: the
        staging buffer's fill, the CUDA context, both copies and the wait. Its caller runs
        it between queries (on the thread that runs them) to keep their code and data in
        the CPU's caches; the gate is left alone, so the bulk lane does not pause, and the
        rows buffer's contents are overwritten by the next `embed` before it reads them."""
        self._run(self._stage(batch), batch.num_seqs, launch=False)

    def _stage(self, batch: HostArrays) -> int:
        """Writes the batch into the pinned staging buffer; its bucket."""
        bucket = self._graphs.bucket_for(batch.num_tokens, batch.num_seqs)
        self._graphs.inputs.fill(
            batch.input_ids, batch.token_type_ids, batch.position_ids, batch.cu_seqlens, bucket
        )
        return bucket

    def _run(self, bucket: int, n: int, *, launch: bool) -> None:
        """In the device's context, on the lane's stream: the inputs' copy, the bucket's
        graph (with `launch`), its first `n` pooled rows' copy, and the wait for them."""
        driver, stream = self._driver, self._stream
        host, device, nbytes = self._inputs
        previous = driver.make_current(self._context)
        try:
            driver.copy_to_device(device, host, nbytes, stream)
            if launch:
                driver.launch(self._launches[bucket], stream)
            driver.copy_to_host(self._rows_ptr, self._pooled[bucket], n * self._row_bytes, stream)
            driver.synchronize(stream)
        finally:
            if previous is not None:
                driver.set_current(previous)
