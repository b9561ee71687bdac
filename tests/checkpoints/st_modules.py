"""sentence-transformers' module files next to a checkpoint (modules.json, 1_Pooling,
Dense, Normalize, SpladePooling): their contents, shared by the tests' factories and the
snapshot generator, and the tests' writer of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

ST = "sentence_transformers.models"
SPARSE = "sentence_transformers.sparse_encoder.models"


def module(idx: int, path: str, kind: str) -> dict[str, Any]:
    """A modules.json entry: module `idx` of class `kind` in folder `path`."""
    return {"idx": idx, "name": str(idx), "path": path, "type": kind}


def pooling_config(hidden: int, pooling: str | None) -> dict[str, Any]:
    """1_Pooling/config.json for "cls", "mean" or "lasttoken" pooling."""
    return {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_lasttoken": pooling == "lasttoken",
    }


def dense_config(n_in: int, n_out: int, *, bias: bool, activation: str) -> dict[str, Any]:
    """A Dense module's config.json; `activation` is a torch.nn.modules path."""
    return {
        "in_features": n_in,
        "out_features": n_out,
        "bias": bias,
        "activation_function": f"torch.nn.modules.{activation}",
    }


def splade_files(strategy: str, activation: str) -> dict[str, Any]:
    """A SparseEncoder's files (path: JSON value): the masked LM at the root, then
    SpladePooling with `strategy` ("max", "sum") and `activation` ("relu", "log1p_relu")."""
    return {
        "modules.json": [
            module(0, "", f"{SPARSE}.MLMTransformer"),
            module(1, "1_SpladePooling", f"{SPARSE}.SpladePooling"),
        ],
        "1_SpladePooling/config.json": {
            "pooling_strategy": strategy,
            "activation_function": activation,
            "word_embedding_dimension": None,
        },
        "config_sentence_transformers.json": {
            "model_type": "SparseEncoder",
            "similarity_fn_name": "dot",
        },
    }


def write_sentence_transformers_files(
    folder: Path,
    *,
    hidden: int,
    pooling: str | None = None,
    max_seq_length: int | None = None,
    normalize: bool = False,
    dense_out: int | None = None,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
    seed: int = 0,
) -> None:
    """modules.json and the files of each module sentence-transformers would write."""
    if pooling is None and max_seq_length is None and not normalize and prompts is None:
        return
    modules = [module(0, "", f"{ST}.Transformer")]
    if pooling is not None:
        (folder / "1_Pooling").mkdir(exist_ok=True)
        (folder / "1_Pooling" / "config.json").write_text(
            json.dumps(pooling_config(hidden, pooling))
        )
        modules.append(module(1, "1_Pooling", f"{ST}.Pooling"))
    if dense_out is not None:
        from safetensors.torch import save_file

        gen = torch.Generator().manual_seed(seed + 1)
        dense_dir = folder / "2_Dense"
        dense_dir.mkdir(exist_ok=True)
        (dense_dir / "config.json").write_text(
            json.dumps(dense_config(hidden, dense_out, bias=True, activation="activation.Tanh"))
        )
        save_file(
            {
                "linear.weight": torch.randn(dense_out, hidden, generator=gen) * 0.2,
                "linear.bias": torch.randn(dense_out, generator=gen) * 0.1,
            },
            str(dense_dir / "model.safetensors"),
        )
        modules.append(module(2, "2_Dense", f"{ST}.Dense"))
    if normalize:
        modules.append(module(3, "3_Normalize", f"{ST}.Normalize"))
    (folder / "modules.json").write_text(json.dumps(modules))
    if max_seq_length is not None:
        (folder / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
        )
    if prompts is not None:
        (folder / "config_sentence_transformers.json").write_text(
            json.dumps({"prompts": prompts, "default_prompt_name": default_prompt_name})
        )
