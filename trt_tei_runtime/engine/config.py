"""The builder YAML (`release_matrix_cfg/*.yaml`): parsed and validated with clear errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError


class BuilderConfigError(InputError):
    """A builder YAML is malformed; the message names the file and the field."""


_TOP_LEVEL = {
    "base_model": "encoder | decoder",
    "checkpoint_repository": "{repo, revision, source: HF | local}",
    "quantization_type": "no_quant | fp8",
    "max_num_tokens": "positive integer (tokens per forward pass)",
    "max_batch_size": "positive integer (sequences per forward pass)",
    "dtype": "float32 | float16 | bfloat16",
    "pooling": "cls | mean | last-token (optional)",
    "device": "cuda | cpu (optional, default cuda when present)",
    "fp8_min_cosine": "number in (0, 1] (optional, default 0.999)",
    "fp8_fallback": "auto | none (optional, default auto: keep the linears FP8 hurts most "
    "in dtype until the quality gate passes)",
}
_REPO_FIELDS = {"repo", "revision", "source"}


@dataclass(frozen=True)
class CheckpointRepository:
    repo: str
    revision: str | None
    source: str  # "HF" or "local"


@dataclass(frozen=True)
class BuilderConfig:
    base_model: str
    checkpoint: CheckpointRepository
    quantization_type: str
    max_num_tokens: int
    max_batch_size: int
    dtype: str
    pooling: str | None = None
    device: str | None = None
    fp8_min_cosine: float = 0.999
    fp8_fallback: str = "auto"

    @classmethod
    def from_yaml(cls, path: str | Path) -> BuilderConfig:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BuilderConfigError(f"builder config {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise BuilderConfigError(f"{path}: not valid YAML: {exc}") from exc
        return cls.from_dict(data, source=str(path), base_dir=path.parent)

    @classmethod
    def from_dict(
        cls, data: Any, *, source: str = "builder config", base_dir: Path | None = None
    ) -> BuilderConfig:
        if not isinstance(data, dict):
            raise BuilderConfigError(f"{source}: expected a mapping of fields at the top level")
        unknown = sorted(set(data) - set(_TOP_LEVEL))
        if unknown:
            allowed = "; ".join(f"{k}: {v}" for k, v in _TOP_LEVEL.items())
            raise BuilderConfigError(f"{source}: unknown field(s) {unknown}; allowed: {allowed}")
        field = _FieldReader(data, source)
        repo = _checkpoint(data.get("checkpoint_repository"), source, base_dir)
        config = cls(
            base_model=field.choice("base_model", ("encoder", "decoder")),
            checkpoint=repo,
            quantization_type=field.choice("quantization_type", ("no_quant", "fp8"), "no_quant"),
            max_num_tokens=field.positive_int("max_num_tokens", 16384),
            max_batch_size=field.positive_int("max_batch_size", 256),
            dtype=field.choice("dtype", ("float32", "float16", "bfloat16"), "bfloat16"),
            pooling=field.optional_choice("pooling", ("cls", "mean", "last-token")),
            device=field.optional_choice("device", ("cuda", "cpu")),
            fp8_min_cosine=field.fraction("fp8_min_cosine", 0.999),
            fp8_fallback=field.choice("fp8_fallback", ("auto", "none"), "auto"),
        )
        if config.max_batch_size > config.max_num_tokens:
            raise BuilderConfigError(
                f"{source}: max_batch_size ({config.max_batch_size}) cannot exceed "
                f"max_num_tokens ({config.max_num_tokens}): every sequence has a token"
            )
        if config.quantization_type == "fp8" and config.dtype == "float32":
            raise BuilderConfigError(
                f"{source}: quantization_type fp8 needs dtype bfloat16 or float16 "
                "(the activations around the FP8 GEMMs)"
            )
        return config


class _FieldReader:
    def __init__(self, data: dict[str, Any], source: str) -> None:
        self.data, self.source = data, source

    def _get(self, key: str, default: Any) -> Any:
        if key not in self.data or self.data[key] is None:
            if default is _REQUIRED:
                raise BuilderConfigError(
                    f"{self.source}: missing field {key!r} ({_TOP_LEVEL[key]})"
                )
            return default
        return self.data[key]

    def choice(self, key: str, options: tuple[str, ...], default: Any = None) -> str:
        value = self._get(key, _REQUIRED if default is None else default)
        if value not in options:
            raise BuilderConfigError(
                f"{self.source}: {key} must be one of {', '.join(options)}; got {value!r}"
            )
        return str(value)

    def optional_choice(self, key: str, options: tuple[str, ...]) -> str | None:
        if self.data.get(key) is None:
            return None
        return self.choice(key, options)

    def positive_int(self, key: str, default: int) -> int:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise BuilderConfigError(
                f"{self.source}: {key} must be a positive integer; got {value!r}"
            )
        return value

    def fraction(self, key: str, default: float) -> float:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise BuilderConfigError(
                f"{self.source}: {key} must be a number in (0, 1]; got {value!r}"
            )
        return float(value)


_REQUIRED = object()


def _checkpoint(value: Any, source: str, base_dir: Path | None) -> CheckpointRepository:
    where = f"{source}: checkpoint_repository"
    if value is None:
        raise BuilderConfigError(
            f"{source}: missing field 'checkpoint_repository' "
            f"({_TOP_LEVEL['checkpoint_repository']})"
        )
    if not isinstance(value, dict):
        raise BuilderConfigError(f"{where} must be a mapping with repo, revision, source")
    unknown = sorted(set(value) - _REPO_FIELDS)
    if unknown:
        raise BuilderConfigError(
            f"{where}: unknown field(s) {unknown}; allowed: {sorted(_REPO_FIELDS)}"
        )
    repo = value.get("repo")
    if not isinstance(repo, str) or not repo.strip():
        raise BuilderConfigError(f"{where}.repo must be a hub id or a folder path")
    source_kind = value.get("source", "HF")
    if source_kind not in ("HF", "local"):
        raise BuilderConfigError(f"{where}.source must be HF or local; got {source_kind!r}")
    revision = value.get("revision")
    if revision is not None and not isinstance(revision, str):
        raise BuilderConfigError(f"{where}.revision must be a string; got {revision!r}")
    if source_kind == "local":
        folder = Path(repo).expanduser()
        if not folder.is_absolute() and base_dir is not None and not folder.exists():
            folder = base_dir / folder
        if not folder.is_dir():
            raise BuilderConfigError(f"{where}.repo: local folder {repo!r} does not exist")
        if revision is not None:
            raise BuilderConfigError(f"{where}.revision does not apply to source: local")
        repo = str(folder.resolve())
    return CheckpointRepository(repo=repo, revision=revision, source=source_kind)
