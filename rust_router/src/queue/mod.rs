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
use crate::tokenization::{PoolThrottle, ValidEncoding};
use futures_util::future::select_all;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};

/// What the batching task hands back to a waiting request.
#[derive(Debug)]
pub struct InferResult {
    /// Row-major `[rows, cols]`: one row for pooled / predict, one per token for all-tokens.
    pub values: Vec<f32>,
    pub cols: usize,
    /// From queueing to the start of the forward pass.
    pub queue: Duration,
    /// The part of `queue` until the batch was handed to a backend thread; the rest is that
    /// thread's wait for its previous batch, or its wake-up.
    pub handover: Duration,
    pub inference: Duration,
}

pub type ResponseTx = oneshot::Sender<Result<InferResult, BackendError>>;

/// Identifies the client request a sequence belongs to: a batch that fails is re-run one
/// request at a time, and a request whose client left is taken out of the queue.
pub type RequestId = u64;

#[derive(Debug)]
pub struct Metadata {
    pub response_tx: ResponseTx,
    pub request_id: RequestId,
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
    /// Sized by the bulk pacing ([`BulkPacing`]): its time measures the device's speed, and
    /// no batch is prefetched behind it.
    pub paced: bool,
}

/// What the `te_batch_next_*` metrics record of a batch.
#[derive(Debug, Clone, Copy)]
pub struct BatchSize {
    pub lane: Lane,
    pub sequences: usize,
    pub tokens: usize,
}

impl NextBatch {
    pub fn size(&self) -> BatchSize {
        BatchSize {
            lane: self.lane,
            sequences: self.metadata.len(),
            tokens: self.batch.num_tokens(),
        }
    }

    /// A batch of exactly `entries`, in order: one request's sequences, so all of one kind
    /// and lane. `None` when there are none.
    pub fn of_request(entries: Vec<Entry>) -> Option<Self> {
        let first = entries.first()?;
        let (kind, lane) = (first.kind, first.lane);
        let mut batch = Batch::empty();
        let mut metadata = Vec::with_capacity(entries.len());
        for entry in entries {
            push_entry(entry, &mut batch, &mut metadata);
        }
        Some(NextBatch {
            kind,
            lane,
            batch,
            metadata,
            paced: false,
        })
    }
}

