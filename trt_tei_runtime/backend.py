"""The object the Rust router calls, through PyO3.

Contract (see README "Architecture"): every batch is packed with no padding. Array
arguments are little-endian uint32 `bytes` (what the router sends) or array-likes; results
are C-contiguous float32 numpy arrays (the router reads them with `.tobytes()`).
Normalization, Matryoshka truncation and score activations happen in the router.

Bulk batches come from one router thread. When `info()["interactive_lane"]` is true, a
second router thread sends small batches with `interactive=True` at the same time; they run
on the model's interactive lane (`InferenceModel.lane`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .batch import PackedBatch
from .inference import InferenceModel, load_inference_model

log = logging.getLogger(__name__)

# How long a Python thread may hold the interpreter before a waiting one gets it. The
# default (5 ms) would let the bulk thread, while it launches a large eager batch, hold an
# interactive query for whole milliseconds; the router's process runs no other Python.
LANE_SWITCH_INTERVAL_S = 0.0002


class Backend:
    def __init__(
        self,
        model_id: str,
        revision: str | None = None,
        dtype: str | None = None,
        pooling: str | None = None,
        device: str | None = None,
        task: str | None = None,
        max_batch_tokens: int | None = None,
        max_batch_requests: int | None = None,
    ) -> None:
        # The router's batch limits size the CUDA graphs: every batch it sends replays one.
        self.model: InferenceModel = load_inference_model(
            model_id,
            revision=revision,
            device=device,
            dtype=dtype,
            pooling=pooling,
            task=task,
            max_num_tokens=max_batch_tokens,
            max_batch_size=max_batch_requests,
            full_length_must_fit=max_batch_tokens is not None,
        )
        if self.model.interactive is not None:
            sys.setswitchinterval(LANE_SWITCH_INTERVAL_S)

    def info(self) -> dict[str, Any]:
        """The router's `ModelInfo` (rust_router/src/backend/mod.rs defines the keys; a test
        checks that these are exactly those)."""
        info = self.model.info
        return {
            "model_type": info.model_type,
            "architecture": info.architecture,
            "tokenizer_path": str(info.model_dir / "tokenizer.json"),
            "hidden_size": info.hidden_size,
            "max_input_length": info.max_input_length,
            "position_offset": info.position_offset,
            "pooling": info.pooling,
            "num_labels": info.num_labels,
            "id2label": dict(info.id2label),
            "score_activation": info.score_activation,
            "prompts": dict(info.prompts),
            "default_prompt_name": info.default_prompt_name,
            # Rerankers trained on a prompt (Qwen3-Reranker): how to lay out a pair.
            "pair_template": None if info.pair_template is None else info.pair_template.as_dict(),
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "device": str(self.model.device),
            "interactive_lane": self.model.interactive is not None,
        }

    def health(self) -> None:
        """Runs one tiny forward pass; raises if the model cannot run."""
        batch = PackedBatch.from_sequences(
            [[0, 0]], position_offset=self.model.info.position_offset
        )
        self.model.hidden_states(batch)
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)

    # The router calls these with `interactive=True` from its second thread (see above).
    # `arrays`: input_ids, token_type_ids, position_ids, cu_seqlens (the router sends no
    # max_length: the batch computes its longest sequence from cu_seqlens).

    def embed(self, *arrays: Any, interactive: bool = False) -> np.ndarray:
        return self._run(self.model.embed, arrays, interactive)

    def embed_all(self, *arrays: Any, interactive: bool = False) -> np.ndarray:
        return self._run(self.model.embed_tokens, arrays, interactive)

    def predict(self, *arrays: Any, interactive: bool = False) -> np.ndarray:
        return self._run(self.model.predict, arrays, interactive)

    def _run(
        self, method: Callable[..., torch.Tensor], arrays: tuple[Any, ...], interactive: bool
    ) -> np.ndarray:
        batch = PackedBatch.from_arrays(*arrays)
        # The copy to the host follows the lane's own work, not the other lane's.
        with self.model.lane(interactive):
            return _numpy(method(batch, interactive=interactive))


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().to("cpu", torch.float32).numpy())
