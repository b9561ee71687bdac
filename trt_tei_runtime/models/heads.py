"""Task heads: from the final hidden states of a packed batch to one row of logits per
sequence. Families pick one in `classification_head`; `adapters` attaches it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..batch import PackedBatch
from ..errors import CheckpointError
from ..layers import LayerNorm, get_activation, linear_activation
from ..weights import WeightReader
from .base import TaskHead, TokenLogitsHead
from .linears import take_linear


class FirstTokenClassifier(TaskHead):
    """`out(act(dense(h[first token])))`: the head of every BERT-like classifier, which
    differ only in the tensor names and the activation (BERT's pooler and RoBERTa's,
    MPNet's classifier: tanh; ELECTRA, DeBERTa: GELU; DistilBERT: ReLU)."""

    def __init__(
        self,
        reader: WeightReader,
        *,
        dense: str,
        out: str,
        hidden_size: int,
        num_labels: int,
        activation: str,
    ) -> None:
        super().__init__()
        self.dense = take_linear(reader, dense, hidden_size, hidden_size)
        self.out = take_linear(reader, out, num_labels, hidden_size)
        self.act = get_activation(activation)

    def forward(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        first = hidden[batch.cu_seqlens[:-1].long()]
        return self.out(self.act(self.dense(first)))


def last_token_indices(
    input_ids: torch.Tensor, cu_seqlens: torch.Tensor, pad_token_id: int | None
) -> torch.Tensor:
    """Per sequence, the packed index of the token a decoder's sequence classifier reads.

    transformers takes the rightmost token that is not `pad_token_id` (the first token when
    all are padding) and, without a pad token, the last one. Packed batches carry no
    padding, so this is the last token unless a sequence itself ends in pad tokens.
    """
    starts = cu_seqlens[:-1].long()
    ends = cu_seqlens[1:].long()
    if pad_token_id is None:
        return ends - 1
    lengths = ends - starts
    seq_of_token = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=ends.device), lengths, output_size=input_ids.numel()
    )
    positions = torch.arange(input_ids.numel(), device=ends.device)
    candidates = torch.where(input_ids != pad_token_id, positions, starts[seq_of_token])
    return starts.scatter_reduce(0, seq_of_token, candidates, reduce="amax", include_self=True)


class LastTokenScore(TaskHead):
    """A decoder's `*ForSequenceClassification`: `score` (one row per label, bias optional)
    on the last real token, with transformers' `pad_token_id` rule."""

    def __init__(
        self, reader: WeightReader, hidden_size: int, num_labels: int, pad_token_id: int | None
    ) -> None:
        super().__init__()
        self.score = take_linear(reader, "score", num_labels, hidden_size, bias=False)
        bias = reader.take_optional("score.bias", (num_labels,))
        if bias is not None:
            self.score.bias = nn.Parameter(bias, requires_grad=False)
        self.pad_token_id = pad_token_id

    def forward(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        index = last_token_indices(batch.input_ids, batch.cu_seqlens, self.pad_token_id)
        return self.score(hidden[index])


class TokenPairScore(TaskHead):
    """logit(tokens[1]) - logit(tokens[0]) of an LM head at each sequence's last position
    (yes/no rerankers: a sigmoid of it is P(yes) between the two), from just those two rows
    of the LM head. Computed in float32 whatever the model dtype: the difference of two large
    logits is where half precision would lose the score."""

    def __init__(self, rows: torch.Tensor, final_softcap: float | None) -> None:
        super().__init__()
        self.rows = nn.Parameter(rows, requires_grad=False)
        self.final_softcap = final_softcap

    def forward(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        last = hidden[batch.cu_seqlens[1:].long() - 1]
        scores = F.linear(last.float(), self.rows.float())
        if self.final_softcap is not None:
            scores = torch.tanh(scores / self.final_softcap) * self.final_softcap
        return scores[:, 1:2] - scores[:, 0:1]


class MaskedLMHead(TokenLogitsHead):
    """`decoder(norm(act(dense(h))))` for every token: BERT's, RoBERTa's and DistilBERT's
    masked-LM heads, which differ in tensor names and activation. The decoder's weight is
    the word embedding matrix (tied) unless the checkpoint stores a different one."""

    def __init__(
        self,
        reader: WeightReader,
        *,
        dense: str,
        norm: str,
        decoder: str,
        bias: str,
        hidden_size: int,
        vocab_size: int,
        activation: str,
        eps: float,
        word_embeddings: nn.Parameter,
    ) -> None:
        super().__init__()
        h = hidden_size
        self.dense = take_linear(reader, dense, h, h)
        self.act_name = activation
        self.act = get_activation(activation)
        self.norm = LayerNorm(
            reader.take(f"{norm}.weight", (h,)), reader.take(f"{norm}.bias", (h,)), eps
        )
        # Tied checkpoints store the bias once (`bias`); untied ones, and older tied ones
        # as a copy, also as the decoder's own, which is the one the decoder adds.
        own = reader.take_optional(f"{decoder}.weight", (vocab_size, h))
        head_bias = reader.take_optional(bias, (vocab_size,))
        decoder_bias = reader.take_optional(f"{decoder}.bias", (vocab_size,))
        if decoder_bias is None:
            decoder_bias = head_bias
        if decoder_bias is None:
            raise CheckpointError(f"missing tensor {bias!r} (the masked-LM decoder's bias)")
        # Tied: the decoder reads the embedding matrix itself, so the largest tensor of the
        # model is not on the device twice. (An engine's skeleton has no values to compare.)
        self.tied = own is None or (not own.is_meta and torch.equal(own, word_embeddings.data))
        self.decoder_weight = (
            word_embeddings if own is None or self.tied else nn.Parameter(own, requires_grad=False)
        )
        self.decoder_bias = nn.Parameter(decoder_bias, requires_grad=False)

    def token_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.norm(linear_activation(self.dense, hidden, self.act_name, self.act))
        return F.linear(x, self.decoder_weight, self.decoder_bias)
