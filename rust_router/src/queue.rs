//! The request queue: a pure [`State`] that packs sequences into batches, and a [`Queue`]
//! handle that the handlers append to and the batching task drains.
//!
//! One queue entry is one sequence. A client request with many inputs becomes many entries, so a
//! request larger than one batch is split across consecutive batches for free; the handler
//! reassembles the per-sequence results in input order.

use crate::backend::{BackendError, Batch, BatchKind};
use crate::metrics::Metrics;
use crate::tokenization::ValidEncoding;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};

/// What the batching task hands back to a waiting request.
#[derive(Debug)]
pub struct InferResult {
    /// Row-major `[rows, cols]`: one row for pooled / predict, one per token for all-tokens.
    pub values: Vec<f32>,
    pub cols: usize,
    pub queue: Duration,
    pub inference: Duration,
}

pub type ResponseTx = oneshot::Sender<Result<InferResult, BackendError>>;

#[derive(Debug)]
pub struct Metadata {
    pub response_tx: ResponseTx,
    pub tokenization: Duration,
    pub queued_at: Instant,
}

#[derive(Debug)]
pub struct Entry {
    pub encoding: ValidEncoding,
    pub kind: BatchKind,
    pub metadata: Metadata,
}

#[derive(Debug)]
pub struct NextBatch {
    pub kind: BatchKind,
    pub batch: Batch,
    /// One per sequence, in batch order.
    pub metadata: Vec<Metadata>,
}

/// Queue contents and the packing rule, with no I/O so it can be tested directly.
#[derive(Debug)]
pub struct State {
    entries: VecDeque<Entry>,
    max_batch_tokens: usize,
    max_batch_requests: Option<usize>,
    dropped: u64,
}

impl State {
    pub fn new(max_batch_tokens: usize, max_batch_requests: Option<usize>) -> Self {
        Self {
            entries: VecDeque::new(),
            max_batch_tokens,
            max_batch_requests,
            dropped: 0,
        }
    }

    pub fn append(&mut self, entry: Entry) {
        self.entries.push_back(entry);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries skipped because their client went away, since the last call.
    pub fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }

    /// Takes entries from the front, in order, while they are of the same kind as the first and
    /// fit in the token and sequence budgets. Entries whose receiver is gone are discarded, so a
    /// disconnected client costs no compute.
    pub fn next_batch(&mut self) -> Option<NextBatch> {
        let mut kind = None;
        let mut batch = Batch {
            cu_seqlens: vec![0],
            ..Default::default()
        };
        let mut metadata = Vec::new();
        while let Some(entry) = self.entries.front() {
            if entry.metadata.response_tx.is_closed() {
                self.entries.pop_front();
                self.dropped += 1;
                continue;
            }
            let len = entry.encoding.input_ids.len();
            let fits = batch.input_ids.len() + len <= self.max_batch_tokens
                // A sequence longer than the whole budget still has to run somewhere: alone.
                || metadata.is_empty();
            if kind.is_some_and(|k| k != entry.kind) || !fits {
                break;
            }
            let entry = self.entries.pop_front().expect("front exists");
            kind = Some(entry.kind);
            batch.input_ids.extend(entry.encoding.input_ids);
            batch.token_type_ids.extend(entry.encoding.token_type_ids);
            batch.position_ids.extend(entry.encoding.position_ids);
            batch.cu_seqlens.push(batch.input_ids.len() as u32);
            batch.max_length = batch.max_length.max(len as u32);
            metadata.push(entry.metadata);
            if Some(metadata.len()) == self.max_batch_requests {
                break;
            }
        }
        kind.map(|kind| NextBatch {
            kind,
            batch,
            metadata,
        })
    }
}

struct Inner {
    state: Mutex<State>,
    notify: Notify,
    closed: AtomicBool,
    metrics: Arc<Metrics>,
}

/// Shared handle: handlers append, the single batching task takes batches.
#[derive(Clone)]
pub struct Queue {
    inner: Arc<Inner>,
}

