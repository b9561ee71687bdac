"""The tiny random checkpoints the tests build, in one place with the snapshot generator's
(tests/snapshots/): the tokenizers (`vocab`), the config builders (`configs`), the weight
draws (`weights`) and the sentence-transformers module files (`st_modules`) are shared; one
module per family of factories builds on them:

- `encoders`: `make_checkpoint` (BERT, RoBERTa, XLM-R, MPNet, DistilBERT, DeBERTa-v2,
  ELECTRA, their classifiers and masked LMs) and `make_splade_checkpoint`;
- `families`: `make_family_checkpoint` (ModernBERT, NomicBERT, jina-embeddings-v3 and its
  LoRA adapters, Gemma3/EmbeddingGemma) and transformers' jina outputs;
- `decoders`: `make_decoder_checkpoint` (Llama, Mistral, Qwen2, Qwen3, Gemma2), the BPE
  tokenizer and transformers' decoder outputs;
- `vision`: `make_vision_checkpoint` (CLIP, SigLIP: text and vision towers, a
  preprocessor config), sample images made with Pillow and transformers' features.

Tests import from the package: `from checkpoints import make_checkpoint`.
"""

from checkpoints.decoders import (
    PAD_ID,
    VOCAB_SIZE,
    bpe_tokenizer_json,
    hf_decoder_outputs,
    hf_model,
    make_decoder_checkpoint,
    random_ids,
    tokenizer,
)
from checkpoints.encoders import make_checkpoint, make_splade_checkpoint, wordpiece_tokenizer
from checkpoints.families import (
    JINA_PROMPTS,
    JINA_TASKS,
    add_embeddinggemma_modules,
    add_jina_adapters,
    hf_jina_outputs,
    make_family_checkpoint,
)
from checkpoints.st_modules import write_sentence_transformers_files

__all__ = [
    "JINA_PROMPTS",
    "JINA_TASKS",
    "PAD_ID",
    "VOCAB_SIZE",
    "add_embeddinggemma_modules",
    "add_jina_adapters",
    "bpe_tokenizer_json",
    "hf_decoder_outputs",
    "hf_jina_outputs",
    "hf_model",
    "make_checkpoint",
    "make_decoder_checkpoint",
    "make_family_checkpoint",
    "make_splade_checkpoint",
    "random_ids",
    "tokenizer",
    "wordpiece_tokenizer",
    "write_sentence_transformers_files",
]
