"""The table from Hugging Face architecture name to implementation."""

from __future__ import annotations

from ..errors import InputError, UnsupportedArchitectureError
from .base import Task, TransformerModel
from .bert import BertForSequenceClassification, BertModel
from .gemma2 import (
    Gemma2ForCausalLM,
    Gemma2ForSequenceClassification,
    Gemma2Model,
    Gemma2YesNoReranker,
)
from .llama import (
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    LlamaModel,
    LlamaYesNoReranker,
)
from .mistral import (
    MistralForCausalLM,
    MistralForSequenceClassification,
    MistralModel,
    MistralYesNoReranker,
)
from .qwen2 import Qwen2ForCausalLM, Qwen2ForSequenceClassification, Qwen2Model, Qwen2YesNoReranker
from .qwen3 import Qwen3ForCausalLM, Qwen3ForSequenceClassification, Qwen3Model, Qwen3YesNoReranker
from .roberta import RobertaForSequenceClassification, RobertaModel

ARCHITECTURES: dict[str, type[TransformerModel]] = {
    "BertModel": BertModel,
    "BertForSequenceClassification": BertForSequenceClassification,
    "RobertaModel": RobertaModel,
    "XLMRobertaModel": RobertaModel,
    "RobertaForSequenceClassification": RobertaForSequenceClassification,
    "XLMRobertaForSequenceClassification": RobertaForSequenceClassification,
    # Decoders: base models and causal LMs embed (last-token pooling by default).
    "LlamaModel": LlamaModel,
    "LlamaForCausalLM": LlamaForCausalLM,
    "LlamaForSequenceClassification": LlamaForSequenceClassification,
    "MistralModel": MistralModel,
    "MistralForCausalLM": MistralForCausalLM,
    "MistralForSequenceClassification": MistralForSequenceClassification,
    "Qwen2Model": Qwen2Model,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen2ForSequenceClassification": Qwen2ForSequenceClassification,
    "Qwen3Model": Qwen3Model,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3ForSequenceClassification": Qwen3ForSequenceClassification,
    "Gemma2Model": Gemma2Model,
    "Gemma2ForCausalLM": Gemma2ForCausalLM,
    "Gemma2ForSequenceClassification": Gemma2ForSequenceClassification,
}

# Tasks a checkpoint can be loaded for other than the one its architecture implies,
# selected with `task=` at load: task -> architecture -> implementation.
TASKS: dict[str, dict[str, type[TransformerModel]]] = {
    # A causal LM scored as logit("yes") - logit("no") at the last token, with the
    # Qwen3-Reranker prompt template (Qwen/Qwen3-Reranker-*).
    "rerank-yes-no": {
        "Qwen3ForCausalLM": Qwen3YesNoReranker,
        "Qwen2ForCausalLM": Qwen2YesNoReranker,
        "LlamaForCausalLM": LlamaYesNoReranker,
        "MistralForCausalLM": MistralYesNoReranker,
        "Gemma2ForCausalLM": Gemma2YesNoReranker,
    },
}


def architecture_class(name: str, task: str | None = None) -> type[TransformerModel]:
    if task is not None:
        if task not in TASKS:
            raise InputError(f"unknown task {task!r}; supported: {', '.join(sorted(TASKS))}")
        try:
            return TASKS[task][name]
        except KeyError:
            raise UnsupportedArchitectureError(
                f"task {task!r} does not apply to architecture {name!r}; it applies to: "
                + ", ".join(sorted(TASKS[task]))
            ) from None
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"config.json: architecture {name!r} is not supported; supported: "
            + ", ".join(sorted(ARCHITECTURES))
        ) from None


__all__ = ["ARCHITECTURES", "TASKS", "Task", "TransformerModel", "architecture_class"]
