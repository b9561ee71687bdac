"""Reading config.json: typed field access every family shares, and the label facts of
classification checkpoints."""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any

from ..errors import CheckpointError


class ConfigReader:
    """Typed access to config.json fields; a missing or mistyped field names itself."""

    def __init__(self, data: dict[str, Any], source: str = "config.json") -> None:
        self.data = data
        self.source = source

    def int(self, key: str, default: int | None = None) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, "an integer", value)
        return value

    def float(self, key: str, default: float | None = None) -> float:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._bad(key, "a number", value)
        return float(value)

    def str(self, key: str, default: str | None = None) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str):
            raise self._bad(key, "a string", value)
        return value

    def bool(self, key: builtins.str, default: builtins.bool) -> builtins.bool:
        """A true/false field; absent or null means `default`."""
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise CheckpointError(
                f"{self.source}: field {key!r} must be true or false, got {value!r}"
            )
        return value

    def optional_int(
        self, key: builtins.str, default: builtins.int | None = None
    ) -> builtins.int | None:
        """A positive integer or null (a sliding window that may be off)."""
        value = self.data.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise CheckpointError(
                f"{self.source}: field {key!r} must be a positive integer or null"
            )
        return value

    def optional_float(
        self, key: builtins.str, default: builtins.float | None = None
    ) -> builtins.float | None:
        value = self.data.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CheckpointError(
                f"{self.source}: field {key!r} must be a number or null, got {value!r}"
            )
        return float(value)

    def _bad(self, key: builtins.str, kind: builtins.str, value: Any) -> CheckpointError:
        if key not in self.data:
            return CheckpointError(f"{self.source}: missing field {key!r}")
        return CheckpointError(f"{self.source}: field {key!r} must be {kind}, got {value!r}")


@dataclass
class ClassifierInfo:
    """Label facts of a `*ForSequenceClassification` checkpoint."""

    num_labels: int
    id2label: dict[str, str]
    problem_type: str | None

    @classmethod
    def from_config(cls, cfg: ConfigReader) -> ClassifierInfo:
        raw = cfg.data.get("id2label") or {}
        if not isinstance(raw, dict):
            raise CheckpointError(f"{cfg.source}: id2label must be an object")
        id2label = {str(k): str(v) for k, v in raw.items()}
        num_labels = cfg.data.get("num_labels") or len(id2label) or 2
        if not id2label:
            id2label = {str(i): f"LABEL_{i}" for i in range(num_labels)}
        if len(id2label) != num_labels:
            raise CheckpointError(
                f"{cfg.source}: num_labels {num_labels} disagrees with id2label ({len(id2label)})"
            )
        return cls(num_labels, id2label, cfg.data.get("problem_type"))
