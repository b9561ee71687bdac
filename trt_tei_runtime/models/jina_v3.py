"""jina-embeddings-v3 (`JinaEmbeddingsV3Model`, jinaai/jina-embeddings-v3-hf): XLM-RoBERTa
with rotary positions (the encoder of `nomic_bert.py`, GELU MLP, biases) and LoRA task
adapters, chosen per request.

The adapters are the checkpoint's PEFT LoRA folders (`retrieval_query/`,
`retrieval_passage/`, `separation/`, `classification/`, `text_matching/`: each an
`adapter_config.json` and `adapter_model.safetensors`), what transformers loads with
`model.load_adapter(path, adapter_name=task, adapter_kwargs={"subfolder": task})`. All are
loaded, unmerged (`layers.lora`), and every token of a batch carries its request's adapter
index (1..N; 0 = the base weights) in the batch's token-type channel: jina-embeddings-v3
has one token type, so that channel is otherwise all zeros, and it already travels from
the router through batching and CUDA graphs. `adapter_index` maps a task name to it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from ..batch import PackedBatch
from ..checkpoint import read_json
from ..errors import CheckpointError
from ..layers import AttentionMetadata
from ..layers.lora import (
    AdaptedLinear,
    AdapterSelection,
    LowRankDelta,
    embedding_delta,
    stack_adapters,
)
from ..templates import Vocabulary
from ..weights import WeightReader, load_checkpoint_tensors
from .nomic_bert import RotaryEncoderConfig, RotaryEncoderLayer, RotaryEncoderModel

ADAPTER_CONFIG = "adapter_config.json"
_PEFT_PREFIX = "base_model.model."
_LINEAR_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")
_EMBED_KEY = re.compile(r"^(?P<module>.+)\.lora_embedding_(?P<ab>[AB])$")


def task_key(name: str) -> str:
    """Task names as users write them ("retrieval.query", "text-matching") and as adapter
    folders are named ("retrieval_query", "text_matching") compare equal."""
    return re.sub(r"[._\-\s]+", "_", name.strip().lower())


def adapter_folders(model_dir: Path) -> list[Path]:
    """The checkpoint's LoRA adapter folders, in name order (their index order)."""
    return sorted(p.parent for p in model_dir.glob(f"*/{ADAPTER_CONFIG}"))


def _scaling(config: dict[str, Any], path: Path) -> float:
    if config.get("peft_type", "LORA") != "LORA":
        raise CheckpointError(
            f"{path}: only LoRA adapters are supported, got {config.get('peft_type')!r}"
        )
    unsupported = {
        "use_dora": False,
        "fan_in_fan_out": False,
        "bias": "none",
        "rank_pattern": {},
        "alpha_pattern": {},
    }
    for key, plain in unsupported.items():
        if config.get(key) not in (plain, None):
            raise CheckpointError(f"{path}: {key}={config.get(key)!r} is not supported")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank <= 0 or not isinstance(alpha, (int, float)):
        raise CheckpointError(f"{path}: r must be a positive integer and lora_alpha a number")
    return float(alpha) / (rank**0.5 if config.get("use_rslora") else rank)


