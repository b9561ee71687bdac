"""Packed batches: the sequences of a batch laid end to end, with no padding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .errors import InputError
from .token_ids import TokenIds


@dataclass
class PackedBatch:
    """The router ↔ runtime contract in torch form.

    `cu_seqlens[i]:cu_seqlens[i+1]` are the tokens of sequence i.
    """

    input_ids: torch.Tensor  # int64 [T]
    token_type_ids: torch.Tensor  # int64 [T]
    position_ids: torch.Tensor  # int64 [T]
    cu_seqlens: torch.Tensor  # int32 [n+1]
    max_seqlen: int

    @property
    def num_seqs(self) -> int:
        return int(self.cu_seqlens.numel()) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def to(self, device: torch.device) -> PackedBatch:
        return PackedBatch(
            input_ids=self.input_ids.to(device, non_blocking=True),
            token_type_ids=self.token_type_ids.to(device, non_blocking=True),
            position_ids=self.position_ids.to(device, non_blocking=True),
            cu_seqlens=self.cu_seqlens.to(device, non_blocking=True),
            max_seqlen=self.max_seqlen,
        )

    def pin_memory(self) -> PackedBatch:
        """The batch in page-locked host memory, so that `to(cuda)` is an asynchronous
        copy instead of one the launching thread waits for."""
        return PackedBatch(
            input_ids=self.input_ids.pin_memory(),
            token_type_ids=self.token_type_ids.pin_memory(),
            position_ids=self.position_ids.pin_memory(),
            cu_seqlens=self.cu_seqlens.pin_memory(),
            max_seqlen=self.max_seqlen,
        )

    def parts(self, count: int, host_cu_seqlens: np.ndarray | None = None) -> list[PackedBatch]:
        """The batch as at most `count` consecutive runs of whole sequences of about equal
        token counts (each cut at the sequence boundary nearest its share), in order: their
        hidden states laid end to end are the batch's. The parts are views of this batch's
        tensors, wherever they lie. For a batch on a device, pass its `cu_seqlens` as they
        were on the host: reading them back would wait for the device."""
        if host_cu_seqlens is None:
            host_cu_seqlens = self.cu_seqlens.cpu().numpy()
        cu = np.asarray(host_cu_seqlens, dtype=np.int64)
        shares = cu[-1] * np.arange(1, count) / count
        # The boundary nearest each share; duplicates (long sequences) collapse.
        nearest = np.abs(cu[None, :] - shares[:, None]).argmin(axis=1)
        cuts = [0, *sorted({int(i) for i in nearest} - {0, cu.size - 1}), cu.size - 1]
        return [self._sequences(a, b, cu) for a, b in zip(cuts, cuts[1:], strict=False)]

    def _sequences(self, first: int, last: int, cu: np.ndarray) -> PackedBatch:
        start, end = int(cu[first]), int(cu[last])
        return PackedBatch(
            input_ids=self.input_ids[start:end],
            token_type_ids=self.token_type_ids[start:end],
            position_ids=self.position_ids[start:end],
            cu_seqlens=self.cu_seqlens[first : last + 1] - start,
            max_seqlen=int(np.diff(cu[first : last + 1]).max()),
        )

    @classmethod
    def from_sequences(
        cls,
        ids: Sequence[Sequence[int]],
        type_ids: Sequence[Sequence[int]] | None = None,
        position_offset: int = 0,
    ) -> PackedBatch:
        """Packs token id lists; position ids restart at `position_offset` for each."""
        return cls.from_token_ids(
            TokenIds.from_lists(ids),
            None,
            None if type_ids is None else TokenIds.from_lists(type_ids),
            position_offset,
        )

    @classmethod
    def from_token_ids(
        cls,
        tokens: TokenIds,
        index: Sequence[int] | np.ndarray | None = None,
        type_ids: TokenIds | None = None,
        position_offset: int = 0,
    ) -> PackedBatch:
        """Packs sequences `index` of `tokens` (all of them by default), in that order;
        position ids restart at `position_offset` for each. Array operations only: `Model`
        packs on a thread of its own while another thread launches kernels, and both need
        the interpreter lock for any per-token Python work."""
        select = np.arange(len(tokens)) if index is None else np.asarray(index, dtype=np.int64)
        if select.size == 0:
            raise InputError("a batch needs at least one sequence")
        lengths = tokens.lengths[select]
        if lengths.min() == 0:
            raise InputError("sequences must not be empty")
        gather = tokens.gather(select)
        flat = tokens.ids[gather].astype(np.int64)
        if type_ids is None:
            types = np.zeros_like(flat)
        else:
            if not np.array_equal(type_ids.lengths[select], lengths):
                raise InputError("type_ids must have one entry per token")
            types = type_ids.ids[type_ids.gather(select)].astype(np.int64)
        cu = np.zeros(select.size + 1, dtype=np.int32)
        np.cumsum(lengths, out=cu[1:])
        positions = np.arange(flat.size, dtype=np.int64) - np.repeat(cu[:-1], lengths)
        return cls(
            input_ids=torch.from_numpy(flat),
            token_type_ids=torch.from_numpy(types),
            position_ids=torch.from_numpy(positions + position_offset),
            cu_seqlens=torch.from_numpy(cu),
            max_seqlen=int(lengths.max()),
        )


def token_budget_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices of sequences grouped longest first into batches of at most `max_tokens`
    tokens (a sequence longer than the budget gets a batch of its own)."""
    batches: list[list[int]] = []
    batch: list[int] = []
    tokens = 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if batch and tokens + lengths[i] > max_tokens:
            batches.append(batch)
            batch, tokens = [], 0
        batch.append(i)
        tokens += lengths[i]
    if batch:
        batches.append(batch)
    return batches


