"""Tiny random text-and-image checkpoints (CLIPModel, SiglipModel, Siglip2Model) made with
`transformers`:
a WordPiece tokenizer whose end-of-text token is the vocabulary's last id (as CLIP's is), a
`preprocessor_config.json` of the family's processor, and the images the tests embed, made
with Pillow. `hf_text_features` / `hf_image_features` are transformers' own outputs.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from checkpoints.vocab import LETTERS, WORDS
from checkpoints.weights import redraw

IMAGE_SIZE, PATCH = 32, 8
TEXT = dict(
    hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    max_position_embeddings=16,
)  # fmt: skip
VISION = dict(
    intermediate_size=56, num_hidden_layers=2, num_attention_heads=4, image_size=IMAGE_SIZE,
    patch_size=PATCH,
)  # fmt: skip
# CLIP: vision 40 wide, projected with the text's 32 into 24; SigLIP: both towers 32 wide.
CLIP_PROJECTION = 24
# SigLIP 2 NaFlex: a 4x4 grid of learned positions, images of up to 24 patches (a budget
# other than the grid's, as a checkpoint may be run with).
SIGLIP2_POSITIONS, SIGLIP2_BUDGET = 16, 24
PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
PROCESSORS = {
    "CLIPModel": {
        "image_processor_type": "CLIPImageProcessor",
        "size": {"shortest_edge": IMAGE_SIZE},
        "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "do_center_crop": True,
        "resample": 3,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    },
    "SiglipModel": {
        "image_processor_type": "SiglipImageProcessor",
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "resample": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    },
    "Siglip2Model": {
        "image_processor_type": "Siglip2ImageProcessor",
        "patch_size": PATCH,
        "max_num_patches": SIGLIP2_BUDGET,
        "resample": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    },
}


def preprocessor_config(architecture: str, size: int = IMAGE_SIZE) -> dict[str, Any]:
    config = json.loads(json.dumps(PROCESSORS[architecture]))
    if architecture == "Siglip2Model" and size != IMAGE_SIZE:
        config.update(patch_size=16, max_num_patches=256)
    for key in ("size", "crop_size"):
        if key in config:
            config[key] = {k: size for k in config[key]}
    return config


def text_tokenizer(architecture: str) -> Tokenizer:
    """CLIP style: `<start> text <end>`; SigLIP style: `text <end>` (padded by the model
    to its length with `<pad>`). `<end>` is the last id, as CLIP's end-of-text token."""
    vocab = {PAD: 0, UNK: 1, START: 2}
    for piece in [*WORDS, *LETTERS, *("##" + c for c in LETTERS)]:
        vocab.setdefault(piece, len(vocab))
    vocab[END] = len(vocab)
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token=UNK, max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    single = f"{START} $A {END}" if architecture == "CLIPModel" else f"$A {END}"
    tok.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[(START, vocab[START]), (END, vocab[END])]
    )
    return tok


def tokenizer_config(max_length: int) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": PAD,
        "unk_token": UNK,
        "eos_token": END,
        "model_max_length": max_length,
    }


def tiny_config(
    architecture: str,
    vocab_size: int,
    legacy_eos: bool = False,
    hidden_act: str | None = None,
    full_size: bool = False,
    patch_size: int | None = None,
) -> Any:
    """The transformers config of `make_vision_checkpoint`; `<end>` is the last id."""
    import transformers

    end = vocab_size - 1
    act = hidden_act or ("quick_gelu" if architecture == "CLIPModel" else "gelu_pytorch_tanh")
    text: dict[str, Any] = dict(TEXT, vocab_size=vocab_size, hidden_act=act, pad_token_id=0)
    vision: dict[str, Any] = dict(VISION, hidden_act=act)
    if full_size:
        text, vision = {"pad_token_id": 0}, {"patch_size": 16}
    if patch_size is not None:
        vision["patch_size"] = patch_size
    if architecture == "CLIPModel":
        text.update(eos_token_id=2 if legacy_eos else end, bos_token_id=2)
        return transformers.CLIPConfig(
            text_config=text,
            vision_config=vision if full_size else dict(vision, hidden_size=40),
            projection_dim=512 if full_size else CLIP_PROJECTION,
        )
    text.update(eos_token_id=end)
    if not full_size:
        text.update(projection_size=TEXT["hidden_size"])
        vision.update(hidden_size=TEXT["hidden_size"])
    if architecture == "Siglip2Model":
        text.update(bos_token_id=2)  # its default, Gemma's, lies outside a tiny vocabulary
        vision.pop("image_size", None)
        if not full_size:
            vision.update(num_patches=SIGLIP2_POSITIONS)
        return transformers.Siglip2Config(text_config=text, vision_config=vision)
    return transformers.SiglipConfig(text_config=text, vision_config=vision)


