//! Tokenization on a pool of worker threads with the HF `tokenizers` crate.
//!
//! Tokenizing is CPU-bound and can take longer than a small model's forward pass, so it runs on
//! dedicated threads and each input of a batch request is a separate job, spreading one large
//! request over all workers. Small requests (a few KB of text in all: queries) are the
//! exception: they are tokenized inline by their handler, so they never wait in the pool's
//! queue behind a backfill's documents, and skip the two thread hand-offs a pool job costs.

mod fast_wordpiece;
mod throttle;

pub(crate) use fast_wordpiece::FastWordPiece;

pub use throttle::PoolThrottle;

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use tokenizers::{Tokenizer, TruncationParams, TruncationStrategy};
use tokio::sync::oneshot;

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
#[derive(Debug, Clone, PartialEq)]
pub struct ValidEncoding {
    pub input_ids: Vec<u32>,
    pub token_type_ids: Vec<u32>,
    pub position_ids: Vec<u32>,
}

#[derive(Debug, Clone, Default)]
pub struct EncodeOptions {
    pub truncate: bool,
    pub direction: TruncationDirection,
    pub prompt_name: Option<String>,
    /// Prompts are for embedding inputs; classification pairs are encoded as given.
    pub apply_prompts: bool,
    /// Encode on the calling thread instead of a pool worker. For small requests the two
    /// thread hand-offs to and from the pool cost far more than tokenizing a few dozen tokens;
    /// see `Infer::inline_ok`.
    pub inline: bool,
}

/// Requests whose inputs total at most this many bytes are tokenized inline, on the tokio
/// worker that handles them (a few tens of microseconds at most); larger ones go to the pool,
/// which spreads their inputs over all workers and keeps tokio workers free. 2 KB is about
/// 400 tokens of English, above the interactive lane's default 256 tokens.
pub const INLINE_MAX_BYTES: usize = 2048;

/// What [`Tokenization::warmer`] tokenizes: a query-sized sentence of common words.
const WARM_TEXT: &str =
    "how do I change the email address of my account after the old one was closed";

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
    #[error("Tokenizer error: {0}")]
    Tokenizer(String),
    #[error("tokenization workers have stopped")]
    Stopped,
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
}

#[derive(Debug)]
struct Config {
    model: TokenizerConfig,
    vocab_size: usize,
    /// BERT's tokenizer without its per-character bookkeeping, for ASCII texts, where the
    /// tokenizer is BERT's.
    fast: Option<FastWordPiece>,
}

impl Config {
    /// The adapter a prompted text selects, for models with per-request adapters.
    fn adapter(&self, opts: &EncodeOptions) -> Option<u32> {
        if !opts.apply_prompts || self.model.adapters.is_empty() {
            return None;
        }
        let index = match &opts.prompt_name {
            Some(name) => self.model.adapters.get(name).copied().unwrap_or(0),
            None => self.model.default_adapter,
        };
        Some(index)
    }

    fn prompt(&self, opts: &EncodeOptions) -> Result<Option<&str>, TokenizationError> {
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

type Reply<T> = oneshot::Sender<Result<T, TokenizationError>>;

enum Job {
    Encode(EncodingInput, EncodeOptions, Reply<ValidEncoding>),
    Tokenize(String, bool, Option<String>, Reply<Vec<TokenInfo>>),
    Decode(Vec<u32>, bool, Reply<String>),
}

/// How the pool's threads compete for cores with the router's other threads (Linux; other
/// systems keep the default).
///
/// The pool has one thread per core by default, and a backfill keeps them all busy. A query's
/// own threads (its connection's task, the backend thread, the response) then wake up behind
/// them and may wait for a core: milliseconds at the p99 (docs/journal/results-log.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PoolPriority {
    /// The operating system's default class, shared equally with every other thread.
    Normal,
    /// Nice 19: the pool gets a small share of a core that other threads also want.
    Low,
    /// `SCHED_IDLE`: the pool runs only on cores no other thread wants, and a thread that
    /// wakes up takes its core at once. Any core nobody else needs still tokenizes.
    Idle,
}

impl PoolPriority {
    /// The class for a runtime with or without an interactive lane. With one, the forward
    /// passes run on an accelerator and the host's cores serve tokenization and queries, so
    /// queries come first. Without one (a CPU), the forward pass's own threads would take
    /// every core from an idle-class pool: measured on the 2-core CI machine, the backfill
    /// lost 7 % and queries gained nothing (docs/journal/results-log.md).
    pub fn for_runtime(interactive_lane: bool) -> Self {
        if interactive_lane {
            Self::Idle
        } else {
            Self::Normal
        }
    }

