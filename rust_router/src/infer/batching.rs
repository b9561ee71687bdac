//! The batching tasks: one per lane (or one for both, without an interactive lane: which, the
//! profile's `schedule::Batching` says), each packing the queue into batches for whichever
//! device can take one; the tokenizer pool's throttle, which they turn on while the backend
//! bounds the bulk lane (where the profile says so); and what happens to a batch's results: shape checks, per-sequence checks for non-finite values, and, when the
//! runtime raises on a batch of several requests, re-running them apart so that only the
//! request that really fails gets the error. A device failure (`DeviceError`) fails its batch
//! without re-runs: no input is to blame.

use crate::backend::{
    BackendError, BackendHandle, Batch, BatchKind, Lane, ModelInfo, Output, Ran, Slot,
};
use crate::metrics::ModelMetrics;
use crate::queue::{Entry, InferResult, Metadata, NextBatch, Queue, RequestId, Take};
use crate::tokenization::ThrottleVote;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The most extra forward passes spent finding the failing requests of one failed batch. Each
/// pass halves a group of requests, so this finds up to about `MAX_ISOLATION_PASSES /
/// (2 log2 n)` failing requests among `n`; past it, the requests still grouped get an error
/// that says so rather than another client's message.
pub const MAX_ISOLATION_PASSES: usize = 64;

/// What every batch's results need, shared by the tasks.
struct Context {
    backend: BackendHandle,
    /// Told each bulk batch's size and duration, for time-bounded bulk batches.
    queue: Queue,
    info: Arc<ModelInfo>,
    metrics: ModelMetrics,
    /// The `device` label of the `te_batch_*` metrics, by device index. `None` with one
    /// device: its series keep the labels they had before devices existed.
    device_labels: Option<Vec<String>>,
}

impl Context {
    fn device_label(&self, device: usize) -> Option<&str> {
        self.device_labels
            .as_ref()
            .map(|labels| labels[device].as_str())
    }

    /// Runs `f` with the labels of a batch metric of `device`.
    fn labels<R>(&self, device: usize, f: impl FnOnce(&[(&str, &str)]) -> R) -> R {
        match self.device_label(device) {
            Some(label) => f(&[("device", label)]),
            None => f(&[]),
        }
    }

    fn inc(&self, name: &str, device: usize) {
        self.labels(device, |l| self.metrics.inc(name, l));
    }
}

/// Starts the batching tasks, one per entry of `takes` (the first one packs the interactive
/// lane), and lets `throttle`, if given, hold part of the tokenizer pool back
/// ([`throttle_tokenization`]); the returned task ends when they all have. Also returns the
/// [`Direct`] path of interactive requests.
pub fn spawn_tasks(
    queue: &Queue,
    backend: &BackendHandle,
    takes: Vec<Take>,
    throttle: Option<ThrottleVote>,
    info: &Arc<ModelInfo>,
    metrics: &ModelMetrics,
) -> (JoinHandle<()>, Direct) {
    if let Some(throttle) = throttle {
        throttle_tokenization(queue, throttle);
    }
    let devices = backend.num_devices();
    let ctx = Arc::new(Context {
        backend: backend.clone(),
        queue: queue.clone(),
        info: info.clone(),
        metrics: metrics.clone(),
        device_labels: (devices > 1).then(|| (0..devices).map(|i| i.to_string()).collect()),
    });
    // The task that packs interactive entries: their own, or the one for both lanes.
    let take = *takes.first().expect("at least one batching task");
    let direct = Direct {
        queue: queue.clone(),
        take,
        ctx: ctx.clone(),
    };
    let tasks: Vec<_> = takes
        .into_iter()
        .map(|take| tokio::spawn(batching_task(queue.clone(), take, ctx.clone())))
        .collect();
    let all = tokio::spawn(async move {
        for task in tasks {
            let _ = task.await;
        }
    });
    (all, direct)
}

