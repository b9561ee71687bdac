"""A corpus job's settings, and which of them decide what the output holds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

BAD_ROW_POLICIES = ("fail", "skip")
VERIFY_MODES = ("full", "size")
DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class JobOptions:
    model: str
    input: Path
    output: Path
    text_column: str = "text"
    id_column: Optional[str] = None
    devices: Optional[str] = None  # passed straight to Model(device=...)
    # "auto", "threads" or "processes": several devices in this process or one worker
    # process each (device_workers.py)
    device_workers: str = "auto"
    dimensions: Optional[int] = None
    prompt_name: Optional[str] = None
    dtype: Optional[str] = None  # the model's compute dtype; stored vectors are float32
    shard_rows: int = 100_000
    on_bad_row: str = "fail"
    overwrite: bool = False
    verify: str = "full"  # "full": size, row count and sha256 of finished shards; "size": no hash
    chunk_rows: int = 4096  # rows per model call: bounds memory, lets the model sort by length
    ray_address: Optional[str] = None
    ray_actors: Optional[int] = None
    progress_interval_s: float = 10.0  # JSON progress lines (stderr not a terminal)

    def output_identity(self) -> dict[str, Any]:
        """The options that change the shards' contents or layout. A run against an existing
        output must match them; devices, the bad-row policy, verification and chunking do
        not change a stored vector (beyond float rounding across devices) and may differ (so may
        `device_workers`: where the devices run)."""
        return {
            "model": model_reference(self.model),
            "text_column": self.text_column,
            "id_column": self.id_column,
            "dimensions": self.dimensions,
            "prompt_name": self.prompt_name,
            "dtype": self.dtype,
            "shard_rows": self.shard_rows,
            "normalize": True,
        }


def model_reference(model: str) -> str:
    """A local folder by its absolute path (the same job run from another directory still
    matches); a hub id as given."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model
