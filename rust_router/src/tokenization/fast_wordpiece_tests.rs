//! The fast path against the tokenizer it stands in for, on a BERT tokenizer built in code.
use super::*;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::AddedToken;

const SPECIALS: [&str; 5] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
const WORDS: &[&str] = &[
    "the", "a", "how", "do", "i", "change", "e", "mail", "address", "of", "my", "account", "after",
    "old", "one", "was", "closed", "un", "##aff", "##able", "##believ", "##ably", "hello", "world",
    "upper", "lower", "mixed", "##ed", "##s", "##ing", "1", "2", "3", "4", "##4", "##1", "##5",
    "what", "is", "deep", "learning", "query", "quoted", "tick", "user", "example", "com", "node",
    "js", "c", "##x", "##a", "aa", "##aa", "q", "##z",
];

fn bert(lowercase: bool) -> Tokenizer {
    let mut vocab: HashMap<String, u32> = HashMap::new();
    let punctuation = (b'!'..=b'~')
        .filter(u8::is_ascii_punctuation)
        .map(|b| (b as char).to_string());
    let all = SPECIALS
        .iter()
        .map(|s| s.to_string())
        .chain(WORDS.iter().map(|s| s.to_string()))
        .chain(punctuation)
        .chain(["Hello".to_string(), "World".to_string()]);
    for word in all {
        let id = vocab.len() as u32;
        vocab.entry(word).or_insert(id);
    }
    let model = WordPiece::builder()
        .vocab(
            vocab
                .into_iter()
                .collect::<tokenizers::models::bpe::Vocab>(),
        )
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let mut tokenizer = Tokenizer::new(model);
    tokenizer
        .with_normalizer(Some(BertNormalizer::new(true, true, None, lowercase)))
        .unwrap();
    tokenizer.with_pre_tokenizer(Some(BertPreTokenizer));
    let specials: Vec<AddedToken> = SPECIALS
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect();
    tokenizer.add_special_tokens(specials).unwrap();
    let id = |t: &str| tokenizer.token_to_id(t).unwrap();
    let post = TemplateProcessing::builder()
        .try_single("[CLS] $A [SEP]")
        .unwrap()
        .try_pair("[CLS] $A [SEP] $B:1 [SEP]:1")
        .unwrap()
        .special_tokens(vec![("[CLS]", id("[CLS]")), ("[SEP]", id("[SEP]"))])
        .build()
        .unwrap();
    tokenizer.with_post_processor(Some(post));
    tokenizer
}

/// Deterministic texts from an alphabet that leans on the fast path's edges: case, digits,
/// punctuation, each kind of whitespace, and now and then what it must leave alone.
fn texts(count: usize) -> Vec<String> {
    let pieces = [
        "the",
        "The",
        "HOW",
        "do",
        "I",
        "change",
        "e-mail",
        "unaffable",
        "unbelievably",
        "1234",
        "3.14",
        "$5",
        ",",
        ".",
        "?!",
        "(",
        ")",
        "[",
        "]",
        "'",
        "\"",
        "`",
        "~",
        "\\",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "qzxj",
        "aaaa",
        "Hello",
        "World",
        "café",
        "中文",
        "\u{7}",
        "\u{b}",
        "[MASK]",
        "[mask]",
        "[SEP]",
        "##a",
        "#",
        "node.js",
        "user@example.com",
    ];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..count)
        .map(|_| {
            let n = (next() % 24) as usize;
            (0..n)
                .map(|_| pieces[(next() % pieces.len() as u64) as usize])
                .collect::<Vec<_>>()
                .join(if next() % 3 == 0 { "" } else { " " })
        })
        .collect()
}

