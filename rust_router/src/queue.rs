//! The request queue: a pure [`State`] that packs sequences into batches, and a [`Queue`]
//! handle that the handlers append to and the batching tasks drain.
//!
//! One queue entry is one sequence. A client request with many inputs becomes many entries, so a
//! request larger than one batch is split across consecutive batches for free; the handler
//! reassembles the per-sequence results in input order.
//!
//! Entries wait in one of two lanes ([`Lane`]): small requests in the interactive lane, the
//! rest in the bulk lane, each in arrival order. A batch never mixes lanes, so a query is never
//! packed into (and made to wait for) a full-size corpus batch.

use crate::backend::{BackendError, Batch, BatchKind, Lane};
use crate::metrics::Metrics;
use crate::tokenization::ValidEncoding;
use futures_util::future::select_all;
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
    /// The lane of the whole client request this sequence belongs to.
    pub lane: Lane,
    pub metadata: Metadata,
}

#[derive(Debug)]
pub struct NextBatch {
    pub kind: BatchKind,
    pub lane: Lane,
    pub batch: Batch,
    /// One per sequence, in batch order.
    pub metadata: Vec<Metadata>,
}

/// Which entries a batching task packs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// One lane only: each lane has its own backend thread and batching task.
    Lane(Lane),
    /// Interactive entries first, then bulk ones: one backend thread serves both lanes.
    Priority,
}

impl Take {
    /// The lanes this consumer drains, most urgent first.
    pub fn lanes(self) -> &'static [Lane] {
        match self {
            Take::Lane(Lane::Interactive) => &[Lane::Interactive],
            Take::Lane(Lane::Bulk) => &[Lane::Bulk],
            Take::Priority => &Lane::PRIORITY,
        }
    }

    /// The backend thread that runs what this consumer packs (the bulk one is the only one
    /// when lanes share a thread).
    pub fn backend_lane(self) -> Lane {
        match self {
            Take::Lane(lane) => lane,
            Take::Priority => Lane::Bulk,
        }
    }
}

/// Queue contents and the packing rule, with no I/O so it can be tested directly.
#[derive(Debug)]
pub struct State {
    /// Indexed by [`Lane::index`].
    lanes: [VecDeque<Entry>; 2],
    max_batch_tokens: usize,
    max_batch_requests: Option<usize>,
    dropped: u64,
}

impl State {
    pub fn new(max_batch_tokens: usize, max_batch_requests: Option<usize>) -> Self {
        Self {
            lanes: Default::default(),
            max_batch_tokens,
            max_batch_requests,
            dropped: 0,
        }
    }

    pub fn append(&mut self, entry: Entry) {
        self.lanes[entry.lane.index()].push_back(entry);
    }

    /// Entries in both lanes.
    pub fn len(&self) -> usize {
        self.lanes.iter().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.lanes.iter().all(VecDeque::is_empty)
    }

    pub fn lane_len(&self, lane: Lane) -> usize {
        self.lanes[lane.index()].len()
    }

    /// Whether a consumer that takes `take` has anything to pack.
    pub fn has_work(&self, take: Take) -> bool {
        take.lanes().iter().any(|&lane| self.lane_len(lane) > 0)
    }

    /// Entries skipped because their client went away, since the last call.
    pub fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }

    /// The next batch for `take`: from its lane, or from the first lane in priority order that
    /// yields one. A priority batch is never topped up with bulk entries: that would make the
    /// interactive sequences in it wait for a full-size forward pass.
    pub fn take_batch(&mut self, take: Take) -> Option<NextBatch> {
        take.lanes().iter().find_map(|&lane| self.next_batch(lane))
    }

    /// Takes entries from the front of `lane`, in order, while they are of the same kind as the
    /// first and fit in the token and sequence budgets. Entries whose receiver is gone are
    /// discarded, so a disconnected client costs no compute.
    pub fn next_batch(&mut self, lane: Lane) -> Option<NextBatch> {
        let entries = &mut self.lanes[lane.index()];
        let mut kind = None;
        let mut batch = Batch {
            cu_seqlens: vec![0],
            ..Default::default()
        };
        let mut metadata = Vec::new();
        while let Some(entry) = entries.front() {
            if entry.metadata.response_tx.is_closed() {
                entries.pop_front();
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
            let entry = entries.pop_front().expect("front exists");
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
            lane,
            batch,
            metadata,
        })
    }
}

struct Inner {
    state: Mutex<State>,
    /// One per lane (by [`Lane::index`]), so each lane's batching task wakes only for its own
    /// work.
    notify: [Notify; 2],
    closed: AtomicBool,
    metrics: Arc<Metrics>,
}

