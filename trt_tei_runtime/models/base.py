"""What every architecture provides to the runtime."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from ..batch import PackedBatch
from ..errors import CheckpointError
from ..layers import AttentionMetadata
from ..templates import PairTemplate, Vocabulary
from ..weights import WeightReader
from .config import ClassifierInfo

if TYPE_CHECKING:
    from ..images import ImagePreprocessor
    from ..layers.lora import AdapterSelection
    from .peft import LoraAdapter, Pair


class Task(str, Enum):
    EMBEDDING = "embedding"
    CLASSIFICATION = "classification"
    # SPLADE: vocabulary logits of every token (a masked-LM head), pooled into one sparse
    # vector per sequence (`sparse.py`).
    SPARSE_EMBEDDING = "sparse-embedding"


class TaskHead(nn.Module):
    """Reads one row of logits per sequence from the final hidden states of a packed batch
    (a sequence classifier's head, yes/no scoring). Built by `models.adapters`."""

    def forward(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        raise NotImplementedError


class TokenLogitsHead(TaskHead):
    """A masked-LM head: vocabulary logits of every token rather than one row per
    sequence. `forward` gives the whole batch's `[T, vocab]`; SPLADE pooling calls
    `token_logits` on a few sequences at a time instead, as the whole is vocabulary-sized."""

    def token_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        return self.token_logits(hidden)


class ImageTower(nn.Module):
    """A vision tower: images to one embedding each, in the space of the text embeddings.
    Every image is `tokens_per_image` tokens, so a batch of n images packs as n sequences
    of that length (`cu_seqlens` = 0, t, 2t, ...); `forward` takes the pixels `[n, C, H, W]`
    (any float dtype: the tower casts) and that batch's attention metadata, and gives
    `[n, embedding_size]` in the model dtype.

    A tower whose images vary in length (SigLIP 2 NaFlex: `variable_length`) takes each
    image as a fixed-size block that says its own length, packs the images by their real
    lengths itself and ignores `meta`; it runs eagerly (no CUDA graphs: its shapes follow
    the images)."""

    image_size: tuple[int, int]  # (height, width) the pixels must have
    channels: int
    patch_size: int
    tokens_per_image: int  # the most an image runs as, what it costs in a batch's budget
    embedding_size: int
    variable_length: ClassVar[bool] = False
    # The transformer blocks, as a model's `layers`.
    layers: nn.ModuleList

    def forward(self, pixels: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        raise NotImplementedError

    def fit_preprocessor(self, preprocessor: ImagePreprocessor, source: str) -> None:
        """Checks that the checkpoint's preprocessing (`source`: its config file) makes
        the pixels this tower takes; a tower whose input follows the preprocessing
        (NaFlex's patch budget) takes its sizes from it."""
        size = preprocessor.output_size
        if preprocessor.output_channels != self.channels or size != self.image_size:
            shown = "of the image's own aspect ratio" if size is None else "x".join(map(str, size))
            raise CheckpointError(
                f"{source} makes images {shown}; the vision tower takes "
                f"{self.image_size[0]}x{self.image_size[1]}"
            )

    def blank_pixels(self, images: int) -> torch.Tensor:
        """Pixels of `images` images of the largest size the tower takes (warm-up)."""
        return torch.zeros((images, self.channels, *self.image_size))


class TransformerModel(nn.Module):
    """A family's base model: a packed batch to per-token hidden states. Task variants
    (`models.adapters`) add a `head` that maps those states to logits per sequence.

    A family file writes the base model only; what its `*ForSequenceClassification`
    checkpoints put on top is `classification_head`."""

    task: ClassVar[Task] = Task.EMBEDDING
    default_pooling: ClassVar[str]
    hidden_size: int
    vocab_size: int
    max_positions: int  # longest sequence the position embeddings / config allow
    # The transformer blocks, run in order by `forward`; the engine may pause between them
    # (runtime.preemption).
    layers: nn.ModuleList
    position_offset: int = 0
    type_vocab_size: int = 1
    classifier: ClassifierInfo | None = None
    # Set by a task variant (`models.adapters`); an instance attribute, not a class one:
    # a class-level None would hide the registered submodule from attribute lookup.
    head: TaskHead | None
    # Names the base model may be stored under inside a task checkpoint ("bert.", "model.").
    prefixes: ClassVar[tuple[str, ...]] = ("",)
    # Patterns of checkpoint tensors this class knowingly leaves unused (MLM heads, buffers).
    unused: ClassVar[tuple[str, ...]] = ()
    # Decoders have no token-type embeddings: their token type ids are ignored, not checked.
    uses_token_types: ClassVar[bool] = True
    # "encoder" (bidirectional, BERT-like) or "decoder" (Llama-like): what an engine's
    # builder config names as `base_model`.
    base_model: ClassVar[str] = "encoder"
    # False for families whose attention takes a bias the packed kernels lack (MPNet's
    # relative positions): they run padded attention everywhere, so no CUDA graphs either
    # (a graph's padded shape would be its whole token bucket squared).
    packed_attention: ClassVar[bool] = True
    # How (query, document) pairs become one prompt, for models trained on a template.
    pair_template: PairTemplate | None = None
    # Names of the LoRA adapters chosen per request (`models.lora`), in index order; a
    # batch's token type ids then carry each token's adapter index, 1-based (0: none), as
    # `index * adapter_type_stride + token type`.
    adapter_names: tuple[str, ...] = ()
    adapter_type_stride: int = 1
    # Why LoRA adapters cannot be attached to this family, where they cannot.
    lora_unsupported: ClassVar[str | None] = None
    # Models trained on texts padded to their full length (SigLIP: its pooled token is the
    # last pad): every text is padded with the tokenizer's pad token to `max_positions`.
    pads_texts: ClassVar[bool] = False
    # Set by two-tower (text and image) models: the vision tower (an instance attribute, as
    # `head`).
    image_tower: ImageTower | None

    def __init__(self) -> None:
        super().__init__()
        self.head = None
        self.image_tower = None

    @property
    def pooled_size(self) -> int:
        """Width of a pooled embedding, before any sentence-transformers Dense module."""
        return self.hidden_size

    def project_pooled(self, pooled: torch.Tensor) -> torch.Tensor:
        """What the model itself applies to a pooled row `[n, hidden_size]` (float32), as
        float32 `[n, pooled_size]`: CLIP's text projection, SigLIP's text head; nothing for
        text models."""
        return pooled

    def forward(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        raise NotImplementedError

    def adapter_index(self, task: str) -> int | None:
        """1-based index of the adapter a task (prompt) name selects, or None."""
        return None

    def checkpoint_adapters(self) -> list[LoraAdapter]:
        """LoRA adapters the checkpoint itself ships (jina-embeddings-v3's tasks), read by
        `from_checkpoint`, to be attached first (indices 1..k); handed over once."""
        return []

    def attach_embedding_adapters(
        self, weights: list[dict[str, Pair]], selection: AdapterSelection
    ) -> list[set[str]]:
        """Adapts the family's embeddings where it supports LoRA on them: per adapter, the
        module names it used. None by default (`models.lora` refuses such adapters)."""
        return [set() for _ in weights]

    def logits(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        if self.head is None:
            raise CheckpointError(f"{type(self).__name__} has no classification head")
        return self.head(hidden, batch)

    def classification_head(
        self, config: dict[str, Any], reader: WeightReader, num_labels: int
    ) -> TaskHead:
        """The head of this family's `*ForSequenceClassification` checkpoints."""
        raise CheckpointError(f"{type(self).__name__} has no sequence-classification head")

    def token_pair_head(self, reader: WeightReader, token_ids: tuple[int, int]) -> TaskHead:
        """A head scoring logit(token_ids[1]) - logit(token_ids[0]) of the LM head."""
        raise CheckpointError(f"{type(self).__name__} has no LM head to score tokens with")

    def masked_lm_head(self, config: dict[str, Any], reader: WeightReader) -> TokenLogitsHead:
        """The head of this family's `*ForMaskedLM` checkpoints (SPLADE encoders)."""
        raise CheckpointError(f"{type(self).__name__} has no masked-LM head")

    def token_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits `[t, vocab_size]` of hidden states `[t, H]`: SPLADE calls it a
        group of sequences at a time (`sparse.splade_pool`)."""
        if not isinstance(self.head, TokenLogitsHead):
            raise CheckpointError(f"{type(self).__name__} has no masked-LM head")
        return self.head.token_logits(hidden)

    @classmethod
    def load(cls, config: dict[str, Any], reader: WeightReader) -> TransformerModel:
        raise NotImplementedError

    @classmethod
    def from_checkpoint(
        cls, config: dict[str, Any], reader: WeightReader, vocab: Vocabulary
    ) -> TransformerModel:
        """`load`, for task variants that also need the checkpoint's vocabulary."""
        return cls.load(config, reader)
