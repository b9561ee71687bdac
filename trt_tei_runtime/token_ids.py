"""Token ids of many sequences in two flat arrays, the form batches are packed from.

A list of Python int lists costs one object per token to build and to read, under the
interpreter lock that the threads launching kernels need; these arrays cost none.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import InputError


@dataclass(frozen=True)
class TokenIds:
    """`ids[offsets[i]:offsets[i + 1]]` are the token ids of sequence i."""

    ids: np.ndarray  # uint32 [tokens]
    offsets: np.ndarray  # int64 [sequences + 1], starting at 0

    @classmethod
    def from_buffers(cls, ids: bytes, lengths: bytes) -> TokenIds:
        """From little-endian u32 buffers: every token end to end, and each sequence's length."""
        counts = np.frombuffer(lengths, dtype="<u4")
        offsets = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        flat = np.frombuffer(ids, dtype="<u4")
        if flat.size != offsets[-1]:
            raise ValueError(f"{flat.size} token ids for lengths that add up to {offsets[-1]}")
        return cls(flat, offsets)

    @classmethod
    def from_lists(cls, sequences: Sequence[Sequence[int]]) -> TokenIds:
        lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
        offsets = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        flat = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64, count=total)
        if total and (flat.min() < 0 or flat.max() > np.iinfo(np.uint32).max):
            raise InputError("token ids must be between 0 and 2**32 - 1")
        return cls(flat.astype(np.uint32), offsets)

    def __len__(self) -> int:
        return int(self.offsets.size) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i] : self.offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def take(self, indices: Sequence[int] | np.ndarray) -> TokenIds:
        """The sequences at `indices`, in that order."""
        index = np.asarray(indices, dtype=np.int64)
        lengths = self.lengths[index]
        offsets = np.zeros(index.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return TokenIds(self.ids[self.gather(index)], offsets)

    def gather(self, index: np.ndarray) -> np.ndarray:
        """Positions in `ids` of the tokens of sequences `index`, end to end."""
        lengths = self.lengths[index]
        starts = np.zeros(index.size, dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts, lengths)
        return np.repeat(self.offsets[:-1][index], lengths) + within

    def to_lists(self) -> list[list[int]]:
        flat = self.ids.tolist()
        bounds = self.offsets.tolist()
        return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
