"""A corpus job's settings, and which of them decide what the output holds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..long_inputs import DEFAULT_MAX_CHUNKS

BAD_ROW_POLICIES = ("fail", "skip")
VERIFY_MODES = ("full", "size")
DTYPES = ("float32", "float16", "bfloat16")
# What a text over the model's limit gets: cut (as ever) or embedded whole from windows.
LONG_INPUT_MODES = ("truncate", "chunk")


@dataclass(frozen=True)
class Chunking:
    """`--long-input chunk`: a text over the model's limit is embedded whole, as the weighted
    mean of windows overlapping by `overlap` tokens (long_inputs.py, docs/server.md "Long
    inputs"); a text needing more than `max_chunks` windows is a bad row."""

    overlap: int = 0
    max_chunks: int = DEFAULT_MAX_CHUNKS


@dataclass(frozen=True)
class JobOptions:
    model: str
    input: Path
    output: Path
    text_column: str = "text"
    # `--image-column`: the job embeds images (encoded bytes, or paths resolved against
    # `image_root`, else the input file's folder) instead of texts (image_rows.py).
    image_column: Optional[str] = None
    image_root: Optional[Path] = None
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
    long_input: str = "truncate"  # LONG_INPUT_MODES
    chunk_overlap: int = 0
    max_chunks: int = DEFAULT_MAX_CHUNKS
    progress_interval_s: float = 10.0  # JSON progress lines (stderr not a terminal)

    def output_identity(self) -> dict[str, Any]:
        """The options that change the shards' contents or layout. A run against an existing
        output must match them; devices, the bad-row policy, verification and --chunk-rows do
        not change a stored vector (beyond float rounding across devices) and may differ (so may
        `device_workers`: where the devices run)."""
        return {
            "model": model_reference(self.model),
            "text_column": None if self.image_column else self.text_column,
            # Only for image jobs, so that text jobs written before the option still resume.
            **({"image_column": self.image_column} if self.image_column else {}),
            "id_column": self.id_column,
            "dimensions": self.dimensions,
            "prompt_name": self.prompt_name,
            "dtype": self.dtype,
            "shard_rows": self.shard_rows,
            "normalize": True,
            # Only when chunking, so that jobs written before the option still resume.
            **(
                {
                    "long_input": "chunk",
                    "chunk_overlap": self.chunk_overlap,
                    "max_chunks": self.max_chunks,
                }
                if self.chunking
                else {}
            ),
        }

    @property
    def input_column(self) -> str:
        """The column the job embeds: the images' or the texts'."""
        return self.image_column or self.text_column

    def images_folder(self) -> Path:
        """Where relative image paths start: `--image-root`, else the input file's folder."""
        root = self.image_root if self.image_root is not None else self.input.parent
        return Path(root).expanduser().resolve()

    @property
    def chunking(self) -> Optional[Chunking]:
        if self.long_input != "chunk":
            return None
        return Chunking(self.chunk_overlap, self.max_chunks)

    @property
    def stream_dimensions(self) -> Optional[int]:
        """The dimensions the model's stream cuts to: none when chunking, since windows are
        averaged before the cut (`rows.shard_rows`)."""
        return None if self.chunking else self.dimensions


def model_reference(model: str) -> str:
    """A local folder by its absolute path (the same job run from another directory still
    matches); a hub id as given."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model
