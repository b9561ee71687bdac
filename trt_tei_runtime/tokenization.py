"""Tokenizing for `Model` and corpus jobs by the router's own encode rules.

`FlatTokenizer` (rust_router/src/python_tokenizer.rs) is the router's tokenizer and its
request rules: named and default prompts, the adapter a prompt selects, a decoder
reranker's pair template, truncation at the model's limit (special tokens kept) and the
refusal of a longer input without it. The checkpoint's tokenizer.json often carries its own
truncation and padding settings (all-MiniLM-L6-v2's truncates at 128): both are switched
off, as the router does. This module only turns its answers into arrays and errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np

from ._router import FlatTokenizer
from .errors import CheckpointError, InputError
from .long_inputs import Windows
from .templates import PairTemplate, TextPadding
from .token_ids import TokenIds

TextOrPair = Union[str, Sequence[str]]


@dataclass(frozen=True)
class Encoded:
    """One input's token ids and type ids, as lists (`TextTokenizer.encode`)."""

    ids: list[int]
    type_ids: list[int]
    _tokenizer: FlatTokenizer

    @property
    def tokens(self) -> list[str]:
        """The vocabulary token of each id."""
        return [self._tokenizer.id_to_token(i) or "" for i in self.ids]


class TextTokenizer:
    def __init__(
        self,
        model_dir: Path,
        max_length: int,
        *,
        prompts: Optional[dict[str, str]] = None,
        default_prompt_name: Optional[str] = None,
        pair_template: Optional[PairTemplate] = None,
        adapters: Optional[dict[str, int]] = None,
        padding: Optional[TextPadding] = None,
    ) -> None:
        """`padding`: texts to embed are padded after truncation (SigLIP's)."""
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(
                f"missing file tokenizer.json in {model_dir} (save the tokenizer with a "
                "fast tokenizer, e.g. transformers' AutoTokenizer(...).save_pretrained)"
            )
        template = None
        if pair_template is not None:
            parts = pair_template.as_dict()
            template = (
                parts["before_query"],
                parts["between"],
                parts["after_document"],
                list(pair_template.suffix_ids),
            )
        try:
            self._flat = FlatTokenizer(
                str(path), max_length, prompts, default_prompt_name, template, adapters
            )
        except ValueError as exc:
            raise CheckpointError(f"cannot read {path}: {exc}") from exc
        self.max_length = max_length
        self._prompts = sorted(prompts or {})
        self._pair_template = pair_template
        self._padding = padding

    def encode_ids(
        self, texts: Sequence[str], prompt_name: Optional[str] = None, *, truncate: bool = True
    ) -> tuple[TokenIds, Optional[TokenIds]]:
        """Token ids and type ids (None: all zeros) of each text to embed, with the prompt
        `prompt_name` names (default: the model's default prompt), in flat arrays. With
        `truncate=False` a text longer than the model's limit is an error naming its index,
        the limit and its length. The interpreter lock is released while the texts are
        tokenized."""
        try:
            ids, type_ids, lengths = self._flat.encode(list(texts), prompt_name, truncate)
        except ValueError as exc:
            raise self._error(exc, prompt_name, pairs=None, truncate=truncate) from None
        tokens = TokenIds.from_buffers(ids, lengths)
        if self._padding is not None:
            # Pads take type 0 as every token of a model without adapters does.
            return self._padding.pad(tokens), None
        # No type ids: all are 0 (no adapter).
        return tokens, (TokenIds.from_buffers(type_ids, lengths) if type_ids else None)

    def encode_windows(
        self,
        texts: Sequence[str],
        prompt_name: Optional[str],
        *,
        overlap: int,
        max_chunks: int,
        first: int = 0,
    ) -> Windows:
        """Every text cut into windows as `long_input: chunk` cuts it on the server (a text
        within the limit is one window). `first`: the index of `texts[0]` in the caller's
        inputs, which errors name."""
        try:
            flat, counts, weights = self._flat.encode_windows(
                list(texts), prompt_name, overlap, max_chunks
            )
        except ValueError as exc:
            if len(exc.args) == 4 and exc.args[1] == "too_many_chunks":
                _, _, index, needed = exc.args
                return_error = InputError(
                    f"input {first + index} needs {needed} windows, more than max_chunks "
                    f"({max_chunks})"
                )
                raise return_error from None
            if len(exc.args) == 4 and exc.args[1] == "chunk_overlap":
                raise InputError(exc.args[0].removeprefix("Input validation error: ")) from None
            raise self._error(exc, prompt_name, pairs=None, truncate=False) from None
        ids, type_ids, lengths = flat
        tokens = TokenIds.from_buffers(ids, lengths)
        return Windows(
            tokens,
            TokenIds.from_buffers(type_ids, lengths) if type_ids else None,
            np.frombuffer(counts, dtype="<u4"),
            np.frombuffer(weights, dtype="<u4"),
        )

    def encode_flat(
        self, inputs: Sequence[TextOrPair], *, truncate: bool = True, first: int = 0
    ) -> tuple[TokenIds, TokenIds]:
        """Token ids and type ids of texts (as given) or (text, text) pairs to score; a pair
        is laid out with the model's pair template if it has one. `first`: the index of
        `inputs[0]` in the caller's inputs, which a too long templated pair's error names."""
        items = [_as_input(item, i) for i, item in enumerate(inputs)]
        try:
            ids, type_ids, lengths = self._flat.encode_pairs(items, truncate)
        except ValueError as exc:
            raise self._error(exc, None, pairs=items, truncate=truncate, first=first) from None
        tokens = TokenIds.from_buffers(ids, lengths)
        if not type_ids:  # all 0
            return tokens, TokenIds(np.zeros_like(tokens.ids), tokens.offsets)
        return tokens, TokenIds.from_buffers(type_ids, lengths)

    def encode(self, inputs: Sequence[TextOrPair], *, truncate: bool = True) -> list[Encoded]:
        """`encode_flat` as one `Encoded` (lists of ids and type ids) per input."""
        ids, type_ids = self.encode_flat(inputs, truncate=truncate)
        return [Encoded(i, t, self._flat) for i, t in zip(ids.to_lists(), type_ids.to_lists())]

    def adapter(self, prompt_name: Optional[str]) -> int:
        """The adapter index (type id) of a text embedded with `prompt_name` (or the default
        prompt); 0 for a model without adapters."""
        return self._flat.adapter(prompt_name)

    def _error(
        self,
        exc: ValueError,
        prompt_name: Optional[str],
        *,
        pairs: Optional[list[tuple[str, Optional[str]]]],
        truncate: bool,
        first: int = 0,
    ) -> Exception:
        if len(exc.args) != 4:
            return exc
        message, kind, index, given = exc.args
        limit = self.max_length
        if kind == "unknown_prompt":
            return InputError(
                f"unknown prompt_name {prompt_name!r}; the model has {self._prompts or 'none'}"
            )
        if kind != "too_long":
            return InputError(f"input {index}: {message}")
        template = self._pair_template
        if template is not None and pairs is not None and pairs[index][1] is not None:
            if truncate:
                suffix = len(template.suffix_ids)
                return InputError(
                    f"the prompt template's suffix alone ({suffix} tokens) fills the model's "
                    f"maximum input length {limit}"
                )
            return InputError(
                f"input {first + index} has {given} tokens with its prompt template, more than the "
                f"model's maximum of {limit}; pass truncate=True to cut it"
            )
        return InputError(
            f"input {index} has {given} tokens, more than the model's maximum of {limit}; "
            "pass truncate=True to cut it"
        )


def _as_input(item: TextOrPair, index: int) -> tuple[str, Optional[str]]:
    if isinstance(item, str):
        return (item, None)
    if (
        isinstance(item, Sequence)
        and len(item) == 2
        and all(isinstance(part, str) for part in item)
    ):
        return (item[0], item[1])
    raise InputError(f"input {index} must be a string or a pair of strings, got {item!r}")