@dataclass(frozen=True)
class HostArrays:
    """A batch as the router sends it, checked for consistency: uint32 numpy arrays, views
    of the router's buffers where it sent `bytes`."""

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    position_ids: np.ndarray
    cu_seqlens: np.ndarray
    max_seqlen: int

    @property
    def num_seqs(self) -> int:
        return self.cu_seqlens.size - 1

    @property
    def num_tokens(self) -> int:
        return self.input_ids.size

    @classmethod
    def check(
        cls,
        input_ids: Any,
        token_type_ids: Any,
        position_ids: Any,
        cu_seqlens: Any,
        max_length: int | None = None,
    ) -> HostArrays:
        """The arrays of uint32 buffers (`bytes`) or array-likes; `InputError` where they
        do not describe one packed batch."""
        ids = _as_u32(input_ids, "input_ids")
        types = _as_u32(token_type_ids, "token_type_ids")
        positions = _as_u32(position_ids, "position_ids")
        cu = _as_u32(cu_seqlens, "cu_seqlens")
        if cu.size < 2 or cu[0] != 0:
            raise InputError("cu_seqlens must start at 0 and hold at least one sequence")
        # A query is often one sequence: its length needs no array operation (after an
        # idle spell each numpy call costs tens of microseconds; docs/journal/results-log.md).
        if cu.size == 2:
            longest = int(cu[1])
            empty = longest == 0
        else:
            lengths = np.diff(cu.astype(np.int64))
            empty = bool((lengths <= 0).any())
            longest = int(lengths.max())
        if empty:
            raise InputError("cu_seqlens must be strictly increasing (no empty sequences)")
        if not (ids.size == types.size == positions.size == int(cu[-1])):
            raise InputError(
                f"input_ids ({ids.size}), token_type_ids ({types.size}) and position_ids "
                f"({positions.size}) must all hold cu_seqlens[-1] = {int(cu[-1])} tokens"
            )
        if max_length is not None and int(max_length) < longest:
            raise InputError(f"max_length {max_length} is below the longest sequence {longest}")
        return cls(ids, types, positions, cu, longest)

    def packed(self) -> PackedBatch:
        """The batch as host tensors."""
        return PackedBatch(
            input_ids=torch.from_numpy(self.input_ids.astype(np.int64)),
            token_type_ids=torch.from_numpy(self.token_type_ids.astype(np.int64)),
            position_ids=torch.from_numpy(self.position_ids.astype(np.int64)),
            cu_seqlens=torch.from_numpy(self.cu_seqlens.astype(np.int32)),
            max_seqlen=self.max_seqlen,
        )


def _as_u32(value: Any, name: str) -> np.ndarray:
    if isinstance(value, (bytes, bytearray, memoryview)):
        if len(value) % 4:
            raise InputError(f"{name}: byte length {len(value)} is not a multiple of 4 (uint32)")
        return np.frombuffer(value, dtype="<u4")
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise InputError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size and (not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0):
        raise InputError(f"{name} must hold non-negative integers")
    return arr.astype(np.uint32, copy=False)
