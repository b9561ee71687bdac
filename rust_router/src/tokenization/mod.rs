//! Tokenization on a pool of worker threads with the HF `tokenizers` crate.
//!
//! Tokenizing is CPU-bound and can take longer than a small model's forward pass, so it runs on
//! dedicated threads and each input of a batch request is a separate job, spreading one large
//! request over all workers. Small requests (a few KB of text in all: queries) are the
//! exception: they are tokenized inline by their handler, so they never wait in the pool's
//! queue behind a backfill's documents, and skip the two thread hand-offs a pool job costs.
//!
//! [`Tokenization`] is the handle. The encode rules are in `encode` (no threads), the pool's
//! threads in `pool`, their scheduling class in `priority`, inline encoding in `inline`, and
//! the switch that holds part of the pool back in `throttle`.

mod chunk;
mod encode;
mod fast_wordpiece;
mod inline;
mod pool;
mod priority;
mod throttle;

pub(crate) use fast_wordpiece::FastWordPiece;

pub use chunk::{weighted_mean, ChunkError, Chunking, LongInput};
pub use encode::{
    load_tokenizer, EncodeOptions, EncodingInput, PairTemplate, TokenInfo, TokenizationError,
    TokenizerConfig, TruncationDirection, ValidEncoding, Window,
};
pub(crate) use encode::{EncodeConfig, Encoder};
pub use priority::PoolPriority;
pub use throttle::PoolThrottle;

pub use inline::InlinePool;
use pool::{Job, Reply};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use tokenizers::Tokenizer;
use tokio::sync::oneshot;

/// Requests whose inputs total at most this many bytes are tokenized inline, on the tokio
/// worker that handles them (a few tens of microseconds at most); larger ones go to the pool,
/// which spreads their inputs over all workers and keeps tokio workers free. 2 KB is about
/// 400 tokens of English, above the interactive lane's default 256 tokens.
pub const INLINE_MAX_BYTES: usize = 2048;

/// What [`Tokenization::warmer`] tokenizes: a query-sized sentence of common words.
const WARM_TEXT: &str =
    "how do I change the email address of my account after the old one was closed";

/// Handle to the worker pool. Workers exit when the last handle is dropped.
#[derive(Clone)]
pub struct Tokenization {
    tx: mpsc::Sender<Job>,
    inline: Arc<InlinePool>,
    /// Off unless the batching tasks turn it on (see [`PoolThrottle`]).
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

impl Tokenization {
    /// A pool in the class a GPU runtime gets (`PoolPriority::Idle`); the server takes the
    /// class from its `schedule::ServingProfile` and calls `with_priority`.
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
        let config = Arc::new(EncodeConfig::new(&tokenizer, model));
        let worker_tids: Arc<Mutex<Vec<u32>>> = Arc::default();
        let throttle = Arc::new(PoolThrottle::for_pool(workers.max(1)));
        let waiting: Arc<AtomicUsize> = Arc::default();
        let tx = pool::spawn(
            &tokenizer,
            &config,
            workers,
            priority,
            &throttle,
            &waiting,
            &worker_tids,
        );
        let inline = Arc::new(InlinePool::with_config(tokenizer, config));
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

    /// `input`'s sequences: one, or its windows under `long_input: chunk`
    /// ([`EncodeOptions::chunking`]).
    pub async fn encode_windows(
        &self,
        input: EncodingInput,
        opts: EncodeOptions,
    ) -> Result<Vec<Window>, TokenizationError> {
        if opts.inline {
            return self.inline.encode_windows(input, &opts);
        }
        self.submit(|r| Job::EncodeWindows(input, opts, r)).await
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

#[cfg(test)]
pub(crate) mod tests;
