//! The encode rules: what turns a request's input into the token ids the model runs, and
//! what `/tokenize` and `/decode` answer. The prompt (named, or the default one) is prepended
//! to an embedding input, a decoder reranker's pair is laid out by its [`PairTemplate`], an
//! adapter's index becomes every token's type id, over-long inputs are cut or refused, and
//! token ids sent as such are checked against the vocabulary.
//!
//! Plain types and functions over one `tokenizers::Tokenizer`: no threads and no pool. Each pool
//! thread, and each inline caller, encodes with an [`Encoder`] of its own (`super::pool`,
//! `super::inline`).

use super::chunk::{windows, ChunkError, Chunking};
use super::FastWordPiece;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use tokenizers::{Tokenizer, TruncationParams, TruncationStrategy};

#[derive(Debug, Clone, PartialEq)]
pub enum EncodingInput {
    Single(String),
    Pair(String, String),
    /// Pre-tokenized ids, used as given (special tokens included by the client).
    Ids(Vec<u32>),
}

impl EncodingInput {
    /// Size of the text to tokenize (token ids count 4 bytes each).
    pub fn byte_len(&self) -> usize {
        match self {
            Self::Single(s) => s.len(),
            Self::Pair(a, b) => a.len() + b.len(),
            Self::Ids(ids) => 4 * ids.len(),
        }
    }

    pub fn count_chars(&self) -> usize {
        match self {
            Self::Single(s) => s.chars().count(),
            Self::Pair(a, b) => a.chars().count() + b.chars().count(),
            Self::Ids(ids) => ids.len(),
        }
    }
}

/// Which end of an over-long input is cut.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum TruncationDirection {
    #[serde(alias = "left")]
    Left,
    #[default]
    #[serde(alias = "right")]
    Right,
}

impl From<TruncationDirection> for tokenizers::TruncationDirection {
    fn from(value: TruncationDirection) -> Self {
        match value {
            TruncationDirection::Left => Self::Left,
            TruncationDirection::Right => Self::Right,
        }
    }
}

/// A sequence ready for the queue.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValidEncoding {
    pub input_ids: Vec<u32>,
    pub token_type_ids: Vec<u32>,
    pub position_ids: Vec<u32>,
    /// An image's pixels ([`crate::backend::Batch::pixels`]), its ids placeholders that
    /// count its tokens; empty for a text.
    pub pixels: Vec<f32>,
    /// A document scored by MaxSim ([`crate::backend::BatchKind::MaxSim`]): its query's
    /// vectors, shared by the request's documents.
    pub query: Option<std::sync::Arc<[f32]>>,
}

impl ValidEncoding {
    /// An image's sequence: `tokens` placeholder tokens (its cost in a batch's budget) and
    /// its pixels.
    pub fn image(tokens: usize, pixels: Vec<f32>) -> Self {
        Self {
            input_ids: vec![0; tokens],
            token_type_ids: vec![0; tokens],
            position_ids: (0..tokens as u32).collect(),
            pixels,
            query: None,
        }
    }
}

/// One sequence of an input: the whole input, or one window of it (`long_input: chunk`).
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub encoding: ValidEncoding,
    /// The input's own tokens in it (no special tokens, no prompt): its weight in the input's
    /// mean. The sequence's length for an input that was not cut.
    pub weight: usize,
}

