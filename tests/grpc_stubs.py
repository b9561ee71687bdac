"""The project's gRPC API (`rust_router/proto/tei.proto`) as Python modules, generated at test
time with grpcio-tools: what any client of the server would generate from the file."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

PROTO = Path(__file__).resolve().parent.parent / "rust_router" / "proto" / "tei.proto"


def generate(out_dir: Path) -> tuple[ModuleType, ModuleType]:
    """`tei_pb2` (messages) and `tei_pb2_grpc` (stubs), compiled into `out_dir` and imported."""
    from grpc_tools import protoc

    args = [
        "grpc_tools.protoc",
        f"-I{PROTO.parent}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(PROTO),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"grpc_tools.protoc could not compile {PROTO}")
    # The generated stubs import their messages as the top-level module `tei_pb2`.
    sys.path.insert(0, str(out_dir))
    try:
        return importlib.import_module("tei_pb2"), importlib.import_module("tei_pb2_grpc")
    finally:
        sys.path.remove(str(out_dir))