/// Tells `throttle`, the model's say in when part of the tokenizer pool stands aside
/// (`tokenization::PoolThrottle`), whether the backend bounds the bulk lane, as the queue
/// says after every change ([`Queue::on_bulk_backlog`]): for runtimes whose queries have
/// threads of their own.
fn throttle_tokenization(queue: &Queue, throttle: ThrottleVote) {
    queue.on_bulk_backlog(move |bounded| throttle.set_bounded(bounded));
}

/// Hands a packed batch to the backend thread of `slot`; its results are split on a task of
/// their own, beside the next forward pass rather than in front of it.
fn send_batch(slot: Slot, next: NextBatch, take: Take, ctx: &Arc<Context>) {
    let NextBatch {
        kind,
        lane: _,
        batch,
        metadata,
        paced,
    } = next;
    let (reply, rx) = oneshot::channel();
    let sent_at = Instant::now();
    // Paced batches share their thread with queries: none is prefetched behind them, so a
    // query waits for the rest of one of them at most, not for the next one too.
    if paced {
        slot.send_exclusive(kind, batch, reply);
    } else {
        slot.send(kind, batch, reply);
    }
    let job = Job {
        kind,
        lane: take.backend_lane(),
        paced,
        metadata,
        sent_at,
    };
    // On the sender's runtime: a query's handler sends its own batch from the HTTP thread
    // (`http_thread`) and polls for the result there, awake; a worker of the batching
    // runtime would have to be woken for it first (~0.1 ms measured after a pause).
    tokio::spawn(job.finish(rx, ctx.clone()));
}

/// The interactive requests' way around their batching task, and around the queue itself.
///
/// Where queries have a backend thread of their own (a GPU), a query whose thread can take a
/// batch now goes straight to it, as a batch of its own, without entering the queue: the
/// queue's lock is shared with the backfill's appends and its packing of 16k-token batches,
/// and a query must not wait behind those. Otherwise (its slot is taken, or one thread serves
/// both lanes and a query's batch is topped up from the queue) it is queued, and if the thread
/// can take a batch, the handler that queued it packs and sends that batch itself: the
/// batching task would pack the same batch, but only after a wake-up, and after the handler's
/// worker has finished its turn (hyper's bookkeeping for the connection), which measured
/// 5-35 µs a query on a CPU (`benchmarks/profile_idle_query.py --instant-backend`). When the
/// thread's slot is taken (a batch already waits for it), or entries are left over, the
/// batching task is woken as for any append, and packs them once the slot frees, with the
/// queries that arrive meanwhile.
#[derive(Clone)]
pub struct Direct {
    queue: Queue,
    /// The batching task that packs interactive entries (only those are sent here).
    take: Take,
    ctx: Arc<Context>,
}

impl Direct {
    /// Sends one interactive request's sequences to their backend thread, or queues them.
    pub fn submit(&self, entries: Vec<Entry>) {
        if let Err(entries) = self.send_unqueued(entries) {
            self.queue.append_quiet(entries);
            self.send_or_wake();
        }
    }

    /// Sends `entries` as a batch of their own to a free slot of the interactive lane's
    /// threads, touching no lock the bulk lane takes; gives them back when queries share
    /// their thread with the bulk lane, when they do not fit one batch, or when no slot is
    /// free. A query that arrives as its slot frees may thereby pass one that waits in the
    /// queue for the batching task; that task is next in line for the slot (a waiter gets a
    /// freed permit before any new taker), so it waits for one query batch at most.
    fn send_unqueued(&self, entries: Vec<Entry>) -> Result<(), Vec<Entry>> {
        let tokens = entries.iter().map(|e| e.encoding.input_ids.len()).sum();
        // A batch is of one kind: a request of texts and images is packed by the queue.
        let one_kind = entries.windows(2).all(|w| w[0].kind == w[1].kind);
        if self.take != Take::Lane(Lane::Interactive)
            || !one_kind
            || !self.queue.fits_one_query_batch(entries.len(), tokens)
        {
            return Err(entries);
        }
        let Some(slot) = self.ctx.backend.try_reserve(Lane::Interactive) else {
            return Err(entries);
        };
        let device = slot.device();
        let next = NextBatch::of_request(entries).expect("fits_one_query_batch: not empty");
        let size = next.size();
        send_batch(slot, next, self.take, &self.ctx);
        self.queue
            .record_next_batch(size, self.ctx.device_label(device));
        Ok(())
    }

