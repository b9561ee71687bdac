"""Late interaction (ColBERT) as PyLate defines it: a checkpoint's query and document rules,
the token ids each input becomes, which token vectors each keeps, and MaxSim scoring.

A PyLate checkpoint is a sentence-transformers folder whose modules are a `Transformer`
and one or more `Dense` projections (no pooling); `config_sentence_transformers.json`
holds the rules read here (`pylate.models.ColBERT.__init__`, `tokenize` and `encode`):

- A query is tokenized to `query_length - 1` tokens (special tokens included), the query
  prefix token goes in after the first token, and with `do_query_expansion` the query is
  padded to `query_length` with the mask token; those expansion tokens are attended to
  only with `attend_to_expansion_tokens` (else they read the real tokens but no token
  reads them). Every token's vector is kept.
- A document is tokenized to `document_length - 1` tokens, the document prefix goes in
  the same way, and the vectors of tokens in the skiplist (punctuation) are dropped.
- Every kept vector is L2-normalized; a query scores a document by the sum over its
  vectors of the best dot product with the document's vectors (MaxSim).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoint import read_json
from .errors import CheckpointError, InputError
from .templates import Vocabulary
from .token_ids import TokenIds

INPUT_TYPES = ("query", "document")

# PyLate's defaults where the checkpoint's config leaves a field out.
DEFAULT_QUERY_PREFIX = "[Q] "
DEFAULT_DOCUMENT_PREFIX = "[D] "
DEFAULT_QUERY_LENGTH = 32
DEFAULT_DOCUMENT_LENGTH = 180
# The mask token PyLate pads queries with is the tokenizer's; these are the common names.
_MASK_TOKENS = ("[MASK]", "<mask>")


@dataclass(frozen=True)
class LateInteraction:
    """A ColBERT checkpoint's rules, with every token resolved to its id."""

    query_prefix_id: int | None  # None: an empty prefix, none inserted
    document_prefix_id: int | None
    query_length: int
    document_length: int
    expand_queries: bool
    attend_to_expansion: bool
    mask_token_id: int
    skiplist_ids: frozenset[int]
    embedding_size: int

    def length(self, input_type: str) -> int:
        return self.query_length if input_type == "query" else self.document_length

    def token_limit(self, input_type: str) -> int:
        """Tokens the tokenizer may give an input (special tokens included), before its
        prefix token goes in."""
        prefix = self.query_prefix_id if input_type == "query" else self.document_prefix_id
        return self.length(input_type) - (prefix is not None)

    def model_inputs(self, ids: TokenIds, input_type: str) -> TokenIds:
        """Tokenized inputs (each within `token_limit`) as the model reads them: the prefix
        after the first token, queries padded with mask tokens when expanded."""
        check_input_type(input_type)
        query = input_type == "query"
        prefix = self.query_prefix_id if query else self.document_prefix_id
        pad_to = self.query_length if query and self.expand_queries else 0
        rows = []
        for i in range(len(ids)):
            row = ids[i].astype(np.uint32)
            if prefix is not None:
                row = np.concatenate([row[:1], np.array([prefix], np.uint32), row[1:]])
            if row.size < pad_to:
                row = np.concatenate(
                    [row, np.full(pad_to - row.size, self.mask_token_id, np.uint32)]
                )
            rows.append(row)
        return TokenIds.from_lists([r.tolist() for r in rows])

    def kept_tokens(self, ids: np.ndarray, input_type: str) -> np.ndarray:
        """Which of one input's tokens keep their vector: all of a query's (with or without
        expansion: without, the query has no padding to drop), a document's outside the
        skiplist."""
        if input_type == "query" or not self.skiplist_ids:
            return np.ones(ids.shape, dtype=bool)
        return ~np.isin(ids, np.fromiter(self.skiplist_ids, dtype=np.int64))

    def as_dict(self) -> dict[str, Any]:
        return {
            "query_prefix_id": self.query_prefix_id,
            "document_prefix_id": self.document_prefix_id,
            "query_length": self.query_length,
            "document_length": self.document_length,
            "expand_queries": self.expand_queries,
            "attend_to_expansion": self.attend_to_expansion,
            "mask_token_id": self.mask_token_id,
            "skiplist_ids": sorted(self.skiplist_ids),
            "embedding_size": self.embedding_size,
        }


def check_input_type(input_type: object) -> str:
    if input_type not in INPUT_TYPES:
        raise InputError(f"input_type must be 'query' or 'document', got {input_type!r}")
    assert isinstance(input_type, str)
    return input_type


def is_late_interaction_folder(model_dir: Path) -> bool:
    """A PyLate checkpoint: its sentence-transformers config names MaxSim or carries
    PyLate's query/document fields."""
    cfg = read_json(model_dir / "config_sentence_transformers.json", required=False) or {}
    return cfg.get("similarity_fn_name") == "MaxSim" or "query_length" in cfg


