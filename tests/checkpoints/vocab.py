"""The tokenizers of the tiny checkpoints: a small WordPiece vocabulary in BERT or RoBERTa
style, and a byte-level BPE trained on a few lines (the decoders, Gemma3). The tests and the
snapshot generator (tests/snapshots/) build theirs here, with their own word lists and sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

# The tests' vocabulary (tests/snapshots/ adds two words of its own).
WORDS = (
    "the a an of to and in is it that for on with as was at by be this are from or have not "
    "query document search engine embedding fast model text sentence long short cat dog "
    "paris france city river water blue green red house tree book read write server"
).split()
LETTERS = list("abcdefghijklmnopqrstuvwxyz0123456789.,!?'")


@dataclass(frozen=True)
class WordPieceStyle:
    specials: list[str]
    cls: str
    sep: str
    unk: str
    pad: str
    pair: str


WORDPIECE_STYLES = {
    # [CLS] a [SEP] b [SEP], b with token type 1.
    "bert": WordPieceStyle(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        "[CLS]",
        "[SEP]",
        "[UNK]",
        "[PAD]",
        "[CLS] $A [SEP] $B:1 [SEP]:1",
    ),
    # <s> a </s></s> b </s>, <pad> = 1.
    "roberta": WordPieceStyle(
        ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        "<s>",
        "</s>",
        "<unk>",
        "<pad>",
        "<s> $A </s> </s> $B </s>",
    ),
}


def wordpiece(style: str, words: Sequence[str]) -> tuple[Tokenizer, dict[str, int]]:
    """A WordPiece tokenizer of `words`, the letters and their ## pieces, in `style`
    ("bert" or "roberta"), and its vocabulary."""
    s = WORDPIECE_STYLES[style]
    vocab = {tok: i for i, tok in enumerate(s.specials)}
    for piece in [*words, *LETTERS, *("##" + c for c in LETTERS)]:
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token=s.unk, max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{s.cls} $A {s.sep}",
        pair=s.pair,
        special_tokens=[(s.cls, vocab[s.cls]), (s.sep, vocab[s.sep])],
    )
    return tok, vocab


BPE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
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


def bpe(vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer (Qwen/Llama-3 style) trained to `vocab_size` on a few
    lines, with "yes" and "no" as single tokens (added after training) and Qwen's chat
    special tokens: for the decoders and the yes/no reranker template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=BPE_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(BPE_CORPUS * 4, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens(["yes", "no"])
    return tok
