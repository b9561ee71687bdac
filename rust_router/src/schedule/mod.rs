//! The batching and latency policy, in one place: [`ServingProfile::resolve`] turns the flags
//! and what the started backend says about itself into plain settings, once, at start-up;
//! the queue, the batching tasks, the handlers, the tokenizer pool and the HTTP thread each
//! get the settings they need from it. Nothing else asks what kind of device it runs on.
//!
//! # What is the batching policy?
//!
//! Every request is tokenized first (inline when small, `tokenization::INLINE_MAX_BYTES`, else
//! on the pool), then goes into a lane by the tokens of all its inputs together: at most
//! `--interactive-max-tokens` (256) is a query, in the interactive lane; the rest, and every
//! request when the flag is 0, is bulk. Batches are packed in arrival order up to
//! `--max-batch-tokens` (16384) and `--max-batch-requests` (no limit), one kind of output
//! per batch, and one batch waits for each backend thread while another runs (prefetch),
//! except behind a paced bulk batch (below).
//!
//! **With an interactive lane** (the runtime says it can run a query beside a bulk call, a GPU
//! runtime; and `--interactive-max-tokens` is not 0), [`Batching::Lanes`]:
//! - each device has two backend threads, one per lane, and each lane has its own batching
//!   task; a query whose thread is free skips the queue and goes straight to it, and a
//!   query's batch holds queries only. The runtime lets it pass the bulk batch in progress
//!   between layers (`--max-bulk-step-ms`, the runtime's).
//! - bulk batches are bounded by tokens only;
//! - part of the tokenizer pool (3/8 of it) stands aside while full bulk batches leave entries
//!   waiting (the GPU bounds the backfill), and the pool runs at `idle` priority, so the
//!   host's cores are the queries' first (`--tokenization-priority`);
//! - the waits are hot: the interactive thread busy-waits 25 ms for the next query
//!   (`--backend-spin-us`), re-running a query's host steps every 1 ms meanwhile
//!   (`--query-warm-us`); a query's handler polls 5 ms for its result (`--query-spin-us`); the
//!   HTTP thread polls its sockets 25 ms after each request (`--http-spin-us`).
//!
//! **Without one** (a CPU runtime; or `--interactive-max-tokens 0`, with which the router asks
//! the Python runtime for no interactive lane), [`Batching::Shared`]:
//! - each device has one backend thread, fed by one batching task that packs queries first,
//!   then bulk entries;
//! - bulk batches are bounded by time as well (`--max-bulk-batch-ms`, 40): their token budget
//!   follows the measured speed so that one runs about that long, none is prefetched behind
//!   the one that runs, and a batch of queries is topped up with bulk entries of its kind to
//!   that budget (0: tokens only, prefetched, queries in batches of their own);
//! - the tokenizer pool is never held back, and runs at `normal` priority;
//! - nothing spins: the backend threads sleep as soon as they have nothing to do, handlers
//!   await their results and the HTTP thread sleeps when it has nothing to read.
//!
//! The defaults of the waits and of the pool's priority follow the runtime's interactive
//! lane itself, the batching also `--interactive-max-tokens`; each flag above, given, wins.
//! `--backend-spin-us`, given, makes every backend thread (bulk ones too) spin that long,
//! on any device. The waits of the backend threads are decided before the backend starts
//! ([`ServingProfile::backend_waits`]): they need no fact of it, an interactive thread's
//! wait applies only where one exists.

use crate::backend::wait::WaitPolicy;
use crate::backend::{BackendHandle, Lane};
use crate::queue::Take;
use crate::tokenization::PoolPriority;
use std::time::Duration;

/// How long an interactive thread spins by default, and the HTTP thread polls its sockets
/// where the runtime has an interactive lane: a query stream of at least 40 queries/s then
/// always finds them awake. Measured on an H100 (docs/journal/results-log.md): a 24-token
/// all-MiniLM-L6-v2 query every 20 ms went from 2.50 to 1.94 ms p50, and its time waiting for
/// the thread under a backfill from 3.4 to 0.17 ms p99.
pub const DEFAULT_INTERACTIVE_SPIN_US: u64 = 25_000;