    /// Applies the class to the calling thread. A failure (a sandbox that forbids it) leaves
    /// the thread as it was.
    fn apply(self) {
        #[cfg(target_os = "linux")]
        // SAFETY: plain system calls on the calling thread (pid 0 / its own tid) with valid
        // arguments.
        unsafe {
            match self {
                Self::Normal => {}
                Self::Low => {
                    libc::setpriority(libc::PRIO_PROCESS, current_tid(), 19);
                }
                Self::Idle => {
                    let param = libc::sched_param { sched_priority: 0 };
                    libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
                }
            }
        }
    }
}

/// The calling thread's kernel thread id.
#[cfg(target_os = "linux")]
fn current_tid() -> libc::id_t {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as libc::id_t }
}

/// Handle to the worker pool. Workers exit when the last handle is dropped.
#[derive(Clone)]
pub struct Tokenization {
    tx: mpsc::Sender<Job>,
    inline: Arc<InlinePool>,
    /// Off unless the queue turns it on (see [`PoolThrottle`]).
    throttle: Arc<PoolThrottle>,
    /// Jobs sent and not yet taken by a pool thread.
    waiting: Arc<AtomicUsize>,
    /// The pool threads' kernel thread ids (Linux), each added once the thread has taken its
    /// scheduling class.
    worker_tids: Arc<Mutex<Vec<u32>>>,
}

/// How busy the tokenizer pool keeps the host's cores, for threads that would rather poll
/// than sleep (the HTTP thread): while jobs wait for a pool thread, every pool thread is
/// busy and the cores are theirs.
#[derive(Debug, Clone)]
pub struct PoolLoad {
    waiting: Arc<AtomicUsize>,
    throttle: Arc<PoolThrottle>,
}

impl PoolLoad {
    /// Jobs sent to the pool and not yet taken by one of its threads.
    pub fn jobs_waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Whether a core is free for a thread that polls: no job waits for a pool thread, or
    /// part of the pool stands aside on purpose (the throttle is on: the backend bounds the
    /// backfill, and the waiting jobs wait for it, not for cores).
    pub fn leaves_cores_free(&self) -> bool {
        self.throttle.is_limited() || self.jobs_waiting() == 0
    }
}

/// Idle [`Worker`]s for inline encoding: taken for one encode, then put back. There are never
/// more of them than callers that encoded inline at the same time (at most the tokio workers).
struct InlinePool {
    tokenizer: Tokenizer,
    config: Arc<Config>,
    idle: Mutex<Vec<Worker>>,
}

impl InlinePool {
    fn take(&self) -> Worker {
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        idle.unwrap_or_else(|| Worker {
            tokenizer: self.tokenizer.clone(),
            truncation: None,
            config: self.config.clone(),
        })
    }

    fn put(&self, worker: Worker) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(worker);
        }
    }

    /// Encodes on the calling thread with an idle worker, which goes back to the pool last:
    /// the next inline encode takes it.
    fn encode(
        &self,
        input: EncodingInput,
        opts: &EncodeOptions,
    ) -> Result<ValidEncoding, TokenizationError> {
        let mut worker = self.take();
        let result = worker.encode(input, opts);
        self.put(worker);
        result
    }
}

impl Tokenization {
    /// A pool in the class a GPU runtime gets (`PoolPriority::Idle`); the server picks the
    /// class with `PoolPriority::for_runtime` or the flag and calls `with_priority`.
    pub fn new(tokenizer: Tokenizer, workers: usize, model: TokenizerConfig) -> Self {
        Self::with_priority(tokenizer, workers, model, PoolPriority::Idle)
    }