impl Window {
    fn whole(encoding: ValidEncoding) -> Self {
        Self {
            weight: encoding.input_ids.len(),
            encoding,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct EncodeOptions {
    pub truncate: bool,
    /// `long_input: chunk`: a text over the limit is cut into windows (`encode_windows`).
    pub chunking: Option<Chunking>,
    pub direction: TruncationDirection,
    pub prompt_name: Option<String>,
    /// Prompts are for embedding inputs; classification pairs are encoded as given.
    pub apply_prompts: bool,
    /// Encode on the calling thread instead of a pool worker. For small requests the two
    /// thread hand-offs to and from the pool cost far more than tokenizing a few dozen tokens;
    /// see `Infer::inline_ok`.
    pub inline: bool,
    /// A LoRA adapter the request selected (`model: NAME`): its index rides on every token's
    /// type id (`TokenizerConfig::adapter_type_stride`). It overrides a prompt's adapter.
    pub adapter: Option<u32>,
}

/// One token as `/tokenize` reports it; offsets are in characters of the (prompted) input.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenInfo {
    pub id: u32,
    pub text: String,
    pub special: bool,
    pub start: Option<usize>,
    pub stop: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TokenizationError {
    /// The HTTP layer adds how to avoid it, which depends on the route.
    #[error("Input validation error: `inputs` must have at most {max} tokens (the model's limit). Given: {given}")]
    TooLong { max: usize, given: usize },
    #[error("Input validation error: `prompt_name` `{name}` is not a prompt of this model. Available prompts: {available}")]
    UnknownPrompt { name: String, available: String },
    #[error("Input validation error: `prompt_name` cannot be used with token ids")]
    PromptWithIds,
    #[error("Input validation error: token id {id} is outside the vocabulary (size {vocab_size})")]
    IdOutOfRange { id: u32, vocab_size: usize },
    #[error(transparent)]
    Chunk(#[from] ChunkError),
    #[error("Tokenizer error: {0}")]
    Tokenizer(String),
    #[error("tokenization workers have stopped")]
    Stopped,
    /// A task run on the pool ([`super::Tokenization::run`]) panicked.
    #[error("preparing the input panicked")]
    Panicked,
}

/// Reads `tokenizer.json` and strips what the file bakes in: its own truncation (often shorter
/// than the model's limit, e.g. 128 for all-MiniLM-L6-v2) and padding (the batches are packed).
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer, TokenizationError> {
    let mut tokenizer = Tokenizer::from_file(path).map_err(|e| {
        TokenizationError::Tokenizer(format!("cannot load {}: {e}", path.display()))
    })?;
    tokenizer
        .with_truncation(None)
        .map_err(|e| TokenizationError::Tokenizer(e.to_string()))?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
}

/// How a decoder reranker wants a (query, document) pair laid out (`Backend.info()`'s
/// `pair_template`): the text `before_query + query + between + document + after_document` is
/// tokenized without special tokens and truncated to leave room for `suffix_ids`, which are
/// appended after truncation so the tokens the score is read after are never cut.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairTemplate {
    pub before_query: String,
    pub between: String,
    pub after_document: String,
    #[serde(default)]
    pub suffix_ids: Vec<u32>,
}

/// Texts padded to one length (`Backend.info()`'s `text_padding`), for models trained on padded
/// texts whose pooled token may be a pad (SigLIP: the pads are attended to). Every input, after
/// truncation, gets pads of `token_id` up to `length` tokens, type id 0, positions continuing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextPadding {
    pub length: usize,
    pub token_id: u32,
}

/// What the workers need to know about the model.
#[derive(Debug, Clone, Default)]
pub struct TokenizerConfig {
    /// The model's own limit, special tokens included.
    pub max_input_length: usize,
    /// Position ids start here (pad_token_id + 1 for RoBERTa-style models).
    pub position_offset: u32,
    pub prompts: HashMap<String, String>,
    pub default_prompt: Option<String>,
    pub pair_template: Option<PairTemplate>,
    /// Prompt name -> adapter index (`Backend.info()`'s `adapters`): a text embedded with
    /// such a prompt name carries the index as the type id of each of its tokens.
    pub adapters: HashMap<String, u32>,
    /// The adapter of texts sent without a prompt name (the default prompt's).
    pub default_adapter: u32,
    /// How a LoRA adapter's index and a token's own type id share the type id: adapter `i`,
    /// type `t` is `i * stride + t` (`Backend.info()`'s `adapter_type_stride`; 1 where the
    /// model reads no token types, 2 for BERT-style pairs).
    pub adapter_type_stride: u32,
    /// Pads every input up to the same length (SigLIP).
    pub text_padding: Option<TextPadding>,
}

#[derive(Debug)]
pub(crate) struct EncodeConfig {
    model: TokenizerConfig,
    vocab_size: usize,
    /// The special tokens the tokenizer puts before and after one text ([CLS] and [SEP]).
    frame: (Vec<u32>, Vec<u32>),
    /// BERT's tokenizer without its per-character bookkeeping, for ASCII texts, where the
    /// tokenizer is BERT's.
    fast: Option<FastWordPiece>,
}

impl EncodeConfig {
    /// The rules for `model`, with `tokenizer`'s vocabulary and, where it is BERT's, its fast
    /// path.
    pub(crate) fn new(tokenizer: &Tokenizer, model: TokenizerConfig) -> Self {
        Self {
            vocab_size: tokenizer.get_vocab_size(true),
            frame: special_frame(tokenizer),
            fast: FastWordPiece::from_tokenizer(tokenizer),
            model,
        }
    }

    /// The adapter a prompted text selects, for models with per-request adapters.
    pub(crate) fn adapter(&self, opts: &EncodeOptions) -> Option<u32> {
        if !opts.apply_prompts || self.model.adapters.is_empty() {
            return None;
        }
        let index = match &opts.prompt_name {
            Some(name) => self.model.adapters.get(name).copied().unwrap_or(0),
            None => self.model.default_adapter,
        };
        Some(index)
    }

    pub(crate) fn prompt(&self, opts: &EncodeOptions) -> Result<Option<&str>, TokenizationError> {
        if !opts.apply_prompts {
            return Ok(None);
        }
        match &opts.prompt_name {
            Some(name) => match self.model.prompts.get(name) {
                Some(p) => Ok(Some(p)),
                None => {
                    let mut names: Vec<&String> = self.model.prompts.keys().collect();
                    names.sort();
                    Err(TokenizationError::UnknownPrompt {
                        name: name.clone(),
                        available: format!("{names:?}"),
                    })
                }
            },
            None => Ok(self.model.default_prompt.as_deref()),
        }
    }
}

/// The special tokens `tokenizer` puts before and after a text, read off a one-letter text.
fn special_frame(tokenizer: &Tokenizer) -> (Vec<u32>, Vec<u32>) {
    let Ok(encoding) = tokenizer.encode_fast("a", true) else {
        return (Vec::new(), Vec::new());
    };
    let ids = encoding.get_ids();
    let mask = encoding.get_special_tokens_mask();
    let before = mask.iter().take_while(|&&m| m == 1).count();
    let after = mask[before..].iter().rev().take_while(|&&m| m == 1).count();
    (ids[..before].to_vec(), ids[ids.len() - after..].to_vec())
}

/// One tokenizer and the encode rules: a pool thread's, or an inline caller's.
pub(crate) struct Encoder {
    tokenizer: Tokenizer,
    /// The truncation currently set on `tokenizer`, to avoid resetting it for every job.
    truncation: Option<TruncationParams>,
    config: Arc<EncodeConfig>,
}

fn tok_err(e: impl std::fmt::Display) -> TokenizationError {
    TokenizationError::Tokenizer(e.to_string())
}

/// `ids` (already at most `padding.length` long) followed by pads up to `padding.length`.
fn pad(mut ids: Vec<u32>, mut type_ids: Vec<u32>, padding: TextPadding) -> (Vec<u32>, Vec<u32>) {
    let length = padding.length.max(ids.len());
    ids.resize(length, padding.token_id);
    type_ids.resize(length, 0);
    (ids, type_ids)
}

impl Encoder {
    pub(crate) fn new(tokenizer: Tokenizer, config: Arc<EncodeConfig>) -> Self {
        Self {
            tokenizer,
            truncation: None,
            config,
        }
    }

    /// Ids outside the vocabulary are refused: the tokenizer would silently skip them.
    pub(crate) fn decode(
        &self,
        ids: &[u32],
        skip_special_tokens: bool,
    ) -> Result<String, TokenizationError> {
        let vocab_size = self.config.vocab_size;
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(TokenizationError::IdOutOfRange { id, vocab_size });
        }
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(tok_err)
    }

    fn set_truncation(&mut self, want: Option<TruncationParams>) -> Result<(), TokenizationError> {
        let same = match (&self.truncation, &want) {
            (None, None) => true,
            (Some(a), Some(b)) => a.direction == b.direction && a.max_length == b.max_length,
            _ => false,
        };
        if !same {
            self.tokenizer
                .with_truncation(want.clone())
                .map_err(tok_err)?;
            self.truncation = want;
        }
        Ok(())
    }

    fn truncation(&self, opts: &EncodeOptions, max_length: usize) -> Option<TruncationParams> {
        opts.truncate.then(|| TruncationParams {
            direction: opts.direction.into(),
            max_length,
            strategy: TruncationStrategy::LongestFirst,
            stride: 0,
        })
    }

    pub(crate) fn encode(
        &mut self,
        input: EncodingInput,
        opts: &EncodeOptions,
    ) -> Result<ValidEncoding, TokenizationError> {
        let cfg = self.config.clone();
        let max = cfg.model.max_input_length;
        let too_long = |given| TokenizationError::TooLong { max, given };
        let (input_ids, token_type_ids) = match input {
            EncodingInput::Ids(mut ids) => {
                if opts.prompt_name.is_some() && opts.apply_prompts {
                    return Err(TokenizationError::PromptWithIds);
                }
                if let Some(&id) = ids.iter().find(|&&id| id as usize >= cfg.vocab_size) {
                    return Err(TokenizationError::IdOutOfRange {
                        id,
                        vocab_size: cfg.vocab_size,
                    });
                }
                if ids.len() > max {
                    if !opts.truncate {
                        return Err(too_long(ids.len()));
                    }
                    match opts.direction {
                        TruncationDirection::Right => ids.truncate(max),
                        TruncationDirection::Left => {
                            ids.drain(..ids.len() - max);
                        }
                    }
                }
                let n = ids.len();
                (ids, vec![0; n])
            }
            EncodingInput::Pair(query, document) if cfg.model.pair_template.is_some() => {
                let t = cfg.model.pair_template.as_ref().expect("checked");
                let text = format!(
                    "{}{query}{}{document}{}",
                    t.before_query, t.between, t.after_document
                );
                let room = max.saturating_sub(t.suffix_ids.len()).max(1);
                self.set_truncation(self.truncation(opts, room))?;
                let encoding = self.tokenizer.encode_fast(text, false).map_err(tok_err)?;
                let total = encoding.len() + t.suffix_ids.len();
                if total > max {
                    return Err(too_long(total));
                }
                let mut ids = encoding.get_ids().to_vec();
                ids.extend_from_slice(&t.suffix_ids);
                let n = ids.len();
                (ids, vec![0; n])
            }
            text => {
                let text = match (text, cfg.prompt(opts)?) {
                    (EncodingInput::Single(s), Some(p)) => EncodingInput::Single(format!("{p}{s}")),
                    (text, _) => text,
                };
                let fast = match (&text, &cfg.fast) {
                    (EncodingInput::Single(s), Some(fast)) => {
                        fast.encode(s, opts.truncate.then_some(max), opts.direction.into())
                    }
                    _ => None,
                };
                let (ids, type_ids) = match fast {
                    Some(ids) => {
                        let n = ids.len();
                        (ids, vec![0; n])
                    }
                    None => {
                        self.set_truncation(self.truncation(opts, max))?;
                        let encoding = match text {
                            EncodingInput::Single(s) => self.tokenizer.encode_fast(s, true),
                            EncodingInput::Pair(a, b) => self.tokenizer.encode_fast((a, b), true),
                            EncodingInput::Ids(_) => unreachable!("handled above"),
                        }
                        .map_err(tok_err)?;
                        (
                            encoding.get_ids().to_vec(),
                            encoding.get_type_ids().to_vec(),
                        )
                    }
                };
                if ids.len() > max {
                    return Err(too_long(ids.len()));
                }
                (ids, self.text_type_ids(type_ids, opts))
            }
        };
        self.finish(input_ids, token_type_ids, opts)
    }

    /// The type ids a text's tokens get: its prompt's adapter (jina-embeddings-v3), unless
    /// the request chose one.
    fn text_type_ids(&self, type_ids: Vec<u32>, opts: &EncodeOptions) -> Vec<u32> {
        match self.config.adapter(opts).filter(|_| opts.adapter.is_none()) {
            Some(adapter) => vec![adapter; type_ids.len()],
            None => type_ids,
        }
    }

    /// The sequence the queue takes: the request's adapter on the type ids, and positions.
    fn finish(
        &self,
        input_ids: Vec<u32>,
        token_type_ids: Vec<u32>,
        opts: &EncodeOptions,
    ) -> Result<ValidEncoding, TokenizationError> {
        let cfg = &self.config;
        // The request's LoRA adapter, whatever the input's kind (text, pair, token ids).
        let token_type_ids = match opts.adapter {
            Some(adapter) => {
                let base = adapter * cfg.model.adapter_type_stride.max(1);
                token_type_ids.into_iter().map(|t| base + t).collect()
            }
            None => token_type_ids,
        };
        if input_ids.is_empty() {
            return Err(TokenizationError::Tokenizer(
                "the input produced no tokens".into(),
            ));
        }
        let (input_ids, token_type_ids) = match cfg.model.text_padding {
            Some(padding) => pad(input_ids, token_type_ids, padding),
            None => (input_ids, token_type_ids),
        };
        let offset = cfg.model.position_offset;
        let position_ids = (offset..offset + input_ids.len() as u32).collect();
        Ok(ValidEncoding {
            input_ids,
            token_type_ids,
            position_ids,
            pixels: Vec::new(),
            query: None,
        })
    }

    /// `input`'s sequences: one, or with `opts.chunking` a text's windows (the rule is in
    /// `super::chunk`). Token ids and pairs are never cut.
    pub(crate) fn encode_windows(
        &mut self,
        input: EncodingInput,
        opts: &EncodeOptions,
    ) -> Result<Vec<Window>, TokenizationError> {
        let (text, chunking) = match (input, opts.chunking) {
            (EncodingInput::Single(text), Some(chunking)) => (text, chunking),
            (input, _) => return Ok(vec![Window::whole(self.encode(input, opts)?)]),
        };
        let cfg = self.config.clone();
        let prompt = cfg.prompt(opts)?;
        let text = match prompt {
            Some(p) => format!("{p}{text}"),
            None => text,
        };
        let ids = self.whole_text(&text)?;
        let (before, after) = &cfg.frame;
        if ids.len() <= before.len() + after.len() {
            return Err(TokenizationError::Tokenizer(
                "the input produced no tokens".into(),
            ));
        }
        let content = &ids[before.len()..ids.len() - after.len()];
        let prompt_len = match prompt {
            Some(p) => self.prompt_len(p)?.min(content.len()),
            None => 0,
        };
        let (prompt_ids, body) = content.split_at(prompt_len);
        let window = cfg
            .model
            .max_input_length
            .saturating_sub(before.len() + after.len() + prompt_len);
        let ranges = windows(body.len(), window, chunking)?;
        ranges
            .into_iter()
            .map(|range| {
                let weight = range.len();
                let mut ids = Vec::with_capacity(before.len() + prompt_len + weight + after.len());
                ids.extend_from_slice(before);
                ids.extend_from_slice(prompt_ids);
                ids.extend_from_slice(&body[range]);
                ids.extend_from_slice(after);
                let type_ids = self.text_type_ids(vec![0; ids.len()], opts);
                let encoding = self.finish(ids, type_ids, opts)?;
                Ok(Window { encoding, weight })
            })
            .collect()
    }

    /// `text`'s ids with the special tokens, however long.
    fn whole_text(&mut self, text: &str) -> Result<Vec<u32>, TokenizationError> {
        let fast = self.config.fast.as_ref();
        if let Some(ids) =
            fast.and_then(|f| f.encode(text, None, TruncationDirection::Right.into()))
        {
            return Ok(ids);
        }
        self.set_truncation(None)?;
        let encoding = self.tokenizer.encode_fast(text, true).map_err(tok_err)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// How many tokens `prompt` makes alone, without special tokens.
    fn prompt_len(&mut self, prompt: &str) -> Result<usize, TokenizationError> {
        self.set_truncation(None)?;
        let encoding = self.tokenizer.encode_fast(prompt, false).map_err(tok_err)?;
        Ok(encoding.len())
    }

    pub(crate) fn tokenize(
        &mut self,
        input: String,
        add_special_tokens: bool,
        prompt_name: Option<String>,
    ) -> Result<Vec<TokenInfo>, TokenizationError> {
        let opts = EncodeOptions {
            prompt_name,
            apply_prompts: true,
            ..Default::default()
        };
        let text = match self.config.prompt(&opts)? {
            Some(p) => format!("{p}{input}"),
            None => input,
        };
        self.set_truncation(None)?;
        let encoding = self
            .tokenizer
            .encode_char_offsets(text.as_str(), add_special_tokens)
            .map_err(tok_err)?;
        let chars: Vec<char> = text.chars().collect();
        Ok(encoding
            .get_ids()
            .iter()
            .zip(encoding.get_offsets())
            .zip(encoding.get_special_tokens_mask())
            .zip(encoding.get_tokens())
            .map(|(((&id, &(start, stop)), &special), token)| {
                if special == 1 {
                    TokenInfo {
                        id,
                        text: token.clone(),
                        special: true,
                        start: None,
                        stop: None,
                    }
                } else {
                    let stop = stop.min(chars.len());
                    let start = start.min(stop);
                    TokenInfo {
                        id,
                        text: chars[start..stop].iter().collect(),
                        special: false,
                        start: Some(start),
                        stop: Some(stop),
                    }
                }
            })
            .collect())
    }
}
