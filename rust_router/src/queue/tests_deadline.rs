//! Queue deadlines: expired entries are answered and skipped at packing, never cut a batch
//! short, and a request that has started is never expired.

use super::tests::{lane_entry, seq_lens, Rx};
use super::*;
use crate::backend::{BatchKind, Lane};
use crate::metrics::{Metrics, ModelMetrics};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Appends one request of `lens` sequences (id `request`), to start by `deadline`.
fn request(
    state: &mut State,
    request: RequestId,
    lens: &[usize],
    deadline: Option<Instant>,
) -> Vec<Rx> {
    lens.iter()
        .map(|&len| {
            let (mut e, rx) = lane_entry(len, BatchKind::Pooled, Lane::Bulk);
            e.metadata.request_id = request;
            e.metadata.deadline = deadline;
            state.append(e);
            rx
        })
        .collect()
}

fn expired(rx: &mut Rx) -> bool {
    matches!(rx.try_recv(), Ok(Err(QueueError::Expired)))
}

#[test]
fn expired_entries_are_answered_and_the_batch_is_filled_from_those_behind() {
    let mut state = State::new(10, None);
    let past = Some(Instant::now() - Duration::from_millis(1));
    let future = Some(Instant::now() + Duration::from_secs(60));
    let mut first = request(&mut state, 1, &[4, 4], past);
    let _second = request(&mut state, 2, &[3, 3], future);
    let _third = request(&mut state, 3, &[4], None);
    let mut late = request(&mut state, 4, &[2], past);
    let _fifth = request(&mut state, 5, &[5], None);
    let batch = state.next_batch(Lane::Bulk).unwrap();
    // Requests 2 and 3 fill the budget the expired request 1 would have taken.
    assert_eq!(seq_lens(&batch), [3, 3, 4]);
    assert!(first.iter_mut().all(expired), "request 1 was not told");
    // Request 4, met before the cut, is answered too; request 5 waits for the next batch.
    assert!(expired(&mut late[0]));
    assert_eq!(state.len(), 1);
    assert_eq!(seq_lens(&state.next_batch(Lane::Bulk).unwrap()), [5]);
    assert!(state.is_empty());
    // Expired entries are no departed clients: not counted as dropped.
    assert_eq!(state.take_dropped(), 0);
}

#[test]
fn a_request_cut_by_the_budget_has_started_and_never_expires() {
    let mut state = State::new(8, None);
    let soon = Instant::now() + Duration::from_millis(20);
    let _rxs = request(&mut state, 7, &[5, 5, 5], Some(soon));
    let first = state.next_batch(Lane::Bulk).unwrap();
    assert_eq!(seq_lens(&first), [5]);
    // Its deadline passes with two sequences still queued: they run anyway.
    std::thread::sleep(Duration::from_millis(30));
    assert!(!state.expire_request(7, 3), "a started request was expired");
    assert_eq!(seq_lens(&state.next_batch(Lane::Bulk).unwrap()), [5]);
    assert_eq!(seq_lens(&state.next_batch(Lane::Bulk).unwrap()), [5]);
    assert!(state.is_empty());
}

#[test]
fn a_request_is_expired_at_its_deadline_only_while_none_of_it_has_started() {
    let mut state = State::new(100, None);
    let _a = request(&mut state, 1, &[3, 3], None);
    let _b = request(&mut state, 2, &[2], None);
    // Not all of request 1's sequences are queued (the caller counts 3): it has started.
    assert!(!state.expire_request(1, 3));
    assert_eq!(state.len(), 3);
    assert!(state.expire_request(1, 2));
    assert_eq!(state.len(), 1);
    // Gone (expired, or packed whole): nothing to take out.
    assert!(!state.expire_request(1, 2));
    assert!(!state.expire_request(9, 1));
}

#[tokio::test]
async fn the_queue_handle_updates_its_size_when_packing_only_expires() {
    let metrics = Arc::new(Metrics::new(512));
    let queue = Queue::new(10, None, ModelMetrics::only(metrics.clone()));
    let (mut e, mut rx) = lane_entry(4, BatchKind::Pooled, Lane::Bulk);
    e.metadata.deadline = Some(Instant::now() - Duration::from_millis(1));
    queue.append([e]);
    assert!(metrics.render().contains("te_queue_size 1"));
    assert!(queue.try_next_batch(Take::Lane(Lane::Bulk), None).is_none());
    assert!(expired(&mut rx));
    assert!(
        metrics.render().contains("te_queue_size 0"),
        "{}",
        metrics.render()
    );
}
