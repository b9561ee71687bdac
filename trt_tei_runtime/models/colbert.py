"""ColBERT (PyLate) networks: any encoder family's base model, then the checkpoint's Dense
projections on every token and a per-token L2 normalization (`late_interaction.py` holds
the rules around them). The output of a packed batch is `[T, embedding_size]` float32.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..batch import PackedBatch
from ..dense import DenseLayer
from ..layers import AttentionMetadata
from .base import TransformerModel


class ColBERTNetwork(TransformerModel):
    """A base model whose every token is projected and normalized; queries' expansion
    tokens are attended to as any other (PyLate's `attend_to_expansion_tokens`)."""

    def __init__(self, backbone: TransformerModel, projections: list[DenseLayer]) -> None:
        super().__init__()
        self.backbone = backbone
        self.projections = nn.ModuleList(projections)
        self.layers = backbone.layers
        self.hidden_size = (
            projections[-1].linear.out_features if projections else backbone.hidden_size
        )
        self.vocab_size = backbone.vocab_size
        self.max_positions = backbone.max_positions
        self.position_offset = backbone.position_offset
        self.type_vocab_size = backbone.type_vocab_size

    def forward(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        x = self.backbone(batch, meta)
        for projection in self.projections:
            x = projection(x)
        return F.normalize(x.float(), p=2.0, dim=-1)


class ExpansionHiddenColBERTNetwork(ColBERTNetwork):
    """PyLate's default: a query's expansion tokens (the trailing run of mask tokens)
    read the query's tokens but no token reads them. Keys past a sequence's last
    non-mask token are masked out, which the padded attention path expresses."""

    packed_attention: ClassVar[bool] = False

    def __init__(
        self, backbone: TransformerModel, projections: list[DenseLayer], mask_token_id: int
    ) -> None:
        super().__init__(backbone, projections)
        self.mask_token_id = mask_token_id

    def forward(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        return super().forward(batch, self._hide_expansion(batch, meta))

    def _hide_expansion(self, batch: PackedBatch, meta: AttentionMetadata) -> AttentionMetadata:
        pad_index, key_mask = meta.padding(batch.num_tokens)
        n = meta.cu_seqlens.numel() - 1
        position = pad_index % meta.max_seqlen
        sequence = pad_index // meta.max_seqlen
        # Each sequence's keys end after its last token that is not a mask token.
        real = torch.where(batch.input_ids != self.mask_token_id, position, -1)
        last = torch.full((n,), -1, dtype=position.dtype, device=position.device)
        last = last.scatter_reduce(0, sequence, real, reduce="amax", include_self=True)
        keys = torch.arange(meta.max_seqlen, device=position.device)[None, :] <= last[:, None]
        return replace(meta, pad_index=pad_index, key_mask=key_mask & keys[:, None, None, :])
