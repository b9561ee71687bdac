"""A batch's inputs on their way to a CUDA device: one asynchronous copy.

Token ids, type ids and positions (int64 rows of `max_tokens`), then `cu_seqlens` (int32)
and, where asked for, the attention's block table (int32, `triton_attention`) lie in one
device buffer, and a pinned host buffer of the same layout is filled through
numpy views; one non-blocking copy moves it. A copy from pageable memory instead waits
for the stream's earlier work and keeps the launching thread until the data has landed:
four of them per bulk batch left the GPU idle ~0.4 ms of a 19 ms bert-large backfill batch
(H100, `benchmarks/profile_engine.py`, docs/journal/results-log.md).

One staging serves one stream: the device buffer is rewritten by the next `send`, in
stream order after the work that read the previous batch. The host buffer is reused once
the copy out of it has run (an event).
"""

from __future__ import annotations

import numpy as np
import torch

from ..batch import PackedBatch
from ..layers.triton_attention import block_table_capacity, fill_block_table


class InputStaging:
    def __init__(
        self, device: torch.device, *, max_tokens: int, slots: int, block_table: bool = False
    ) -> None:
        """Room for `max_tokens` tokens and `slots` `cu_seqlens` entries, and with
        `block_table` for the table of their attention's query blocks."""
        self.max_tokens = max_tokens
        self.slots = slots
        token_bytes = 3 * max_tokens * 8
        table_entries = block_table_capacity(max_tokens, slots) if block_table else 0
        size = token_bytes + (slots + table_entries) * 4
        self._device_buffer = torch.zeros(size, dtype=torch.uint8, device=device)
        self._host_buffer = torch.zeros(size, dtype=torch.uint8).pin_memory()
        rows = self._device_buffer[:token_bytes].view(torch.int64).view(3, max_tokens)
        self.input_ids, self.token_type_ids, self.position_ids = rows.unbind(0)
        ints = self._device_buffer[token_bytes:].view(torch.int32)
        self.cu_seqlens = ints[:slots]
        # None without one; else the table, entry 0 its length (0 until a batch is sent).
        self.block_table = ints[slots:] if table_entries else None
        self._host_tokens = self._host_buffer[:token_bytes].view(torch.int64).view(3, -1).numpy()
        host_ints = self._host_buffer[token_bytes:].view(torch.int32).numpy()
        self._host_cu, self._host_table = host_ints[:slots], host_ints[slots:]
        # Set once the copy out of the host buffer ran: only then may it be refilled.
        self._host_free = torch.cuda.Event()

    def fits(self, batch: PackedBatch) -> bool:
        return batch.num_tokens <= self.max_tokens and batch.num_seqs + 1 <= self.slots

    def send(self, batch: PackedBatch, tail: int | None = None) -> PackedBatch:
        """Copies a host-side `batch` into the device buffers on the current stream and
        returns it as views of them. `tail`: the value of every `cu_seqlens` entry after the
        batch's own (a CUDA graph's empty sequence slots); else those entries are left as
        they were."""
        tokens, n = batch.num_tokens, batch.num_seqs
        self._host_free.synchronize()
        self.fill(
            batch.input_ids.numpy(),
            batch.token_type_ids.numpy(),
            batch.position_ids.numpy(),
            batch.cu_seqlens.numpy(),
            tail,
        )
        self._device_buffer.copy_(self._host_buffer, non_blocking=True)
        self._host_free.record()
        return PackedBatch(
            input_ids=self.input_ids[:tokens],
            token_type_ids=self.token_type_ids[:tokens],
            position_ids=self.position_ids[:tokens],
            cu_seqlens=self.cu_seqlens[: n + 1],
            max_seqlen=batch.max_seqlen,
        )

    def fill(
        self,
        input_ids: np.ndarray,
        token_type_ids: np.ndarray,
        position_ids: np.ndarray,
        cu_seqlens: np.ndarray,
        tail: int | None = None,
    ) -> None:
        """Writes a batch's arrays (any integer type) into the host buffer, as `send` lays
        them out; the caller copies it (`buffers`) once no copy out of it is pending."""
        tokens, n = input_ids.size, cu_seqlens.size - 1
        host = self._host_tokens
        host[0, :tokens] = input_ids
        host[1, :tokens] = token_type_ids
        host[2, :tokens] = position_ids
        self._host_cu[: n + 1] = cu_seqlens
        if tail is not None:
            self._host_cu[n + 1 :] = tail
        if self.block_table is not None:
            fill_block_table(self._host_cu[: n + 1], self._host_table)

    @property
    def buffers(self) -> tuple[int, int, int]:
        """(host address, device address, bytes) of the one copy `send` makes."""
        return (
            self._host_buffer.data_ptr(),
            self._device_buffer.data_ptr(),
            self._device_buffer.numel(),
        )