    /// Packs the interactive lane into a batch for a free slot of its backend thread and sends
    /// it; wakes the batching task for whatever is left.
    fn send_or_wake(&self) {
        let interactive = Take::Lane(Lane::Interactive);
        if let Some(slot) = self.ctx.backend.try_reserve(self.take.backend_lane()) {
            let label = self.ctx.device_label(slot.device());
            // `None`: the batching task took the entries first; the slot goes back unused.
            if let Some(next) = self.queue.try_next_batch(interactive, label) {
                send_batch(slot, next, self.take, &self.ctx);
            }
        }
        self.queue.wake(interactive);
    }
}

/// Feeds the backend threads of `take`'s lane with what `take` packs: wait for work, reserve a
/// free slot (of the device that can start soonest, see [`BackendHandle::reserve`]), then pack
/// the next batch. Packing only after a slot is free means exactly one batch waits per thread
/// while another runs (prefetch), and that batch is as full as the queue allows at that moment
/// (and, in priority order, holds the queries that arrived meanwhile). Waiting for work
/// *before* the slot means an idle backend frees its slot with nobody waiting on it, so the
/// backend thread wakes no tokio worker in front of its forward pass.
async fn batching_task(queue: Queue, take: Take, ctx: Arc<Context>) {
    loop {
        if !queue.wait_ready(take).await {
            return;
        }
        let slot = match ctx.backend.reserve(take.backend_lane()).await {
            Ok(slot) => slot,
            Err(err) => {
                fail_everything_queued(&queue, take, err).await;
                return;
            }
        };
        // `None`: every queued entry's client went away, or a handler sent them itself
        // (`Direct`); the slot goes back unused.
        let Some(next) = queue.try_next_batch(take, ctx.device_label(slot.device())) else {
            continue;
        };
        send_batch(slot, next, take, &ctx);
    }
}

/// The backend is gone (or every device has failed): fail everything that is or will be
/// queued for `take` instead of leaving clients waiting forever.
async fn fail_everything_queued(queue: &Queue, take: Take, err: BackendError) {
    tracing::error!("{err}; failing queued requests");
    while let Some(next) = queue.next_batch(take).await {
        for m in next.metadata {
            let _ = m.response_tx.send(Err(err.clone().into()));
        }
    }
}

/// The sequences of one batch sent to the backend, waiting for their results.
struct Job {
    kind: BatchKind,
    /// The lane whose threads run the batch (re-runs go to that lane, on any device).
    lane: Lane,
    /// Whether it is a bulk batch, whose size and duration pace the next ones (re-runs are
    /// not: they are split apart).
    paced: bool,
    /// One per sequence, in batch order.
    metadata: Vec<Metadata>,
    /// When the batch went into a backend thread's channel (re-runs keep the first batch's).
    sent_at: Instant,
}

impl Job {
    async fn finish(self, rx: oneshot::Receiver<Ran>, ctx: Arc<Context>) {
        let Ok(mut ran) = rx.await else {
            return self.fail_all(&BackendError::Stopped);
        };
        if matches!(ran.result, Err(BackendError::Refused)) {
            // Its device failed before running it: it goes to another one.
            ran = match run_anywhere(&ctx.backend, self.lane, self.kind, ran.batch).await {
                Ok(ran) => ran,
                Err(err) => return self.fail_all(&err),
            };
        }
        let device = ran.device;
        let result = ran
            .result
            .and_then(|out| check_shape(&out, self.kind, &ran.batch, &ctx.info).map(|_| out));
        match result {
            Ok(out) => self.deliver(&ran.batch, out, device, &ctx),
            Err(err @ BackendError::Inference(_)) if self.requests().len() > 1 => {
                ctx.inc("te_batch_inference_failure", device);
                self.isolate(ran.batch, err, &ctx).await
            }
            Err(err) => {
                ctx.inc("te_batch_inference_failure", device);
                self.fail_all(&err)
            }
        }
    }

