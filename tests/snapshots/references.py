"""The snapshot suite's references: the fixed inputs, and how `transformers` and
sentence-transformers compute the outputs each check of a row compares with."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# --- fixed inputs -----------------------------------------------------------------------------

TEXTS = [
    "the cat sat on the mat",
    "what is the capital of france",
    "paris is a city in france on a river",
    "a",
    "Fast embedding server, for LONG text!",
    "the dog read a book about the blue house and the green tree by the water",
    "Zürich naïve café 1234",
]
QUERY = "what is the capital of france"
DOCUMENTS = ["paris is the capital of france", "the cat sat on the mat", "yes", "a blue house"]
# Classifiers score pairs (cross-encoders) and single texts.
CLASSIFIER_INPUTS: list[Any] = [[QUERY, d] for d in DOCUMENTS] + [TEXTS[0], TEXTS[4]]

# --- references -------------------------------------------------------------------------------


def sparse_reference(folder: Path) -> torch.Tensor:
    """SparseEncoder's vectors of TEXTS, dense `(n, vocab)`."""
    from sentence_transformers import SparseEncoder

    encoder = SparseEncoder(str(folder), device="cpu")
    return encoder.encode(TEXTS, convert_to_sparse_tensor=True).to_dense()


def embed_reference(folder: Path) -> torch.Tensor:
    """sentence-transformers' embeddings of TEXTS with the folder's modules (unnormalized)."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(
        str(folder),
        device="cpu",
        model_kwargs={"dtype": torch.float32, "attn_implementation": "eager"},
    )
    return torch.from_numpy(st.encode(TEXTS, batch_size=4, convert_to_numpy=True))


def classifier_reference(folder: Path) -> torch.Tensor:
    """transformers' logits for each of CLASSIFIER_INPUTS, one at a time (no padding)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    # transformers 5 tokenizers leave token type ids out unless asked; BERT pairs need them.
    types = "token_type_ids" in inspect.signature(model.forward).parameters
    rows = []
    with torch.no_grad():
        for item in CLASSIFIER_INPUTS:
            texts = item if isinstance(item, list) else [item]
            enc = tok(*texts, return_tensors="pt", return_token_type_ids=types)
            rows.append(model(**enc).logits[0].float())
    return torch.stack(rows)


def yes_no_reference(folder: Path) -> torch.Tensor:
    """Qwen3-Reranker scoring as its model card does it: the causal LM's logit("yes") -
    logit("no") after the templated (query, document) prompt, one pair at a time."""
    import transformers

    from trt_tei_runtime.templates import QWEN3_RERANKER as t

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    rows = []
    with torch.no_grad():
        for doc in DOCUMENTS:
            body = t.body.format(instruction=t.instruction, query=QUERY, document=doc)
            ids = [
                i
                for part in (t.prefix, body, t.suffix)
                for i in tok(part, add_special_tokens=False)["input_ids"]
            ]
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            rows.append((logits[yes] - logits[no]).reshape(1))
    return torch.stack(rows)


# --- checks -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One check of a snapshot: load with `task`, run `kind` on `inputs`, compare with the
    output stored under `key` in outputs.safetensors."""

    task: str | None
    # "embed": Model.embed, cosine; "scores": Model.predict raw logits, 1e-4; "sparse":
    # Model.embed_sparse as a dense (n, vocab) array, 1e-4.
    kind: str
    inputs: list[Any]
    reference: Callable[[Path], torch.Tensor]

    @property
    def key(self) -> str:
        return self.task or "default"


# Tasks selected with `task=` at load (trt_tei_runtime.models.TASKS): how each is checked.
TASK_REFERENCES: dict[str, Callable[[], Check]] = {
    "rerank-yes-no": lambda: Check(
        "rerank-yes-no", "scores", [[QUERY, d] for d in DOCUMENTS], yes_no_reference
    ),
}