/// Appends `entry`'s sequence to `batch` and its metadata to `metadata`.
fn push_entry(entry: Entry, batch: &mut Batch, metadata: &mut Vec<Metadata>) {
    let e = &entry.encoding;
    batch.push_sequence(&e.input_ids, &e.token_type_ids, &e.position_ids);
    metadata.push(entry.metadata);
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

/// Bulk batches bounded by time as well as tokens, for backends without an interactive lane
/// (the CPU): there a query waits for the bulk batch that runs, and a 16k-token batch takes
/// seconds on a CPU. The token budget of bulk batches follows the device's measured speed so
/// that one takes about `target`; tokens per second stay about the same, since a CPU is as
/// efficient on a few hundred tokens as on thousands.
#[derive(Debug, Clone)]
pub struct BulkPacing {
    target: Duration,
    /// Smoothed tokens per second of the bulk batches run so far.
    tokens_per_s: Option<f64>,
}

/// Bulk batches before the device's speed is known hold at most this many tokens, so the
/// first one cannot hold a query for seconds either.
pub const PACED_FIRST_BATCH_TOKENS: usize = 1024;

/// Paced bulk batches never get a smaller budget than this. A batch's duration has a fixed
/// part (the Python call; on a CPU shared with other busy processes, the thread pool's
/// barriers, measured at ~1 s per batch), so tokens/s measured on tiny batches understates
/// the device and would shrink the next batches further, down to one short document.
pub const PACED_MIN_BATCH_TOKENS: usize = 256;

impl BulkPacing {
    pub fn new(target: Duration) -> Self {
        Self {
            target,
            tokens_per_s: None,
        }
    }

    /// Folds in one bulk batch's size and duration. Weighted towards the latest: the speed
    /// moves with the batch size (small batches run slower on a GPU) and with other load.
    pub fn record(&mut self, tokens: usize, took: Duration) {
        let seconds = took.as_secs_f64();
        if tokens == 0 || seconds <= 0.0 {
            return;
        }
        let rate = tokens as f64 / seconds;
        self.tokens_per_s = Some(match self.tokens_per_s {
            Some(old) => 0.5 * old + 0.5 * rate,
            None => rate,
        });
    }

    /// Tokens of a bulk batch that runs about `target`, within
    /// `[PACED_MIN_BATCH_TOKENS, max_batch_tokens]`.
    pub fn budget(&self, max_batch_tokens: usize) -> usize {
        match self.tokens_per_s {
            Some(rate) => ((rate * self.target.as_secs_f64()) as usize)
                .max(PACED_MIN_BATCH_TOKENS)
                .min(max_batch_tokens),
            None => PACED_FIRST_BATCH_TOKENS.min(max_batch_tokens),
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
    /// `Some` when bulk batches are bounded by time too.
    pacing: Option<BulkPacing>,
    dropped: u64,
    /// Whether the last bulk batch left entries behind: it was cut by its budget, so the
    /// backend, not the supply of tokenized entries, bounds the bulk lane.
    bulk_backlog: bool,
}

impl State {
    pub fn new(max_batch_tokens: usize, max_batch_requests: Option<usize>) -> Self {
        Self {
            lanes: Default::default(),
            max_batch_tokens,
            max_batch_requests,
            pacing: None,
            dropped: 0,
            bulk_backlog: false,
        }
    }

    /// Bounds bulk batches by `target` of forward-pass time as well (see [`BulkPacing`]).
    pub fn pace_bulk(&mut self, target: Duration) {
        self.pacing = Some(BulkPacing::new(target));
    }

    /// One bulk batch ran: its tokens and forward-pass time set the next ones' budget.
    pub fn record_bulk(&mut self, tokens: usize, took: Duration) {
        if let Some(pacing) = &mut self.pacing {
            pacing.record(tokens, took);
        }
    }

    /// The token budget of `lane`'s next batch.
    pub fn batch_tokens(&self, lane: Lane) -> usize {
        match (&self.pacing, lane) {
            (Some(pacing), Lane::Bulk) => pacing.budget(self.max_batch_tokens),
            _ => self.max_batch_tokens,
        }
    }

    pub fn append(&mut self, entry: Entry) {
        self.lanes[entry.lane.index()].push_back(entry);
    }

    /// Whether the backend bounds the bulk lane: its last batch was full and left entries
    /// waiting, and they still wait. Entries tokenized faster would only wait longer. Where
    /// tokenization bounds it instead, each bulk batch takes everything queued.
    pub fn backend_bounds_bulk(&self) -> bool {
        self.bulk_backlog && self.lane_len(Lane::Bulk) > 0
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

    /// Removes every entry of `request`; returns how many there were.
    pub fn remove_request(&mut self, request: RequestId) -> usize {
        let before = self.len();
        for lane in &mut self.lanes {
            lane.retain(|e| e.metadata.request_id != request);
        }
        before - self.len()
    }

    /// Entries skipped because their client went away, since the last call. They are not
    /// failures to count here: a request is many entries, and the HTTP layer counts the
    /// request once (`te_request_failure{err="dropped"}`).
    pub fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }

    /// The next batch for `take`: from its lane, or from the first lane in priority order that
    /// yields one.
    ///
    /// Where bulk batches are paced (one thread serves both lanes, on a CPU), a batch of
    /// queries is topped up with bulk entries of its kind, up to a paced bulk batch's budget.
    /// Its queries then take about as long as a bulk batch (`--max-bulk-batch-ms`), but a
    /// query no longer costs the backfill a forward pass of its own: on a CPU that pass
    /// streams every weight for a few tokens, a fifth of the machine at a query every 50 ms.
    /// With separate threads (a GPU) a query runs beside the bulk batch instead, and its
    /// batch is never topped up.
    pub fn take_batch(&mut self, take: Take) -> Option<NextBatch> {
        let mut next = take
            .lanes()
            .iter()
            .find_map(|&lane| self.next_batch(lane))?;
        if take == Take::Priority && next.lane == Lane::Interactive && self.pacing.is_some() {
            let budget = self.batch_tokens(Lane::Bulk);
            let mut kind = Some(next.kind);
            self.fill(
                Lane::Bulk,
                budget,
                &mut kind,
                &mut next.batch,
                &mut next.metadata,
            );
            next.paced = true;
        }
        Some(next)
    }

    /// Takes entries from the front of `lane`, in order, while they are of the same kind as the
    /// first and fit in the token and sequence budgets. Entries whose receiver is gone are
    /// discarded, so a disconnected client costs no compute.
    pub fn next_batch(&mut self, lane: Lane) -> Option<NextBatch> {
        let max_tokens = self.batch_tokens(lane);
        let mut kind = None;
        let mut batch = Batch::empty();
        let mut metadata = Vec::new();
        self.fill(lane, max_tokens, &mut kind, &mut batch, &mut metadata);
        kind.map(|kind| NextBatch {
            kind,
            lane,
            batch,
            metadata,
            paced: lane == Lane::Bulk && self.pacing.is_some(),
        })
    }

    /// Moves entries from the front of `lane` into `batch` while they are of `kind` (the first
    /// one's, when `None`) and fit in `max_tokens` and the sequence limit.
    fn fill(
        &mut self,
        lane: Lane,
        max_tokens: usize,
        kind: &mut Option<BatchKind>,
        batch: &mut Batch,
        metadata: &mut Vec<Metadata>,
    ) {
        let entries = &mut self.lanes[lane.index()];
        while let Some(entry) = entries.front() {
            if entry.metadata.response_tx.is_closed() {
                entries.pop_front();
                self.dropped += 1;
                continue;
            }
            let len = entry.encoding.input_ids.len();
            let fits = batch.input_ids.len() + len <= max_tokens
                // A sequence longer than the whole budget still has to run somewhere: alone.
                || metadata.is_empty();
            if kind.is_some_and(|k| k != entry.kind) || !fits {
                break;
            }
            let entry = entries.pop_front().expect("front exists");
            *kind = Some(entry.kind);
            push_entry(entry, batch, metadata);
            if Some(metadata.len()) == self.max_batch_requests {
                break;
            }
        }
        if lane == Lane::Bulk && !metadata.is_empty() {
            self.bulk_backlog = !self.lanes[lane.index()].is_empty();
        }
    }
}

struct Inner {
    state: Mutex<State>,
    /// The interactive lane's budgets, which never change (only bulk batches are paced):
    /// read without the lock.
    max_batch_tokens: usize,
    max_batch_requests: Option<usize>,
    /// One per lane (by [`Lane::index`]), so each lane's batching task wakes only for its own
    /// work.
    notify: [Notify; 2],
    closed: AtomicBool,
    metrics: Arc<Metrics>,
    /// Told whether the backend bounds the bulk lane, after every change (see
    /// [`Queue::throttle_tokenization`]).
    tokenization: OnceLock<Arc<PoolThrottle>>,
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
                max_batch_tokens,
                max_batch_requests,
                notify: Default::default(),
                closed: AtomicBool::new(false),
                metrics,
                tokenization: OnceLock::new(),
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

    /// Lets `throttle` hold part of the tokenizer pool back while the backend bounds the bulk
    /// lane ([`State::backend_bounds_bulk`], see [`PoolThrottle`]): for runtimes whose queries
    /// have threads of their own.
    pub fn throttle_tokenization(&self, throttle: Arc<PoolThrottle>) {
        let state = self.state();
        throttle.set_limited(state.backend_bounds_bulk());
        let _ = self.inner.tokenization.set(throttle);
    }

    /// Tells the tokenizer pool, if it listens, whether the backend bounds the bulk lane;
    /// called with the lock held after every change, so the last word is the latest state's.
    fn tell_tokenization(&self, state: &State) {
        if let Some(throttle) = self.inner.tokenization.get() {
            throttle.set_limited(state.backend_bounds_bulk());
        }
    }

    /// Holds the queue's lock, as a batching task packing a large batch does.
    #[cfg(test)]
    pub fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state()
    }

    fn notify(&self, lane: Lane) -> &Notify {
        &self.inner.notify[lane.index()]
    }

    /// Appends a request's sequences under one lock, so they sit next to each other and pack
    /// into as few batches as the budget allows.
    pub fn append(&self, entries: impl IntoIterator<Item = Entry>) {
        let woken = self.push(entries);
        for lane in Lane::PRIORITY.into_iter().filter(|l| woken[l.index()]) {
            // `notify_one` stores a permit when nobody waits, so an append never goes
            // unnoticed.
            self.notify(lane).notify_one();
        }
    }

    /// Appends like [`Queue::append`] without waking a batching task: the caller sends the
    /// batch itself if a backend thread can take it, then calls [`Queue::wake`] for whatever
    /// is left (see `infer::batching::Direct`).
    pub fn append_quiet(&self, entries: impl IntoIterator<Item = Entry>) {
        self.push(entries);
    }

    /// Whether one interactive batch holds `sequences` sequences of `tokens` tokens in all.
    /// Takes no lock.
    pub fn fits_one_query_batch(&self, sequences: usize, tokens: usize) -> bool {
        let inner = &self.inner;
        sequences > 0
            && tokens <= inner.max_batch_tokens
            && inner.max_batch_requests.is_none_or(|max| sequences <= max)
    }

    /// Wakes the batching task of `take` if anything is queued for it.
    pub fn wake(&self, take: Take) {
        let waiting = {
            let state = self.state();
            Lane::PRIORITY.map(|lane| state.lane_len(lane) > 0)
        };
        for &lane in take.lanes() {
            if waiting[lane.index()] {
                self.notify(lane).notify_one();
            }
        }
    }

    /// Appends under one lock; returns the lanes that got entries, by [`Lane::index`].
    fn push(&self, entries: impl IntoIterator<Item = Entry>) -> [bool; 2] {
        let mut woken = [false; 2];
        let len = {
            let mut state = self.state();
            for entry in entries {
                woken[entry.lane.index()] = true;
                state.append(entry);
            }
            self.tell_tokenization(&state);
            state.len()
        };
        self.inner.metrics.gauge_set("te_queue_size", len as f64);
        woken
    }

    /// Entries waiting in both lanes.
    pub fn len(&self) -> usize {
        self.state().len()
    }

    /// Takes a request whose client has gone out of the queue at once, so `te_queue_size`
    /// does not count it until the next batch is packed.
    pub fn remove_request(&self, request: RequestId) {
        let (removed, len) = {
            let mut state = self.state();
            let removed = state.remove_request(request);
            self.tell_tokenization(&state);
            (removed, state.len())
        };
        if removed > 0 {
            self.inner.metrics.gauge_set("te_queue_size", len as f64);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.state().is_empty()
    }

    /// Bounds bulk batches by `target` of forward-pass time as well (see [`BulkPacing`]).
    pub fn pace_bulk(&self, target: Duration) {
        self.state().pace_bulk(target);
    }

    /// Whether bulk batches are bounded by time ([`Queue::pace_bulk`]); the batches themselves
    /// say so (`NextBatch::paced`).
    #[cfg(test)]
    pub fn paces_bulk(&self) -> bool {
        self.state().pacing.is_some()
    }

    /// A bulk batch of `tokens` ran in `took` (no-op unless bulk batches are paced).
    pub fn record_bulk(&self, tokens: usize, took: Duration) {
        self.state().record_bulk(tokens, took);
    }

    /// The token budget of `lane`'s next batch.
    pub fn batch_tokens(&self, lane: Lane) -> usize {
        self.state().batch_tokens(lane)
    }

    /// Packs the next batch for `take` from what is queued now, if anything is. `device` labels
    /// the batch metrics when the server runs several devices (`None` with one, so those
    /// series keep their single-device labels).
    pub fn try_next_batch(&self, take: Take, device: Option<&str>) -> Option<NextBatch> {
        let mut state = self.state();
        let next = state.take_batch(take);
        let dropped = state.take_dropped();
        let len = state.len();
        self.tell_tokenization(&state);
        drop(state);
        if dropped > 0 || next.is_some() {
            self.inner.metrics.gauge_set("te_queue_size", len as f64);
        }
        if let Some(next) = &next {
            self.record_next_batch(next.size(), device);
        }
        next
    }

    /// Records a packed batch's size in the `te_batch_next_*` metrics (see
    /// [`Queue::try_next_batch`] for `device`).
    pub fn record_next_batch(&self, size: BatchSize, device: Option<&str>) {
        let m = &self.inner.metrics;
        let lane = ("lane", size.lane.as_str());
        let with_device;
        let labels: &[(&str, &str)] = match device {
            Some(device) => {
                with_device = [lane, ("device", device)];
                &with_device
            }
            None => std::slice::from_ref(&lane),
        };
        m.observe("te_batch_next_size", labels, size.sequences as f64);
        m.observe("te_batch_next_tokens", labels, size.tokens as f64);
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
            if let Some(next) = self.try_next_batch(take, None) {
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
mod tests;
