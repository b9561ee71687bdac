//! The request queue: a pure [`State`] that packs sequences into batches, and a [`Queue`]
//! handle, one lock around that state, that the handlers append to and the batching tasks
//! (`infer::batching`) drain. What to pack and when is theirs to say (`schedule`); the queue
//! knows nothing of devices, threads or the tokenizer.
//!
//! One queue entry is one sequence. A client request with many inputs becomes many entries, so a
//! request larger than one batch is split across consecutive batches for free; the handler
//! reassembles the per-sequence results in input order.
//!
//! Entries wait in one of two lanes ([`Lane`]): small requests in the interactive lane, the
//! rest in the bulk lane, each in arrival order. A batch is packed from one lane, with one
//! exception: where one batching task packs both lanes and bulk batches are paced (a CPU,
//! [`Take::Priority`] with [`BulkPacing`]), [`State::take_batch`] tops a batch of queries up
//! with bulk entries of its kind, to a paced bulk batch's budget. Where each lane has its own
//! batching task and backend thread (a GPU), a query's batch holds queries only, so a query is
//! never packed into (and made to wait for) a full-size corpus batch.
//!
//! A request may carry a deadline to start by (`X-Max-Queue-Ms`): packing drops its entries
//! once it has passed, as it drops those of a departed client, so they never reach the backend
//! and the batch is filled from the entries behind them; the handler takes them out at the
//! deadline itself ([`Queue::expire_request`]) so its client is answered on time.

mod entry;
mod handle;
mod pacing;
mod state;

pub use entry::{
    BatchSize, Entry, InferResult, Metadata, NextBatch, QueueError, RequestId, ResponseTx, Take,
};
pub use handle::Queue;
pub use pacing::{BulkPacing, PACED_FIRST_BATCH_TOKENS, PACED_MIN_BATCH_TOKENS};
pub use state::State;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_deadline;