    /// A pool whose threads compete for cores as `priority` says.
    pub fn with_priority(
        tokenizer: Tokenizer,
        workers: usize,
        model: TokenizerConfig,
        priority: PoolPriority,
    ) -> Self {
        let config = Arc::new(Config {
            model,
            vocab_size: tokenizer.get_vocab_size(true),
            fast: FastWordPiece::from_tokenizer(&tokenizer),
        });
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let worker_tids: Arc<Mutex<Vec<u32>>> = Arc::default();
        let throttle = Arc::new(PoolThrottle::for_pool(workers.max(1)));
        let waiting: Arc<AtomicUsize> = Arc::default();
        for i in 0..workers.max(1) {
            let rx = rx.clone();
            let tids = worker_tids.clone();
            let throttle = throttle.clone();
            let waiting = waiting.clone();
            let mut worker = Worker {
                tokenizer: tokenizer.clone(),
                truncation: None,
                config: config.clone(),
            };
            std::thread::Builder::new()
                .name(format!("tokenizer-{i}"))
                .spawn(move || {
                    priority.apply();
                    #[cfg(target_os = "linux")]
                    if let Ok(mut tids) = tids.lock() {
                        tids.push(current_tid());
                    }
                    loop {
                        throttle.wait_turn(i);
                        // Holding the lock while waiting is fine: the other workers would wait
                        // anyway.
                        let job = match rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => {
                                waiting.fetch_sub(1, Ordering::Relaxed);
                                worker.run(job)
                            }
                            Err(_) => return,
                        }
                    }
                })
                .expect("cannot spawn a tokenization worker");
        }
        // One ready worker so the first small request does not pay for a tokenizer clone.
        let first = Worker {
            tokenizer: tokenizer.clone(),
            truncation: None,
            config: config.clone(),
        };
        let inline = Arc::new(InlinePool {
            tokenizer,
            config,
            idle: Mutex::new(vec![first]),
        });
        Self {
            tx,
            inline,
            throttle,
            waiting,
            worker_tids,
        }
    }

    /// A step that tokenizes a short English text inline, as a query is, and drops the
    /// result: a spinning interactive thread runs it between queries to keep the tokenizer's
    /// code and tables in the CPU's caches (`backend::wait`). Its worker goes back to the
    /// inline pool last, so the next query takes that one.
    pub fn warmer(&self) -> impl Fn() + Send + Sync + 'static {
        let inline = self.inline.clone();
        let opts = EncodeOptions {
            truncate: true,
            apply_prompts: true,
            inline: true,
            ..EncodeOptions::default()
        };
        move || {
            let _ = inline.encode(EncodingInput::Single(WARM_TEXT.to_owned()), &opts);
        }
    }

    /// The switch that lets part of the pool stand aside (see [`PoolThrottle`]).
    pub fn throttle(&self) -> Arc<PoolThrottle> {
        self.throttle.clone()
    }

    /// The kernel thread ids (Linux) of the pool threads that have started and taken their
    /// scheduling class so far.
    pub fn worker_tids(&self) -> Vec<u32> {
        self.worker_tids
            .lock()
            .map(|tids| tids.clone())
            .unwrap_or_default()
    }

    /// Whether the pool leaves cores free now ([`PoolLoad`]), without keeping it alive.
    pub fn load(&self) -> PoolLoad {
        PoolLoad {
            waiting: self.waiting.clone(),
            throttle: self.throttle.clone(),
        }
    }

    async fn submit<T>(&self, make: impl FnOnce(Reply<T>) -> Job) -> Result<T, TokenizationError> {
        let (reply, rx) = oneshot::channel();
        self.waiting.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(make(reply)).is_err() {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(TokenizationError::Stopped);
        }
        rx.await.map_err(|_| TokenizationError::Stopped)?
    }

    pub async fn encode(
        &self,
        input: EncodingInput,
        opts: EncodeOptions,
    ) -> Result<ValidEncoding, TokenizationError> {
        if opts.inline {
            return self.inline.encode(input, &opts);
        }
        self.submit(|r| Job::Encode(input, opts, r)).await
    }

    pub async fn tokenize(
        &self,
        input: String,
        add_special_tokens: bool,
        prompt_name: Option<String>,
    ) -> Result<Vec<TokenInfo>, TokenizationError> {
        self.submit(|r| Job::Tokenize(input, add_special_tokens, prompt_name, r))
            .await
    }

    pub async fn decode(
        &self,
        ids: Vec<u32>,
        skip_special_tokens: bool,
    ) -> Result<String, TokenizationError> {
        self.submit(|r| Job::Decode(ids, skip_special_tokens, r))
            .await
    }
}

struct Worker {
    tokenizer: Tokenizer,
    /// The truncation currently set on `tokenizer`, to avoid resetting it for every job.
    truncation: Option<TruncationParams>,
    config: Arc<Config>,
}

fn tok_err(e: impl std::fmt::Display) -> TokenizationError {
    TokenizationError::Tokenizer(e.to_string())
}

impl Worker {
    fn run(&mut self, job: Job) {
        match job {
            Job::Encode(input, opts, reply) => {
                // The client may be gone already (e.g. a sibling input failed): skip the work.
                if !reply.is_closed() {
                    let _ = reply.send(self.encode(input, &opts));
                }
            }
            Job::Tokenize(input, special, prompt_name, reply) => {
                if !reply.is_closed() {
                    let _ = reply.send(self.tokenize(input, special, prompt_name));
                }
            }
            Job::Decode(ids, skip, reply) => {
                let _ = reply.send(self.decode(&ids, skip));
            }
        }
    }

    /// Ids outside the vocabulary are refused: the tokenizer would silently skip them.
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizationError> {
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

    fn encode(
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
                match cfg.adapter(opts) {
                    Some(adapter) => {
                        let n = ids.len();
                        (ids, vec![adapter; n])
                    }
                    None => (ids, type_ids),
                }
            }
        };
        if input_ids.is_empty() {
            return Err(TokenizationError::Tokenizer(
                "the input produced no tokens".into(),
            ));
        }
        let offset = cfg.model.position_offset;
        let position_ids = (offset..offset + input_ids.len() as u32).collect();
        Ok(ValidEncoding {
            input_ids,
            token_type_ids,
            position_ids,
        })
    }

    fn tokenize(
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

#[cfg(test)]
pub(crate) mod tests;
