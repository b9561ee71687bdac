"""The object the Rust router calls, through PyO3.

Contract (see docs/architecture.md): every batch is packed with no padding. Array
arguments are little-endian uint32 `bytes` (what the router sends) or array-likes; results
are C-contiguous float32 numpy arrays (the router reads them with `.tobytes()`).
Normalization, Matryoshka truncation and score activations happen in the router.

One executor per device (`devices`, e.g. "all" or "cuda:0,cuda:1"; `info()["devices"]`
lists them). With several, the router passes `device=i` to every call. Per device, bulk
batches come from one router thread; when `info()["interactive_lane"]` is true, a second
router thread sends small batches with `interactive=True` at the same time, and they run on
that executor's interactive lane (`runtime.lanes`); an embedding query that fits the lane's
CUDA graphs takes its direct path there (`runtime.query_path`).

A failure of the device itself (a CUDA error) raises `DeviceError`: the router then takes
that device out of service and the others keep serving.

Where `pipelines(device)` is true (a GPU, whose work runs behind the host's), the router's
bulk thread calls `launch` instead: it starts batch k + 1 before it reads batch k's rows
back (`Launched.result`), so the device never waits for the host between two bulk batches.

Text-and-image models (`info()["image_input"]` set): the router turns each encoded image
into its pixels with `preprocess_image` on its own worker threads (Pillow and numpy release
the interpreter lock), then sends a batch's pixels end to end to `embed_images` (or
`launch("embed_images", pixels)`); an image counts as `tokens_per_image` tokens of a batch's
budget. Texts of models with `info()["text_padding"]` (SigLIP) are padded by the router to
that length with that token before they are packed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import torch

from .batch import HostArrays, PackedBatch
from .errors import DeviceError, InputError, RuntimeErrorBase
from .images import DEFAULT_MAX_IMAGE_PIXELS
from .runtime import Executor, Lane, load_executors
from .runtime.devices import parse_devices
from .runtime.dispatch import to_host
from .runtime.preemption import DEFAULT_MAX_STEP_MS

log = logging.getLogger(__name__)
T = TypeVar("T")

# How long a Python thread may hold the interpreter before a waiting one gets it. The
# default (5 ms) would let the bulk thread, while it launches a large eager batch, hold an
# interactive query for whole milliseconds; the router's process runs no other Python.
# TRT_TEI_SWITCH_INTERVAL_US overrides it.
LANE_SWITCH_INTERVAL_S = 0.0002


def lane_switch_interval_s() -> float:
    """`LANE_SWITCH_INTERVAL_S`, or TRT_TEI_SWITCH_INTERVAL_US where set (a positive
    number of microseconds)."""
    value = os.environ.get("TRT_TEI_SWITCH_INTERVAL_US")
    if value is None:
        return LANE_SWITCH_INTERVAL_S
    try:
        micros = float(value)
    except ValueError:
        micros = 0.0
    if not 0 < micros < 1e9:
        raise ValueError(
            f"TRT_TEI_SWITCH_INTERVAL_US={value!r}: expected a positive number of microseconds"
        )
    return micros / 1e6


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
        devices: str | None = None,
        max_active_dims: int | None = None,
        max_bulk_step_ms: float | None = DEFAULT_MAX_STEP_MS,
        lora_adapters: dict[str, str] | None = None,
        memory_fraction: float | None = None,
    ) -> None:
        """`device` names one device, `devices` several ("all", "cuda:0,cuda:1", "cpu,cpu");
        neither: every visible GPU, else the CPU. `max_active_dims` caps a SPLADE model's
        active dimensions per vector. `max_bulk_step_ms`: the longest step of bulk work a
        query should wait behind, where layers are longer (`runtime.preemption`); 0 or
        None: whole layers. `lora_adapters`: name -> PEFT LoRA folder; a token's type id
        then carries its adapter (`ModelInfo.lora_adapters`, `models.lora`).
        `memory_fraction`: each device's share the model must fit in, with what is in use
        there already (`runtime.memory`); None: no check."""
        if device is not None and devices is not None:
            raise ValueError("pass device or devices, not both")
        # The router's batch limits size the CUDA graphs: every batch it sends replays one.
        self.executors: list[Executor] = load_executors(
            model_id,
            devices=devices if devices is not None else device,
            revision=revision,
            dtype=dtype,
            pooling=pooling,
            task=task,
            max_num_tokens=max_batch_tokens,
            max_batch_size=max_batch_requests,
            full_length_must_fit=max_batch_tokens is not None,
            max_active_dims=max_active_dims,
            max_bulk_step_ms=max_bulk_step_ms,
            lora_adapters=lora_adapters,
            memory_fraction=memory_fraction,
        )
        # Every executor holds the same model; the first answers for all in `info()`.
        self.model = self.executors[0]
        # Per device, the arrays of the last query that took the direct path (`warm_query`).
        self._last_queries: dict[int, tuple[Any, ...]] = {}
        if self.model.interactive is not None:
            sys.setswitchinterval(lane_switch_interval_s())

    @staticmethod
    def device_names(devices: str | None = None) -> list[str]:
        """The devices a `devices` (or `device`) spec means, by name, without loading
        anything: the router starts one worker process per name (`--device-workers`)."""
        return [str(device) for device in parse_devices(devices)]

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
            # Prompt name -> adapter index, sent as every token's type id (jina-embeddings-v3).
            "adapters": dict(info.adapters),
            # Every LoRA adapter by name -> index; a token of type t under adapter i carries
            # i * adapter_type_stride + t (models.lora).
            "lora_adapters": dict(info.lora_adapters),
            "adapter_type_stride": info.adapter_type_stride,
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "device": str(self.model.device),
            "devices": [str(executor.device) for executor in self.executors],
            "interactive_lane": self.model.interactive is not None,
            # Text-and-image models: {height, width, channels, patch_size,
            # tokens_per_image} of the pixels `embed_images` takes; None for text models.
            "image_input": None if info.image_input is None else info.image_input.as_dict(),
            # SigLIP: {length, token_id}, every text padded to `length` with `token_id`.
            "text_padding": None if info.text_padding is None else info.text_padding.as_dict(),
            # Late-interaction (ColBERT) models: the rules that make an input's tokens
            # (`late_interaction.LateInteraction`); `embed_all` then gives their vectors.
            "late_interaction": (
                None if info.late_interaction is None else info.late_interaction.as_dict()
            ),
        }

    def preprocess_image(
        self, data: bytes, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
    ) -> np.ndarray:
        """An encoded image (PNG, JPEG, WebP, GIF, ...) as the float32 pixels `[C, H, W]`
        (C-contiguous; `.tobytes()` is what `embed_images` takes) the checkpoint's
        preprocessor makes (SigLIP 2 NaFlex: its block of patches and grid, the same size
        for every image, `image_patches.py`). `InputError` for bytes that are no readable
        image, a truncated one, one above `max_pixels` pixels (None: no limit), or a model
        without images. Safe to call from many threads at once; it holds the interpreter
        lock only between Pillow's and numpy's steps."""
        image_input = self.model.info.image_input
        if image_input is None:
            raise InputError(
                f"{self.model.info.architecture} embeds texts only: it takes no images"
            )
        return image_input.preprocessor.preprocess(data, max_pixels)

    def embed_images(self, pixels: Any, interactive: bool = False, device: int = 0) -> np.ndarray:
        """Image embeddings `[n, D]` float32 (not normalized) of n images' pixels, as
        little-endian float32 `bytes` of `[n, C, H, W]` (`preprocess_image`'s arrays end to
        end) or an array of that shape."""
        return self._call_images(self._pixels(pixels), interactive, device, _numpy)

    def _pixels(self, pixels: Any) -> torch.Tensor:
        image_input = self.model.info.image_input
        if image_input is None:
            raise InputError(
                f"{self.model.info.architecture} embeds texts only: it takes no images"
            )
        shape = (image_input.channels, image_input.height, image_input.width)
        if isinstance(pixels, (bytes, bytearray, memoryview)):
            flat = np.frombuffer(pixels, dtype="<f4")
            per_image = int(np.prod(shape))
            if flat.size == 0 or flat.size % per_image:
                raise InputError(
                    f"pixels: {flat.size} float32 values are not a whole number of "
                    f"{'x'.join(map(str, shape))} images"
                )
            with warnings.catch_warnings():
                # The router's buffer is read-only, and nothing writes to these pixels.
                warnings.filterwarnings("ignore", "The given NumPy array is not writable")
                return torch.from_numpy(flat.reshape(-1, *shape))
        return torch.as_tensor(np.asarray(pixels, dtype=np.float32))

    def _call_images(
        self,
        pixels: torch.Tensor,
        interactive: bool,
        device: int,
        finish: Callable[[torch.Tensor], T],
    ) -> T:
        executor = self.executors[device]
        lane = executor.lane(interactive)
        with _device_failures(executor), lane.active():
            return finish(executor.embed_images(pixels, lane))

    def health(self, device: int = 0) -> None:
        """Runs one tiny forward pass on that device; raises if the model cannot run."""
        executor = self.executors[device]
        with _device_failures(executor):
            executor.health()

    # The router calls these with `interactive=True` from its second thread (see above).
    # `arrays`: input_ids, token_type_ids, position_ids, cu_seqlens (the router sends no
    # max_length: the batch computes its longest sequence from cu_seqlens).

    def embed(self, *arrays: Any, interactive: bool = False, device: int = 0) -> np.ndarray:
        batch = HostArrays.check(*arrays)
        if interactive:
            # A query that fits the interactive lane's graphs goes without torch on its way.
            executor = self.executors[device]
            with _device_failures(executor):
                rows = executor.query_rows(batch)
            if rows is not None:
                self._last_queries[device] = arrays
                return rows
        return self._call(Executor.embed, batch, interactive, device, _numpy)

    def warm_query(self, device: int = 0) -> None:
        """Runs the host side of the last query that `embed` answered by the direct path on
        `device` again (its checks, the staging buffer, the CUDA context, the copies),
        without the model: the router's interactive thread calls it while it waits for the
        next query, so that one finds this code and data in the CPU's caches. After 20 ms
        of idling a query's host steps took twice as long as back to back
        (docs/journal/results-log.md). Nothing before the first such query."""
        arrays = self._last_queries.get(device)
        if arrays is not None:
            self.executors[device].warm_query(HostArrays.check(*arrays))

    def embed_all(self, *arrays: Any, interactive: bool = False, device: int = 0) -> np.ndarray:
        return self._run(Executor.embed_tokens, arrays, interactive, device)

    def predict(self, *arrays: Any, interactive: bool = False, device: int = 0) -> np.ndarray:
        return self._run(Executor.predict, arrays, interactive, device)

    def embed_sparse(self, *arrays: Any, interactive: bool = False, device: int = 0) -> np.ndarray:
        """SPLADE vectors as `[n, 2k]` float32: per row k (vocabulary index, value) pairs in
        index order, the index an integral float; pairs of value 0 are padding
        (`sparse.top_active`)."""
        return self._run(Executor.embed_sparse, arrays, interactive, device)

    def maxsim(
        self,
        *arrays: Any,
        interactive: bool = False,
        device: int = 0,
    ) -> np.ndarray:
        """A late-interaction model's MaxSim score of each document against its own query,
        `[n, 1]` float32. `arrays`: the documents' four batch arrays (as `embed`'s), then
        `queries`, every query's vectors as little-endian float32 bytes of `[R, D]` end to
        end, and `query_spans`, little-endian uint32 bytes of `[n, 2]`: the [start, end)
        of each document's query in `queries`, counted in float32 values (whole rows).
        Documents of several queries may share a batch."""
        batch, queries, spans = self._maxsim_arrays(arrays)
        return self._call(_scored_against(queries, spans), batch, interactive, device, _numpy)

    def _maxsim_arrays(
        self, arrays: tuple[Any, ...]
    ) -> tuple[HostArrays, torch.Tensor, torch.Tensor]:
        late = self.model.info.late_interaction
        if late is None:
            raise InputError(
                f"{self.model.info.architecture} is not a late-interaction (ColBERT) model: "
                "it has no MaxSim to score by"
            )
        if len(arrays) != 6:
            raise InputError(
                f"maxsim takes 6 arrays (the batch's 4, queries, query_spans), got {len(arrays)}"
            )
        batch = HostArrays.check(*arrays[:4])
        queries = _float32_rows(arrays[4], late.embedding_size, "queries")
        spans = np.frombuffer(arrays[5], dtype="<u4").astype(np.int64)
        if spans.size != 2 * batch.num_seqs:
            raise InputError(
                f"query_spans: {spans.size} values for {batch.num_seqs} documents "
                "(two per document)"
            )
        if np.any(spans % late.embedding_size):
            raise InputError(
                f"query_spans: a span that does not fall on rows of {late.embedding_size} values"
            )
        rows = spans.reshape(-1, 2) // late.embedding_size
        return batch, queries, torch.from_numpy(rows)

    def pipelines(self, device: int = 0) -> bool:
        """Whether `launch` returns before its batch has run: on a GPU, not on a CPU (where
        holding a finished batch back while the next one runs would only delay it)."""
        return self.executors[device].device.type == "cuda"

    def launch(self, method: str, *arrays: Any, device: int = 0) -> Launched:
        """Starts a bulk batch of `method` ("embed", "embed_all", "predict", "embed_sparse" or
        "embed_images", with the same arguments) and returns once the device holds all of
        its work, its rows on their way to the host (with the interactive lane, that is
        when its last step is queued). Read them with `Launched.result()`, before or after
        launching the next batch."""
        if method not in _LAUNCHABLE and method not in ("embed_images", "maxsim"):
            raise ValueError(
                f"launch: unknown method {method!r}, expected one of "
                f"{[*_LAUNCHABLE, 'embed_images', 'maxsim']}"
            )
        if getattr(type(self), method) is not getattr(Backend, method):
            # A subclass that wraps the method (e.g. to inject faults) keeps its say: its
            # rows are ready when this returns.
            host, wait = to_host(torch.from_numpy(getattr(self, method)(*arrays, device=device)))
        elif method == "embed_images":
            (pixels,) = arrays
            host, wait = self._call_images(self._pixels(pixels), False, device, to_host)
        elif method == "maxsim":
            batch, queries, spans = self._maxsim_arrays(arrays)
            host, wait = self._call(_scored_against(queries, spans), batch, False, device, to_host)
        else:
            host, wait = self._call(
                _LAUNCHABLE[method], HostArrays.check(*arrays), False, device, to_host
            )
        return Launched(self.executors[device], host, wait)

    def _run(
        self,
        method: Callable[[Executor, PackedBatch, Lane], torch.Tensor],
        arrays: tuple[Any, ...],
        interactive: bool,
        device: int,
    ) -> np.ndarray:
        return self._call(method, HostArrays.check(*arrays), interactive, device, _numpy)

    def _call(
        self,
        method: Callable[[Executor, PackedBatch, Lane], torch.Tensor],
        arrays: HostArrays,
        interactive: bool,
        device: int,
        finish: Callable[[torch.Tensor], T],
    ) -> T:
        """`method` on the batch, and `finish` on its result, on the lane's stream: the copy
        to the host follows the lane's own work, not the other lane's."""
        batch = arrays.packed()
        executor = self.executors[device]
        lane = executor.lane(interactive)
        with _device_failures(executor), lane.active():
            return finish(method(executor, batch, lane))


class Launched:
    """A bulk batch launched by `Backend.launch`: its rows, once they reach the host."""

    def __init__(self, executor: Executor, host: torch.Tensor, wait: Callable[[], None]) -> None:
        self._executor = executor
        self._host = host
        self._wait = wait

    def result(self) -> np.ndarray:
        """The rows as `Backend.embed` (or the launched method) returns them; waits for the
        batch to finish. A device failure meanwhile raises `DeviceError`."""
        with _device_failures(self._executor):
            self._wait()
            return _numpy(self._host)


_LAUNCHABLE: dict[str, Callable[[Executor, PackedBatch, Lane], torch.Tensor]] = {
    "embed": Executor.embed,
    "embed_all": Executor.embed_tokens,
    "predict": Executor.predict,
    "embed_sparse": Executor.embed_sparse,
}


@contextlib.contextmanager
def _device_failures(executor: Executor) -> Iterator[None]:
    """Raises a CUDA failure as `DeviceError`, naming the device; the runtime's own errors
    (bad input) and everything on the CPU pass unchanged."""
    try:
        yield
    except RuntimeErrorBase:
        raise
    except Exception as exc:
        if executor.device.type == "cuda" and _is_device_failure(exc):
            raise DeviceError(f"{executor.device} failed: {type(exc).__name__}: {exc}") from exc
        raise


def _is_device_failure(exc: BaseException) -> bool:
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("CUDA error" in text or "CUDA driver" in text)


def _scored_against(
    queries: torch.Tensor, spans: torch.Tensor
) -> Callable[[Executor, PackedBatch, Lane], torch.Tensor]:
    """`Executor.maxsim` of a batch against `queries`, as `_call` runs a method."""
    return lambda executor, batch, lane: executor.maxsim(batch, queries, spans, lane)


def _float32_rows(data: Any, width: int, name: str) -> torch.Tensor:
    """Little-endian float32 bytes (or an array) as `[rows, width]` float32."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        flat = np.frombuffer(data, dtype="<f4")
    else:
        flat = np.asarray(data, dtype=np.float32).reshape(-1)
    if flat.size % width:
        raise InputError(f"{name}: {flat.size} float32 values are not rows of {width}")
    with warnings.catch_warnings():
        # The router's buffer is read-only, and nothing writes to these values.
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return torch.from_numpy(flat.reshape(-1, width))


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().to("cpu", torch.float32).numpy())
