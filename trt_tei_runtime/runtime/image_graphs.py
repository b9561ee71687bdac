"""CUDA graphs of a vision tower, for batches of up to `max_images` images.

Every image is the same number of tokens, so a batch of n images is one fixed shape: its
`cu_seqlens` are 0, t, 2t, ... n t whatever the images, and a graph per image count needs no
junk sequence, only the smallest captured count ≥ n (powers of two, then `max_images`;
the rows past n are left over from earlier batches and dropped). The pixels travel into a
static float32 buffer (the tower casts them to the model dtype inside the graph); the
graphs share one memory pool, captured largest first, as the text graphs (`graphs.py`),
whose `collector_paused` they use too.

The text graphs' runner (`graphs.CudaGraphRunner`) stages token ids (`staging.InputStaging`)
and pads each bucket with a junk sequence; these stage pixels and need neither, so they are
a runner of their own.
"""

from __future__ import annotations

import gc
import logging
import time

import torch

from ..layers import AttentionMetadata
from ..models.base import ImageTower
from .graphs import collector_paused

log = logging.getLogger(__name__)


def image_buckets(max_images: int) -> list[int]:
    """1, 2, 4, ... below `max_images`, then `max_images`."""
    buckets = []
    size = 1
    while size < max_images:
        buckets.append(size)
        size *= 2
    buckets.append(max_images)
    return buckets


def image_cu_seqlens(images: int, tokens_per_image: int, device: torch.device) -> torch.Tensor:
    """`cu_seqlens` of `images` sequences of `tokens_per_image` tokens (int32)."""
    return torch.arange(
        0, (images + 1) * tokens_per_image, tokens_per_image, dtype=torch.int32, device=device
    )


class ImageGraphRunner:
    def __init__(self, tower: ImageTower, device: torch.device, max_images: int) -> None:
        self.tower = tower
        self.device = device
        self.max_images = max_images
        self.buckets = image_buckets(max_images)
        height, width = tower.image_size
        self.pixels = torch.zeros(
            (max_images, tower.channels, height, width), dtype=torch.float32, device=device
        )
        self.cu_seqlens = image_cu_seqlens(max_images, tower.tokens_per_image, device)
        self.outputs: dict[int, torch.Tensor] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def can_run(self, images: int) -> bool:
        return 0 < images <= self.max_images

    def _pass(self, images: int) -> torch.Tensor:
        meta = AttentionMetadata(
            cu_seqlens=self.cu_seqlens[: images + 1], max_seqlen=self.tower.tokens_per_image
        )
        return self.tower(self.pixels[:images], meta)

    @torch.inference_mode()
    def capture(self) -> None:
        started = time.perf_counter()
        gc.collect()  # as torch.cuda.graph does before a capture (`graphs.collector_paused`)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        for images in sorted(self.buckets, reverse=True):
            with collector_paused():
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):  # kernels compiled and chosen
                    self._pass(images)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.outputs[images] = self._pass(images)
                self.graphs[images] = graph
        torch.cuda.synchronize(self.device)
        log.info(
            "captured %d CUDA graphs of the vision tower (%s images) in %.1f s",
            len(self.graphs),
            ",".join(map(str, sorted(self.graphs))),
            time.perf_counter() - started,
        )

    def run(self, pixels: torch.Tensor) -> torch.Tensor:
        """The tower's rows `[n, D]` (model dtype) for pixels `[n, C, H, W]` (on the host or
        the device), by one replay; valid until the next `run`."""
        images = pixels.shape[0]
        bucket = next(b for b in self.buckets if b >= images)
        self.pixels[:images].copy_(pixels, non_blocking=True)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:images]
