//! The queue's contents and its packing rule, with no I/O and no lock.

use super::entry::{push_entry, Entry, Metadata, NextBatch, QueueError, RequestId, Take};
use super::pacing::BulkPacing;
use crate::backend::{Batch, BatchKind, Lane};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Queue contents and the packing rule, with no I/O so it can be tested directly.
#[derive(Debug)]
pub struct State {
    /// Indexed by [`Lane::index`].
    lanes: [VecDeque<Entry>; 2],
    max_batch_tokens: usize,
    max_batch_requests: Option<usize>,
    /// `Some` when bulk batches are bounded by time too.
    pub(super) pacing: Option<BulkPacing>,
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

    /// Takes `request` out of the queue if it has not started: all its `sequences` still wait
    /// here (none was packed into a batch, none was answered [`QueueError::Expired`] by
    /// packing). Returns whether it did; `false` leaves the queue as it was. Scans the queue,
    /// which a request does once at most, at its deadline.
    pub fn expire_request(&mut self, request: RequestId, sequences: usize) -> bool {
        let queued: usize = self
            .lanes
            .iter()
            .map(|lane| {
                lane.iter()
                    .filter(|e| e.metadata.request_id == request)
                    .count()
            })
            .sum();
        if queued == 0 || queued != sequences {
            return false;
        }
        self.remove_request(request);
        true
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
    /// one's, when `None`) and fit in `max_tokens` and the sequence limit. Entries past their
    /// request's deadline are answered [`QueueError::Expired`] and skipped, like those of a
    /// departed client, so the batch is filled from the entries behind them.
    fn fill(
        &mut self,
        lane: Lane,
        max_tokens: usize,
        kind: &mut Option<BatchKind>,
        batch: &mut Batch,
        metadata: &mut Vec<Metadata>,
    ) {
        let entries = &mut self.lanes[lane.index()];
        // Read once, and only when an entry has a deadline.
        let mut now = None;
        while let Some(entry) = entries.front() {
            if entry.metadata.response_tx.is_closed() {
                entries.pop_front();
                self.dropped += 1;
                continue;
            }
            if entry.metadata.deadline.is_some()
                && entry
                    .metadata
                    .expired(*now.get_or_insert_with(Instant::now))
            {
                let entry = entries.pop_front().expect("front exists");
                let _ = entry.metadata.response_tx.send(Err(QueueError::Expired));
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
        // The last request packed has started: the rest of it, cut off by the budget, waits at
        // the front of the lane (a request's entries are appended together) and must run too.
        if let Some(started) = metadata.last().map(|m| m.request_id) {
            entries
                .iter_mut()
                .take_while(|e| e.metadata.request_id == started)
                .for_each(|e| e.metadata.deadline = None);
        }
        if lane == Lane::Bulk && !metadata.is_empty() {
            self.bulk_backlog = !self.lanes[lane.index()].is_empty();
        }
    }
}
