"""One image's preprocessing on one CPU thread, the router's Rust path against the runtime's
Python one (issue 42):

    python benchmarks/bench_image_preprocess.py [--count 20] [--rounds 5]

Photo-like 640x480 JPEGs (bench_images.py's) through a CLIP processor at 224 pixels (shortest
edge, bicubic, centre crop, rescale, normalize) and a SigLIP one (fixed 384x384, bilinear):
milliseconds per image (decode + resize + normalize) of `ImagePreprocessor.preprocess`
(Pillow + numpy) and of `_router.preprocess_image` (rust_router/src/images/pixels; the
extension's build, so build it with `--release`), the best of `--rounds`. Reports only.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from bench_images import photo_jpegs

from trt_tei_runtime import _router
from trt_tei_runtime.images import ImagePreprocessor

CONFIGS = {
    "clip-224": {"image_processor_type": "CLIPImageProcessor"},
    "siglip-384": {"image_processor_type": "SiglipImageProcessor", "size": 384, "resample": 2},
}


def ms_per_image(run: Callable[[bytes], object], jpegs: list[bytes], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for jpeg in jpegs:
            run(jpeg)
        best = min(best, (time.perf_counter() - start) / len(jpegs))
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    jpegs = photo_jpegs(args.count)
    print(f"{'processor':<12} {'python ms':>10} {'rust ms':>8}")
    for name, config in CONFIGS.items():
        processor = ImagePreprocessor.from_config(config)
        steps = json.dumps(processor.steps())
        python = ms_per_image(processor.preprocess, jpegs, args.rounds)
        rust = ms_per_image(
            lambda j, s=steps: _router.preprocess_image(s, j, 64_000_000), jpegs, args.rounds
        )
        print(f"{name:<12} {python:>10.2f} {rust:>8.2f}")


if __name__ == "__main__":
    main()