    /// The distinct requests of the batch, in order of their first sequence.
    fn requests(&self) -> Vec<RequestId> {
        let mut ids: Vec<RequestId> = Vec::new();
        for m in &self.metadata {
            if !ids.contains(&m.request_id) {
                ids.push(m.request_id);
            }
        }
        ids
    }

    fn fail_all(self, err: &BackendError) {
        if matches!(err, BackendError::Inference(_)) {
            tracing::error!(batch_size = self.metadata.len(), "{err}");
        }
        for m in self.metadata {
            let _ = m.response_tx.send(Err(err.clone().into()));
        }
    }

    /// Splits the results back to the sequences; a sequence whose values are not all finite
    /// gets an error of its own instead of `null`s in JSON.
    fn deliver(self, batch: &Batch, out: Output, device: usize, ctx: &Context) {
        if self.paced {
            ctx.queue.record_bulk(batch.num_tokens(), out.duration);
        }
        let m = &ctx.metrics;
        ctx.labels(device, |labels| {
            m.inc("te_batch_inference_success", labels);
            m.observe(
                "te_batch_inference_duration",
                labels,
                out.duration.as_secs_f64(),
            );
            m.observe(
                "te_batch_inference_size",
                labels,
                self.metadata.len() as f64,
            );
        });
        let cols = out.matrix.cols;
        let batch_size = self.metadata.len();
        for (i, meta) in self.metadata.into_iter().enumerate() {
            let (a, b) = match self.kind {
                BatchKind::AllTokens => (
                    batch.cu_seqlens[i] as usize,
                    batch.cu_seqlens[i + 1] as usize,
                ),
                _ => (i, i + 1),
            };
            let values = &out.matrix.data[a * cols..b * cols];
            let result = if values.iter().all(|v| v.is_finite()) {
                Ok(InferResult {
                    values: values.to_vec(),
                    cols,
                    queue: out.started.saturating_duration_since(meta.queued_at),
                    handover: self.sent_at.saturating_duration_since(meta.queued_at),
                    inference: out.duration,
                    started: out.started,
                    device,
                    batch_size,
                    batch_tokens: batch.num_tokens(),
                })
            } else {
                m.inc("te_inference_non_finite", &[]);
                tracing::error!(
                    request_id = meta.request_id,
                    "the model returned non-finite values for a sequence"
                );
                Err(BackendError::NonFinite.into())
            };
            let _ = meta.response_tx.send(result);
        }
    }

