"""Task variants derived from a family's base model, and the architecture tables built from
one row per family.

A family file writes its base model (`BertModel`, `Qwen3Model`): a packed batch to hidden
states, plus, as methods, what its task checkpoints put on top (`classification_head`,
`token_pair_head`). Every Hugging Face architecture name of the family is then a generated
subclass of that base that attaches the head after loading: nothing is inherited from two
places, so no class order can pick the wrong `__init__` or `load`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..templates import QWEN3_RERANKER, PairTemplate, Vocabulary
from ..weights import WeightReader
from .base import Task, TransformerModel
from .config import ClassifierInfo, ConfigReader

Adapter = Callable[[type[TransformerModel], str], type[TransformerModel]]


def _subclass(
    base: type[TransformerModel], name: str, attrs: dict[str, Any]
) -> type[TransformerModel]:
    attrs = {"__module__": base.__module__, "__qualname__": name, **attrs}
    return type(name, (base,), attrs)


def as_embedder(base: type[TransformerModel], name: str) -> type[TransformerModel]:
    """The base model itself, under the architecture's name."""
    return base if name == base.__name__ else _subclass(base, name, {})


def as_causal_lm_embedder(base: type[TransformerModel], name: str) -> type[TransformerModel]:
    """A `*ForCausalLM` checkpoint used as an embedder: the LM head is left unused."""
    return _subclass(base, name, {"unused": (*base.unused, r"^lm_head\.")})


def as_sequence_classifier(base: type[TransformerModel], name: str) -> type[TransformerModel]:
    """`*ForSequenceClassification`: the base model plus the family's classification head,
    with the labels of config.json."""

    def from_checkpoint(
        cls: type[TransformerModel],
        config: dict[str, Any],
        reader: WeightReader,
        vocab: Vocabulary,
    ) -> TransformerModel:
        info = ClassifierInfo.from_config(ConfigReader(config))
        model = cls.load(config, reader)
        model.head = model.classification_head(config, reader, info.num_labels)
        model.classifier = info
        return model

    return _subclass(
        base,
        name,
        {"task": Task.CLASSIFICATION, "from_checkpoint": classmethod(from_checkpoint)},
    )


def as_masked_lm_encoder(base: type[TransformerModel], name: str) -> type[TransformerModel]:
    """`*ForMaskedLM` as a SPLADE encoder: the base model plus the family's masked-LM head,
    whose per-token vocabulary logits `sparse.py` pools into one sparse vector."""

    def from_checkpoint(
        cls: type[TransformerModel],
        config: dict[str, Any],
        reader: WeightReader,
        vocab: Vocabulary,
    ) -> TransformerModel:
        model = cls.load(config, reader)
        model.head = model.masked_lm_head(config, reader)
        return model

    attrs: dict[str, Any] = {
        "task": Task.SPARSE_EMBEDDING,
        "default_pooling": "splade",
        # BertForPreTraining checkpoints also carry the next-sentence head.
        "unused": (*base.unused, r"^cls\.seq_relationship\."),
        "from_checkpoint": classmethod(from_checkpoint),
    }
    return _subclass(base, name, attrs)


def as_token_pair_scorer(template: PairTemplate, tokens: tuple[str, str], label: str) -> Adapter:
    """A causal LM read as a reranker: logit(tokens[1]) - logit(tokens[0]) at the last
    position, with pairs rendered by `template` (Qwen3-Reranker: "no" vs "yes")."""

    def adapt(base: type[TransformerModel], name: str) -> type[TransformerModel]:
        def from_checkpoint(
            cls: type[TransformerModel],
            config: dict[str, Any],
            reader: WeightReader,
            vocab: Vocabulary,
        ) -> TransformerModel:
            first, second = (vocab.token_id(t) for t in tokens)
            model = cls.load(config, reader)
            model.head = model.token_pair_head(reader, (first, second))
            model.classifier = ClassifierInfo(1, {"0": label}, None)
            model.pair_template = template.with_suffix_ids(vocab.encode(template.suffix))
            return model

        attrs: dict[str, Any] = {
            "task": Task.CLASSIFICATION,
            "from_checkpoint": classmethod(from_checkpoint),
        }
        return _subclass(base, name, attrs)

    return adapt


as_yes_no_reranker = as_token_pair_scorer(QWEN3_RERANKER, ("no", "yes"), "yes")


@dataclass(frozen=True)
class Variant:
    """One architecture name of a family: `{family}{suffix}`, built by `adapt`. With
    `task`, the name is loaded that way only when asked (`task=` at load)."""

    suffix: str
    adapt: Adapter
    task: str | None = None


ENCODER: tuple[Variant, ...] = (
    Variant("Model", as_embedder),
    Variant("ForSequenceClassification", as_sequence_classifier),
)
# Encoders whose family writes `masked_lm_head`: SPLADE sparse encoders.
MASKED_LM: tuple[Variant, ...] = (Variant("ForMaskedLM", as_masked_lm_encoder),)
DECODER: tuple[Variant, ...] = (
    Variant("Model", as_embedder),
    # Causal LMs embed (last-token pooling by default) ...
    Variant("ForCausalLM", as_causal_lm_embedder),
    Variant("ForSequenceClassification", as_sequence_classifier),
    # ... or, asked for, score yes vs no (Qwen/Qwen3-Reranker-*).
    Variant("ForCausalLM", as_yes_no_reranker, task="rerank-yes-no"),
)


@dataclass(frozen=True)
class Family:
    """One row of the table: a Hugging Face name prefix ("Bert", "XLMRoberta"), the base
    model class, and the variants its checkpoints come in."""

    name: str
    base: type[TransformerModel]
    variants: tuple[Variant, ...]


def architecture_tables(
    families: tuple[Family, ...],
) -> tuple[dict[str, type[TransformerModel]], dict[str, dict[str, type[TransformerModel]]]]:
    """(name -> class, task -> name -> class) for every variant of every family."""
    architectures: dict[str, type[TransformerModel]] = {}
    tasks: dict[str, dict[str, type[TransformerModel]]] = {}
    for family in families:
        for variant in family.variants:
            name = family.name + variant.suffix
            table = architectures if variant.task is None else tasks.setdefault(variant.task, {})
            if name in table:
                raise ValueError(f"architecture {name!r} is listed twice")
            table[name] = variant.adapt(family.base, name)
    return architectures, tasks