/// How often a spinning interactive thread re-runs a query's host steps by default
/// (`--query-warm-us`).
pub const DEFAULT_WARM_EVERY_US: u64 = 1_000;

/// How long a query's handler polls for its result by default where the runtime has an
/// interactive lane: longer than a small model's query under a backfill, short enough that a
/// long one (a large model's, waiting for a bulk step) does not hold a core throughout.
pub const DEFAULT_QUERY_SPIN: Duration = Duration::from_millis(5);

/// The flags that move the policy, as given (`cli::Args::policy_flags`).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyFlags {
    pub max_batch_tokens: usize,
    pub max_batch_requests: Option<usize>,
    pub interactive_max_tokens: usize,
    pub max_bulk_batch_ms: u64,
    pub backend_spin_us: Option<u64>,
    pub query_warm_us: u64,
    pub query_spin_us: Option<u64>,
    pub http_spin_us: Option<u64>,
    pub tokenization_priority: Option<PoolPriority>,
    /// `--max-queue-ms`.
    pub max_queue: Option<Duration>,
}

/// What the policy needs to know of the started backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendFacts {
    /// Interactive batches have backend threads of their own, beside the bulk ones (the
    /// runtime says so, as a GPU runtime does, and the lane was asked for).
    pub interactive_lane: bool,
}

impl BackendFacts {
    /// The facts of `backend`. The only place that asks whether it has an interactive lane.
    pub fn of(backend: &BackendHandle) -> Self {
        Self {
            interactive_lane: backend.has_interactive_lane(),
        }
    }
}

/// How the queue is packed into batches, and for which backend threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batching {
    /// A batching task per lane, each feeding that lane's threads on every device; a query's
    /// batch holds queries only.
    Lanes,
    /// One batching task, packing queries first, then bulk entries, for each device's only
    /// thread. `pace_bulk`: bulk batches hold about this much forward-pass time at most
    /// (their token budget follows the measured speed), none is prefetched behind one that
    /// runs, and a batch of queries is topped up with bulk entries to that budget; `None`:
    /// tokens only.
    Shared { pace_bulk: Option<Duration> },
}

impl Batching {
    /// The batching tasks, by what each packs; the first one packs the interactive lane.
    pub fn takes(self) -> Vec<Take> {
        match self {
            Batching::Lanes => Lane::PRIORITY.into_iter().map(Take::Lane).collect(),
            Batching::Shared { .. } => vec![Take::Priority],
        }
    }

    /// The forward-pass time bulk batches are bounded by, if they are.
    pub fn bulk_pacing(self) -> Option<Duration> {
        match self {
            Batching::Lanes => None,
            Batching::Shared { pace_bulk } => pace_bulk,
        }
    }
}

/// How each kind of backend thread waits for its next batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendWaits {
    pub bulk: WaitPolicy,
    /// Applies only where interactive threads exist.
    pub interactive: WaitPolicy,
}

/// How the tokenizer pool shares the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenizerPoolPolicy {
    /// How its threads compete for cores.
    pub priority: PoolPriority,
    /// Whether part of it stands aside while the backend bounds the bulk lane
    /// (`tokenization::PoolThrottle`, told by the batching tasks).
    pub throttled: bool,
}

/// The batching and latency policy, resolved once from the flags and the backend.
#[derive(Debug, Clone, PartialEq)]
pub struct ServingProfile {
    /// Most tokens of one batch (bulk batches may get less, see [`Batching::Shared`]).
    pub max_batch_tokens: usize,
    /// Most sequences of one batch.
    pub max_batch_requests: Option<usize>,
    /// Requests of at most this many tokens in all are queries (interactive lane); 0: every
    /// request is bulk.
    pub interactive_max_tokens: usize,
    pub batching: Batching,
    pub backend_waits: BackendWaits,
    /// How long a query's handler polls for its result before it sleeps (zero: never).
    pub query_spin: Duration,
    /// How long the HTTP thread polls its sockets after each request's start (zero: never).
    pub http_spin: Duration,
    pub tokenizer_pool: TokenizerPoolPolicy,
    /// How long a request may wait in the queue before it starts, unless it says
    /// (`X-Max-Queue-Ms`); `None`: as long as it takes.
    pub max_queue: Option<Duration>,
}

