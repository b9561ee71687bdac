//! Tokenization on a pool of worker threads with the HF `tokenizers` crate.
//!
//! Tokenizing is CPU-bound and can take longer than a small model's forward pass, so it runs on
//! dedicated threads and each input of a batch request is a separate job, spreading one large
//! request over all workers. Small requests (a few KB of text in all: queries) are the
//! exception: they are tokenized inline by their handler, so they never wait in the pool's
//! queue behind a backfill's documents, and skip the two thread hand-offs a pool job costs.

mod encode;
mod fast_wordpiece;
mod throttle;

pub(crate) use fast_wordpiece::FastWordPiece;

pub use encode::{
    load_tokenizer, EncodeOptions, EncodingInput, PairTemplate, TokenInfo, TokenizationError,
    TokenizerConfig, TruncationDirection, ValidEncoding,
};
pub(crate) use encode::{EncodeConfig, Encoder};
pub use throttle::PoolThrottle;

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

/// Idle [`Encoder`]s for inline encoding: taken for one encode, then put back. There are never
/// more of them than callers that encoded inline at the same time (at most the tokio workers).
struct InlinePool {
    tokenizer: Tokenizer,
    config: Arc<EncodeConfig>,
    idle: Mutex<Vec<Encoder>>,
}

impl InlinePool {
    fn take(&self) -> Encoder {
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        idle.unwrap_or_else(|| Encoder::new(self.tokenizer.clone(), self.config.clone()))
    }

    fn put(&self, worker: Encoder) {
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
        let config = Arc::new(EncodeConfig::new(&tokenizer, model));
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
            let mut worker = Encoder::new(tokenizer.clone(), config.clone());
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
                                run_job(&mut worker, job)
                            }
                            Err(_) => return,
                        }
                    }
                })
                .expect("cannot spawn a tokenization worker");
        }
        // One ready worker so the first small request does not pay for a tokenizer clone.
        let first = Encoder::new(tokenizer.clone(), config.clone());
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

/// Runs one pool job with a pool thread's encoder.
fn run_job(encoder: &mut Encoder, job: Job) {
    match job {
        Job::Encode(input, opts, reply) => {
            // The client may be gone already (e.g. a sibling input failed): skip the work.
            if !reply.is_closed() {
                let _ = reply.send(encoder.encode(input, &opts));
            }
        }
        Job::Tokenize(input, special, prompt_name, reply) => {
            if !reply.is_closed() {
                let _ = reply.send(encoder.tokenize(input, special, prompt_name));
            }
        }
        Job::Decode(ids, skip, reply) => {
            let _ = reply.send(encoder.decode(&ids, skip));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
