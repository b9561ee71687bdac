"""The table from Hugging Face architecture name to implementation: one row per family.

A new family is one file with its base model (a `TransformerModel` subclass, and its
`classification_head` if it has `*ForSequenceClassification` checkpoints) plus one row
here; `adapters` derives every architecture name of the row from it.
"""

from __future__ import annotations

from ..errors import InputError, UnsupportedArchitectureError
from .adapters import (
    DECODER,
    ENCODER,
    MASKED_LM,
    Family,
    Variant,
    architecture_tables,
    as_causal_lm_embedder,
    as_embedder,
)
from .base import Task, TransformerModel
from .bert import BertModel
from .clip import ClipModel
from .deberta_v2 import DebertaV2Model
from .distilbert import DistilBertModel
from .electra import ElectraModel
from .gemma2 import Gemma2Model
from .gemma3 import Gemma3TextModel
from .jina_v3 import JinaEmbeddingsV3Model
from .llama import LlamaModel
from .mistral import MistralModel
from .modernbert import ModernBertModel
from .mpnet import MPNetModel
from .nomic_bert import NomicBertModel
from .qwen2 import Qwen2Model
from .qwen3 import Qwen3Model
from .roberta import RobertaModel
from .siglip import SiglipModel
from .siglip2 import Siglip2Model

# Families whose checkpoints only embed.
EMBEDDER: tuple[Variant, ...] = (Variant("Model", as_embedder),)

FAMILIES: tuple[Family, ...] = (
    Family("Bert", BertModel, ENCODER + MASKED_LM),
    Family("Roberta", RobertaModel, ENCODER + MASKED_LM),
    Family("XLMRoberta", RobertaModel, ENCODER + MASKED_LM),
    Family("DistilBert", DistilBertModel, ENCODER + MASKED_LM),
    Family("Electra", ElectraModel, ENCODER),
    Family("MPNet", MPNetModel, ENCODER),
    Family("DebertaV2", DebertaV2Model, ENCODER),
    Family("ModernBert", ModernBertModel, ENCODER),
    Family("NomicBert", NomicBertModel, EMBEDDER),
    # LoRA task adapters chosen per request (prompt name -> adapter, see jina_v3.py).
    Family("JinaEmbeddingsV3", JinaEmbeddingsV3Model, EMBEDDER),
    Family("Llama", LlamaModel, DECODER),
    Family("Mistral", MistralModel, DECODER),
    Family("Qwen2", Qwen2Model, DECODER),
    Family("Qwen3", Qwen3Model, DECODER),
    Family("Gemma2", Gemma2Model, DECODER),
    # EmbeddingGemma: bidirectional, its sentence-transformers Dense modules after pooling.
    Family("Gemma3Text", Gemma3TextModel, EMBEDDER),
    Family("Gemma3", Gemma3TextModel, (Variant("ForCausalLM", as_causal_lm_embedder),)),
    # Texts and images in one space: the text tower is the model, the vision tower its
    # `image_tower` (models/contrastive.py).
    Family("CLIP", ClipModel, EMBEDDER),
    Family("Siglip", SiglipModel, EMBEDDER),
    # SigLIP 2 NaFlex: images at their own aspect ratio, as variable-length patch sequences.
    Family("Siglip2", Siglip2Model, EMBEDDER),
)

# ARCHITECTURES: name -> class. TASKS: tasks a checkpoint can be loaded for other than the
# one its architecture implies, selected with `task=` at load: task -> name -> class
# ("rerank-yes-no": a causal LM scored as logit("yes") - logit("no") at the last token, with
# the Qwen3-Reranker prompt template, for Qwen/Qwen3-Reranker-*).
ARCHITECTURES, TASKS = architecture_tables(FAMILIES)


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


__all__ = ["ARCHITECTURES", "FAMILIES", "TASKS", "Task", "TransformerModel", "architecture_class"]
