"""PEFT LoRA adapter folders (`adapter_config.json` + `adapter_model.safetensors`, what
`PeftModel.save_pretrained` writes), read into plain tensors: module name → (A, B scaled).

Only what inference with unmerged low-rank deltas can reproduce exactly is accepted: plain
LoRA (`lora_alpha / r` scaling, or `lora_alpha / sqrt(r)` with `use_rslora`), any rank up
to `MAX_RANK` (per module too: `rank_pattern` only changes tensor shapes), `bias: "none"`.
Everything that changes the forward pass otherwise (DoRA, trained biases, modules saved
whole, per-module alphas, ...) is refused by name, as is any tensor that is not a LoRA
matrix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import read_json
from ..errors import CheckpointError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
# The widest low-rank space one adapter may add to a projection: the deltas are two thin
# GEMMs per projection, which stay thin only while ranks are small.
MAX_RANK = 64
_PEFT_PREFIX = "base_model.model."
_LINEAR_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")
_EMBED_KEY = re.compile(r"^(?P<module>.+)\.lora_embedding_(?P<ab>[AB])$")

# Config keys whose other values change what the adapter computes, with the values that
# leave plain LoRA (None: absent or null). `bias` is checked apart, for its own message.
_PLAIN: dict[str, tuple[Any, ...]] = {
    "use_dora": (False, None),
    "fan_in_fan_out": (False, None),
    "modules_to_save": (None, []),
    "alpha_pattern": ({}, None),
    "lora_bias": (False, None),
    "trainable_token_indices": (None, [], {}),
    "alora_invocation_tokens": (None, []),
    "use_qalora": (False, None),
    "target_parameters": (None, []),
    "layer_replication": (None, []),
    "arrow_config": (None,),
    "use_bdlora": (None, False),
    "kasa_config": (None,),
}

Pair = tuple[torch.Tensor, torch.Tensor]


@dataclass
class LoraAdapter:
    """One adapter: `modules` maps a module name of the base checkpoint (as transformers
    names it, e.g. "encoder.layer.0.attention.self.query") to (A `[r, in]`, B · scaling
    `[out, r]`); for an embedding table A is `[r, vocab]`."""

    name: str
    path: Path
    modules: dict[str, Pair] = field(default_factory=dict)


def _scaling(config: dict[str, Any], path: Path) -> tuple[float, bool]:
    """lora_alpha, and whether scaling divides by sqrt(r) (rsLoRA) instead of r."""
    kind = config.get("peft_type", "LORA")
    if kind != "LORA":
        raise CheckpointError(f"{path}: only LoRA adapters are supported, got peft_type {kind!r}")
    if config.get("bias", "none") not in ("none", None):
        raise CheckpointError(
            f"{path}: bias={config.get('bias')!r} is not supported (only 'none': the "
            "adapter may not train the base model's biases)"
        )
    for key, plain in _PLAIN.items():
        if key in config and config[key] not in plain:
            raise CheckpointError(f"{path}: {key}={config[key]!r} is not supported")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank <= 0 or not isinstance(alpha, (int, float)):
        raise CheckpointError(f"{path}: r must be a positive integer and lora_alpha a number")
    if rank > MAX_RANK:
        raise CheckpointError(f"{path}: rank r={rank} is above the supported {MAX_RANK}")
    return float(alpha), bool(config.get("use_rslora"))


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    for name in ADAPTER_WEIGHTS:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            return dict(torch.load(path, map_location="cpu", weights_only=True))
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f"cannot read adapter weights {path}: {exc}") from exc
    raise CheckpointError(
        f"no adapter weights in {folder}: expected {' or '.join(ADAPTER_WEIGHTS)}"
    )


def read_adapter(folder: str | Path, name: str | None = None) -> LoraAdapter:
    """One PEFT LoRA folder (named `name`, default: the folder's name)."""
    folder = Path(folder)
    config_path = folder / ADAPTER_CONFIG
    if not config_path.is_file():
        raise CheckpointError(f"{folder} is not a PEFT adapter folder: no {ADAPTER_CONFIG}")
    config = read_json(config_path)
    assert config is not None
    alpha, rslora = _scaling(config, config_path)
    found: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in _weights(folder).items():
        module = key.removeprefix(_PEFT_PREFIX)
        match = _LINEAR_KEY.match(module) or _EMBED_KEY.match(module)
        if match is None:
            raise CheckpointError(
                f"{folder}: adapter tensor {key!r} is not a LoRA matrix (lora_A / lora_B); "
                "only LoRA's low-rank matrices are supported"
            )
        found.setdefault(match["module"], {})[match["ab"]] = tensor
    modules = {}
    for module, ab in found.items():
        if set(ab) != {"A", "B"}:
            raise CheckpointError(f"{folder}: adapter of {module!r} lacks lora_A or lora_B")
        down, up = ab["A"].float(), ab["B"].float()
        rank = down.shape[0]
        if down.dim() != 2 or up.dim() != 2 or up.shape[1] != rank:
            raise CheckpointError(
                f"{folder}: adapter of {module!r} has shapes {tuple(down.shape)} and "
                f"{tuple(up.shape)}, expected [r, in] and [out, r]"
            )
        if rank > MAX_RANK:
            raise CheckpointError(
                f"{folder}: adapter of {module!r} has rank {rank}, above the supported {MAX_RANK}"
            )
        # Per module: `rank_pattern` gives some modules another rank than `r`.
        scale = alpha / (rank**0.5 if rslora else rank)
        modules[module] = (down, up * scale)
    if not modules:
        raise CheckpointError(f"{folder}: the adapter holds no LoRA matrices")
    return LoraAdapter(name or folder.name, folder, modules)
