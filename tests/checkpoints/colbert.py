"""Tiny random ColBERT checkpoints in PyLate's layout, and PyLate's encoder rules on them.

PyLate 1.6 (the `pylate` package) pins sentence-transformers 5.3 and transformers <= 5.3;
with this project's sentence-transformers 6 its `ColBERT` neither loads nor saves a model
(its Dense conversion and `save` read attributes sentence-transformers 6 renamed). The
folder is written here as `ColBERT.save` writes it, and `pylate_encode` follows
`ColBERT.tokenize` and `ColBERT.encode` of pylate 1.6.0 step by step, on transformers'
own model and tokenizer.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken

from checkpoints.configs import encoder_config
from checkpoints.st_modules import ST, dense_config, module
from checkpoints.vocab import WORDS, wordpiece
from checkpoints.weights import perturb

PREFIXES = ("[Q] ", "[D] ")
EMBEDDING_SIZE = 16


def make_colbert_checkpoint(
    folder: Path,
    *,
    seed: int = 0,
    query_length: int = 12,
    document_length: int = 20,
    do_query_expansion: bool = True,
    attend_to_expansion_tokens: bool = False,
    query_prefix: str = PREFIXES[0],
    document_prefix: str = PREFIXES[1],
    embedding_size: int = EMBEDDING_SIZE,
    architecture: str = "BertModel",
    **config_overrides: object,
) -> Path:
    """A random BERT (or `architecture`: ModernBertModel) with PyLate's prefix tokens
    added (its embeddings sized for them), a bias-free Dense projection to
    `embedding_size` in `1_Dense`, and PyLate's config_sentence_transformers.json.
    `config_overrides`: the backbone config's fields (the benchmark's larger shapes)."""
    import transformers

    torch.manual_seed(seed)
    tok, vocab = wordpiece("bert", WORDS)
    # PyLate adds its prefixes as ordinary added tokens (`tokenizer.add_tokens`).
    tok.add_tokens([AddedToken(p, normalized=True) for p in PREFIXES])
    if architecture == "BertModel":
        config = encoder_config(
            "BertConfig", tok.get_vocab_size(), {"pad_token_id": 0}, config_overrides
        )
        model = transformers.BertModel(config).eval()
        perturb(model)
    else:
        from checkpoints.families import _config
        from checkpoints.weights import redraw

        config = _config(architecture, tok.get_vocab_size(), **config_overrides)
        model = getattr(transformers, architecture)(config).eval()
        redraw(model, norm_center=1.0)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "BertTokenizer",
                "cls_token": "[CLS]",
                "sep_token": "[SEP]",
                "pad_token": "[MASK]",  # PyLate pads with the mask token
                "mask_token": "[MASK]",
                "unk_token": "[UNK]",
                "model_max_length": 512,
            }
        )
    )
    dense = folder / "1_Dense"
    dense.mkdir(exist_ok=True)
    weight = torch.randn(embedding_size, config.hidden_size) / config.hidden_size**0.5
    save_file({"linear.weight": weight.contiguous()}, str(dense / "model.safetensors"))
    dense_cfg = dense_config(
        config.hidden_size, embedding_size, bias=False, activation="linear.Identity"
    )
    _write(dense / "config.json", dense_cfg)
    _write(
        folder / "modules.json",
        [module(0, "", f"{ST}.Transformer"), module(1, "1_Dense", "pylate.models.Dense.Dense")],
    )
    _write(
        folder / "sentence_bert_config.json",
        {"max_seq_length": document_length - 1, "do_lower_case": False},
    )
    _write(
        folder / "config_sentence_transformers.json",
        {
            "__version__": {"pylate": "1.6.0"},
            "prompts": {},
            "default_prompt_name": None,
            "similarity_fn_name": "MaxSim",
            "query_prefix": query_prefix,
            "document_prefix": document_prefix,
            "query_length": query_length,
            "document_length": document_length,
            "attend_to_expansion_tokens": attend_to_expansion_tokens,
            "skiplist_words": list(string.punctuation),
            "do_query_expansion": do_query_expansion,
        },
    )
    return folder


def _write(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2))


def pylate_encode(folder: Path, texts: list[str], *, is_query: bool) -> list[torch.Tensor]:
    """`ColBERT(folder).encode(texts, is_query=...)` of pylate 1.6.0 in float32 on the CPU:
    one normalized `[tokens, dim]` tensor per text."""
    return PyLateRules(folder).encode(texts, is_query=is_query)


class PyLateRules:
    """pylate 1.6.0's `ColBERT` on a folder of `make_colbert_checkpoint`'s: `encode` as
    `ColBERT.encode` (texts sorted longest first into batches of `batch_size`)."""

    def __init__(self, folder: Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        import transformers
        from safetensors.torch import load_file

        self.cfg = json.loads((folder / "config_sentence_transformers.json").read_text())
        self.tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_file=str(folder / "tokenizer.json"),
            cls_token="[CLS]",
            sep_token="[SEP]",
            unk_token="[UNK]",
            mask_token="[MASK]",
        )
        # ColBERT.__init__: the mask token pads (query expansion).
        self.tokenizer.pad_token_id = self.tokenizer.mask_token_id
        self.device = torch.device(device)
        self.model = transformers.AutoModel.from_pretrained(str(folder), dtype=dtype)
        self.model = self.model.to(self.device).eval()
        weight = load_file(str(folder / "1_Dense" / "model.safetensors"))["linear.weight"]
        self.weight = weight.to(self.device, dtype)
        words = self.cfg["skiplist_words"]
        skiplist = [self.tokenizer.convert_tokens_to_ids(w) for w in words]
        self.skiplist = torch.tensor(skiplist, device=self.device)

    def encode(
        self, texts: list[str], *, is_query: bool, batch_size: int = 32
    ) -> list[torch.Tensor]:
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out: list[torch.Tensor] = [torch.empty(0)] * len(texts)
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            vectors = self._batch([texts[i] for i in rows], is_query)
            for i, v in zip(rows, vectors):
                out[i] = v
        return out

    def _batch(self, texts: list[str], is_query: bool) -> list[torch.Tensor]:
        cfg = self.cfg
        expand = cfg["do_query_expansion"]
        attend = cfg["attend_to_expansion_tokens"] and expand
        prefix = cfg["query_prefix"] if is_query else cfg["document_prefix"]
        prefix_id = self.tokenizer.convert_tokens_to_ids(prefix) if prefix else None
        length = cfg["query_length"] if is_query else cfg["document_length"]
        # ColBERT.tokenize: the Transformer module's tokenize (texts stripped), one token
        # less for the prefix, padded to the length for expanded queries.
        features = self.tokenizer(
            [t.strip() for t in texts],
            padding="max_length" if is_query and expand else True,
            truncation="longest_first",
            max_length=length - 1 if prefix_id is not None else length,
            return_tensors="pt",
        )
        ids, attention = features["input_ids"], features["attention_mask"]
        if prefix_id is not None:
            ids = _insert(ids, prefix_id)
            attention = _insert(attention, 1)
        if is_query and attend:
            attention = torch.ones_like(attention)
        ids, attention = ids.to(self.device), attention.to(self.device)
        with torch.no_grad():
            hidden = self.model(input_ids=ids, attention_mask=attention).last_hidden_state
            vectors = hidden @ self.weight.T
        # ColBERT.encode: queries keep every token when expanded, documents drop padding
        # and the skiplist; every kept row is normalized.
        if is_query:
            masks = torch.ones_like(ids, dtype=torch.bool) if expand else attention.bool()
        else:
            masks = ~torch.isin(ids, self.skiplist) & attention.bool()
        return [torch.nn.functional.normalize(v[m], p=2, dim=1) for v, m in zip(vectors, masks)]


def _insert(rows: torch.Tensor, value: int) -> torch.Tensor:
    column = torch.full((rows.shape[0], 1), value, dtype=rows.dtype)
    return torch.cat([rows[:, :1], column, rows[:, 1:]], dim=1)


def pylate_maxsim(query: torch.Tensor, documents: list[torch.Tensor]) -> torch.Tensor:
    """`pylate.scores.colbert_scores` of one query against each document, each scored on
    its own (PyLate's `rank.rerank` pads documents with zero rows, which then count as
    similarity 0 in the max; alone, a document has no padding)."""
    return torch.stack(
        [torch.einsum("sh,th->st", query, doc).max(dim=-1).values.sum() for doc in documents]
    )
