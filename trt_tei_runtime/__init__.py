"""trt_tei_runtime: fast embedding, reranking and classification inference."""

from .errors import (
    CheckpointError,
    InputError,
    UnsupportedArchitectureError,
    WeightError,
)
from .model import Model
from .models import ARCHITECTURES

__version__ = "0.1.0"

__all__ = [
    "ARCHITECTURES",
    "CheckpointError",
    "InputError",
    "Model",
    "UnsupportedArchitectureError",
    "WeightError",
    "__version__",
]
