//! Tokenization on a pool of worker threads with the HF `tokenizers` crate.
//!
//! Tokenizing is CPU-bound and can take longer than a small model's forward pass, so it runs on
//! dedicated threads and each input of a batch request is a separate job, spreading one large
//! request over all workers. Small requests (a few KB of text in all: queries) are the
//! exception: they are tokenized inline by their handler, so they never wait in the pool's
//! queue behind a backfill's documents, and skip the two thread hand-offs a pool job costs.
//!
//! One pool serves every model of the server ([`TokenizerPool`]): its threads take each
//! model's jobs in turn, each job carrying its model's tokenizer and rules.
//!
//! [`Tokenization`] is one model's handle. The encode rules are in `encode` (no threads), the
//! pool's threads in `pool`, their scheduling class in `priority`, inline encoding in
//! `inline`, and the switch that holds part of the pool back in `throttle`.

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
    load_tokenizer, EncodeOptions, EncodingInput, PairTemplate, TextPadding, TokenInfo,
    TokenizationError, TokenizerConfig, TruncationDirection, ValidEncoding, Window,
};
pub(crate) use encode::{EncodeConfig, Encoder};
pub use priority::PoolPriority;
pub use throttle::{PoolThrottle, ThrottleVote};

pub use inline::InlinePool;
use pool::{Job, ModelEncoders, Reply, Work};
pub use pool::{PoolLoad, TokenizerPool};
use std::sync::atomic::Ordering;
use std::sync::Arc;
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

/// One model's tokenization: inline for small requests, else on the server's shared
/// [`TokenizerPool`], whose jobs carry the model's encoders.
#[derive(Clone)]
pub struct Tokenization {
    pool: TokenizerPool,
    model: Arc<ModelEncoders>,
}

impl Tokenization {
    /// A model with a pool of its own in the class a GPU runtime gets (`PoolPriority::Idle`);
    /// the server starts one pool for all its models and calls `on_pool`.
    pub fn new(tokenizer: Tokenizer, workers: usize, model: TokenizerConfig) -> Self {
        let pool = TokenizerPool::spawn(workers, PoolPriority::Idle);
        Self::on_pool(&pool, tokenizer, model)
    }

    /// The model whose tokenizer and rules are `tokenizer` and `model`, its pool jobs run by
    /// `pool`'s threads.
    pub fn on_pool(pool: &TokenizerPool, tokenizer: Tokenizer, model: TokenizerConfig) -> Self {
        let config = Arc::new(EncodeConfig::new(&tokenizer, model));
        let inline = InlinePool::with_config(tokenizer, config);
        Self {
            model: Arc::new(ModelEncoders::new(pool.next_slot(), inline, pool.workers())),
            pool: pool.clone(),
        }
    }

    /// A step that tokenizes a short English text inline, as a query is, and drops the
    /// result: a spinning interactive thread runs it between queries to keep the tokenizer's
    /// code and tables in the CPU's caches (`backend::wait`). Its worker goes back to the
    /// inline pool last, so the next query takes that one.
    pub fn warmer(&self) -> impl Fn() + Send + Sync + 'static {
        let model = self.model.clone();
        let opts = EncodeOptions {
            truncate: true,
            apply_prompts: true,
            inline: true,
            ..EncodeOptions::default()
        };
        move || {
            let _ = model
                .inline
                .encode(EncodingInput::Single(WARM_TEXT.to_owned()), &opts);
        }
    }

    /// This model's say in when part of the pool stands aside (see [`PoolThrottle`]).
    pub fn throttle(&self) -> ThrottleVote {
        self.pool.throttle.vote()
    }

    /// The kernel thread ids (Linux) of the pool threads that have started and taken their
    /// scheduling class so far.
    pub fn worker_tids(&self) -> Vec<u32> {
        self.pool.worker_tids()
    }

    /// Whether the pool leaves cores free now ([`PoolLoad`]), without keeping it alive.
    pub fn load(&self) -> PoolLoad {
        self.pool.load()
    }

    async fn submit<T>(&self, make: impl FnOnce(Reply<T>) -> Work) -> Result<T, TokenizationError> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            model: self.model.clone(),
            work: make(reply),
        };
        let waiting = &self.pool.waiting;
        waiting.fetch_add(1, Ordering::Relaxed);
        if self.pool.tx.send(job).is_err() {
            waiting.fetch_sub(1, Ordering::Relaxed);
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
            return self.model.inline.encode(input, &opts);
        }
        self.submit(|r| Work::Encode(input, opts, r)).await
    }

    /// `input`'s sequences: one, or its windows under `long_input: chunk`
    /// ([`EncodeOptions::chunking`]).
    pub async fn encode_windows(
        &self,
        input: EncodingInput,
        opts: EncodeOptions,
    ) -> Result<Vec<Window>, TokenizationError> {
        if opts.inline {
            return self.model.inline.encode_windows(input, &opts);
        }
        self.submit(|r| Work::EncodeWindows(input, opts, r)).await
    }

    pub async fn tokenize(
        &self,
        input: String,
        add_special_tokens: bool,
        prompt_name: Option<String>,
    ) -> Result<Vec<TokenInfo>, TokenizationError> {
        self.submit(|r| Work::Tokenize(input, add_special_tokens, prompt_name, r))
            .await
    }

    /// Runs `task` on a pool thread, in the pool's scheduling class and under its throttle
    /// like the model's tokenization: the other work of preparing inputs (an image's decoding
    /// and resizing), which would otherwise take cores from the threads that answer queries.
    /// Skipped if the caller is gone before a thread takes it.
    pub async fn run<T: Send + 'static>(
        &self,
        task: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, TokenizationError> {
        self.submit(|reply: Reply<T>| {
            Work::Task(Box::new(move || {
                if reply.is_closed() {
                    return;
                }
                let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(task));
                let _ = reply.send(done.map_err(|_| TokenizationError::Panicked));
            }))
        })
        .await
    }

    pub async fn decode(
        &self,
        ids: Vec<u32>,
        skip_special_tokens: bool,
    ) -> Result<String, TokenizationError> {
        self.submit(|r| Work::Decode(ids, skip_special_tokens, r))
            .await
    }
}

#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_pool;
