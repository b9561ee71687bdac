//! The shared handle around [`State`]: appends, wake-ups of the batching tasks, the queue's
//! metrics, and one listener of its bulk lane's backlog.

use super::entry::{BatchSize, Entry, NextBatch, RequestId, Take};
use super::state::State;
use crate::backend::Lane;
use crate::metrics::ModelMetrics;
use futures_util::future::select_all;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::Notify;

/// Told whether the backend bounds the bulk lane ([`Queue::on_bulk_backlog`]).
type BacklogListener = Box<dyn Fn(bool) + Send + Sync>;

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
    metrics: ModelMetrics,
    /// Told whether the backend bounds the bulk lane, after every change (see
    /// [`Queue::on_bulk_backlog`]).
    bulk_backlog: OnceLock<BacklogListener>,
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
        metrics: ModelMetrics,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State::new(max_batch_tokens, max_batch_requests)),
                max_batch_tokens,
                max_batch_requests,
                notify: Default::default(),
                closed: AtomicBool::new(false),
                metrics,
                bulk_backlog: OnceLock::new(),
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

    /// Tells `listener` whether the backend bounds the bulk lane
    /// ([`State::backend_bounds_bulk`]) now, and again after every change, with the lock held,
    /// so the last word is the latest state's. One listener at most: a second is ignored.
    /// The batching tasks make it the tokenizer pool's throttle where the policy says so
    /// (`infer::batching`).
    pub fn on_bulk_backlog(&self, listener: impl Fn(bool) + Send + Sync + 'static) {
        let state = self.state();
        listener(state.backend_bounds_bulk());
        let _ = self.inner.bulk_backlog.set(Box::new(listener));
    }

    /// Tells the listener, if there is one, whether the backend bounds the bulk lane; called
    /// with the lock held after every change.
    fn tell_bulk_backlog(&self, state: &State) {
        if let Some(listener) = self.inner.bulk_backlog.get() {
            listener(state.backend_bounds_bulk());
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
            self.tell_bulk_backlog(&state);
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
            self.tell_bulk_backlog(&state);
            (removed, state.len())
        };
        if removed > 0 {
            self.inner.metrics.gauge_set("te_queue_size", len as f64);
        }
    }

    /// Takes `request` out of the queue at its deadline if none of its `sequences` has started
    /// (see [`State::expire_request`]); returns whether it did. `false`: it runs, or packing
    /// already answered its sequences as expired.
    pub fn expire_request(&self, request: RequestId, sequences: usize) -> bool {
        let (expired, len) = {
            let mut state = self.state();
            let expired = state.expire_request(request, sequences);
            if expired {
                self.tell_bulk_backlog(&state);
            }
            (expired, state.len())
        };
        if expired {
            self.inner.metrics.gauge_set("te_queue_size", len as f64);
        }
        expired
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
        let before = state.len();
        let next = state.take_batch(take);
        let dropped = state.take_dropped();
        let len = state.len();
        self.tell_bulk_backlog(&state);
        drop(state);
        // `len != before`: entries past their deadline were answered and taken out.
        if dropped > 0 || next.is_some() || len != before {
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