    /// The runtime raised on a batch of several requests: re-run them in halves until every
    /// failure is pinned on one request, which then gets its own error message; the others
    /// get their results.
    async fn isolate(self, batch: Batch, err: BackendError, ctx: &Context) {
        let requests = self.requests();
        tracing::warn!(
            requests = requests.len(),
            sequences = self.metadata.len(),
            "{err}; re-running the batch's requests apart to find the one that fails"
        );
        let kind = self.kind;
        let lane = self.lane;
        let sent_at = self.sent_at;
        // Each request's sequences, by index in `batch`.
        let mut slots: Vec<Option<Metadata>> = self.metadata.into_iter().map(Some).collect();
        let seqs_of = |group: &[RequestId], slots: &[Option<Metadata>]| -> Vec<usize> {
            (0..slots.len())
                .filter(|&i| {
                    slots[i]
                        .as_ref()
                        .is_some_and(|m| group.contains(&m.request_id))
                })
                .collect()
        };
        let mut work = halves(&requests);
        let mut passes = 0;
        while let Some(group) = work.pop() {
            let seqs = seqs_of(&group, &slots);
            if seqs.is_empty() {
                continue;
            }
            let take = |slots: &mut Vec<Option<Metadata>>| -> Vec<Metadata> {
                seqs.iter().filter_map(|&i| slots[i].take()).collect()
            };
            if passes == MAX_ISOLATION_PASSES {
                let err = BackendError::Inference(format!(
                    "the batch holding this request failed, and {MAX_ISOLATION_PASSES} \
                     re-runs did not single out the failing request (see the log)"
                ));
                Job::new(kind, lane, take(&mut slots), sent_at).fail_all(&err);
                continue;
            }
            passes += 1;
            let sub = batch.select(&seqs);
            let ran = match run_anywhere(&ctx.backend, lane, kind, sub).await {
                Ok(ran) => ran,
                Err(err) => {
                    Job::new(kind, lane, take(&mut slots), sent_at).fail_all(&err);
                    continue;
                }
            };
            let device = ran.device;
            ctx.inc("te_batch_isolation_pass", device);
            match ran.result {
                Ok(out) => {
                    let job = Job::new(kind, lane, take(&mut slots), sent_at);
                    match check_shape(&out, kind, &ran.batch, &ctx.info) {
                        Ok(()) => job.deliver(&ran.batch, out, device, ctx),
                        Err(e) => job.fail_all(&e),
                    }
                }
                Err(BackendError::Inference(message)) if group.len() > 1 => {
                    tracing::debug!(requests = group.len(), "still failing: {message}");
                    work.extend(halves(&group));
                }
                Err(err) => Job::new(kind, lane, take(&mut slots), sent_at).fail_all(&err),
            }
        }
        tracing::info!(passes, "isolated the failing requests of a batch");
    }

    fn new(kind: BatchKind, lane: Lane, metadata: Vec<Metadata>, sent_at: Instant) -> Self {
        Self {
            kind,
            lane,
            paced: false,
            metadata,
            sent_at,
        }
    }
}

/// `ids` in two halves (one group when it holds a single id), second half first on the stack
/// so the first half runs first.
fn halves(ids: &[RequestId]) -> Vec<Vec<RequestId>> {
    if ids.len() <= 1 {
        return vec![ids.to_vec()];
    }
    let (a, b) = ids.split_at(ids.len() / 2);
    vec![b.to_vec(), a.to_vec()]
}

/// Runs one batch on `lane`'s thread of a healthy device, waiting for its slot like any other
/// batch. A device that failed before running it hands it back, and it goes to another; once
/// none is left, the error says why.
async fn run_anywhere(
    backend: &BackendHandle,
    lane: Lane,
    kind: BatchKind,
    mut batch: Batch,
) -> Result<Ran, BackendError> {
    loop {
        let slot = backend.reserve(lane).await?;
        let (reply, rx) = oneshot::channel();
        slot.send(kind, batch, reply);
        let ran = rx.await.map_err(|_| BackendError::Stopped)?;
        match ran.result {
            Err(BackendError::Refused) => batch = ran.batch,
            _ => return Ok(ran),
        }
    }
}

fn check_shape(
    out: &Output,
    kind: BatchKind,
    batch: &Batch,
    info: &ModelInfo,
) -> Result<(), BackendError> {
    let rows = match kind {
        BatchKind::AllTokens => batch.num_tokens(),
        _ => batch.num_seqs(),
    };
    let m = &out.matrix;
    let (cols_ok, expected) = match info.output_cols(kind) {
        Some(cols) => (m.cols == cols, cols.to_string()),
        // Sparse rows: k (index, value) pairs, k at least 1 and at most the vocabulary.
        None => (
            m.cols >= 2 && m.cols.is_multiple_of(2) && m.cols / 2 <= info.hidden_size.max(1),
            "2k".to_string(),
        ),
    };
    if m.rows != rows || !cols_ok || m.data.len() != rows * m.cols {
        return Err(BackendError::Inference(format!(
            "the backend returned a [{}, {}] array for a {kind:?} batch, expected [{rows}, {expected}]",
            m.rows, m.cols
        )));
    }
    Ok(())
}