impl Queue {
    pub fn new(
        max_batch_tokens: usize,
        max_batch_requests: Option<usize>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State::new(max_batch_tokens, max_batch_requests)),
                notify: Notify::new(),
                closed: AtomicBool::new(false),
                metrics,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The lock is held only for pushes and packing, which cannot panic half-way; recover
        // from poisoning instead of wedging the server.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn append(&self, entry: Entry) {
        let len = {
            let mut state = self.state();
            state.append(entry);
            state.len()
        };
        self.inner.metrics.gauge_set("te_queue_size", len as f64);
        // `notify_one` stores a permit when nobody waits, so an append never goes unnoticed.
        self.inner.notify.notify_one();
    }

    /// Packs the next batch from what is queued now, if anything is.
    pub fn try_next_batch(&self) -> Option<NextBatch> {
        let mut state = self.state();
        let next = state.next_batch();
        let dropped = state.take_dropped();
        let len = state.len();
        drop(state);
        let m = &self.inner.metrics;
        if dropped > 0 {
            m.counter_add("te_request_failure", &[("err", "dropped")], dropped);
        }
        if let Some(next) = &next {
            m.gauge_set("te_queue_size", len as f64);
            m.observe("te_batch_next_size", &[], next.metadata.len() as f64);
            m.observe("te_batch_next_tokens", &[], next.batch.num_tokens() as f64);
        }
        next
    }

    /// Waits until something is queued (`true`), or the queue is closed and empty (`false`).
    pub async fn wait_ready(&self) -> bool {
        loop {
            let notified = self.inner.notify.notified();
            if !self.state().is_empty() {
                return true;
            }
            if self.inner.closed.load(Ordering::Acquire) {
                return false;
            }
            notified.await;
        }
    }

    /// Waits for the next batch; `None` once the queue is closed and drained.
    pub async fn next_batch(&self) -> Option<NextBatch> {
        loop {
            if !self.wait_ready().await {
                return None;
            }
            if let Some(next) = self.try_next_batch() {
                return Some(next);
            }
        }
    }

    /// Lets the batching task finish once what is queued has run.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.notify.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(
        len: usize,
        kind: BatchKind,
    ) -> (Entry, oneshot::Receiver<Result<InferResult, BackendError>>) {
        let (tx, rx) = oneshot::channel();
        let entry = Entry {
            encoding: ValidEncoding {
                input_ids: (1..=len as u32).collect(),
                token_type_ids: vec![0; len],
                position_ids: (0..len as u32).collect(),
            },
            kind,
            metadata: Metadata {
                response_tx: tx,
                tokenization: Duration::ZERO,
                queued_at: Instant::now(),
            },
        };
        (entry, rx)
    }

    fn fill(
        state: &mut State,
        lens: &[usize],
    ) -> Vec<oneshot::Receiver<Result<InferResult, BackendError>>> {
        lens.iter()
            .map(|&len| {
                let (e, rx) = entry(len, BatchKind::Pooled);
                state.append(e);
                rx
            })
            .collect()
    }

    fn sizes(state: &mut State) -> Vec<Vec<u32>> {
        std::iter::from_fn(|| state.next_batch())
            .map(|b| b.batch.cu_seqlens.windows(2).map(|w| w[1] - w[0]).collect())
            .collect()
    }

    #[test]
    fn token_budget_packs_in_order() {
        let mut state = State::new(10, None);
        let _rx = fill(&mut state, &[4, 5, 3, 7, 2]);
        // 4+5 fits, +3 would be 12; 3+7 fits; 2 alone.
        assert_eq!(sizes(&mut state), vec![vec![4, 5], vec![3, 7], vec![2]]);
        assert!(state.is_empty());
    }

    #[test]
    fn packed_arrays_are_consistent() {
        let mut state = State::new(100, None);
        let _rx = fill(&mut state, &[3, 2]);
        let next = state.next_batch().unwrap();
        let b = next.batch;
        assert_eq!(b.input_ids, vec![1, 2, 3, 1, 2]);
        assert_eq!(b.position_ids, vec![0, 1, 2, 0, 1]);
        assert_eq!(b.token_type_ids, vec![0; 5]);
        assert_eq!(b.cu_seqlens, vec![0, 3, 5]);
        assert_eq!(b.max_length, 3);
        assert_eq!(next.metadata.len(), 2);
    }

    #[test]
    fn max_requests_caps_a_batch() {
        let mut state = State::new(1000, Some(2));
        let _rx = fill(&mut state, &[1, 1, 1, 1, 1]);
        assert_eq!(sizes(&mut state), vec![vec![1, 1], vec![1, 1], vec![1]]);
    }

    #[test]
    fn dropped_receivers_are_skipped() {
        let mut state = State::new(1000, None);
        let mut rxs = fill(&mut state, &[1, 2, 3, 4]);
        // The clients of the 2- and 4-token sequences went away.
        drop(rxs.remove(3));
        drop(rxs.remove(1));
        assert_eq!(sizes(&mut state), vec![vec![1, 3]]);
        assert_eq!(state.take_dropped(), 2);
        assert_eq!(state.take_dropped(), 0);
    }

    #[test]
    fn all_dropped_gives_no_batch() {
        let mut state = State::new(1000, None);
        drop(fill(&mut state, &[1, 2]));
        assert!(state.next_batch().is_none());
        assert!(state.is_empty());
    }

    #[test]
    fn kinds_are_never_mixed_and_order_is_kept() {
        let mut state = State::new(1000, None);
        let kinds = [
            BatchKind::Pooled,
            BatchKind::Pooled,
            BatchKind::AllTokens,
            BatchKind::Pooled,
        ];
        let _rx: Vec<_> = kinds
            .iter()
            .map(|&k| {
                let (e, rx) = entry(2, k);
                state.append(e);
                rx
            })
            .collect();
        let got: Vec<(BatchKind, usize)> = std::iter::from_fn(|| state.next_batch())
            .map(|b| (b.kind, b.metadata.len()))
            .collect();
        assert_eq!(
            got,
            vec![
                (BatchKind::Pooled, 2),
                (BatchKind::AllTokens, 1),
                (BatchKind::Pooled, 1)
            ]
        );
    }

    #[test]
    fn request_larger_than_a_batch_is_split_in_order() {
        // One client request of six 4-token inputs against an 8-token budget: three batches,
        // and the sequences come out in input order so the handler can reassemble them.
        let mut state = State::new(8, None);
        let rxs: Vec<_> = (0..6)
            .map(|i| {
                let (mut e, rx) = entry(4, BatchKind::Pooled);
                e.encoding.input_ids = vec![i; 4];
                state.append(e);
                rx
            })
            .collect();
        let batches: Vec<Vec<u32>> = std::iter::from_fn(|| state.next_batch())
            .map(|b| b.batch.input_ids.chunks(4).map(|c| c[0]).collect())
            .collect();
        assert_eq!(batches, vec![vec![0, 1], vec![2, 3], vec![4, 5]]);
        drop(rxs);
    }

    #[test]
    fn sequence_over_the_budget_runs_alone() {
        let mut state = State::new(4, None);
        let _rx = fill(&mut state, &[2, 6, 1]);
        assert_eq!(sizes(&mut state), vec![vec![2], vec![6], vec![1]]);
    }

    #[tokio::test]
    async fn handle_wakes_the_consumer_and_drains_on_close() {
        let queue = Queue::new(100, None, Arc::new(Metrics::new(16)));
        let consumer = {
            let queue = queue.clone();
            tokio::spawn(async move {
                let mut n = 0;
                while let Some(b) = queue.next_batch().await {
                    n += b.metadata.len();
                }
                n
            })
        };
        let mut rxs = Vec::new();
        for _ in 0..3 {
            let (e, rx) = entry(2, BatchKind::Pooled);
            queue.append(e);
            rxs.push(rx);
            tokio::task::yield_now().await;
        }
        queue.close();
        assert_eq!(consumer.await.unwrap(), 3);
    }
}
