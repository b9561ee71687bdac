"""Tokenizing texts and text pairs with the `tokenizers` package.

The checkpoint's tokenizer.json often carries its own truncation and padding settings
(all-MiniLM-L6-v2's truncates at 128): both are switched off and the model's own limit is
applied instead, truncating the way sentence-transformers does (special tokens kept).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Union

import numpy as np
from tokenizers import Encoding, Tokenizer

from ._router import FlatTokenizer
from .errors import CheckpointError, InputError
from .token_ids import TokenIds

TextOrPair = Union[str, Sequence[str]]


class TextTokenizer:
    def __init__(self, model_dir: Path, max_length: int) -> None:
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(
                f"missing file tokenizer.json in {model_dir} (save the tokenizer with a "
                "fast tokenizer, e.g. transformers' AutoTokenizer(...).save_pretrained)"
            )
        # Two configured copies rather than one toggled: encode() stays thread-safe.
        self._full = _load(path)
        self._truncating = _load(path)
        self._truncating.enable_truncation(max_length)
        # The same tokenizer file through the router's Rust tokenizer, for texts to embed:
        # flat arrays rather than an Encoding and a list of ints per text (`encode_ids`).
        self._flat = FlatTokenizer(str(path), max_length)
        self.max_length = max_length

    def encode(self, inputs: Sequence[TextOrPair], *, truncate: bool = True) -> list[Encoding]:
        """Encodes texts or (text, text) pairs. With `truncate=False` an input longer than
        the model's limit is an error naming its index, the limit and its length."""
        texts = [_as_input(item, i) for i, item in enumerate(inputs)]
        tokenizer = self._truncating if truncate else self._full
        encodings = tokenizer.encode_batch(texts, add_special_tokens=True)
        if not truncate:
            for i, enc in enumerate(encodings):
                if len(enc.ids) > self.max_length:
                    raise InputError(
                        f"input {i} has {len(enc.ids)} tokens, more than the model's maximum "
                        f"of {self.max_length}; pass truncate=True to cut it"
                    )
        return encodings

    def encode_ids(
        self, texts: Sequence[str], prompt: str = "", *, truncate: bool = True
    ) -> TokenIds:
        """Token ids of `prompt + text` for each text, as `encode` gives them, in flat arrays.
        The interpreter lock is released while the texts are tokenized."""
        ids, lengths = self._flat.encode(list(texts), prompt, truncate)
        tokens = TokenIds.from_buffers(ids, lengths)
        if not truncate:
            too_long = np.flatnonzero(tokens.lengths > self.max_length)
            if too_long.size:
                i = int(too_long[0])
                raise InputError(
                    f"input {i} has {int(tokens.lengths[i])} tokens, more than the model's "
                    f"maximum of {self.max_length}; pass truncate=True to cut it"
                )
        return tokens


def _load(path: Path) -> Tokenizer:
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _as_input(item: TextOrPair, index: int) -> str | tuple[str, str]:
    if isinstance(item, str):
        return item
    if (
        isinstance(item, Sequence)
        and len(item) == 2
        and all(isinstance(part, str) for part in item)
    ):
        return (item[0], item[1])
    raise InputError(f"input {index} must be a string or a pair of strings, got {item!r}")
