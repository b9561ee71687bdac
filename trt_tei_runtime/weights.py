"""Reading checkpoint tensors strictly.

Model classes pull their tensors by Hugging Face name through a `WeightReader`; anything a
model does not take and is not on its short list of known-unused tensors (an MLM head, a
`position_ids` buffer) is an error, as is a missing tensor or one of the wrong shape. Every
message names the tensor.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from safetensors import safe_open

from .checkpoint import read_json
from .errors import CheckpointError, WeightError

_INDEX_FILE = "model.safetensors.index.json"


def load_checkpoint_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder: safetensors (single or sharded), else a
    `pytorch_model.bin` loaded with `weights_only=True`."""
    index = read_json(folder / _INDEX_FILE, required=False)
    if index is not None:
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"malformed {folder / _INDEX_FILE}: no weight_map")
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if files:
        tensors: dict[str, torch.Tensor] = {}
        for name in files:
            path = folder / name
            if not path.is_file():
                raise CheckpointError(f"missing weight file {name} in {folder}")
            try:
                with safe_open(str(path), framework="pt") as handle:
                    for key in handle.keys():
                        tensors[key] = handle.get_tensor(key)
            except Exception as exc:  # safetensors raises its own error types
                raise CheckpointError(f"cannot read weight file {path}: {exc}") from exc
        return tensors
    bin_path = folder / "pytorch_model.bin"
    if bin_path.is_file():
        try:
            state = torch.load(bin_path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"cannot read weight file {bin_path}: {exc}") from exc
        return dict(state)
    raise CheckpointError(
        f"no weights in {folder}: expected model.safetensors, {_INDEX_FILE} or pytorch_model.bin"
    )


class WeightReader:
    """Hands out checkpoint tensors by name, checking shapes, and accounts for the rest.

    `prefix` is the name of the base model inside a task checkpoint ("bert.", "roberta.",
    "model."); `take` looks a name up with and without it, because the same architecture is
    saved both ways (a `BertModel` without, a `BertForSequenceClassification` with).
    """

    def __init__(
        self,
        tensors: dict[str, torch.Tensor],
        *,
        prefixes: Sequence[str] = ("",),
        ignore: Iterable[str] = (),
        source: str = "checkpoint",
    ) -> None:
        self._tensors = dict(tensors)
        self._prefixes = list(prefixes)
        self._ignore = [re.compile(p) for p in ignore]
        self._source = source
        # Name → shape of every tensor handed out: an engine records it so that the same
        # module tree can be rebuilt from the engine file alone (see `SkeletonReader`).
        self.taken: dict[str, tuple[int, ...]] = {}

    def has(self, name: str) -> bool:
        return self._find(name) is not None

    def take(self, name: str, shape: Sequence[int]) -> torch.Tensor:
        key = self._find(name)
        if key is None:
            raise WeightError(f"missing tensor {name!r} in {self._source}")
        tensor = self._tensors.pop(key)
        if tuple(tensor.shape) != tuple(shape):
            raise WeightError(
                f"tensor {key!r} in {self._source} has shape {tuple(tensor.shape)}, "
                f"expected {tuple(shape)}"
            )
        self.taken[name] = tuple(shape)
        return tensor

    def take_optional(self, name: str, shape: Sequence[int]) -> torch.Tensor | None:
        return self.take(name, shape) if self.has(name) else None

    def finish(self) -> None:
        """Fails on any tensor nobody took that is not known to be unused."""
        left = sorted(k for k in self._tensors if not any(p.search(k) for p in self._ignore))
        if left:
            shown = ", ".join(repr(k) for k in left[:8])
            more = f" and {len(left) - 8} more" if len(left) > 8 else ""
            raise WeightError(f"unexpected tensors in {self._source}: {shown}{more}")

    def _find(self, name: str) -> str | None:
        for prefix in self._prefixes:
            if prefix + name in self._tensors:
                return prefix + name
        return None


class SkeletonReader(WeightReader):
    """Hands out empty `meta` tensors of the recorded shapes: builds a model's module tree
    (fusions included) without reading or converting any weight. An engine fills it with
    `load_state_dict(..., assign=True)`."""

    def __init__(self, shapes: dict[str, Sequence[int]], source: str = "engine") -> None:
        super().__init__({}, source=source)
        self._shapes = {name: tuple(shape) for name, shape in shapes.items()}

    def has(self, name: str) -> bool:
        return name in self._shapes

    def take(self, name: str, shape: Sequence[int]) -> torch.Tensor:
        if self._shapes.get(name) != tuple(shape):
            raise WeightError(
                f"engine in {self._source} does not match this runtime's model code: tensor "
                f"{name!r} recorded as {self._shapes.get(name)}, expected {tuple(shape)}; "
                "rebuild the engine"
            )
        self.taken[name] = tuple(shape)
        return torch.empty(shape, device="meta")

    def finish(self) -> None:
        left = sorted(set(self._shapes) - set(self.taken))
        if left:
            raise WeightError(f"engine in {self._source} records tensors no model took: {left[:8]}")