#[test]
fn builds_for_bert_and_not_for_other_pipelines() {
    assert!(FastWordPiece::from_tokenizer(&bert(true)).is_some());
    assert!(FastWordPiece::from_tokenizer(&bert(false)).is_some());
    // The router's word-level test tokenizer is not BERT's pipeline.
    assert!(FastWordPiece::from_tokenizer(&crate::tokenization::tests::test_tokenizer()).is_none());
    let mut no_normalizer = bert(true);
    no_normalizer
        .with_normalizer(None::<BertNormalizer>)
        .unwrap();
    assert!(FastWordPiece::from_tokenizer(&no_normalizer).is_none());
}

#[test]
fn encodes_as_the_tokenizer_does_or_leaves_the_text_to_it() {
    for lowercase in [true, false] {
        let tokenizer = bert(lowercase);
        let fast = FastWordPiece::from_tokenizer(&tokenizer).unwrap();
        let (mut taken, mut left) = (0, 0);
        for text in texts(4000) {
            let expected = tokenizer.encode_fast(text.as_str(), true).unwrap();
            match fast.encode(&text, None, TruncationDirection::Right) {
                Some(ids) => {
                    assert_eq!(ids, expected.get_ids(), "{text:?} (lowercase: {lowercase})");
                    taken += 1;
                }
                None => left += 1,
            }
        }
        // Texts holding an added token's text are left to the tokenizer; the others are not.
        assert!(taken > 1000 && left > 100, "{taken} taken, {left} left");
    }
}

#[test]
fn truncates_as_the_tokenizer_does_from_either_end() {
    let mut tokenizer = bert(true);
    let fast = FastWordPiece::from_tokenizer(&tokenizer).unwrap();
    for direction in [TruncationDirection::Right, TruncationDirection::Left] {
        for max_length in [3, 5, 8, 40] {
            tokenizer
                .with_truncation(Some(tokenizers::TruncationParams {
                    max_length,
                    direction,
                    strategy: tokenizers::TruncationStrategy::LongestFirst,
                    stride: 0,
                }))
                .unwrap();
            for text in texts(300) {
                let Some(ids) = fast.encode(&text, Some(max_length), direction) else {
                    continue;
                };
                let expected = tokenizer.encode_fast(text.as_str(), true).unwrap();
                assert_eq!(
                    ids,
                    expected.get_ids(),
                    "{text:?} to {max_length} {direction:?}"
                );
            }
        }
    }
}

#[test]
fn hands_runs_that_are_not_printable_ascii_to_the_tokenizer() {
    let tokenizer = bert(true);
    let fast = FastWordPiece::from_tokenizer(&tokenizer).unwrap();
    for text in [
        "café",
        "a\u{7}b",
        "a\u{b}b x",
        "a\u{c}b",
        "Hello\u{a0}World",
        "\u{0}",
        "中文 the",
    ] {
        let expected = tokenizer.encode_fast(text, true).unwrap();
        let ids = fast.encode(text, None, TruncationDirection::Right);
        assert_eq!(ids.as_deref(), Some(expected.get_ids()), "{text:?}");
    }
}

#[test]
fn leaves_texts_with_an_added_token_to_the_tokenizer() {
    let fast = FastWordPiece::from_tokenizer(&bert(true)).unwrap();
    let right = TruncationDirection::Right;
    for text in ["what is [MASK]?", "what is [mask]?", "[CLS] again"] {
        assert_eq!(fast.encode(text, None, right), None, "{text:?}");
    }
    assert!(fast.encode("what is a mask?", None, right).is_some());
    // An added token with a capital outside ASCII is found whatever its case in the text.
    let mut tokenizer = bert(true);
    tokenizer
        .add_tokens([AddedToken::from("ÄRGER", false)])
        .unwrap();
    let fast = FastWordPiece::from_tokenizer(&tokenizer).unwrap();
    assert_eq!(fast.encode("so much ärger", None, right), None);
    // No room for the text's own ids: left to the tokenizer too.
    assert_eq!(fast.encode("hello", Some(2), right), None);
}

#[test]
fn splits_words_as_the_bert_pre_tokenizer_does() {
    let split: Vec<&str> = words("  Hi,there!! a.b\tc\r\nd  ").collect();
    assert_eq!(
        split,
        ["Hi", ",", "there", "!", "!", "a", ".", "b", "c", "d"]
    );
    assert_eq!(words(" \t ").count(), 0);
}

