"""`Model` and corpus jobs encode a request by the router's own rules (`FlatTokenizer`, the
router's `Tokenization` on the calling thread): prompts, adapters, pairs, pair templates and
truncation, checked here against the `tokenizers` package configured as the router
configures it (rust_router/src/tokenization)."""

from __future__ import annotations

import pytest

from trt_tei_runtime import InputError
from trt_tei_runtime.errors import CheckpointError
from trt_tei_runtime.templates import PairTemplate
from trt_tei_runtime.token_ids import TokenIds
from trt_tei_runtime.tokenization import TextTokenizer

TEXTS = [
    "the cat",
    "A Dog in Paris reads a book, très vite!",
    "How do I change the E-MAIL address, after the old one was closed?! (see §4.2; ±2.1%)",
    "word " * 600,
]
PROMPTS = {"query": "query: ", "passage": "passage: ", "plain": ""}
TEMPLATE = PairTemplate(
    prefix="judge: ", body="{instruction} q {query} d {document}", suffix=" answer", instruction="i"
)


def _reference(minilm_dir, max_length=None, direction="right"):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    if max_length is not None:
        tokenizer.enable_truncation(max_length, direction=direction)
    return tokenizer


@pytest.mark.parametrize("prompt_name", [None, "query", "plain"])
@pytest.mark.parametrize("truncate", [True, False])
def test_prompts_as_the_router_applies_them(minilm_dir, prompt_name, truncate) -> None:  # type: ignore[no-untyped-def]
    tokenizer = TextTokenizer(minilm_dir, 64, prompts=PROMPTS, default_prompt_name="passage")
    prompt = PROMPTS[prompt_name or "passage"]
    texts = TEXTS if truncate else TEXTS[:3]
    expected = [e.ids for e in _reference(minilm_dir, 64).encode_batch([prompt + t for t in texts])]
    ids, types = tokenizer.encode_ids(texts, prompt_name, truncate=truncate)
    assert ids.to_lists() == expected
    assert types is None


def test_left_truncation(minilm_dir) -> None:  # type: ignore[no-untyped-def]
    tokenizer = TextTokenizer(minilm_dir, 16)
    ids, _, lengths = tokenizer._flat.encode(TEXTS, None, True, True)
    got = TokenIds.from_buffers(ids, lengths).to_lists()
    reference = _reference(minilm_dir, 16, direction="left")
    assert got == [e.ids for e in reference.encode_batch(TEXTS)]
    assert got[-1][0] == reference.token_to_id("[CLS]")


def test_too_long_and_unknown_prompt_errors(minilm_dir) -> None:  # type: ignore[no-untyped-def]
    tokenizer = TextTokenizer(minilm_dir, 16, prompts=PROMPTS)
    with pytest.raises(
        InputError,
        match=r"input 2 has 33 tokens, more than the model's maximum of 16; pass truncate=True",
    ):
        tokenizer.encode_ids(TEXTS, truncate=False)
    message = r"unknown prompt_name 'nope'; the model has \['passage', 'plain', 'query'\]"
    with pytest.raises(InputError, match=message):
        tokenizer.encode_ids(TEXTS, "nope")
    with pytest.raises(InputError, match=message):
        tokenizer.encode_ids([], "nope")
    with pytest.raises(CheckpointError, match="default prompt name `nope`"):
        TextTokenizer(minilm_dir, 16, prompts=PROMPTS, default_prompt_name="nope")


def test_adapters_are_type_ids(minilm_dir) -> None:  # type: ignore[no-untyped-def]
    adapters = {"query": 3, "passage": 2}
    tokenizer = TextTokenizer(
        minilm_dir, 64, prompts=PROMPTS, default_prompt_name="passage", adapters=adapters
    )
    for name, adapter in [("query", 3), (None, 2), ("plain", 0)]:
        ids, types = tokenizer.encode_ids(TEXTS, name)
        if adapter:
            assert types is not None and set(types.ids.tolist()) == {adapter}
            assert types.to_lists() == [[adapter] * len(i) for i in ids.to_lists()]
        else:
            assert types is None
        assert tokenizer.adapter(name) == adapter
    assert tokenizer.adapter("nope") == 0
    assert TextTokenizer(minilm_dir, 64).adapter(None) == 0


@pytest.mark.parametrize("truncate", [True, False])
def test_pairs_as_the_tokenizer_encodes_them(minilm_dir, truncate) -> None:  # type: ignore[no-untyped-def]
    limit = 32 if truncate else 64
    tokenizer = TextTokenizer(minilm_dir, limit, prompts=PROMPTS, default_prompt_name="query")
    pairs = [(TEXTS[0], TEXTS[1]), (TEXTS[2], TEXTS[0])]
    items = [*pairs, TEXTS[1]]
    reference = _reference(minilm_dir, limit if truncate else None)
    expected = reference.encode_batch([*pairs, TEXTS[1]])  # no prompt: scored as given
    got = tokenizer.encode(items, truncate=truncate)
    assert [e.ids for e in got] == [e.ids for e in expected]
    assert [e.type_ids for e in got] == [e.type_ids for e in expected]
    assert got[0].tokens == expected[0].tokens
    if truncate:
        long = tokenizer.encode([(TEXTS[3], TEXTS[3])])[0]
        assert long.ids == reference.encode(TEXTS[3], TEXTS[3]).ids and len(long.ids) == 32
    else:
        with pytest.raises(InputError, match=r"input 1 has \d+ tokens, more than"):
            tokenizer.encode([TEXTS[0], (TEXTS[3], "x")], truncate=False)


def test_pair_template(minilm_dir) -> None:  # type: ignore[no-untyped-def]
    """The router's rule: the filled template without special tokens, cut to leave room for
    the suffix ids, which follow; a single text is scored as given."""
    reference = _reference(minilm_dir)
    suffix = tuple(reference.encode(TEMPLATE.suffix, add_special_tokens=False).ids)
    template = TEMPLATE.with_suffix_ids(suffix)
    tokenizer = TextTokenizer(minilm_dir, 24, pair_template=template)
    pairs = [("what is it", "a cat"), ("q", TEXTS[3])]

    def expected(query: str, document: str) -> list[int]:
        head = reference.encode(template.head(query, document), add_special_tokens=False).ids
        return head[: 24 - len(suffix)] + list(suffix)

    got = tokenizer.encode([*pairs, "as given"])
    assert [e.ids for e in got[:2]] == [expected(*p) for p in pairs]
    assert len(got[1].ids) == 24
    assert got[2].ids == _reference(minilm_dir, 24).encode("as given").ids
    assert all(t == 0 for e in got for t in e.type_ids)
    with pytest.raises(InputError, match=r"input 1 has \d+ tokens with its prompt template"):
        tokenizer.encode(pairs, truncate=False)
    fills = TextTokenizer(minilm_dir, len(suffix), pair_template=template)
    with pytest.raises(InputError, match="the prompt template's suffix alone"):
        fills.encode(pairs[:1])


def test_no_tokens_is_an_empty_sequence(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A text the tokenizer drops entirely (no special tokens added) is an empty sequence,
    which corpus jobs report as a bad row, not an error."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.save(str(tmp_path / "tokenizer.json"))
    tokenizer = TextTokenizer(tmp_path, 8)
    ids, _ = tokenizer.encode_ids(["a", "", "a a"])
    assert ids.to_lists() == [[0], [], [0, 0]]
