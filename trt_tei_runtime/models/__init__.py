"""The table from Hugging Face architecture name to implementation."""

from __future__ import annotations

from ..errors import UnsupportedArchitectureError
from .base import Task, TransformerModel
from .bert import BertForSequenceClassification, BertModel
from .roberta import RobertaForSequenceClassification, RobertaModel

ARCHITECTURES: dict[str, type[TransformerModel]] = {
    "BertModel": BertModel,
    "BertForSequenceClassification": BertForSequenceClassification,
    "RobertaModel": RobertaModel,
    "XLMRobertaModel": RobertaModel,
    "RobertaForSequenceClassification": RobertaForSequenceClassification,
    "XLMRobertaForSequenceClassification": RobertaForSequenceClassification,
}


def architecture_class(name: str) -> type[TransformerModel]:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"config.json: architecture {name!r} is not supported; supported: "
            + ", ".join(sorted(ARCHITECTURES))
        ) from None


__all__ = ["ARCHITECTURES", "Task", "TransformerModel", "architecture_class"]
