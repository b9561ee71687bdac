//! What a request may ask of its own queueing: a priority, which overrides the lane its size
//! would give it, and a queue deadline, past which it is answered without running.

use crate::backend::Lane;
use std::future::Future;
use std::time::{Duration, Instant};

/// A request's `priority` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// The interactive lane whatever the request's size, as long as it fits one interactive
    /// batch (see [`lane_for_request`]).
    High,
    /// The bulk lane even when small: a backfill of short documents marked low never takes
    /// the queries' lane.
    Low,
}

impl Priority {
    /// The field's values, as the API spells them.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Low => "low",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "high" => Some(Priority::High),
            "low" => Some(Priority::Low),
            _ => None,
        }
    }
}

/// A request's lane, from the tokens of all its inputs together: a query's latency is what
/// the interactive lane protects, and a large request split into small inputs is no query.
pub fn lane_for(total_tokens: usize, interactive_max_tokens: usize) -> Lane {
    if interactive_max_tokens > 0 && total_tokens <= interactive_max_tokens {
        Lane::Interactive
    } else {
        Lane::Bulk
    }
}

/// A request's lane once its `priority` is read: none, by its size ([`lane_for`]); `low`,
/// bulk; `high`, interactive if the request fits one interactive batch (`fits_one_batch`:
/// `--max-batch-tokens` and `--max-batch-requests`), else bulk. A `high` request that does not
/// fit is served rather than refused: it would take several interactive batches in a row, each
/// a full bulk batch's size, and hold every query behind it, which is what the lane is there
/// to prevent; so it runs as the backfill it is. With the lane off
/// (`--interactive-max-tokens 0`) every request is bulk, `high` too: the operator's choice
/// stands over the client's.
pub fn lane_for_request(
    priority: Option<Priority>,
    total_tokens: usize,
    fits_one_batch: bool,
    interactive_max_tokens: usize,
) -> Lane {
    match priority {
        None => lane_for(total_tokens, interactive_max_tokens),
        Some(Priority::Low) => Lane::Bulk,
        Some(Priority::High) if interactive_max_tokens > 0 && fits_one_batch => Lane::Interactive,
        Some(Priority::High) => Lane::Bulk,
    }
}

/// The largest queue deadline a request (`X-Max-Queue-Ms`) or the server (`--max-queue-ms`)
/// may set: one hour. A larger value is more likely a mistake (microseconds, a timestamp) than a
/// bound worth keeping, and is refused.
pub const MAX_QUEUE_MS_CAP: u64 = 3_600_000;

/// A queue deadline in milliseconds, as `X-Max-Queue-Ms` and `--max-queue-ms` take it: a
/// whole number from 1 to [`MAX_QUEUE_MS_CAP`]. 0 is refused rather than read as "no
/// deadline": leaving the header out says that, and a request that may not wait at all would
/// fail whenever anything else runs.
pub fn parse_max_queue_ms(value: &str) -> Result<Duration, String> {
    let ms: u64 = value.trim().parse().map_err(|_| {
        format!(
            "must be a whole number of milliseconds from 1 to {MAX_QUEUE_MS_CAP}, got `{value}`"
        )
    })?;
    if !(1..=MAX_QUEUE_MS_CAP).contains(&ms) {
        return Err(format!(
            "must be from 1 to {MAX_QUEUE_MS_CAP} milliseconds (one hour), got {ms}"
        ));
    }
    Ok(Duration::from_millis(ms))
}

tokio::task_local! {
    /// The queue deadline the client asked for (`X-Max-Queue-Ms`), set around the whole
    /// handler by the HTTP layer. A task-local rather than a field of each body: it is a
    /// header, which applies to every inference call the request makes, `/vertex`'s
    /// instances included, and those run through the routes' handlers as they are.
    static MAX_QUEUE: Duration;
}

/// Runs `calls` (a request's handler) with `limit` as the queue deadline of every inference
/// call they make, over the server's default.
pub async fn with_max_queue<F: Future>(limit: Duration, calls: F) -> F::Output {
    MAX_QUEUE.scope(limit, calls).await
}

tokio::task_local! {
    /// The instant a gRPC call's deadline (`grpc-timeout`) passes, set around its handler: its
    /// queue wait ends by then whenever its sequences were queued, so that a call still queued
    /// at its deadline is answered as a queue timeout, never racing the call's own deadline.
    static QUEUE_DEADLINE: Instant;
}

/// Runs `calls` so that the queue wait of every inference call they make ends by `deadline`
/// (and within `with_max_queue`'s limit, if shorter).
pub async fn with_queue_deadline<F: Future>(deadline: Instant, calls: F) -> F::Output {
    QUEUE_DEADLINE.scope(deadline, calls).await
}

tokio::task_local! {
    /// Set around the calls of a gRPC stream: each of its messages is a request of its own,
    /// and one that finds every concurrency permit taken waits for one instead of failing
    /// (which would end the stream). The stream's own bound on messages in flight keeps the
    /// waiting finite.
    static WAITS_FOR_ADMISSION: ();
}

/// Runs `calls` (the calls of one stream message) so that they wait for a concurrency permit
/// rather than being refused as overloaded.
pub async fn waiting_for_admission<F: Future>(calls: F) -> F::Output {
    WAITS_FOR_ADMISSION.scope((), calls).await
}

/// Whether the request being handled waits for a permit ([`waiting_for_admission`]).
pub(super) fn waits_for_admission() -> bool {
    WAITS_FOR_ADMISSION.try_with(|_| ()).is_ok()
}

/// The queue deadline of the request being handled, from now: the client's, else `default`
/// (`--max-queue-ms`), cut to what is left before [`with_queue_deadline`]'s instant.
pub(super) fn max_queue(default: Option<Duration>) -> Option<Duration> {
    let limit = MAX_QUEUE.try_with(|limit| *limit).ok().or(default);
    match QUEUE_DEADLINE.try_with(|at| at.saturating_duration_since(Instant::now())) {
        Ok(left) => Some(limit.map_or(left, |limit| limit.min(left))),
        Err(_) => limit,
    }
}

/// The instant the queue wait of sequences queued at `queued_at` ends: `limit` later
/// ([`max_queue`]), and never past [`with_queue_deadline`]'s instant.
pub(super) fn queue_deadline(queued_at: Instant, limit: Option<Duration>) -> Option<Instant> {
    let end = limit.map(|limit| queued_at + limit)?;
    Some(QUEUE_DEADLINE.try_with(|at| end.min(*at)).unwrap_or(end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_calls_deadline_ends_the_queue_wait_however_late_it_is_queued() {
        let at = Instant::now() + Duration::from_millis(50);
        with_queue_deadline(at, async {
            let limit = max_queue(Some(Duration::from_secs(5))).unwrap();
            assert!(limit <= Duration::from_millis(50), "{limit:?}");
            // Queued after tokenizing took 30 ms: still ends at the call's deadline.
            let queued_at = Instant::now() + Duration::from_millis(30);
            assert_eq!(queue_deadline(queued_at, Some(limit)), Some(at));
            // A shorter limit of its own still applies.
            let now = Instant::now();
            let short = Duration::from_millis(1);
            assert_eq!(queue_deadline(now, Some(short)), Some(now + short));
        })
        .await;
        // Without a call deadline: the limit as given, from when the sequences are queued.
        let five = Duration::from_secs(5);
        assert_eq!(max_queue(Some(five)), Some(five));
        assert_eq!(max_queue(None), None);
        let now = Instant::now();
        assert_eq!(queue_deadline(now, Some(five)), Some(now + five));
        assert_eq!(queue_deadline(now, None), None);
    }
}
