"""`trt-tei-build CONFIG.yaml --output DIR`: convert a checkpoint into an engine directory.

An engine directory holds the converted, fused (and optionally FP8-quantized) weights in
one safetensors file, a manifest, and the tokenizer and model files the router needs.
"""

from __future__ import annotations

import json
import logging
import platform
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from .. import __version__
from ..errors import InputError
from ..layers.fp8 import quantizable_linears, quantize_linears, set_submodule
from ..layers.linear import Linear
from ..model import Model
from . import ENGINE_FORMAT, ENGINE_VERSION, MANIFEST, WEIGHTS
from .calibration import CALIBRATION_QUERIES, CALIBRATION_TEXTS
from .config import BuilderConfig

log = logging.getLogger(__name__)

# Files and folders of a checkpoint the runtime and router read besides the weights.
_COPY_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
)
_COPY_DIR_SUFFIXES = ("_Pooling", "_Dense", "_Normalize")


class BuildRefusedError(InputError):
    """The FP8 engine failed its quality gate; nothing was written."""


def build_engine(config: BuilderConfig, output: Path, *, force: bool = False) -> dict[str, Any]:
    """Builds the engine described by `config` into `output`; returns the manifest."""
    output = Path(output)
    if output.exists() and any(output.iterdir()) and not (output / MANIFEST).is_file():
        raise InputError(f"output {output} exists and is not an engine directory; not overwriting")
    steps = tqdm(total=4, desc="build", unit="step")
    started = time.time()
    with steps:
        steps.set_postfix_str("load checkpoint")
        # No CUDA graphs while building: graphs captured before quantization would keep
        # replaying the bf16 kernels, and the quality gate would compare bf16 with itself.
        model = Model(
            config.checkpoint.repo,
            device=config.device,
            dtype=config.dtype,
            pooling=config.pooling,
            revision=config.checkpoint.revision,
            max_batch_tokens=config.max_num_tokens,
            cuda_graphs=False,
        )
        loaded = model.loaded_model
        kind = loaded.network.base_model
        if kind != config.base_model:
            article = "an" if kind == "encoder" else "a"
            raise InputError(
                f"base_model is {config.base_model!r} but {model.info.architecture} is "
                f"{article} {kind}"
            )
        steps.update()

        quality: dict[str, Any] | None = None
        steps.set_postfix_str("quantize" if config.quantization_type == "fp8" else "convert")
        if config.quantization_type == "fp8":
            quality = _quantize_under_gate(model, config, force)
        steps.update()

        steps.set_postfix_str("write")
        output.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().contiguous().cpu() for k, v in loaded.network.state_dict().items()}
        save_file(tensors, str(output / WEIGHTS), metadata={"format": ENGINE_FORMAT})
        _copy_model_files(model.info.model_dir, output)
        steps.update()

        manifest = {
            "format": ENGINE_FORMAT,
            "version": ENGINE_VERSION,
            "architecture": model.info.architecture,
            "base_model": config.base_model,
            "model_type": model.info.model_type,
            "dtype": str(loaded.dtype).removeprefix("torch."),
            "quantization": {"type": config.quantization_type, "quality": quality},
            "max_num_tokens": config.max_num_tokens,
            "max_batch_size": config.max_batch_size,
            "max_input_length": model.info.max_input_length,
            "pooling": model.info.pooling,
            "source": {
                "repo": config.checkpoint.repo,
                "revision": config.checkpoint.revision,
                "source": config.checkpoint.source,
            },
            "checkpoint_tensors": {k: list(v) for k, v in loaded.checkpoint_tensors.items()},
            "built_with": {
                "trt_tei_runtime": __version__,
                "torch": torch.__version__,
                "python": platform.python_version(),
                "device": _device_name(loaded.device),
            },
            "build_seconds": round(time.time() - started, 2),
        }
        (output / MANIFEST).write_text(json.dumps(manifest, indent=2))
        steps.update()
    return manifest


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _quantize_under_gate(model: Model, config: BuilderConfig, force: bool) -> dict[str, Any]:
    """Swaps the network's linears for FP8 ones and measures the result on the calibration
    set. Under the gate, with `fp8_fallback: auto`, the linears whose quantization costs
    the most keep the model dtype, one at a time, until the gate passes — at most half of
    them, beyond which FP8 would buy little. Still under the gate: refused unless `force`."""
    network = model.loaded_model.network
    reference = _calibration_outputs(model)
    originals = quantizable_linears(network)
    quantize_linears(network)
    quality = _compare(model, reference)
    kept: list[str] = []
    if not _passes(quality, config) and config.fp8_fallback == "auto":
        kept, quality = _keep_most_sensitive(model, reference, originals, config)
    quality["quantized_linears"] = len(originals) - len(kept)
    quality["kept_linears"] = kept
    quality["min_cosine_required"] = config.fp8_min_cosine
    quality["passed"] = _passes(quality, config)
    if not quality["passed"] and not force:
        fallback = (
            f" even with {len(kept)} of {len(originals)} linears kept in {config.dtype}"
            if kept
            else ""
        )
        raise BuildRefusedError(
            f"FP8 engine fails the quality gate: min cosine {quality['min_cosine']:.6f} "
            f"(needs {config.fp8_min_cosine}), rank order preserved: "
            f"{quality['order_preserved']}{fallback}; nothing written (use --force to write "
            "anyway, or quantization_type: no_quant)"
        )
    return quality


