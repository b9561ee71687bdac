"""Loading a corpus job's model, in this process or in a device worker process: the same
checks either way, so a bad checkpoint, device, prompt name or --chunk-overlap fails the job
as bad input (exit status 2) before any row is embedded."""

from __future__ import annotations

from typing import Any, Optional

from ..errors import CheckpointError, InputError
from .errors import CorpusError
from .options import Chunking


def load_model(
    model_ref: str,
    devices: Optional[str],
    dtype: Optional[str],
    prompt_name: Optional[str],
) -> Any:
    """A `Model` of `model_ref` on `devices` (as `Model(device=...)` takes them), its prompt
    name checked."""
    from ..model import Model

    try:
        model = Model(model_ref, device=devices, dtype=dtype)
    except (CheckpointError, InputError) as exc:
        raise CorpusError(f"cannot load model {model_ref!r}: {exc}") from exc
    try:
        model.tokenize_ids(["x"], prompt_name=prompt_name)
    except InputError as exc:
        raise CorpusError(f"--prompt-name: {exc}") from exc
    return model


def check_chunking(model: Any, chunking: Optional[Chunking]) -> None:
    """`--chunk-overlap` must be less than the model's window: checked on a short text,
    whose windowing checks it as a long one's would."""
    if chunking is None:
        return
    try:
        model.tokenize_windows(["x"], overlap=chunking.overlap, max_chunks=chunking.max_chunks)
    except InputError as exc:
        raise CorpusError(f"--chunk-overlap: {exc}") from exc