def read_late_interaction(
    model_dir: Path, tokenizer_dir: Path, embedding_size: int
) -> LateInteraction:
    """The rules of the PyLate checkpoint in `model_dir`, tokens resolved against the
    tokenizer in `tokenizer_dir`."""
    path = model_dir / "config_sentence_transformers.json"
    cfg = read_json(path, required=False) or {}
    vocab = Vocabulary(tokenizer_dir)

    def prefix_id(key: str, default: str) -> int | None:
        prefix = cfg.get(key)
        prefix = default if prefix is None else prefix
        if not isinstance(prefix, str):
            raise CheckpointError(f"{path}: {key} must be a string, got {prefix!r}")
        return vocab.token_id(prefix, f"the {key}") if prefix else None

    def length(key: str, default: int) -> int:
        value = cfg.get(key)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, int) or value < 3:
            raise CheckpointError(f"{path}: {key} must be an integer of at least 3, got {value!r}")
        return value

    def flag(key: str, default: bool) -> bool:
        value = cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise CheckpointError(f"{path}: {key} must be true or false, got {value!r}")
        return value

    words = cfg.get("skiplist_words")
    words = list(string.punctuation) if words is None else words
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise CheckpointError(f"{path}: skiplist_words must be a list of strings")
    expand = flag("do_query_expansion", True)
    return LateInteraction(
        query_prefix_id=prefix_id("query_prefix", DEFAULT_QUERY_PREFIX),
        document_prefix_id=prefix_id("document_prefix", DEFAULT_DOCUMENT_PREFIX),
        query_length=length("query_length", DEFAULT_QUERY_LENGTH),
        document_length=length("document_length", DEFAULT_DOCUMENT_LENGTH),
        expand_queries=expand,
        # PyLate: without expansion there is nothing to attend to.
        attend_to_expansion=expand and flag("attend_to_expansion_tokens", False),
        mask_token_id=_mask_token_id(tokenizer_dir, vocab),
        # As transformers' convert_tokens_to_ids: a word not in the vocabulary is the
        # unknown token, which PyLate then skips too.
        skiplist_ids=frozenset(_token_or_unknown(vocab, w, tokenizer_dir) for w in words),
        embedding_size=embedding_size,
    )


def _mask_token_id(tokenizer_dir: Path, vocab: Vocabulary) -> int:
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        cfg = read_json(tokenizer_dir / name, required=False) or {}
        token = cfg.get("mask_token")
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str):
            return vocab.token_id(token, "query expansion")
    for token in _MASK_TOKENS:
        try:
            return vocab.token_id(token)
        except CheckpointError:
            continue
    raise CheckpointError(
        f"{tokenizer_dir}: no mask token (tokenizer_config.json's mask_token, or one of "
        f"{list(_MASK_TOKENS)}), which ColBERT query expansion pads with"
    )


def _token_or_unknown(vocab: Vocabulary, word: str, tokenizer_dir: Path) -> int:
    try:
        return vocab.token_id(word)
    except CheckpointError:
        pass
    cfg = read_json(tokenizer_dir / "tokenizer_config.json", required=False) or {}
    unknown = cfg.get("unk_token")
    if isinstance(unknown, dict):
        unknown = unknown.get("content")
    for name in ([unknown] if isinstance(unknown, str) else []) + ["[UNK]", "<unk>"]:
        try:
            return vocab.token_id(name)
        except CheckpointError:
            continue
    raise CheckpointError(f"{tokenizer_dir}: skiplist word {word!r} is not in the vocabulary")


def rows_per_sequence(vectors: torch.Tensor, cu_seqlens: torch.Tensor, width: int) -> torch.Tensor:
    """Packed token vectors `[T, D]` as `[n, width, D]`, each sequence's from row 0, zeros
    after its end (`width` at least the longest sequence)."""
    n = cu_seqlens.numel() - 1
    starts = cu_seqlens[:-1].long()
    lengths = cu_seqlens[1:].long() - starts
    sequence = torch.repeat_interleave(
        torch.arange(n, device=vectors.device), lengths, output_size=vectors.shape[0]
    )
    position = torch.arange(vectors.shape[0], device=vectors.device) - starts[sequence]
    out = vectors.new_zeros((n * width, vectors.shape[1]))
    out[sequence * width + position] = vectors
    return out.view(n, width, vectors.shape[1])


def packed_maxsim(
    vectors: torch.Tensor,
    cu_seqlens: torch.Tensor,
    kept: torch.Tensor,
    queries: torch.Tensor,
    query_spans: torch.Tensor,
    width: int,
    query_width: int,
) -> torch.Tensor:
    """MaxSim of each packed document against its own query, float32 `[n]`, all on the
    vectors' device: `vectors` `[T, D]` the documents' token vectors end to end
    (`cu_seqlens` `[n+1]`), `kept` `[T]` which of them count (outside the skiplist),
    `queries` `[R, D]` every query's vectors end to end, `query_spans` `[n, 2]` the
    [start, end) rows of document i's query, `width` at least the longest document and
    `query_width` the longest query (host numbers: nothing here waits for the device).
    Documents of different queries share one pass: each query is padded to the longest
    with zero rows, whose best dot product (0, or nothing) adds nothing."""
    n = cu_seqlens.numel() - 1
    if n == 0:
        return torch.zeros(0, dtype=torch.float32, device=vectors.device)
    docs = rows_per_sequence(vectors.float(), cu_seqlens, width)
    valid = rows_per_sequence(kept[:, None].float(), cu_seqlens, width)[..., 0] > 0
    spans = query_spans.long()
    lengths = spans[:, 1] - spans[:, 0]
    rows = torch.arange(query_width, device=vectors.device)[None, :]
    real_rows = rows < lengths[:, None]
    index = (spans[:, :1] + rows).clamp(max=max(queries.shape[0] - 1, 0))
    padded = queries.float()[index] * real_rows[..., None]
    scores = torch.einsum("nqd,ntd->nqt", padded, docs)
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    best = scores.amax(dim=2)
    # A document with no vectors left (all punctuation) scores 0, as an empty max would.
    best = torch.where(valid.any(dim=1)[:, None], best, torch.zeros_like(best))
    return best.sum(dim=1)
