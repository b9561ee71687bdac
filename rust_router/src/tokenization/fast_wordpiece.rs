//! A fast path for BERT-style WordPiece tokenizers.
//!
//! HF `tokenizers` keeps an alignment for every character through normalization and
//! pre-tokenization; on the development machine a 16-word English query took ~40 µs to
//! encode, most of it that bookkeeping, which the router never reads. BERT's pipeline
//! (`BertNormalizer`, `BertPreTokenizer`, `WordPiece`) works word by word: nothing crosses a
//! space, tab or line break. On a run of printable ASCII between them it reduces to:
//! lowercase (when the normalizer does), isolate each ASCII punctuation mark, greedy
//! longest-match WordPiece on what is left. [`FastWordPiece`] does that for such runs and
//! hands any other run (accents, other scripts, control characters) to the tokenizer alone;
//! the post-processor's ids go around the whole. [`FastWordPiece::from_tokenizer`] builds it
//! only for exactly that pipeline, learns the post-processor's ids from the tokenizer itself,
//! and checks itself against the tokenizer on a set of texts before it is used. A text that
//! holds an added token's text (such as `[MASK]`) is left to the tokenizer whole.

use std::collections::HashMap;
use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{Model, Tokenizer, TruncationDirection};

/// Texts the fast path must encode as the tokenizer does before it is used: cases, digits,
/// punctuation runs, whitespace of each kind, unknown pieces and a word over the model's
/// per-word limit.
const SELF_CHECK: &[&str] = &[
    "",
    "   ",
    "hello world",
    "How do I change the e-mail address of my account, after the old one was closed?",
    "UPPER lower MiXeD 1234 3.14159 $5,000.00 (parenthesised) [bracketed] {braced}",
    "punctuation!!! ... ?! --- ''' \"quoted\" `tick` ~tilde ^caret |pipe| \\back/slash",
    "tabs\tand\nnewlines\r\nand  double  spaces",
    "unaffable unbelievably antidisestablishmentarianism pneumonoultramicroscopic",
    "qzxjqzxjqzxj wxyzzyx aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\
     aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "user@example.com https://example.org/path?q=1&r=2#frag C++ C# node.js",
    "query: what is deep learning?",
    "café naïve Ωmega ΣΊΣΥΦΟΣ 中文字 margin ±2.1% (see §4.2) bell\u{7}ring a\u{a0}b e\u{301}",
];

