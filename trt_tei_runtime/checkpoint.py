"""Resolving a model id to a local folder and reading its configuration files.

A model id is either a local folder or a Hugging Face hub id. Hub ids go through
`huggingface_hub.snapshot_download`, which honours `revision`, the cache (`HF_HOME`) and
`HF_HUB_OFFLINE`; when the hub cannot be reached the error says so and names the id.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CheckpointError
from .sparse import SpladeConfig

# Only what the runtime reads; weights in other formats (pytorch_model.bin, onnx) are skipped.
_HUB_PATTERNS = [
    "*.json",
    "*.safetensors",
    "*.txt",
    "*.model",
    "1_Pooling/*",
    "2_Dense/*",
    "*_Dense/*",
]


def resolve_model_dir(model_id: str | os.PathLike[str], revision: str | None = None) -> Path:
    """Returns the local folder of `model_id`, downloading a hub snapshot if needed."""
    path = Path(model_id).expanduser()
    if path.is_dir():
        return path.resolve()
    text = str(model_id)
    if path.exists():
        raise CheckpointError(f"model path {text!r} is a file; expected a checkpoint folder")
    if text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise CheckpointError(f"model folder {text!r} does not exist")
    return _download_from_hub(text, revision)


def _download_from_hub(repo_id: str, revision: str | None) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - huggingface_hub is a dependency
        raise CheckpointError("huggingface_hub is needed to download hub ids") from exc
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=_HUB_PATTERNS))
    except Exception as exc:  # the hub raises many types: offline, 404, gated, network
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
        hint = (
            " (HF_HUB_OFFLINE is set and the model is not in the local cache)"
            if offline
            else " (is the hub reachable and the id spelled right?)"
        )
        raise CheckpointError(
            f"cannot fetch model {repo_id!r}"
            f"{'' if revision is None else f' at revision {revision!r}'} from the Hugging Face hub"
            f"{hint}: {type(exc).__name__}: {exc}"
        ) from exc


# sentence-transformers module types that hold a whole transformers model in their folder.
_MODEL_MODULES = ("CLIPModel", "Transformer")


def transformer_folder(model_dir: Path) -> Path:
    """The folder of the checkpoint's config.json: the model folder itself, or where its
    first sentence-transformers module keeps the model (sentence-transformers' CLIP folders
    put it in `0_CLIPModel/`)."""
    if (model_dir / "config.json").is_file():
        return model_dir
    for module in _read_modules(model_dir / "modules.json"):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        folder = model_dir / str(module.get("path", ""))
        if kind in _MODEL_MODULES and (folder / "config.json").is_file():
            return folder
    return model_dir


def read_json(path: Path, *, required: bool = True) -> dict[str, Any] | None:
    """Reads a JSON object; a missing required file or malformed JSON names the file."""
    if not path.is_file():
        if required:
            raise CheckpointError(f"missing file {path.name} in {path.parent}")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"malformed JSON in {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"malformed {path}: expected a JSON object")
    return data


@dataclass
class DenseModule:
    """A sentence-transformers `Dense` layer applied after pooling."""

    path: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str  # e.g. "torch.nn.modules.activation.Tanh"


@dataclass
class SentenceTransformersConfig:
    """What the sentence-transformers files of a checkpoint say (all optional)."""

    pooling: str | None = None
    max_seq_length: int | None = None
    dense: list[DenseModule] = field(default_factory=list)
    normalize: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    # Set for a SparseEncoder folder: its `SpladePooling` module's config.
    splade: SpladeConfig | None = None


# sentence-transformers modules of sparse encoders the runtime does not implement: a folder
# holding one fails at load rather than serving different numbers.
_UNSUPPORTED_MODULES = ("SparseStaticEmbedding", "SparseAutoEncoder", "Router", "Asym")


# sentence-transformers' pooling config flags, in the order it checks them.
_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "last-token",
}


def read_sentence_transformers_config(model_dir: Path) -> SentenceTransformersConfig:
    st = SentenceTransformersConfig()
    bert_cfg = read_json(model_dir / "sentence_bert_config.json", required=False)
    if bert_cfg and bert_cfg.get("max_seq_length") is not None:
        st.max_seq_length = _positive_int(
            bert_cfg["max_seq_length"], "max_seq_length", model_dir / "sentence_bert_config.json"
        )
    st_cfg = read_json(model_dir / "config_sentence_transformers.json", required=False) or {}
    prompts = st_cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise CheckpointError(
            f"malformed {model_dir / 'config_sentence_transformers.json'}: "
            "'prompts' must map names to strings"
        )
    st.prompts = dict(prompts)
    st.default_prompt_name = st_cfg.get("default_prompt_name") or None
    if st.default_prompt_name is not None and st.default_prompt_name not in st.prompts:
        raise CheckpointError(
            "config_sentence_transformers.json: default_prompt_name "
            f"{st.default_prompt_name!r} is not among its prompts {sorted(st.prompts)}"
        )

    modules_path = model_dir / "modules.json"
    modules = _read_modules(modules_path)
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        sub = model_dir / str(module.get("path", ""))
        if kind == "Pooling":
            st.pooling = _read_pooling(sub / "config.json")
        elif kind == "Dense":
            st.dense.append(_read_dense(sub))
        elif kind == "Normalize":
            st.normalize = True
        elif kind == "SpladePooling":
            path = sub / "config.json"
            st.splade = SpladeConfig.from_dict(read_json(path, required=False) or {}, str(path))
        elif kind in _UNSUPPORTED_MODULES:
            raise CheckpointError(
                f"{modules_path}: the sentence-transformers module {kind} is not supported "
                "(supported sparse encoders: a masked-LM transformer followed by SpladePooling)"
            )
    return st


def _read_modules(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"malformed JSON in {path}: {exc}") from exc
    if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        raise CheckpointError(f"malformed {path}: expected a list of module objects")
    return data


def _read_pooling(path: Path) -> str:
    cfg = read_json(path)
    assert cfg is not None
    for flag, mode in _POOLING_FLAGS.items():
        if cfg.get(flag):
            return mode
    enabled = [k for k, v in cfg.items() if k.startswith("pooling_mode") and v]
    raise CheckpointError(
        f"{path}: unsupported pooling {enabled or 'none enabled'}; supported: cls, mean, lasttoken"
    )


def _read_dense(folder: Path) -> DenseModule:
    cfg_path = folder / "config.json"
    cfg = read_json(cfg_path)
    assert cfg is not None
    try:
        return DenseModule(
            path=folder,
            in_features=_positive_int(cfg["in_features"], "in_features", cfg_path),
            out_features=_positive_int(cfg["out_features"], "out_features", cfg_path),
            bias=bool(cfg.get("bias", True)),
            activation=str(cfg.get("activation_function", "torch.nn.modules.linear.Identity")),
        )
    except KeyError as exc:
        raise CheckpointError(f"{cfg_path}: missing field {exc.args[0]!r}") from exc


def _positive_int(value: Any, name: str, path: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"{path}: {name} must be a positive integer, got {value!r}")
    return value
