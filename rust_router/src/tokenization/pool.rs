//! The pool's threads, shared by every model the server serves: each takes the next job from
//! one channel, whichever model's it is, once its class is set and the throttle lets it, and
//! runs it with an [`Encoder`] of its own for the job's model.

#[cfg(target_os = "linux")]
use super::priority::current_tid;
use super::{
    EncodeOptions, Encoder, EncodingInput, InlinePool, PoolPriority, PoolThrottle, TokenInfo,
    TokenizationError, ValidEncoding, Window,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

pub(super) type Reply<T> = oneshot::Sender<Result<T, TokenizationError>>;

/// One request for a pool thread, with the model whose rules it follows.
pub(super) struct Job {
    pub(super) model: Arc<ModelEncoders>,
    pub(super) work: Work,
}

pub(super) enum Work {
    Encode(EncodingInput, EncodeOptions, Reply<ValidEncoding>),
    EncodeWindows(EncodingInput, EncodeOptions, Reply<Vec<Window>>),
    Tokenize(String, bool, Option<String>, Reply<Vec<TokenInfo>>),
    Decode(Vec<u32>, bool, Reply<String>),
    /// Any other preparation of a model's inputs (an image's decoding and resizing), which
    /// answers its caller itself.
    Task(Box<dyn FnOnce() + Send>),
}

/// One model's encoders: those its inline callers take in turn, and those ready for the pool
/// threads, each of which keeps one for every model it has run a job of (in the model's
/// `slot` of its list).
pub(super) struct ModelEncoders {
    pub(super) slot: usize,
    pub(super) inline: InlinePool,
    /// Built with the model (as many as the pool has threads), so that no job waits for a
    /// tokenizer to be copied.
    for_threads: Mutex<Vec<Encoder>>,
}

impl ModelEncoders {
    pub(super) fn new(slot: usize, inline: InlinePool, threads: usize) -> Self {
        let for_threads = (0..threads).map(|_| inline.new_encoder()).collect();
        Self {
            slot,
            inline,
            for_threads: Mutex::new(for_threads),
        }
    }

    /// An encoder for a pool thread that has none for this model yet.
    fn for_thread(&self) -> Encoder {
        let ready = self
            .for_threads
            .lock()
            .ok()
            .and_then(|mut ready| ready.pop());
        ready.unwrap_or_else(|| self.inline.new_encoder())
    }
}

/// The tokenizer threads of a server, shared by the models it serves (each one's
/// `Tokenization` sends its jobs here). The threads exit once every handle is dropped.
#[derive(Clone)]
pub struct TokenizerPool {
    pub(super) tx: mpsc::Sender<Job>,
    workers: usize,
    /// Off unless some model's batching tasks turn it on (see [`PoolThrottle`]).
    pub(super) throttle: Arc<PoolThrottle>,
    /// Jobs sent and not yet taken by a pool thread.
    pub(super) waiting: Arc<AtomicUsize>,
    /// The threads' kernel thread ids (Linux), each added once the thread has taken its
    /// scheduling class.
    worker_tids: Arc<Mutex<Vec<u32>>>,
    /// The slot of the next model's encoders in each thread's list.
    next_slot: Arc<AtomicUsize>,
}

impl TokenizerPool {
    /// Starts `workers` threads (at least one) in the class `priority`, taking jobs in turn:
    /// a thread that the throttle holds back takes none.
    pub fn spawn(workers: usize, priority: PoolPriority) -> Self {
        let workers = workers.max(1);
        let throttle = Arc::new(PoolThrottle::for_pool(workers));
        let waiting: Arc<AtomicUsize> = Arc::default();
        let worker_tids: Arc<Mutex<Vec<u32>>> = Arc::default();
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..workers {
            let rx = rx.clone();
            let tids = worker_tids.clone();
            let throttle = throttle.clone();
            let waiting = waiting.clone();
            std::thread::Builder::new()
                .name(format!("tokenizer-{i}"))
                .spawn(move || {
                    priority.apply();
                    #[cfg(target_os = "linux")]
                    if let Ok(mut tids) = tids.lock() {
                        tids.push(current_tid());
                    }
                    // By model slot: this thread's encoder of each model it has run a job of.
                    let mut encoders: Vec<Option<Encoder>> = Vec::new();
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
                                run_job(encoder_for(&mut encoders, &job.model), job.work)
                            }
                            Err(_) => return,
                        }
                    }
                })
                .expect("cannot spawn a tokenization worker");
        }
        Self {
            tx,
            workers,
            throttle,
            waiting,
            worker_tids,
            next_slot: Arc::default(),
        }
    }

    /// How many threads the pool has.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The slot of a new model's encoders.
    pub(super) fn next_slot(&self) -> usize {
        self.next_slot.fetch_add(1, Ordering::Relaxed)
    }

    /// The kernel thread ids (Linux) of the threads that have started and taken their
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
    /// part of the pool stands aside on purpose (the throttle is on: a backend bounds its
    /// backfill, and the waiting jobs wait for it, not for cores).
    pub fn leaves_cores_free(&self) -> bool {
        self.throttle.is_limited() || self.jobs_waiting() == 0
    }
}

/// A pool thread's encoder for `model` (in `encoders`, by slot), taken from the model's
/// ready ones the first time.
fn encoder_for<'a>(
    encoders: &'a mut Vec<Option<Encoder>>,
    model: &ModelEncoders,
) -> &'a mut Encoder {
    if encoders.len() <= model.slot {
        encoders.resize_with(model.slot + 1, || None);
    }
    encoders[model.slot].get_or_insert_with(|| model.for_thread())
}

/// Runs one pool job with a pool thread's encoder of its model.
fn run_job(encoder: &mut Encoder, work: Work) {
    match work {
        Work::Encode(input, opts, reply) => {
            // The client may be gone already (e.g. a sibling input failed): skip the work.
            if !reply.is_closed() {
                let _ = reply.send(encoder.encode(input, &opts));
            }
        }
        Work::EncodeWindows(input, opts, reply) => {
            if !reply.is_closed() {
                let _ = reply.send(encoder.encode_windows(input, &opts));
            }
        }
        Work::Tokenize(input, special, prompt_name, reply) => {
            if !reply.is_closed() {
                let _ = reply.send(encoder.tokenize(input, special, prompt_name));
            }
        }
        Work::Decode(ids, skip, reply) => {
            let _ = reply.send(encoder.decode(&ids, skip));
        }
        Work::Task(task) => task(),
    }
}
