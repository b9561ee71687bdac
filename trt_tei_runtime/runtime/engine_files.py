"""The engine directory's format, and loading one: rebuild the module tree from the
manifest, then assign the stored (already fused and quantized) tensors. No checkpoint
conversion happens here; `engine.build` writes what this reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from ..checkpoint import read_json
from ..errors import CheckpointError
from ..layers.fp8 import quantize_linears
from ..models import TransformerModel
from ..templates import Vocabulary
from ..weights import SkeletonReader

ENGINE_FORMAT = "trt-tei-engine"
ENGINE_VERSION = 2  # 2: task heads are one `head` submodule (state-dict names changed)
MANIFEST = "manifest.json"
WEIGHTS = "engine.safetensors"


def read_engine_manifest(model_dir: Path) -> dict[str, Any] | None:
    """The manifest of an engine directory, or None for a plain checkpoint."""
    manifest = read_json(model_dir / MANIFEST, required=False)
    if manifest is None or manifest.get("format") != ENGINE_FORMAT:
        return None
    if manifest.get("version") != ENGINE_VERSION:
        raise CheckpointError(
            f"{model_dir / MANIFEST}: engine format version {manifest.get('version')} is not "
            f"supported by this runtime (expects {ENGINE_VERSION}); rebuild the engine"
        )
    return manifest


def load_engine_network(
    arch: type[TransformerModel],
    config: dict[str, Any],
    model_dir: Path,
    manifest: dict[str, Any],
    device: torch.device,
) -> TransformerModel:
    shapes = manifest.get("checkpoint_tensors")
    if not isinstance(shapes, dict):
        raise CheckpointError(f"{model_dir / MANIFEST}: missing field 'checkpoint_tensors'")
    reader = SkeletonReader(shapes, source=str(model_dir))
    network = arch.from_checkpoint(config, reader, Vocabulary(model_dir))
    reader.finish()
    if manifest["quantization"]["type"] == "fp8":
        quality = manifest["quantization"].get("quality") or {}
        quantize_linears(network, keep=quality.get("kept_linears", []))
    weights_path = model_dir / WEIGHTS
    if not weights_path.is_file():
        raise CheckpointError(f"missing file {WEIGHTS} in engine {model_dir}")
    tensors = load_file(str(weights_path), device=str(device))
    try:
        network.load_state_dict(tensors, strict=True, assign=True)
    except RuntimeError as exc:
        raise CheckpointError(f"engine {weights_path} does not fit its manifest: {exc}") from exc
    # Buffers computed from the config at construction (rotary tables) follow the weights.
    return network.to(device).eval()
