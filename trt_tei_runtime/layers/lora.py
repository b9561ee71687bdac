"""LoRA adapters chosen per token, for models that serve several adapters at once (PEFT
LoRA folders given at load, jina-embeddings-v3's task adapters).

Every adapter of a projection is kept unmerged: `down` stacks the adapters' A matrices
(`[K, in]`, K = the sum of their ranks), `up` their B matrices scaled by alpha / r
(`[out, K]`), and `owner[k]` names the adapter that column k of the low-rank space belongs
to. A batch's tokens each carry an adapter index (0: none), and

    y = base(x) + up((down x) * [owner == adapter of the token])

costs two thin GEMMs and a compare per projection, whatever mix of adapters a batch holds:
no data-dependent control flow, so the same CUDA graph serves every mix. A fused projection
(q/k/v) stacks its parts' adapters the same way, with `up` block-diagonal over the parts.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import nn


class AdapterSelection:
    """Each token's adapter index for the forward pass under way (set by the model before
    its layers run; 0 = base weights only).

    Per thread: the bulk and the interactive lane run the same network from two threads at
    once, and a bulk pass paused between layers must not read the query's selection."""

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def token_adapters(self) -> torch.Tensor | None:
        return getattr(self._local, "token_adapters", None)

    @token_adapters.setter
    def token_adapters(self, value: torch.Tensor | None) -> None:
        self._local.token_adapters = value


class LowRankDelta(nn.Module):
    """The stacked adapters of one projection (see the module docstring)."""

    owner: torch.Tensor

    def __init__(self, down: torch.Tensor, up: torch.Tensor, owner: torch.Tensor) -> None:
        super().__init__()
        self.down = nn.Parameter(down, requires_grad=False)  # [K, in]
        self.up = nn.Parameter(up, requires_grad=False)  # [out, K]
        self.register_buffer("owner", owner.to(torch.int64), persistent=False)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        # `owner` is an index: a cast of the model to bfloat16 must leave it int64.
        owner = self.owner
        super()._apply(fn, recurse)
        self.owner = owner.to(self.down.device)
        return self

    def mask(self, token_adapters: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return (token_adapters[:, None] == self.owner[None, :]).to(dtype)


class AdaptedLinear(nn.Module):
    """A linear layer plus per-token LoRA deltas."""

    def __init__(self, base: nn.Module, delta: LowRankDelta, selection: AdapterSelection) -> None:
        super().__init__()
        self.base = base
        self.delta = delta
        self.selection = selection

    @property
    def out_features(self) -> int:
        return int(self.delta.up.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        adapters = self.selection.token_adapters
        if adapters is None:
            return out
        low = F.linear(x, self.delta.down).mul_(self.delta.mask(adapters, x.dtype))
        if out.dim() == 2:
            # The base output is the projection's own: the delta is added by the GEMM itself
            # instead of by a pass over `[T, out]` of its own (measured on an H100: a bert-large
            # backfill with four adapters loaded went from 84 % to 87 % of the plain model).
            return out.addmm_(low, self.delta.up.t())
        return out + F.linear(low, self.delta.up)


def embedding_delta(
    delta: LowRankDelta, input_ids: torch.Tensor, token_adapters: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """LoRA on an embedding table: `down` holds A transposed (`[vocab, K]`), looked up by
    token instead of multiplied."""
    low = F.embedding(input_ids, delta.down).to(dtype) * delta.mask(token_adapters, dtype)
    return F.linear(low, delta.up.to(dtype))


def stack_adapters(
    parts: list[list[tuple[torch.Tensor, torch.Tensor] | None]],
    in_features: int,
    out_features: list[int],
) -> LowRankDelta | None:
    """`parts[p][a]`: adapter a's (A `[r, in]`, scaled B `[out_p, r]`) of part p of a fused
    projection, or None where that adapter leaves the part alone. Adapter a is index a + 1
    in `AdapterSelection`. None when no adapter touches the projection at all."""
    downs: list[torch.Tensor] = []
    ups: list[torch.Tensor] = []
    owners: list[int] = []
    offsets = [0]
    for size in out_features:
        offsets.append(offsets[-1] + size)
    total_out = offsets[-1]
    for p, adapters in enumerate(parts):
        for a, pair in enumerate(adapters):
            if pair is None:
                continue
            down, up = pair
            rank = down.shape[0]
            full_up = torch.zeros(total_out, rank, dtype=torch.float32)
            full_up[offsets[p] : offsets[p + 1]] = up.float()
            downs.append(down.float())
            ups.append(full_up)
            owners.extend([a + 1] * rank)
    if not downs:
        return None
    down = torch.cat(downs)
    assert down.shape[1] == in_features
    return LowRankDelta(down, torch.cat(ups, dim=1), torch.tensor(owners))
