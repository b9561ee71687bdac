"""`trt-tei-build CONFIG.yaml --output DIR [--force]`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ..errors import RuntimeErrorBase
from .build import build_engine
from .config import BuilderConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trt-tei-build",
        description="Build an engine directory (fused, optionally FP8 weights + manifest) "
        "from a builder YAML such as release_matrix_cfg/builder_config_embed.yaml.",
    )
    parser.add_argument("config", type=Path, help="builder YAML")
    parser.add_argument("--output", "-o", type=Path, required=True, help="engine directory")
    parser.add_argument(
        "--force",
        action="store_true",
        help="write an FP8 engine even if it fails the quality gate (recorded in the manifest)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        manifest = build_engine(BuilderConfig.from_yaml(args.config), args.output, force=args.force)
    except RuntimeErrorBase as exc:
        print(f"trt-tei-build: error: {exc}", file=sys.stderr)
        return 2
    summary = {k: manifest[k] for k in ("architecture", "dtype", "quantization", "build_seconds")}
    print(json.dumps(summary, indent=2))
    print(f"engine written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