impl ServingProfile {
    /// The policy for `flags` on a backend with `backend`'s facts.
    pub fn resolve(flags: &PolicyFlags, backend: BackendFacts) -> Self {
        let has_lane = backend.interactive_lane;
        let lanes_apart = has_lane && flags.interactive_max_tokens > 0;
        let batching = if lanes_apart {
            Batching::Lanes
        } else {
            Batching::Shared {
                pace_bulk: (flags.max_bulk_batch_ms > 0)
                    .then(|| Duration::from_millis(flags.max_bulk_batch_ms)),
            }
        };
        let query_spin = match flags.query_spin_us {
            Some(us) => Duration::from_micros(us),
            None if has_lane => DEFAULT_QUERY_SPIN,
            None => Duration::ZERO,
        };
        let http_spin_us = flags.http_spin_us.unwrap_or(if has_lane {
            DEFAULT_INTERACTIVE_SPIN_US
        } else {
            0
        });
        // With an interactive lane the forward passes run on an accelerator and the host's
        // cores serve tokenization and queries, so queries come first. Without one (a CPU),
        // the forward pass's own threads would take every core from an idle-class pool:
        // measured on the 2-core CI machine, the backfill lost 7 % and queries gained nothing
        // (docs/journal/results-log.md).
        let priority = flags.tokenization_priority.unwrap_or(if has_lane {
            PoolPriority::Idle
        } else {
            PoolPriority::Normal
        });
        Self {
            max_batch_tokens: flags.max_batch_tokens,
            max_batch_requests: flags.max_batch_requests,
            interactive_max_tokens: flags.interactive_max_tokens,
            batching,
            backend_waits: Self::backend_waits(flags),
            query_spin,
            http_spin: Duration::from_micros(http_spin_us),
            tokenizer_pool: TokenizerPoolPolicy {
                priority,
                // Queries have threads of their own: the pool need not outrun the backend,
                // and the cores it leaves are the queries'.
                throttled: lanes_apart,
            },
            max_queue: flags.max_queue,
        }
    }

    /// How the backend threads wait, which is needed to start the backend, before its facts
    /// are known (and is the same in [`ServingProfile::resolve`]'s profile): by default only
    /// the interactive threads spin ([`DEFAULT_INTERACTIVE_SPIN_US`]; they exist only with an
    /// interactive lane), warming every `--query-warm-us`, and bulk threads, whose batches
    /// are large, sleep at once. `--backend-spin-us` makes every thread spin that long (0:
    /// none).
    pub fn backend_waits(flags: &PolicyFlags) -> BackendWaits {
        let (bulk, interactive) = match flags.backend_spin_us {
            Some(us) => (WaitPolicy::spin_micros(us), WaitPolicy::spin_micros(us)),
            None => (
                WaitPolicy::default(),
                WaitPolicy::spin_micros(DEFAULT_INTERACTIVE_SPIN_US),
            ),
        };
        BackendWaits {
            bulk,
            interactive: interactive.warming_every(flags.query_warm_us),
        }
    }

    /// How small requests are served, for the start-up log.
    pub fn describe_interactive_lane(&self) -> String {
        let max = self.interactive_max_tokens;
        if max == 0 {
            "off".into()
        } else if self.batching == Batching::Lanes {
            format!("requests of <= {max} tokens on their own backend thread (one per device)")
        } else {
            format!("requests of <= {max} tokens first in the shared queue (the runtime has no interactive lane)")
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
