//! What waits in the queue (an [`Entry`]: one sequence and where its result goes) and what a
//! batching task takes out of it ([`NextBatch`], as much as [`Take`] asks for).

use crate::backend::{BackendError, Batch, BatchKind, Lane};
use crate::tokenization::ValidEncoding;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

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
    /// When the forward pass began (`queue` after queueing).
    pub started: Instant,
    /// The device that ran it, by index.
    pub device: usize,
    /// Sequences and tokens of the whole batch, every request's.
    pub batch_size: usize,
    pub batch_tokens: usize,
}

/// Why a sequence got no result: its batch failed, or it waited past its request's deadline
/// and was taken out of the queue without running.
#[derive(Debug, Clone, thiserror::Error)]
pub enum QueueError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Its request was still waiting, none of it started, at its deadline
    /// ([`Metadata::deadline`]).
    #[error("the request waited in the queue past its deadline and was not run")]
    Expired,
}

pub type ResponseTx = oneshot::Sender<Result<InferResult, QueueError>>;

/// Identifies the client request a sequence belongs to: a batch that fails is re-run one
/// request at a time, and a request whose client left is taken out of the queue.
pub type RequestId = u64;

#[derive(Debug)]
pub struct Metadata {
    pub response_tx: ResponseTx,
    pub request_id: RequestId,
    pub queued_at: Instant,
    /// The latest instant the request may start (`X-Max-Queue-Ms`, `--max-queue-ms`): an entry
    /// packed after it is answered [`QueueError::Expired`] instead, and never reaches the
    /// backend. Cleared on the rest of a request's entries once one of them is in a batch: a
    /// request that has started runs to the end, so its client never loses work already done.
    pub deadline: Option<Instant>,
}

impl Metadata {
    /// Whether this entry's request may no longer start at `now`.
    pub fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|deadline| now >= deadline)
    }
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
pub(super) fn push_entry(entry: Entry, batch: &mut Batch, metadata: &mut Vec<Metadata>) {
    let e = &entry.encoding;
    batch.push_sequence(&e.input_ids, &e.token_type_ids, &e.position_ids);
    batch.push_pixels(&e.pixels);
    if let Some(query) = &e.query {
        batch.push_query(query);
    }
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
