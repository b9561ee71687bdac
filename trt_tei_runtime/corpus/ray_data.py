"""Ray Data: embed a text column of a `ray.data.Dataset`, one `Model` per actor.

    import ray
    from trt_tei_runtime.corpus.ray_data import EmbedBatches, embed_dataset

    ds = ray.data.read_parquet("s3://bucket/corpus/")
    ds = embed_dataset(ds, "BAAI/bge-base-en-v1.5", text_column="text", concurrency=8)
    ds.write_parquet("s3://bucket/vectors/")

or with `map_batches` directly:

    ds.map_batches(EmbedBatches, fn_constructor_kwargs={"model": "..."}, concurrency=8,
                   num_gpus=1, batch_size=1024)
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pyarrow as pa

from ..errors import InputError
from .reader import Rows
from .rows import BadRow, embed, output_schema, screen, tokenize

__all__ = ["EmbedBatches", "default_device", "embed_dataset"]


def default_device() -> str:
    """The GPU Ray assigned this actor (Ray sets CUDA_VISIBLE_DEVICES), else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class EmbedBatches:
    """A callable class for `Dataset.map_batches` (batch_format "numpy", the default): adds an
    `embedding` column ((n, dim) float32, L2-normalized) and a `num_tokens` column.

    Rows whose text is missing, null, not a string or empty raise an `InputError` naming the
    row (and its `id_column` value), or with `on_bad_row="skip"` are dropped from the batch.
    """

    def __init__(
        self,
        model: str,
        *,
        text_column: str = "text",
        id_column: Optional[str] = None,
        output_column: str = "embedding",
        device: Optional[str] = None,
        dtype: Optional[str] = None,
        dimensions: Optional[int] = None,
        prompt_name: Optional[str] = None,
        on_bad_row: str = "fail",
    ) -> None:
        from ..model import Model

        if on_bad_row not in ("fail", "skip"):
            raise InputError(f"on_bad_row must be 'fail' or 'skip', got {on_bad_row!r}")
        self.model = Model(model, device=device or default_device(), dtype=dtype)
        self.text_column = text_column
        self.id_column = id_column
        self.output_column = output_column
        self.dimensions = dimensions
        self.prompt_name = prompt_name
        self.on_bad_row = on_bad_row
        dim = dimensions or self.model.info.hidden_size
        self._schema = output_schema(pa.int64(), dim)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.text_column not in batch:
            raise InputError(f"no column {self.text_column!r} in the batch; it has {sorted(batch)}")
        texts = list(batch[self.text_column])
        n = len(texts)
        ids = batch[self.id_column] if self.id_column else np.arange(n)
        rows = Rows(0, pa.array(range(n), type=pa.int64()), texts)
        screened = screen(rows)
        tokenized = tokenize(self.model, screened, self.prompt_name)
        if tokenized.bad and self.on_bad_row == "fail":
            raise InputError(_describe(tokenized.bad[0], ids))
        out = embed(self.model, tokenized, self.dimensions, self._schema)
        keep = out.column("id").to_numpy()  # positions in this batch of the rows kept
        result = {k: np.asarray(v)[keep] for k, v in batch.items()}
        dim = self._schema.field("embedding").type.list_size
        vectors = out.column("embedding").flatten().to_numpy(zero_copy_only=False)
        result[self.output_column] = vectors.reshape(len(keep), dim)
        result["num_tokens"] = out.column("num_tokens").to_numpy()
        return result


def _describe(bad: BadRow, ids: Any) -> str:
    return f"row {bad.row} of the batch (id {ids[bad.row]!r}): {bad.reason}"


def embed_dataset(
    ds: Any,
    model: str,
    *,
    concurrency: Optional[int] = None,
    batch_size: int = 1024,
    num_gpus: Optional[float] = None,
    **kwargs: Any,
) -> Any:
    """`ds.map_batches(EmbedBatches, ...)` with one actor per GPU on GPU clusters (`num_gpus=1`
    each) and one CPU each otherwise. `kwargs` go to `EmbedBatches`."""
    import ray

    gpus = int(ray.cluster_resources().get("GPU", 0))
    if num_gpus is None:
        num_gpus = 1 if gpus else 0
    if concurrency is None:
        concurrency = max(1, gpus) if num_gpus else max(1, len(_cpu_nodes()))
    return ds.map_batches(
        EmbedBatches,
        fn_constructor_kwargs={"model": model, **kwargs},
        batch_size=batch_size,
        concurrency=concurrency,
        num_gpus=num_gpus,
        num_cpus=0 if num_gpus else 1,
    )


def _cpu_nodes() -> list[dict[str, Any]]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1]
