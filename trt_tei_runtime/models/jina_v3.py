"""jina-embeddings-v3 (`JinaEmbeddingsV3Model`, jinaai/jina-embeddings-v3-hf): XLM-RoBERTa
with rotary positions (the encoder of `nomic_bert.py`, GELU MLP, biases) and LoRA task
adapters, chosen per request.

The adapters are the checkpoint's PEFT LoRA folders (`retrieval_query/`,
`retrieval_passage/`, `separation/`, `classification/`, `text_matching/`: each an
`adapter_config.json` and `adapter_model.safetensors`), what transformers loads with
`model.load_adapter(path, adapter_name=task, adapter_kwargs={"subfolder": task})`. They are
read here and attached like any other LoRA adapters (`models.lora`), first, in folder name
order; only their word-embedding deltas are this family's own. Every token of a batch
carries its request's adapter index (1..N; 0 = the base weights) in the batch's token-type
channel: jina-embeddings-v3 has one token type, so that channel is otherwise all zeros.
`adapter_index` maps a task name to it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

import torch

from ..batch import PackedBatch
from ..errors import CheckpointError
from ..layers.lora import AdapterSelection, LowRankDelta, embedding_delta, stack_adapters
from ..templates import Vocabulary
from ..weights import WeightReader
from .nomic_bert import RotaryEncoderConfig, RotaryEncoderLayer, RotaryEncoderModel
from .peft import ADAPTER_CONFIG, LoraAdapter, Pair, read_adapter

WORD_EMBEDDINGS = "embeddings.word_embeddings"


def task_key(name: str) -> str:
    """Task names as users write them ("retrieval.query", "text-matching") and as adapter
    folders are named ("retrieval_query", "text_matching") compare equal."""
    return re.sub(r"[._\-\s]+", "_", name.strip().lower())


def adapter_folders(model_dir: Path) -> list[Path]:
    """The checkpoint's LoRA adapter folders, in name order (their index order)."""
    return sorted(p.parent for p in model_dir.glob(f"*/{ADAPTER_CONFIG}"))


class JinaLayer(RotaryEncoderLayer):
    attention_name: ClassVar[str] = "mixer"


class JinaEmbeddingsV3Model(RotaryEncoderModel):
    prefixes: ClassVar[tuple[str, ...]] = ("", "roberta.")
    layer_cls: ClassVar[type[RotaryEncoderLayer]] = JinaLayer

    def __init__(
        self,
        config: RotaryEncoderConfig,
        reader: WeightReader,
        adapters: list[LoraAdapter] | None = None,
    ) -> None:
        super().__init__(config, reader)
        # Read by `from_checkpoint`, attached by the loader with any others (`models.lora`).
        self._task_adapters = list(adapters or [])
        self.task_names = tuple(a.name for a in self._task_adapters)
        self.word_delta: LowRankDelta | None = None
        self.selection: AdapterSelection | None = None

    def checkpoint_adapters(self) -> list[LoraAdapter]:
        adapters, self._task_adapters = self._task_adapters, []
        return adapters

    def attach_embedding_adapters(
        self, weights: list[dict[str, Pair]], selection: AdapterSelection
    ) -> list[set[str]]:
        part = [w.get(WORD_EMBEDDINGS) for w in weights]
        present = [x for x in part if x is not None]
        vocab, hidden = self.vocab_size, self.hidden_size
        for down, up in present:
            if down.shape[1] != vocab or up.shape[0] != hidden:
                raise CheckpointError(
                    f"LoRA adapter of {WORD_EMBEDDINGS!r} has shapes {tuple(down.shape)} and "
                    f"{tuple(up.shape)}, expected [r, {vocab}] and [{hidden}, r]"
                )
        if present:
            delta = stack_adapters([part], vocab, [hidden])
            assert delta is not None
            # Looked up by token: A transposed, `[vocab, K]`, contiguous.
            self.word_delta = LowRankDelta(
                delta.down.data.t().contiguous(), delta.up.data, delta.owner
            )
            self.selection = selection
        return [{WORD_EMBEDDINGS} if x is not None else set() for x in part]

    def adapter_index(self, task: str) -> int | None:
        """1-based index of the checkpoint's adapter for a task name, or None."""
        keys = [task_key(n) for n in self.task_names]
        key = task_key(task)
        return keys.index(key) + 1 if key in keys else None

    def embed(self, batch: PackedBatch) -> torch.Tensor:
        # Token types here are the real ones (all 0): `models.lora` took the adapters out.
        x = super().embed(batch)
        adapters = None if self.selection is None else self.selection.token_adapters
        if self.word_delta is not None and adapters is not None:
            x = x + embedding_delta(self.word_delta, batch.input_ids, adapters, x.dtype)
        return x

    @classmethod
    def parse_config(cls, config: dict[str, Any]) -> RotaryEncoderConfig:
        # transformers' JinaEmbeddingsV3Config defaults (jina-embeddings-v3's values).
        return RotaryEncoderConfig.parse(
            config,
            default_theta=20000.0,
            bias=True,
            gated_mlp=False,
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
            hidden_act="gelu",
            layer_norm_eps=1e-5,
            max_position_embeddings=8194,
            type_vocab_size=1,
        )

    @classmethod
    def load(cls, config: dict[str, Any], reader: WeightReader) -> JinaEmbeddingsV3Model:
        """Without the folder: no adapters (an engine rebuilds its module tree this way)."""
        return cls(cls.parse_config(config), reader)

    @classmethod
    def from_checkpoint(
        cls, config: dict[str, Any], reader: WeightReader, vocab: Vocabulary
    ) -> JinaEmbeddingsV3Model:
        adapters = [read_adapter(f) for f in adapter_folders(vocab.model_dir)]
        return cls(cls.parse_config(config), reader, adapters)