/// Shared handle: handlers append, the batching tasks take batches.
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
                notify: Default::default(),
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

    fn notify(&self, lane: Lane) -> &Notify {
        &self.inner.notify[lane.index()]
    }

    /// Appends a request's sequences under one lock, so they sit next to each other and pack
    /// into as few batches as the budget allows.
    pub fn append(&self, entries: impl IntoIterator<Item = Entry>) {
        let mut woken = [false; 2];
        let len = {
            let mut state = self.state();
            for entry in entries {
                woken[entry.lane.index()] = true;
                state.append(entry);
            }
            state.len()
        };
        self.inner.metrics.gauge_set("te_queue_size", len as f64);
        for lane in Lane::PRIORITY.into_iter().filter(|l| woken[l.index()]) {
            // `notify_one` stores a permit when nobody waits, so an append never goes
            // unnoticed.
            self.notify(lane).notify_one();
        }
    }

    /// Entries waiting in both lanes.
    pub fn len(&self) -> usize {
        self.state().len()
    }

    pub fn is_empty(&self) -> bool {
        self.state().is_empty()
    }

    /// Packs the next batch for `take` from what is queued now, if anything is.
    pub fn try_next_batch(&self, take: Take) -> Option<NextBatch> {
        let mut state = self.state();
        let next = state.take_batch(take);
        let dropped = state.take_dropped();
        let len = state.len();
        drop(state);
        let m = &self.inner.metrics;
        if dropped > 0 {
            m.counter_add("te_request_failure", &[("err", "dropped")], dropped);
        }
        if let Some(next) = &next {
            let lane = [("lane", next.lane.as_str())];
            m.gauge_set("te_queue_size", len as f64);
            m.observe("te_batch_next_size", &lane, next.metadata.len() as f64);
            m.observe(
                "te_batch_next_tokens",
                &lane,
                next.batch.num_tokens() as f64,
            );
        }
        next
    }

    /// Waits until something is queued for `take` (`true`), or the queue is closed and that
    /// is empty (`false`).
    pub async fn wait_ready(&self, take: Take) -> bool {
        loop {
            // Registered before the check, so an append between the check and the wait still
            // wakes us.
            let wakeups: Vec<_> = take
                .lanes()
                .iter()
                .map(|&lane| Box::pin(self.notify(lane).notified()))
                .collect();
            if self.state().has_work(take) {
                return true;
            }
            if self.inner.closed.load(Ordering::Acquire) {
                return false;
            }
            select_all(wakeups).await;
        }
    }

    /// Waits for the next batch for `take`; `None` once the queue is closed and that is
    /// drained.
    pub async fn next_batch(&self, take: Take) -> Option<NextBatch> {
        loop {
            if !self.wait_ready(take).await {
                return None;
            }
            if let Some(next) = self.try_next_batch(take) {
                return Some(next);
            }
        }
    }

    /// Lets the batching tasks finish once what is queued has run.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        for notify in &self.inner.notify {
            notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Rx = oneshot::Receiver<Result<InferResult, BackendError>>;

    fn entry(len: usize, kind: BatchKind) -> (Entry, Rx) {
        lane_entry(len, kind, Lane::Bulk)
    }

    fn lane_entry(len: usize, kind: BatchKind, lane: Lane) -> (Entry, Rx) {
        let (tx, rx) = oneshot::channel();
        let entry = Entry {
            encoding: ValidEncoding {
                input_ids: (1..=len as u32).collect(),
                token_type_ids: vec![0; len],
                position_ids: (0..len as u32).collect(),
            },
            kind,
            lane,
            metadata: Metadata {
                response_tx: tx,
                tokenization: Duration::ZERO,
                queued_at: Instant::now(),
            },
        };
        (entry, rx)
    }

    fn fill(state: &mut State, lens: &[usize]) -> Vec<Rx> {
        lens.iter()
            .map(|&len| {
                let (e, rx) = entry(len, BatchKind::Pooled);
                state.append(e);
                rx
            })
            .collect()
    }

    fn seq_lens(b: &NextBatch) -> Vec<u32> {
        b.batch.cu_seqlens.windows(2).map(|w| w[1] - w[0]).collect()
    }

    fn sizes(state: &mut State) -> Vec<Vec<u32>> {
        std::iter::from_fn(|| state.next_batch(Lane::Bulk))
            .map(|b| seq_lens(&b))
            .collect()
    }

    /// Appends one entry per `(tokens, lane)`, each with its tokens all equal to its index in
    /// `spec`, so a batch's contents name the entries it holds.
    fn fill_lanes(state: &mut State, spec: &[(usize, Lane)]) -> Vec<Rx> {
        spec.iter()
            .enumerate()
            .map(|(i, &(len, lane))| {
                let (mut e, rx) = lane_entry(len, BatchKind::Pooled, lane);
                e.encoding.input_ids = vec![i as u32; len];
                state.append(e);
                rx
            })
            .collect()
    }

    /// The entry indices (see [`fill_lanes`]) in each batch `take` packs, and its lane.
    fn drain(state: &mut State, take: Take) -> Vec<(Lane, Vec<u32>)> {
        std::iter::from_fn(|| state.take_batch(take))
            .map(|b| {
                let mut ids = b.batch.input_ids.clone();
                ids.dedup();
                (b.lane, ids)
            })
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
        let next = state.next_batch(Lane::Bulk).unwrap();
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
        assert!(state.next_batch(Lane::Bulk).is_none());
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
        let got: Vec<(BatchKind, usize)> = std::iter::from_fn(|| state.next_batch(Lane::Bulk))
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
        let batches: Vec<Vec<u32>> = std::iter::from_fn(|| state.next_batch(Lane::Bulk))
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
                while let Some(b) = queue.next_batch(Take::Priority).await {
                    n += b.metadata.len();
                }
                n
            })
        };
        let mut rxs = Vec::new();
        for _ in 0..3 {
            let (e, rx) = entry(2, BatchKind::Pooled);
            queue.append([e]);
            rxs.push(rx);
            tokio::task::yield_now().await;
        }
        queue.close();
        assert_eq!(consumer.await.unwrap(), 3);
    }

    #[test]
    fn lanes_are_separated_and_keep_their_order() {
        let mut state = State::new(6, None);
        let (i, b) = (Lane::Interactive, Lane::Bulk);
        let _rx = fill_lanes(
            &mut state,
            &[(4, b), (2, i), (4, b), (3, i), (2, b), (3, i)],
        );
        assert_eq!(
            (state.lane_len(i), state.lane_len(b), state.len()),
            (3, 3, 6)
        );
        // Each lane packs only its own entries, in arrival order, under the usual budget.
        assert_eq!(
            drain(&mut state, Take::Lane(i)),
            vec![(i, vec![1, 3]), (i, vec![5])]
        );
        assert!(!state.has_work(Take::Lane(i)));
        assert!(state.has_work(Take::Lane(b)) && state.has_work(Take::Priority));
        assert_eq!(
            drain(&mut state, Take::Lane(b)),
            vec![(b, vec![0]), (b, vec![2, 4])]
        );
        assert!(state.is_empty());
    }

    #[test]
    fn priority_packs_interactive_first_and_never_mixes_lanes() {
        let mut state = State::new(100, None);
        let (i, b) = (Lane::Interactive, Lane::Bulk);
        let _rx = fill_lanes(&mut state, &[(8, b), (8, b), (2, i), (2, i)]);
        // The queries arrived last but run first, in a batch of their own although the bulk
        // entries would fit beside them.
        assert_eq!(
            drain(&mut state, Take::Priority),
            vec![(i, vec![2, 3]), (b, vec![0, 1])]
        );
    }

    #[test]
    fn priority_falls_through_to_bulk_when_every_query_was_dropped() {
        let mut state = State::new(100, None);
        let (i, b) = (Lane::Interactive, Lane::Bulk);
        let mut rxs = fill_lanes(&mut state, &[(4, b), (2, i), (2, i)]);
        drop(rxs.split_off(1));
        assert_eq!(drain(&mut state, Take::Priority), vec![(b, vec![0])]);
        assert_eq!(state.take_dropped(), 2);
    }

    #[test]
    fn dropped_entries_are_counted_in_either_lane() {
        let mut state = State::new(100, None);
        let (i, b) = (Lane::Interactive, Lane::Bulk);
        let mut rxs = fill_lanes(&mut state, &[(1, i), (1, b), (1, i), (1, b)]);
        drop(rxs.remove(3));
        drop(rxs.remove(0));
        assert_eq!(drain(&mut state, Take::Lane(i)), vec![(i, vec![2])]);
        assert_eq!(state.take_dropped(), 1);
        assert_eq!(drain(&mut state, Take::Lane(b)), vec![(b, vec![1])]);
        assert_eq!(state.take_dropped(), 1);
    }

    #[tokio::test]
    async fn each_lane_wakes_only_its_own_consumer() {
        let metrics = Arc::new(Metrics::new(16));
        let queue = Queue::new(100, None, metrics.clone());
        let (e, _rx) = lane_entry(2, BatchKind::Pooled, Lane::Bulk);
        queue.append([e]);
        let interactive = tokio::time::timeout(
            Duration::from_millis(50),
            queue.wait_ready(Take::Lane(Lane::Interactive)),
        );
        assert!(interactive.await.is_err(), "woke for a bulk entry");
        assert!(queue.wait_ready(Take::Lane(Lane::Bulk)).await);
        let next = queue.try_next_batch(Take::Lane(Lane::Bulk)).unwrap();
        assert_eq!(next.lane, Lane::Bulk);
        let text = metrics.render();
        assert!(
            text.contains("te_batch_next_size_count{lane=\"bulk\"} 1"),
            "{text}"
        );
        assert!(text.contains("te_queue_size 0"), "{text}");
        // Closing wakes every consumer, with nothing left to take.
        queue.close();
        assert!(!queue.wait_ready(Take::Lane(Lane::Interactive)).await);
        assert!(!queue.wait_ready(Take::Priority).await);
    }
}
