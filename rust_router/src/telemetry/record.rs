//! What a traced request went through, noted by the inference layer as it happens: when its
//! inputs were tokenized and, for each sequence, when it was queued and which batch ran it.
//! The transport layer turns a finished request's [`RequestRecord`] into spans
//! ([`super::spans`]); nothing here knows about OpenTelemetry.
//!
//! Noting is a task-local: a request is recorded only inside [`recording`], which the HTTP
//! and gRPC layers enter only when `--otlp-endpoint` is set. Elsewhere [`note`] finds no
//! record and costs one task-local lookup.

use std::cell::RefCell;
use std::future::Future;
use std::time::{Duration, Instant};

tokio::task_local! {
    static RECORD: RefCell<RequestRecord>;
}

/// One inference call's tokenization (a request may make several: `/vertex`, `/similarity`).
#[derive(Debug, Clone)]
pub struct Tokenized {
    pub start: Instant,
    pub end: Instant,
    pub inputs: usize,
    pub tokens: usize,
    /// The lane its sequences were queued in (`interactive` or `bulk`).
    pub lane: &'static str,
}

/// The forward pass that ran a sequence: shared by every sequence of its batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRun {
    pub started: Instant,
    pub duration: Duration,
    /// The device's name (`cuda:0`), or its index where the model names none.
    pub device: String,
    /// Sequences in the batch, over every request it served.
    pub size: usize,
    /// Tokens in the batch, over every request it served.
    pub tokens: usize,
}

/// One sequence of the request, from its queueing to its batch's end.
#[derive(Debug, Clone)]
pub struct SequenceRun {
    pub tokens: usize,
    pub queued_at: Instant,
    pub lane: &'static str,
    pub batch: BatchRun,
}

/// Everything noted about one request.
#[derive(Debug, Clone, Default)]
pub struct RequestRecord {
    pub tokenized: Vec<Tokenized>,
    pub sequences: Vec<SequenceRun>,
}

impl RequestRecord {
    /// Tokens of every input the request tokenized.
    pub fn tokens(&self) -> usize {
        self.tokenized.iter().map(|t| t.tokens).sum()
    }

    /// The request's lane: `bulk` if any of its calls went there.
    pub fn lane(&self) -> Option<&'static str> {
        let mut lanes = self.tokenized.iter().map(|t| t.lane);
        let first = lanes.next()?;
        Some(if lanes.any(|l| l != first) {
            "bulk"
        } else {
            first
        })
    }
}

/// Runs `request`, noting what it goes through; returns its output and the record.
pub async fn recording<F: Future>(request: F) -> (F::Output, RequestRecord) {
    let run = async {
        let output = request.await;
        (output, RECORD.with(|record| record.take()))
    };
    RECORD.scope(RefCell::default(), run).await
}

/// Notes something about the request being recorded; nothing outside [`recording`].
pub fn note(f: impl FnOnce(&mut RequestRecord)) {
    let _ = RECORD.try_with(|record| f(&mut record.borrow_mut()));
}

/// Whether the running task is a recorded request (to skip building what [`note`] would
/// throw away).
pub fn is_recording() -> bool {
    RECORD.try_with(|_| ()).is_ok()
}
