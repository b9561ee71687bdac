"""Flat token ids: the Rust tokenizer against the `tokenizers` package, and packing from
flat arrays against packing from lists."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trt_tei_runtime import InputError
from trt_tei_runtime.batch import PackedBatch
from trt_tei_runtime.token_ids import TokenIds
from trt_tei_runtime.tokenization import TextTokenizer

TEXTS = [
    "the cat",
    "A Dog in Paris reads a book, très vite!",
    "",
    "  spaces   and\ttabs\nand lines ",
    "emoji 🙂 and 漢字 and numbers 1234567",
    "How do I change the E-MAIL address, after the old one was closed?! (see §4.2; ±2.1%)",
    "a bell\u0007, a form\u000cfeed, a no-break\u00a0space and [MASK] or [mask]",
    "x" * 120 + " user@example.com C++ $5,000.00 ~tilde `tick` \\back/slash",
    "word " * 600,  # past every limit below
]


def sequences() -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 30000, int(n)).tolist() for n in rng.integers(1, 50, 40)]


def test_round_trip_and_take() -> None:
    seqs = sequences()
    tokens = TokenIds.from_lists(seqs)
    assert len(tokens) == 40 and tokens.num_tokens == sum(map(len, seqs))
    assert tokens.to_lists() == seqs
    assert tokens.lengths.tolist() == [len(s) for s in seqs]
    assert tokens[3].tolist() == seqs[3]
    picked = [7, 0, 39, 7]
    assert tokens.take(picked).to_lists() == [seqs[i] for i in picked]
    assert len(tokens.take([])) == 0
    with pytest.raises(InputError, match="between 0 and 2\\*\\*32 - 1"):
        TokenIds.from_lists([[1, -2]])


def test_packing_from_flat_arrays_equals_packing_from_lists() -> None:
    seqs = sequences()
    types = [[i % 2] * len(s) for i, s in enumerate(seqs)]
    picked = [5, 1, 30, 2]
    flat = PackedBatch.from_token_ids(
        TokenIds.from_lists(seqs), picked, TokenIds.from_lists(types), position_offset=2
    )
    lists = PackedBatch.from_sequences(
        [seqs[i] for i in picked], [types[i] for i in picked], position_offset=2
    )
    for name in ("input_ids", "token_type_ids", "position_ids", "cu_seqlens"):
        assert torch.equal(getattr(flat, name), getattr(lists, name)), name
    assert flat.max_seqlen == lists.max_seqlen == max(len(seqs[i]) for i in picked)
    expected_positions = [p + 2 for i in picked for p in range(len(seqs[i]))]
    assert flat.position_ids.tolist() == expected_positions
    with pytest.raises(InputError, match="sequences must not be empty"):
        PackedBatch.from_token_ids(TokenIds.from_lists([[1], []]))
    with pytest.raises(InputError, match="at least one sequence"):
        PackedBatch.from_token_ids(TokenIds.from_lists([[1]]), [])


def _reference(minilm_dir, max_length: int | None):  # type: ignore[no-untyped-def]
    """The `tokenizers` package, configured as the router configures its tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    if max_length is not None:
        tokenizer.enable_truncation(max_length)
    return tokenizer


@pytest.mark.parametrize("max_length", [8, 128, 512])
@pytest.mark.parametrize("prompt", ["", "query: "])
def test_rust_tokenizer_matches_tokenizers(minilm_dir, max_length, prompt) -> None:  # type: ignore[no-untyped-def]
    prompts = {"q": prompt}
    tokenizer = TextTokenizer(minilm_dir, max_length, prompts=prompts)
    reference = _reference(minilm_dir, max_length)
    expected = [e.ids for e in reference.encode_batch([prompt + t for t in TEXTS])]
    ids, types = tokenizer.encode_ids(TEXTS, "q")
    assert ids.to_lists() == expected
    assert types is None  # all zeros
    assert [e.ids for e in tokenizer.encode([prompt + t for t in TEXTS])] == expected
    assert max(len(ids) for ids in expected) == max_length  # the long text was cut


def test_rust_tokenizer_without_truncation(minilm_dir) -> None:  # type: ignore[no-untyped-def]
    tokenizer = TextTokenizer(minilm_dir, 16)
    short = TEXTS[:2]
    assert tokenizer.encode_ids(short, truncate=False)[0].to_lists() == [
        e.ids for e in _reference(minilm_dir, None).encode_batch(short)
    ]
    with pytest.raises(
        InputError, match=r"input 5 has \d+ tokens, more than the model's maximum of 16"
    ):
        tokenizer.encode_ids(TEXTS, truncate=False)
    assert len(tokenizer.encode_ids([])[0]) == 0