def read_adapter(folder: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """One PEFT LoRA folder: module name → (A `[r, in]`, B·scaling `[out, r]`)."""
    config_path = folder / ADAPTER_CONFIG
    config = read_json(config_path)
    assert config is not None
    scale = _scaling(config, config_path)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in load_checkpoint_tensors(folder).items():
        name = key.removeprefix(_PEFT_PREFIX)
        match = _LINEAR_KEY.match(name) or _EMBED_KEY.match(name)
        if match is None:
            raise CheckpointError(f"{folder}: unexpected adapter tensor {key!r}")
        pairs.setdefault(match["module"], {})[match["ab"]] = tensor
    out = {}
    for module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise CheckpointError(f"{folder}: adapter of {module!r} lacks lora_A or lora_B")
        out[module] = (ab["A"].float(), ab["B"].float() * scale)
    return out


class JinaLayer(RotaryEncoderLayer):
    attention_name: ClassVar[str] = "mixer"


class JinaEmbeddingsV3Model(RotaryEncoderModel):
    prefixes: ClassVar[tuple[str, ...]] = ("", "roberta.")
    layer_cls: ClassVar[type[RotaryEncoderLayer]] = JinaLayer

    def __init__(
        self,
        config: RotaryEncoderConfig,
        reader: WeightReader,
        adapters: list[tuple[str, dict[str, tuple[torch.Tensor, torch.Tensor]]]] = (),  # type: ignore[assignment]
    ) -> None:
        super().__init__(config, reader)
        self.adapter_names = tuple(name for name, _ in adapters)
        # Token type ids select adapters (module docstring); the one real token type is 0.
        self.type_vocab_size = len(adapters) + 1
        self.selection = AdapterSelection()
        weights = [w for _, w in adapters]
        used: set[str] = set()
        self.word_delta = self._delta(weights, ["embeddings.word_embeddings"], used, embedding=True)
        h, inner = config.hidden_size, config.num_attention_heads * config.head_dim
        ffn = config.intermediate_size
        for i, layer in enumerate(self.layers):
            p = f"layers.{i}"
            attn = [f"{p}.self_attn.{n}_proj" for n in "qkv"]
            for attr, names, outs, in_f in (
                ("qkv", attn, [inner] * 3, h),
                ("o_proj", [f"{p}.self_attn.o_proj"], [h], inner),
                ("up", [f"{p}.mlp.fc1"], [ffn], h),
                ("down", [f"{p}.mlp.fc2"], [h], ffn),
            ):
                delta = self._delta(weights, names, used, in_f=in_f, outs=outs)
                if delta is not None:
                    setattr(layer, attr, AdaptedLinear(getattr(layer, attr), delta, self.selection))
        for name, w in adapters:
            left = sorted(set(w) - used)
            if left:
                raise CheckpointError(
                    f"adapter {name!r} targets modules this model does not have: {left[:4]}"
                )

    @staticmethod
    def _delta(
        weights: list[dict[str, tuple[torch.Tensor, torch.Tensor]]],
        names: list[str],
        used: set[str],
        *,
        embedding: bool = False,
        in_f: int = 0,
        outs: list[int] | None = None,
    ) -> LowRankDelta | None:
        parts = [[w.get(n) for w in weights] for n in names]
        used.update(n for n in names for w in weights if n in w)
        if embedding:
            part = parts[0]
            present = [x for x in part if x is not None]
            if not present:
                return None
            vocab, hidden = present[0][0].shape[1], present[0][1].shape[0]
            delta = stack_adapters([part], vocab, [hidden])
            assert delta is not None
            # Looked up by token: A transposed, `[vocab, K]`, contiguous.
            return LowRankDelta(delta.down.data.t().contiguous(), delta.up.data, delta.owner)
        for part, out_f in zip(parts, outs or []):
            for pair in part:
                if pair is not None and (pair[0].shape[1] != in_f or pair[1].shape[0] != out_f):
                    raise CheckpointError(
                        f"adapter of {names} has shapes {tuple(pair[0].shape)} and "
                        f"{tuple(pair[1].shape)}, expected [r, {in_f}] and [{out_f}, r]"
                    )
        return stack_adapters(parts, in_f, outs or [])

    def adapter_index(self, task: str) -> int | None:
        """1-based index of the adapter for a task name, or None."""
        keys = [task_key(n) for n in self.adapter_names]
        key = task_key(task)
        return keys.index(key) + 1 if key in keys else None

    def embed(self, batch: PackedBatch) -> torch.Tensor:
        # Token types are adapter indices here: every token embeds with the one real type.
        x = F.embedding(batch.input_ids, self.word) + self.token_type[0]
        if self.word_delta is not None:
            x = x + embedding_delta(self.word_delta, batch.input_ids, batch.token_type_ids, x.dtype)
        return x

    def forward(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        self.selection.token_adapters = batch.token_type_ids if self.adapter_names else None
        try:
            return super().forward(batch, meta)
        finally:
            self.selection.token_adapters = None

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
        adapters = [(f.name, read_adapter(f)) for f in adapter_folders(vocab.model_dir)]
        return cls(cls.parse_config(config), reader, adapters)