def make_vision_checkpoint(
    folder: Path,
    architecture: str,
    *,
    seed: int = 0,
    legacy_eos: bool = False,
    hidden_act: str | None = None,
    sentence_transformers: bool = False,
    full_size: bool = False,
    patch_size: int | None = None,
) -> Path:
    """A random `architecture` ("CLIPModel", "SiglipModel", "Siglip2Model") checkpoint with its
    tokenizer and preprocessor config. `legacy_eos`: CLIP's old `eos_token_id` 2, for which
    transformers pools at the largest token id. `sentence_transformers`: saved as
    sentence-transformers' CLIP folders are, the model in `0_CLIPModel/`. `full_size`: the
    towers of transformers' default configs (CLIP ViT-B at patch 16, SigLIP base, 224
    pixels; SigLIP 2 NaFlex base, 256 patches) with transformers' own initialization, for
    the device tests."""
    import transformers

    tok = text_tokenizer(architecture)
    config = tiny_config(
        architecture, tok.get_vocab_size(), legacy_eos, hidden_act, full_size, patch_size
    )
    size = 224 if full_size else IMAGE_SIZE
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).eval()
    if not full_size:
        redraw(model)
    model_dir = folder / "0_CLIPModel" if sentence_transformers else folder
    model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(model_dir, safe_serialization=True)
    tok.save(str(model_dir / "tokenizer.json"))
    length = config.text_config.max_position_embeddings
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(length)))
    processor = preprocessor_config(architecture, size)
    (model_dir / "preprocessor_config.json").write_text(json.dumps(processor))
    if sentence_transformers:
        module = {"idx": 0, "name": "0", "path": "0_CLIPModel"}
        module["type"] = "sentence_transformers.models.CLIPModel"
        (folder / "modules.json").write_text(json.dumps([module]))
    return folder


def hf_model(folder: Path, *, dtype: torch.dtype = torch.float32, device: str = "cpu"):  # type: ignore[no-untyped-def]
    import transformers

    config = json.loads((folder / "config.json").read_text())
    cls = getattr(transformers, config["architectures"][0])
    return cls.from_pretrained(folder, dtype=dtype, attn_implementation="eager").to(device).eval()


def hf_text_features(model: Any, ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """`get_text_features` of each sequence alone (no padding, no mask), float32."""
    device = next(model.parameters()).device
    with torch.inference_mode():
        rows = [
            model.get_text_features(
                input_ids=torch.tensor([list(seq)], device=device)
            ).pooler_output
            for seq in ids
        ]
    return torch.cat(rows).float().cpu()


def hf_image_features(model: Any, pixels: np.ndarray | dict[str, np.ndarray]) -> torch.Tensor:
    """`get_image_features` of the processor's outputs: `pixel_values`, or all of a NaFlex
    processor's (`pixel_values`, `pixel_attention_mask`, `spatial_shapes`)."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    inputs = pixels if isinstance(pixels, dict) else {"pixel_values": pixels}
    tensors = {k: torch.from_numpy(np.asarray(v)).to(device) for k, v in inputs.items()}
    tensors["pixel_values"] = tensors["pixel_values"].to(dtype)
    with torch.inference_mode():
        return model.get_image_features(**tensors).pooler_output.float().cpu()


def png_image(width: int, height: int, mode: str, seed: int) -> bytes:
    """A PNG of random pixels with a block of colour, converted to `mode` ("RGB", "RGBA",
    "L", "P"): lossless, so its pixels are the same whichever zlib wrote it."""
    rng = np.random.default_rng(seed)
    array = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    array[: height // 2, : width // 3] = [200, 30, 90]
    image = Image.fromarray(array, "RGB")
    if mode == "RGBA":
        image.putalpha(Image.fromarray(rng.integers(0, 256, (height, width), dtype=np.uint8), "L"))
    buffer = io.BytesIO()
    image.convert(mode).save(buffer, format="PNG")
    return buffer.getvalue()


def sample_images() -> list[bytes]:
    """Images of several formats, modes and shapes (landscape, portrait, smaller than the
    model's size), as encoded files."""
    rng = np.random.default_rng(0)
    shapes = [(48, 40), (30, 64), (20, 20), (64, 36), (33, 70)]
    formats = [("PNG", "RGB"), ("JPEG", "L"), ("WEBP", "RGB"), ("PNG", "RGBA"), ("GIF", "P")]
    images = []
    for (width, height), (fmt, mode) in zip(shapes, formats):
        array = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        array[: height // 2, : width // 3] = [200, 30, 90]
        buffer = io.BytesIO()
        Image.fromarray(array, "RGB").convert(mode).save(buffer, format=fmt)
        images.append(buffer.getvalue())
    return images


def reference_pixels(folder: Path, images: list[bytes]) -> np.ndarray | dict[str, np.ndarray]:
    """What transformers' PIL processor of the checkpoint's config makes: the pixels, or
    a NaFlex processor's patches with their mask and grids."""
    from transformers.image_utils import load_image
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    config = json.loads((folder / "preprocessor_config.json").read_text())
    cls = {
        "CLIPImageProcessor": CLIPImageProcessorPil,
        "SiglipImageProcessor": SiglipImageProcessorPil,
        "Siglip2ImageProcessor": Siglip2ImageProcessorPil,
    }[config["image_processor_type"]]
    fields = {k: v for k, v in config.items() if not k.endswith("_type")}
    decoded = [load_image(Image.open(io.BytesIO(data))) for data in images]
    out = cls(**fields)(images=decoded, return_tensors="np")
    if cls is Siglip2ImageProcessorPil:
        return {k: np.asarray(v) for k, v in out.items()}
    return np.asarray(out["pixel_values"])
