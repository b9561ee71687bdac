//! The pool's threads: each takes the next job from one channel, with an [`Encoder`] of its
//! own, once its class is set and the throttle lets it.

#[cfg(target_os = "linux")]
use super::priority::current_tid;
use super::{
    EncodeConfig, EncodeOptions, Encoder, EncodingInput, PoolPriority, PoolThrottle, TokenInfo,
    TokenizationError, ValidEncoding, Window,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use tokenizers::Tokenizer;
use tokio::sync::oneshot;

pub(super) type Reply<T> = oneshot::Sender<Result<T, TokenizationError>>;

/// One request for a pool thread.
pub(super) enum Job {
    Encode(EncodingInput, EncodeOptions, Reply<ValidEncoding>),
    EncodeWindows(EncodingInput, EncodeOptions, Reply<Vec<Window>>),
    Tokenize(String, bool, Option<String>, Reply<Vec<TokenInfo>>),
    Decode(Vec<u32>, bool, Reply<String>),
}

/// Starts `workers` pool threads (at least one) in the class `priority`, each with an
/// [`Encoder`] of its own, taking jobs from the returned sender in turn: a thread that
/// `throttle` holds back takes none, `waiting` counts the jobs no thread has taken yet, and
/// each thread adds its kernel thread id to `worker_tids` once it has taken its class.
pub(super) fn spawn(
    tokenizer: &Tokenizer,
    config: &Arc<EncodeConfig>,
    workers: usize,
    priority: PoolPriority,
    throttle: &Arc<PoolThrottle>,
    waiting: &Arc<AtomicUsize>,
    worker_tids: &Arc<Mutex<Vec<u32>>>,
) -> mpsc::Sender<Job> {
    let (tx, rx) = mpsc::channel::<Job>();
    let rx = Arc::new(Mutex::new(rx));
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
    tx
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
        Job::EncodeWindows(input, opts, reply) => {
            if !reply.is_closed() {
                let _ = reply.send(encoder.encode_windows(input, &opts));
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
