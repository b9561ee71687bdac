//! The batching tasks: one per backend thread, packing the queue into batches, and what
//! happens to a batch's results: shape checks, per-sequence checks for non-finite values, and,
//! when the runtime raises on a batch of several requests, re-running them apart so that only
//! the request that really fails gets the error.

use crate::backend::{BackendError, BackendHandle, Batch, BatchKind, Lane, ModelInfo, Output};
use crate::metrics::Metrics;
use crate::queue::{InferResult, Metadata, NextBatch, Queue, RequestId, Take};
use std::sync::Arc;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The most extra forward passes spent finding the failing requests of one failed batch. Each
/// pass halves a group of requests, so this finds up to about `MAX_ISOLATION_PASSES /
/// (2 log2 n)` failing requests among `n`; past it, the requests still grouped get an error
/// that says so rather than another client's message.
pub const MAX_ISOLATION_PASSES: usize = 64;

/// One batching task per backend thread: a task per lane when the runtime has an interactive
/// lane (and it is on), else one task that packs in priority order for the only thread.
pub fn batching_takes(backend: &BackendHandle, interactive_max_tokens: usize) -> Vec<Take> {
    if backend.has_interactive_lane() && interactive_max_tokens > 0 {
        Lane::PRIORITY.into_iter().map(Take::Lane).collect()
    } else {
        vec![Take::Priority]
    }
}

/// What every batch's results need, shared by the tasks.
struct Context {
    backend: BackendHandle,
    info: Arc<ModelInfo>,
    metrics: Arc<Metrics>,
}

/// Starts the batching tasks; the returned task ends when they all have.
pub fn spawn_tasks(
    queue: &Queue,
    backend: &BackendHandle,
    interactive_max_tokens: usize,
    info: &Arc<ModelInfo>,
    metrics: &Arc<Metrics>,
) -> JoinHandle<()> {
    let ctx = Arc::new(Context {
        backend: backend.clone(),
        info: info.clone(),
        metrics: metrics.clone(),
    });
    let tasks: Vec<_> = batching_takes(backend, interactive_max_tokens)
        .into_iter()
        .map(|take| tokio::spawn(batching_task(queue.clone(), take, ctx.clone())))
        .collect();
    tokio::spawn(async move {
        for task in tasks {
            let _ = task.await;
        }
    })
}

/// Feeds one backend thread with what `take` packs: wait for work, reserve the thread's one
/// free slot, then pack the next batch. Packing only after a slot is free means exactly one
/// batch waits while another runs (prefetch), and that batch is as full as the queue allows at
/// that moment (and, in priority order, holds the queries that arrived meanwhile). Waiting for
/// work *before* the slot means an idle backend frees its slot with nobody waiting on it, so
/// the backend thread wakes no tokio worker in front of its forward pass.
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
        // `None`: every queued entry's client went away; the slot goes back unused.
        let Some(NextBatch {
            kind,
            batch,
            metadata,
            ..
        }) = queue.try_next_batch(take)
        else {
            continue;
        };
        let (reply, rx) = oneshot::channel();
        slot.send(kind, batch, reply);
        // Splitting results runs beside the next forward pass, not in front of it.
        let job = Job {
            kind,
            lane: take.backend_lane(),
            metadata,
        };
        tokio::spawn(job.finish(rx, ctx.clone()));
    }
}

/// The backend is gone: fail everything that is or will be queued for `take` instead of
/// leaving clients waiting forever.
async fn fail_everything_queued(queue: &Queue, take: Take, err: BackendError) {
    tracing::error!("{err}; failing queued requests");
    while let Some(next) = queue.next_batch(take).await {
        for m in next.metadata {
            let _ = m.response_tx.send(Err(err.clone()));
        }
    }
}

/// The sequences of one batch sent to the backend, waiting for their results.
struct Job {
    kind: BatchKind,
    /// The backend thread the batch ran on (re-runs go to the same one).
    lane: Lane,
    /// One per sequence, in batch order.
    metadata: Vec<Metadata>,
}

impl Job {
    async fn finish(self, rx: oneshot::Receiver<crate::backend::Ran>, ctx: Arc<Context>) {
        let Ok(ran) = rx.await else {
            return self.fail_all(&BackendError::Stopped);
        };
        let result = ran
            .result
            .and_then(|out| check_shape(&out, self.kind, &ran.batch, &ctx.info).map(|_| out));
        match result {
            Ok(out) => self.deliver(&ran.batch, out, &ctx),
            Err(err @ BackendError::Inference(_)) if self.requests().len() > 1 => {
                ctx.metrics.inc("te_batch_inference_failure", &[]);
                self.isolate(ran.batch, err, &ctx).await
            }
            Err(err) => {
                ctx.metrics.inc("te_batch_inference_failure", &[]);
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
            let _ = m.response_tx.send(Err(err.clone()));
        }
    }

    /// Splits the results back to the sequences; a sequence whose values are not all finite
    /// gets an error of its own instead of `null`s in JSON.
    fn deliver(self, batch: &Batch, out: Output, ctx: &Context) {
        let m = &ctx.metrics;
        m.inc("te_batch_inference_success", &[]);
        m.observe(
            "te_batch_inference_duration",
            &[],
            out.duration.as_secs_f64(),
        );
        m.observe("te_batch_inference_size", &[], self.metadata.len() as f64);
        let cols = out.matrix.cols;
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
                    inference: out.duration,
                })
            } else {
                m.inc("te_inference_non_finite", &[]);
                tracing::error!(
                    request_id = meta.request_id,
                    "the model returned non-finite values for a sequence"
                );
                Err(BackendError::NonFinite)
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
                Job::new(kind, lane, take(&mut slots)).fail_all(&err);
                continue;
            }
            passes += 1;
            ctx.metrics.inc("te_batch_isolation_pass", &[]);
            let sub = batch.select(&seqs);
            match run_once(&ctx.backend, lane, kind, sub).await {
                Ok((sub, out)) => {
                    let job = Job::new(kind, lane, take(&mut slots));
                    match check_shape(&out, kind, &sub, &ctx.info) {
                        Ok(()) => job.deliver(&sub, out, ctx),
                        Err(e) => job.fail_all(&e),
                    }
                }
                Err(BackendError::Inference(message)) if group.len() > 1 => {
                    tracing::debug!(requests = group.len(), "still failing: {message}");
                    work.extend(halves(&group));
                }
                Err(err) => Job::new(kind, lane, take(&mut slots)).fail_all(&err),
            }
        }
        tracing::info!(passes, "isolated the failing requests of a batch");
    }

    fn new(kind: BatchKind, lane: Lane, metadata: Vec<Metadata>) -> Self {
        Self {
            kind,
            lane,
            metadata,
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

/// Runs one batch on `lane`'s backend thread, waiting for its slot like any other batch.
async fn run_once(
    backend: &BackendHandle,
    lane: Lane,
    kind: BatchKind,
    batch: Batch,
) -> Result<(Batch, Output), BackendError> {
    let slot = backend.reserve(lane).await?;
    let (reply, rx) = oneshot::channel();
    slot.send(kind, batch, reply);
    let ran = rx.await.map_err(|_| BackendError::Stopped)?;
    ran.result.map(|out| (ran.batch, out))
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
    let cols = info.output_cols(kind);
    let m = &out.matrix;
    if m.rows != rows || m.cols != cols || m.data.len() != rows * cols {
        return Err(BackendError::Inference(format!(
            "the backend returned a [{}, {}] array for a {kind:?} batch, expected [{rows}, {cols}]",
            m.rows, m.cols
        )));
    }
    Ok(())
}
