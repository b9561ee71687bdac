"""LoRA adapters stacked onto a built model, one index per adapter, chosen per token.

Every linear of the transformer layers knows the checkpoint projections it was built from
(`Linear.parts`: one, or several for a fused q/k/v or gate/up GEMM). An adapter's module
names (PEFT's, which are transformers', maybe under the task checkpoint's prefix such as
"bert." or "model.") are matched against those, and each part's (A, B) lands on that
part's rows of the fused output (`layers.lora.stack_adapters`). Adapters that target
anything else (embeddings, heads, poolers) are refused by name, except where a family
adapts it itself (`TransformerModel.attach_embedding_adapters`: jina-embeddings-v3's word
embeddings).

Token type ids carry the adapter: a token of type `t` under adapter `i` (0: none) carries
`i * stride + t`, where `stride` is the number of token types the model reads (1 for models
that read none: decoders, jina-embeddings-v3, RoBERTa). A hook before the model's forward
splits them, the adapter index going to every adapted linear (`AdapterSelection`), the
type to the embeddings: a few elementwise operations per batch, no data-dependent control
flow, so CUDA graphs cover every mix of adapters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..batch import PackedBatch
from ..errors import CheckpointError
from ..layers import Linear
from ..layers.lora import AdaptedLinear, AdapterSelection, stack_adapters
from .base import TransformerModel
from .peft import LoraAdapter, Pair


def attach_adapters(network: TransformerModel, adapters: Sequence[LoraAdapter]) -> None:
    """Adapter k of `adapters` becomes index k + 1 (see the module docstring)."""
    if not adapters:
        return
    name = type(network).__name__
    if network.lora_unsupported is not None:
        raise CheckpointError(
            f"LoRA adapters are not supported on {name}: {network.lora_unsupported}"
        )
    seen: set[str] = set()
    for adapter in adapters:
        if adapter.name in seen:
            raise CheckpointError(f"two LoRA adapters are named {adapter.name!r}")
        seen.add(adapter.name)
    selection = AdapterSelection()
    weights = [a.modules for a in adapters]
    used: list[set[str]] = [set() for _ in adapters]
    for parent, attr, linear in _layer_linears(network.layers):
        delta = stack_adapters(
            [_part(weights, used, part, network.prefixes, linear) for part, _ in linear.parts],
            int(linear.weight.shape[1]),
            [rows for _, rows in linear.parts],
        )
        if delta is not None:
            setattr(parent, attr, AdaptedLinear(linear, delta, selection))
    for k, names in enumerate(network.attach_embedding_adapters(weights, selection)):
        used[k] |= names
    for adapter, taken in zip(adapters, used):
        left = sorted(set(adapter.modules) - taken)
        if left:
            shown = ", ".join(repr(m) for m in left[:6]) + (" ..." if len(left) > 6 else "")
            raise CheckpointError(
                f"LoRA adapter {adapter.name!r} ({adapter.path}) targets {shown}, which "
                f"{name} cannot adapt: adapters apply to the linear projections of its "
                "transformer layers (attention q/k/v/o, MLP up/gate/down), not to "
                "embeddings, poolers or heads"
            )
    stride = max(network.type_vocab_size, 1) if network.uses_token_types else 1
    network.adapter_names = tuple(a.name for a in adapters)
    network.adapter_type_stride = stride
    # Every type id a batch may carry now: the executor checks them against it.
    network.type_vocab_size = stride * (len(adapters) + 1)
    route = _AdapterRouting(selection, stride, network.uses_token_types)
    network.register_forward_pre_hook(route.before)
    network.register_forward_hook(route.after)


def _layer_linears(layers: nn.Module) -> list[tuple[nn.Module, str, Linear]]:
    """(parent, attribute, linear) of every checkpoint linear inside the layers."""
    found = []
    for parent in layers.modules():
        for attr, child in parent.named_children():
            if isinstance(child, Linear) and child.parts:
                found.append((parent, attr, child))
    return found


def _part(
    weights: list[dict[str, Pair]],
    used: list[set[str]],
    module: str,
    prefixes: Sequence[str],
    linear: Linear,
) -> list[Pair | None]:
    """Each adapter's (A, B) of checkpoint module `module`, looked up with each of the
    model's prefixes (a `*ForSequenceClassification` adapter names "bert.encoder...")."""
    rows = dict(linear.parts)[module]
    in_f = int(linear.weight.shape[1])
    out: list[Pair | None] = []
    for k, modules in enumerate(weights):
        pair = None
        for prefix in prefixes:
            if prefix + module in modules:
                pair = modules[prefix + module]
                used[k].add(prefix + module)
                break
        if pair is not None and (pair[0].shape[1] != in_f or pair[1].shape[0] != rows):
            raise CheckpointError(
                f"LoRA adapter of {module!r} has shapes {tuple(pair[0].shape)} and "
                f"{tuple(pair[1].shape)}, expected [r, {in_f}] and [{rows}, r]"
            )
        out.append(pair)
    return out


class _AdapterRouting:
    """The hooks around the model's forward that split token type ids into adapter and
    type (module docstring), and clear the selection after the pass."""

    def __init__(self, selection: AdapterSelection, stride: int, reads_types: bool) -> None:
        self.selection = selection
        self.stride = stride
        self.reads_types = reads_types

    def before(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        batch, *rest = args
        assert isinstance(batch, PackedBatch)
        ids = batch.token_type_ids
        if self.stride == 1:
            adapters, types = ids, torch.zeros_like(ids) if self.reads_types else ids
        else:
            adapters = torch.div(ids, self.stride, rounding_mode="floor")
            types = ids - adapters * self.stride
        self.selection.token_adapters = adapters
        if types is ids:
            return args
        return (dataclasses.replace(batch, token_type_ids=types), *rest)

    def after(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self.selection.token_adapters = None