/// all-MiniLM-L6-v2's own tokenizer.json, where `make test` names it
/// (`TRT_TEI_TEST_BERT_TOKENIZER`); a plain `cargo test` without it has nothing to compare.
#[test]
fn encodes_as_a_real_bert_tokenizer_does() {
    let Some(path) = std::env::var_os("TRT_TEI_TEST_BERT_TOKENIZER") else {
        eprintln!("TRT_TEI_TEST_BERT_TOKENIZER is not set: `make test` sets it");
        return;
    };
    let tokenizer = crate::tokenization::load_tokenizer(std::path::Path::new(&path)).unwrap();
    let fast = FastWordPiece::from_tokenizer(&tokenizer).expect("a BERT tokenizer");
    let english = [
        "The quick brown fox jumps over the lazy dog.",
        "In 1969, Apollo 11's crew (Armstrong, Aldrin & Collins) landed on the Moon!",
        "What's the difference between TCP/IP and UDP? See RFC-793, section 3.2.",
        "Embeddings map text to vectors; cosine similarity compares them.",
        "Questions remain (see §4.2). Data: 3,412 respondents; margin ±2.1%. Café naïve 中文",
    ];
    let mut taken = 0;
    for text in texts(4000).iter().map(String::as_str).chain(english) {
        let expected = tokenizer.encode_fast(text, true).unwrap();
        if let Some(ids) = fast.encode(text, None, TruncationDirection::Right) {
            assert_eq!(ids, expected.get_ids(), "{text:?}");
            taken += 1;
        }
    }
    assert!(taken > 1000, "{taken}");
}

/// Through the router's own encode (prompts, truncation from either end, the length limit),
/// the same ids as the tokenizer, inline and on the pool.
#[tokio::test]
async fn the_router_encodes_as_the_tokenizer_does() {
    use crate::tokenization::{
        EncodeOptions, EncodingInput, Tokenization, TokenizationError, TokenizerConfig,
        TruncationDirection as Side,
    };
    const MAX: usize = 12;
    let config = TokenizerConfig {
        max_input_length: MAX,
        prompts: [("query".to_string(), "Query: ".to_string())].into(),
        ..Default::default()
    };
    let tokenization = Tokenization::new(bert(true), 1, config);
    let mut reference = bert(true);
    let cases = [
        (false, Side::Right, None, false),
        (true, Side::Right, None, true),
        (true, Side::Left, Some("query"), true),
        (false, Side::Right, Some("query"), false),
    ];
    for text in texts(300) {
        for (truncate, side, prompt, inline) in cases {
            let opts = EncodeOptions {
                truncate,
                direction: side,
                prompt_name: prompt.map(str::to_string),
                apply_prompts: true,
                inline,
                adapter: None,
                chunking: None,
            };
            let got = tokenization
                .encode(EncodingInput::Single(text.clone()), opts)
                .await;
            let prompted = format!("{}{text}", if prompt.is_some() { "Query: " } else { "" });
            reference
                .with_truncation(truncate.then(|| tokenizers::TruncationParams {
                    max_length: MAX,
                    direction: side.into(),
                    strategy: tokenizers::TruncationStrategy::LongestFirst,
                    stride: 0,
                }))
                .unwrap();
            let expected = reference.encode_fast(prompted.as_str(), true).unwrap();
            match got {
                Ok(e) => {
                    assert_eq!(
                        e.input_ids,
                        expected.get_ids(),
                        "{prompted:?} {truncate} {side:?}"
                    );
                    assert_eq!(e.token_type_ids, expected.get_type_ids());
                }
                Err(TokenizationError::TooLong { given, .. }) => {
                    assert!(!truncate, "{prompted:?}");
                    assert_eq!(given, expected.len(), "{prompted:?}");
                }
                Err(e) => panic!("{prompted:?}: {e}"),
            }
        }
    }
}
