"""Prompt templates that turn a (query, document) pair into the single prompt a decoder
reranker was trained on, and the checkpoint facts they need (token ids from tokenizer.json,
read with the router's tokenizer).

The template is split around the document's end: `prefix + body` is tokenized and
truncated like any text, `suffix` (pre-tokenized, special tokens and all) is appended after
truncation, so a long document never cuts off the tokens the score is read after.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CheckpointError
from .token_ids import TokenIds


@dataclass(frozen=True)
class PairTemplate:
    prefix: str
    body: str  # formatted with {instruction}, {query} and {document}
    suffix: str
    instruction: str
    suffix_ids: tuple[int, ...] = ()

    def head(self, query: str, document: str) -> str:
        """The text before the suffix; `suffix_ids` follow it after truncation."""
        return self.prefix + self.body.format(
            instruction=self.instruction, query=query, document=document
        )

    def render(self, query: str, document: str) -> str:
        """The whole prompt as one string (for reference and for routers that template)."""
        return self.head(query, document) + self.suffix

    def with_suffix_ids(self, ids: tuple[int, ...]) -> PairTemplate:
        return replace(self, suffix_ids=tuple(ids))

    def as_dict(self) -> dict[str, Any]:
        """The template for a router that tokenizes itself: the text to tokenize is
        `before_query + query + between + document + after_document`; truncate it to the
        model's maximum input length minus `len(suffix_ids)`, then append `suffix_ids`."""
        filled = self.prefix + self.body.format(
            instruction=self.instruction, query="\0", document="\1"
        )
        before_query, rest = filled.split("\0")
        between, after_document = rest.split("\1")
        return {
            "before_query": before_query,
            "between": between,
            "after_document": after_document,
            "suffix": self.suffix,
            "suffix_ids": list(self.suffix_ids),
        }


@dataclass(frozen=True)
class TextPadding:
    """Texts padded to `length` tokens with `token_id` after truncation, for models trained
    on padded texts whose pooled token is a pad (SigLIP: `padding="max_length"`, and no
    attention mask: the pads are attended to)."""

    length: int
    token_id: int

    def as_dict(self) -> dict[str, int]:
        return {"length": self.length, "token_id": self.token_id}

    def pad(self, tokens: TokenIds) -> TokenIds:
        """Every sequence (at most `length` long) followed by pads up to `length`."""
        count = len(tokens)
        padded = np.full((count, self.length), self.token_id, dtype=np.uint32)
        lengths = tokens.lengths
        rows = np.repeat(np.arange(count), lengths)
        columns = np.arange(tokens.num_tokens) - np.repeat(tokens.offsets[:-1], lengths)
        padded[rows, columns] = tokens.ids
        offsets = np.arange(count + 1, dtype=np.int64) * self.length
        return TokenIds(padded.reshape(-1), offsets)


# The documented prompt of Qwen/Qwen3-Reranker-{0.6B,4B,8B} (model card, "Transformers
# usage"): a chat turn asking for "yes" or "no", with an empty thinking block.
QWEN3_RERANKER = PairTemplate(
    prefix=(
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the "
        'Query and the Instruct provided. Note that the answer can only be "yes" or "no".'
        "<|im_end|>\n<|im_start|>user\n"
    ),
    body="<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    instruction="Given a web search query, retrieve relevant passages that answer the query",
)


class Vocabulary:
    """A checkpoint's tokenizer.json, read on first use: what a task head built from
    vocabulary rows (yes/no scoring) asks for, so model code never opens text files."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self._tokenizer: Any = None

    def _load(self) -> Any:
        if self._tokenizer is None:
            from ._router import FlatTokenizer

            path = self.model_dir / "tokenizer.json"
            if not path.is_file():
                raise CheckpointError(f"missing file tokenizer.json in {self.model_dir}")
            try:
                # Lookups only: the length limit plays no part.
                self._tokenizer = FlatTokenizer(str(path), 1)
            except Exception as exc:
                raise CheckpointError(f"cannot read {path}: {exc}") from exc
        return self._tokenizer

    def token_id(self, token: str, needed_for: str = "yes/no scoring") -> int:
        """The id of one vocabulary token, as transformers' `convert_tokens_to_ids` finds it."""
        value = self._load().token_to_id(token)
        if value is None:
            raise CheckpointError(
                f"tokenizer.json in {self.model_dir} has no token {token!r}, which "
                f"{needed_for} needs"
            )
        return int(value)

    def encode(self, text: str) -> tuple[int, ...]:
        """Token ids of `text` without special tokens added."""
        return tuple(self._load().encode_plain(text))