def _passes(quality: dict[str, Any], config: BuilderConfig) -> bool:
    return bool(quality["min_cosine"] >= config.fp8_min_cosine and quality["order_preserved"])


def _keep_most_sensitive(
    model: Model, reference: np.ndarray, originals: dict[str, Linear], config: BuilderConfig
) -> tuple[list[str], dict[str, Any]]:
    """Ranks the linears by the calibration cosine with only that one back in high
    precision, then puts them back in that order until the gate passes."""
    network = model.loaded_model.network
    fp8 = {name: network.get_submodule(name) for name in originals}
    recovered = {}
    for name, linear in tqdm(originals.items(), desc="fp8 sensitivity", unit="linear"):
        set_submodule(network, name, linear)
        recovered[name] = _compare(model, reference)["min_cosine"]
        set_submodule(network, name, fp8[name])
    kept: list[str] = []
    quality: dict[str, Any] = {}
    for name in sorted(recovered, key=recovered.__getitem__, reverse=True):
        if len(kept) >= len(originals) // 2:
            break
        set_submodule(network, name, originals[name])
        kept.append(name)
        quality = _compare(model, reference)
        if _passes(quality, config):
            break
    return kept, quality


def _calibration_outputs(model: Model) -> np.ndarray:
    if model.info.model_type == "embedding":
        return model.embed(CALIBRATION_TEXTS, show_progress_bar=False)
    pairs = [(q, t) for q in CALIBRATION_QUERIES for t in CALIBRATION_TEXTS]
    return model.predict(pairs, raw_scores=True, show_progress_bar=False)


def _compare(model: Model, reference: np.ndarray) -> dict[str, Any]:
    """Cosine of each quantized output to the reference; for rerankers also whether every
    query's ranking of the calibration texts is unchanged."""
    quantized = _calibration_outputs(model)
    a, b = reference.astype(np.float64), quantized.astype(np.float64)
    result: dict[str, Any] = {"calibration_inputs": len(a)}
    if model.info.model_type == "embedding":
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        result["min_cosine"] = float(cos.min())
        result["order_preserved"] = True
    else:
        groups = len(CALIBRATION_QUERIES)
        ref_scores, q_scores = a.reshape(groups, -1), b.reshape(groups, -1)
        # Scores of a reranker are compared per query as vectors over its candidates.
        cos = (ref_scores * q_scores).sum(1) / (
            np.linalg.norm(ref_scores, axis=1) * np.linalg.norm(q_scores, axis=1)
        )
        result["min_cosine"] = float(cos.min())
        result["order_preserved"] = bool(
            all((np.argsort(-r) == np.argsort(-q)).all() for r, q in zip(ref_scores, q_scores))
        )
        result["max_abs_score_diff"] = float(np.abs(a - b).max())
    return result


def _copy_model_files(src: Path, dst: Path) -> None:
    for name in _COPY_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    for sub in src.iterdir():
        if sub.is_dir() and sub.name.endswith(_COPY_DIR_SUFFIXES):
            shutil.copytree(sub, dst / sub.name, dirs_exist_ok=True)