/// The bytes between which nothing in BERT's pipeline crosses: what its normalizer turns into
/// a space and its pre-tokenizer splits on. (Other ASCII whitespace, such as a form feed, is
/// a control character the normalizer removes, joining what is on either side.)
fn separates(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// BERT's tokenizer without its per-character bookkeeping.
#[derive(Debug, Clone)]
pub struct FastWordPiece {
    lowercase: bool,
    vocab: HashMap<String, u32>,
    continuing_prefix: String,
    max_word_chars: usize,
    unk: u32,
    /// The post-processor's ids before and after a single text's own.
    before: Vec<u32>,
    after: Vec<u32>,
    /// Added tokens' texts, lowercased: a text holding one goes to the tokenizer, which
    /// matches them before it normalizes.
    added: Vec<String>,
    /// The tokenizer without truncation or padding, for runs that are not printable ASCII.
    tokenizer: Tokenizer,
}

impl FastWordPiece {
    /// The fast path for `tokenizer`, or `None` when its pipeline is not BERT's or the fast
    /// path does not encode [`SELF_CHECK`] as it does.
    pub fn from_tokenizer(tokenizer: &Tokenizer) -> Option<Self> {
        let lowercase = match tokenizer.get_normalizer()? {
            NormalizerWrapper::BertNormalizer(n) => n.lowercase,
            _ => return None,
        };
        if !matches!(
            tokenizer.get_pre_tokenizer()?,
            PreTokenizerWrapper::BertPreTokenizer(_)
        ) {
            return None;
        }
        let ModelWrapper::WordPiece(model) = tokenizer.get_model() else {
            return None;
        };
        let added: Vec<String> = tokenizer
            .get_added_tokens_decoder()
            .values()
            .map(|t| t.content.to_lowercase())
            .collect();
        // Matching many added tokens costs more than the fast path saves.
        if added.len() > 64 || added.iter().any(String::is_empty) {
            return None;
        }
        let mut plain = tokenizer.clone();
        plain.with_truncation(None).ok()?;
        plain.with_padding(None);
        let (before, after) = special_ids(&plain)?;
        let fast = Self {
            lowercase,
            vocab: model.get_vocab(),
            continuing_prefix: model.continuing_subword_prefix.clone(),
            max_word_chars: model.max_input_chars_per_word,
            unk: model.token_to_id(&model.unk_token)?,
            before,
            after,
            added,
            tokenizer: plain,
        };
        SELF_CHECK
            .iter()
            .all(|text| fast.agrees_with(text))
            .then_some(fast)
    }

    fn agrees_with(&self, text: &str) -> bool {
        let Ok(expected) = self.tokenizer.encode_fast(text, true) else {
            return false;
        };
        let ids = self.encode(text, None, TruncationDirection::Right);
        ids.as_deref() == Some(expected.get_ids())
            && expected.get_type_ids().iter().all(|&t| t == 0)
    }

    /// How many ids the post-processor adds around a single text.
    pub fn added_ids(&self) -> usize {
        self.before.len() + self.after.len()
    }

    /// `text`'s ids with the post-processor's around them, its own cut to `max_length` in
    /// all (from `direction`'s end) when given; `None` when the text is not for this path
    /// (the caller then asks the tokenizer). Type ids are all 0.
    pub fn encode(
        &self,
        text: &str,
        max_length: Option<usize>,
        direction: TruncationDirection,
    ) -> Option<Vec<u32>> {
        if self.holds_an_added_token(text) {
            return None;
        }
        let mut ids = Vec::with_capacity(text.len() / 3 + self.added_ids());
        ids.extend_from_slice(&self.before);
        for run in text.split(|c: char| c.is_ascii() && separates(c as u8)) {
            if run.bytes().all(|b| b.is_ascii_graphic()) {
                for word in words(run) {
                    self.word_pieces(word, &mut ids);
                }
            } else if !run.is_empty() {
                let own = self.tokenizer.encode_fast(run, false).ok()?;
                ids.extend_from_slice(own.get_ids());
            }
        }
        if let Some(max) = max_length {
            let room = max.checked_sub(self.added_ids()).filter(|&r| r > 0)?;
            let own = ids.len() - self.before.len();
            if own > room {
                match direction {
                    TruncationDirection::Right => ids.truncate(self.before.len() + room),
                    TruncationDirection::Left => {
                        let start = self.before.len();
                        ids.drain(start..start + own - room);
                    }
                }
            }
        }
        ids.extend_from_slice(&self.after);
        Some(ids)
    }

    fn holds_an_added_token(&self, text: &str) -> bool {
        let folded = text.to_lowercase();
        self.added
            .iter()
            .any(|token| folded.contains(token.as_str()))
    }

    /// Greedy longest-match-first pieces of one word of printable ASCII, lowercased first
    /// where the normalizer lowercases, as `WordPiece` cuts them: a word longer than the
    /// per-word limit, or with a part no piece matches, is one unknown.
    fn word_pieces(&self, word: &str, ids: &mut Vec<u32>) {
        let lowered;
        let word = if self.lowercase && word.bytes().any(|b| b.is_ascii_uppercase()) {
            lowered = word.to_ascii_lowercase();
            lowered.as_str()
        } else {
            word
        };
        if word.len() > self.max_word_chars {
            ids.push(self.unk);
            return;
        }
        let first = ids.len();
        let mut piece = String::with_capacity(word.len() + self.continuing_prefix.len());
        let mut start = 0;
        while start < word.len() {
            let mut end = word.len();
            let found = loop {
                piece.clear();
                if start > 0 {
                    piece.push_str(&self.continuing_prefix);
                }
                piece.push_str(&word[start..end]);
                if let Some(&id) = self.vocab.get(piece.as_str()) {
                    break Some(id);
                }
                end -= 1;
                if end == start {
                    break None;
                }
            };
            match found {
                Some(id) => ids.push(id),
                None => {
                    ids.truncate(first);
                    ids.push(self.unk);
                    return;
                }
            }
            start = end;
        }
    }
}

/// The words BERT's pre-tokenizer cuts printable ASCII into: runs without whitespace or
/// punctuation, and each punctuation mark alone.
fn words(text: &str) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut at = 0;
    std::iter::from_fn(move || {
        while at < bytes.len() && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        if at == bytes.len() {
            return None;
        }
        let start = at;
        if bytes[at].is_ascii_punctuation() {
            at += 1;
        } else {
            while at < bytes.len()
                && !bytes[at].is_ascii_whitespace()
                && !bytes[at].is_ascii_punctuation()
            {
                at += 1;
            }
        }
        Some(&text[start..at])
    })
}

/// The post-processor's ids before and after a single text's own, the same for every probe
/// (else `None`).
fn special_ids(tokenizer: &Tokenizer) -> Option<(Vec<u32>, Vec<u32>)> {
    let mut found: Option<(Vec<u32>, Vec<u32>)> = None;
    for probe in ["hello", "the world", "a b c"] {
        let with = tokenizer.encode_fast(probe, true).ok()?;
        let own = tokenizer.encode_fast(probe, false).ok()?;
        let (with, own) = (with.get_ids(), own.get_ids());
        let at = (0..=with.len().saturating_sub(own.len()))
            .find(|&i| with[i..].starts_with(own) && !own.is_empty())?;
        let ids = (with[..at].to_vec(), with[at + own.len()..].to_vec());
        if found.as_ref().is_some_and(|f| *f != ids) {
            return None;
        }
        found = Some(ids);
    }
    found
}

#[cfg(test)]
#[path = "fast_wordpiece_tests.rs"]
mod tests;
