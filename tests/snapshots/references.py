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
# Text-and-image models' images: (width, height, mode, seed) of a PNG
# (checkpoints.vision.png_image): landscape, portrait, smaller than the model's size, and
# RGBA, greyscale and palette modes.
IMAGES: list[list[Any]] = [
    [48, 40, "RGB", 1],
    [30, 64, "RGBA", 2],
    [20, 20, "L", 3],
    [70, 33, "P", 4],
]
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


def contrastive_text_reference(folder: Path) -> torch.Tensor:
    """`get_text_features` of each of TEXTS alone, tokenized by transformers with
    truncation and, for SigLIP and SigLIP 2, `padding="max_length"` (as their model cards say)."""
    import transformers

    model = transformers.AutoModel.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), pad_token="<pad>"
    )
    length = model.config.text_config.max_position_embeddings
    padding = "max_length" if model.config.model_type in ("siglip", "siglip2") else False
    rows = []
    with torch.no_grad():
        for text in TEXTS:
            enc = tok(
                text, truncation=True, max_length=length, padding=padding, return_tensors="pt"
            )
            rows.append(model.get_text_features(input_ids=enc["input_ids"]).pooler_output[0])
    return torch.stack(rows)


def image_reference(folder: Path) -> torch.Tensor:
    """`get_image_features` of IMAGES on the pixels of transformers' PIL processor of the
    checkpoint's preprocessor_config.json."""
    import io
    import json

    import transformers
    from checkpoints.vision import png_image
    from PIL import Image
    from transformers.image_utils import load_image
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    config = json.loads((folder / "preprocessor_config.json").read_text())
    kind = config.pop("image_processor_type")
    processor = {
        "CLIPImageProcessor": CLIPImageProcessorPil,
        "SiglipImageProcessor": SiglipImageProcessorPil,
        # NaFlex: patches, their mask and each image's grid.
        "Siglip2ImageProcessor": Siglip2ImageProcessorPil,
    }[kind](**config)
    images = [load_image(Image.open(io.BytesIO(png_image(*spec)))) for spec in IMAGES]
    inputs = dict(processor(images=images, return_tensors="pt"))
    model = transformers.AutoModel.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        return model.get_image_features(**inputs).pooler_output


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


def colbert_multivector_reference(folder: Path) -> torch.Tensor:
    """PyLate's token vectors (tests/checkpoints/colbert.py) of TEXTS as queries, then as
    documents, every text's rows end to end."""
    from checkpoints.colbert import pylate_encode

    rows = [
        vectors
        for is_query in (True, False)
        for vectors in pylate_encode(folder, TEXTS, is_query=is_query)
    ]
    return torch.cat(rows)


def colbert_maxsim_reference(folder: Path) -> torch.Tensor:
    """PyLate's MaxSim of QUERY against each of DOCUMENTS, `(n, 1)`."""
    from checkpoints.colbert import pylate_encode, pylate_maxsim

    query = pylate_encode(folder, [QUERY], is_query=True)[0]
    documents = pylate_encode(folder, DOCUMENTS, is_query=False)
    return pylate_maxsim(query, documents).reshape(-1, 1)


# --- checks -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One check of a snapshot: load with `task`, run `kind` on `inputs`, compare with the
    output stored under `key` in outputs.safetensors."""

    task: str | None
    # "embed": Model.embed, cosine; "scores": Model.predict raw logits, 1e-4; "sparse":
    # Model.embed_sparse as a dense (n, vocab) array, 1e-4; "embed_images":
    # Model.embed_images of PNGs made from `inputs` (IMAGES), cosine; "multivector":
    # Model.embed_multivector of `inputs` as queries then documents, every token's row end
    # to end, cosine per row; "maxsim": Model.maxsim_scores of `inputs[0]` against the rest,
    # 1e-4.
    kind: str
    inputs: list[Any]
    reference: Callable[[Path], torch.Tensor]

    @property
    def key(self) -> str:
        """Its output's name in outputs.safetensors: a row's image check (and a ColBERT
        row's scores) sits beside its own task's check."""
        return {"embed_images": "images", "maxsim": "maxsim"}.get(self.kind, self.task or "default")


def colbert_checks() -> list[Check]:
    """A late-interaction row: its token vectors (cosine per token) and MaxSim scores."""
    return [
        Check(None, "multivector", TEXTS, colbert_multivector_reference),
        Check(None, "maxsim", [QUERY, *DOCUMENTS], colbert_maxsim_reference),
    ]


# Tasks selected with `task=` at load (trt_tei_runtime.models.TASKS): how each is checked.
TASK_REFERENCES: dict[str, Callable[[], Check]] = {
    "rerank-yes-no": lambda: Check(
        "rerank-yes-no", "scores", [[QUERY, d] for d in DOCUMENTS], yes_no_reference
    ),
}
