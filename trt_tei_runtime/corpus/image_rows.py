"""Rows of images to vectors (`--image-column`), as rows.py does texts: `screen` with
`image_problem`, then `read_images` (the thread running ahead of the model: the files of
paths read), then `embed_images` (the model's thread). A value is the encoded image's bytes
(a Parquet binary column) or a path, relative ones under the job's images folder."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

import numpy as np
import pyarrow as pa

from ..errors import InputError
from ..images import load_image
from .rows import BadRow, Screened, WindowLayout, json_id


class ImageModel(Protocol):
    """What an image job needs of `trt_tei_runtime.Model`."""

    info: Any

    def embed_images(
        self,
        images: Sequence[bytes],
        normalize: bool = True,
        dimensions: Optional[int] = None,
        show_progress_bar: Optional[bool] = None,
    ) -> np.ndarray: ...


@dataclass
class ImageChunk:
    """Input rows `start .. stop` whose images are read: the usable rows' ids, encoded images
    and input ordinals, and the bad rows."""

    start: int
    stop: int
    ids: pa.Array
    images: list[bytes]
    rows: list[int]
    tokens_per_image: int
    bad: list[BadRow] = field(default_factory=list)
    windows: Optional[WindowLayout] = None  # an image is never cut into windows

    @property
    def row_tokens(self) -> np.ndarray:
        """An image costs the model its `tokens_per_image` (its patches)."""
        return np.full(len(self.images), self.tokens_per_image, dtype=np.int64)

    @property
    def num_tokens(self) -> int:
        return len(self.images) * self.tokens_per_image

    def without(self, bad: list[BadRow]) -> ImageChunk:
        """This chunk less the rows of `bad`, which join its bad rows."""
        dropped = {b.row for b in bad}
        keep = [k for k, row in enumerate(self.rows) if row not in dropped]
        return ImageChunk(
            self.start,
            self.stop,
            self.ids.take(pa.array(keep, type=pa.int64())),
            [self.images[k] for k in keep],
            [self.rows[k] for k in keep],
            self.tokens_per_image,
            sorted(self.bad + bad, key=lambda b: b.row),
        )


def image_problem(value: Any) -> Optional[str]:
    if value is None:
        return "missing or null image"
    if isinstance(value, (bytes, bytearray)):
        return None if value else "empty image"
    if isinstance(value, str):
        return None if value.strip() else "empty image path"
    return f"image is a {type(value).__name__}, not bytes or a path"


def read_images(screened: Screened, folder: Path, tokens_per_image: int) -> ImageChunk:
    """The encoded images of `screened`'s rows: bytes as they are, paths read (relative ones
    under `folder`). A file that cannot be read is a bad row."""
    images: list[bytes] = []
    keep: list[int] = []
    bad = list(screened.bad)
    id_values: Optional[list[Any]] = None
    values: list[Any] = screened.texts  # bytes or paths: `image_problem` screened them
    for k, value in enumerate(values):
        if isinstance(value, str):
            path = folder / value.strip()
            try:
                data = path.read_bytes()
            except OSError as exc:
                id_values = id_values if id_values is not None else screened.ids.to_pylist()
                reason = f"cannot read image file {path}: {exc.strerror or exc}"
                bad.append(BadRow(screened.rows[k], json_id(id_values[k]), reason))
                continue
        else:
            data = bytes(value)
        images.append(data)
        keep.append(k)
    ids = screened.ids
    if len(keep) < len(screened.texts):
        ids = ids.take(pa.array(keep, type=pa.int64()))
        bad.sort(key=lambda b: b.row)
    rows = [screened.rows[k] for k in keep]
    return ImageChunk(screened.start, screened.stop, ids, images, rows, tokens_per_image, bad)


def unreadable(chunk: ImageChunk) -> list[BadRow]:
    """The rows of `chunk` whose bytes are no image the model reads (not an image, a
    truncated file, too many pixels), each with the reason."""
    bad: list[BadRow] = []
    id_values: Optional[list[Any]] = None
    for k, data in enumerate(chunk.images):
        try:
            load_image(data)
        except InputError as exc:
            id_values = id_values if id_values is not None else chunk.ids.to_pylist()
            bad.append(BadRow(chunk.rows[k], json_id(id_values[k]), str(exc)))
    return bad


def embed_images(
    model: ImageModel, chunk: ImageChunk, dimensions: Optional[int], dim: int
) -> tuple[ImageChunk, np.ndarray]:
    """The chunk's L2-normalized vectors, and the chunk they are of: when an image is found
    unreadable, its row becomes a bad row and the rest are embedded (each image is decoded
    once unless one of its chunk is bad)."""
    if not chunk.images:
        return chunk, np.zeros((0, dim), dtype=np.float32)
    try:
        vectors = model.embed_images(chunk.images, dimensions=dimensions, show_progress_bar=False)
        return chunk, vectors
    except InputError:
        bad = unreadable(chunk)
        if not bad:
            raise
    return embed_images(model, chunk.without(bad), dimensions, dim)
