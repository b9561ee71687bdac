use super::*;
use crate::backend::{BatchKind, Lane};
use crate::metrics::{Metrics, ModelMetrics};
use crate::tokenization::PoolThrottle;
use crate::tokenization::ValidEncoding;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

pub(super) type Rx = oneshot::Receiver<Result<InferResult, QueueError>>;

fn entry(len: usize, kind: BatchKind) -> (Entry, Rx) {
    lane_entry(len, kind, Lane::Bulk)
}

pub(super) fn lane_entry(len: usize, kind: BatchKind, lane: Lane) -> (Entry, Rx) {
    let (tx, rx) = oneshot::channel();
    let entry = Entry {
        encoding: ValidEncoding {
            input_ids: (1..=len as u32).collect(),
            token_type_ids: vec![0; len],
            position_ids: (0..len as u32).collect(),
            pixels: Vec::new(),
            query: None,
        },
        kind,
        lane,
        metadata: Metadata {
            response_tx: tx,
            request_id: 0,
            queued_at: Instant::now(),
            deadline: None,
        },
    };
    (entry, rx)
}

fn fill(state: &mut State, lens: &[usize]) -> Vec<Rx> {
    lens.iter()
        .map(|&len| {
            let (e, rx) = entry(len, BatchKind::Pooled);
            state.append(e);
            rx
        })
        .collect()
}

pub(super) fn seq_lens(b: &NextBatch) -> Vec<u32> {
    b.batch.cu_seqlens.windows(2).map(|w| w[1] - w[0]).collect()
}

fn sizes(state: &mut State) -> Vec<Vec<u32>> {
    std::iter::from_fn(|| state.next_batch(Lane::Bulk))
        .map(|b| seq_lens(&b))
        .collect()
}

/// Appends one entry per `(tokens, lane)`, each with its tokens all equal to its index in
/// `spec`, so a batch's contents name the entries it holds.
fn fill_lanes(state: &mut State, spec: &[(usize, Lane)]) -> Vec<Rx> {
    spec.iter()
        .enumerate()
        .map(|(i, &(len, lane))| {
            let (mut e, rx) = lane_entry(len, BatchKind::Pooled, lane);
            e.encoding.input_ids = vec![i as u32; len];
            state.append(e);
            rx
        })
        .collect()
}

/// The entry indices (see [`fill_lanes`]) in each batch `take` packs, and its lane.
fn drain(state: &mut State, take: Take) -> Vec<(Lane, Vec<u32>)> {
    std::iter::from_fn(|| state.take_batch(take))
        .map(|b| {
            let mut ids = b.batch.input_ids.clone();
            ids.dedup();
            (b.lane, ids)
        })
        .collect()
}

#[test]
fn token_budget_packs_in_order() {
    let mut state = State::new(10, None);
    let _rx = fill(&mut state, &[4, 5, 3, 7, 2]);
    // 4+5 fits, +3 would be 12; 3+7 fits; 2 alone.
    assert_eq!(sizes(&mut state), vec![vec![4, 5], vec![3, 7], vec![2]]);
    assert!(state.is_empty());
}

#[test]
fn packed_arrays_are_consistent() {
    let mut state = State::new(100, None);
    let _rx = fill(&mut state, &[3, 2]);
    let next = state.next_batch(Lane::Bulk).unwrap();
    let b = next.batch;
    assert_eq!(b.input_ids, vec![1, 2, 3, 1, 2]);
    assert_eq!(b.position_ids, vec![0, 1, 2, 0, 1]);
    assert_eq!(b.token_type_ids, vec![0; 5]);
    assert_eq!(b.cu_seqlens, vec![0, 3, 5]);
    assert_eq!(next.metadata.len(), 2);
}

#[test]
fn max_requests_caps_a_batch() {
    let mut state = State::new(1000, Some(2));
    let _rx = fill(&mut state, &[1, 1, 1, 1, 1]);
    assert_eq!(sizes(&mut state), vec![vec![1, 1], vec![1, 1], vec![1]]);
}

#[test]
fn dropped_receivers_are_skipped() {
    let mut state = State::new(1000, None);
    let mut rxs = fill(&mut state, &[1, 2, 3, 4]);
    // The clients of the 2- and 4-token sequences went away.
    drop(rxs.remove(3));
    drop(rxs.remove(1));
    assert_eq!(sizes(&mut state), vec![vec![1, 3]]);
    assert_eq!(state.take_dropped(), 2);
    assert_eq!(state.take_dropped(), 0);
}

#[test]
fn all_dropped_gives_no_batch() {
    let mut state = State::new(1000, None);
    drop(fill(&mut state, &[1, 2]));
    assert!(state.next_batch(Lane::Bulk).is_none());
    assert!(state.is_empty());
}

#[test]
fn kinds_are_never_mixed_and_order_is_kept() {
    let mut state = State::new(1000, None);
    let kinds = [
        BatchKind::Pooled,
        BatchKind::Pooled,
        BatchKind::AllTokens,
        BatchKind::Pooled,
    ];
    let _rx: Vec<_> = kinds
        .iter()
        .map(|&k| {
            let (e, rx) = entry(2, k);
            state.append(e);
            rx
        })
        .collect();
    let got: Vec<(BatchKind, usize)> = std::iter::from_fn(|| state.next_batch(Lane::Bulk))
        .map(|b| (b.kind, b.metadata.len()))
        .collect();
    assert_eq!(
        got,
        vec![
            (BatchKind::Pooled, 2),
            (BatchKind::AllTokens, 1),
            (BatchKind::Pooled, 1)
        ]
    );
}

#[test]
fn request_larger_than_a_batch_is_split_in_order() {
    // One client request of six 4-token inputs against an 8-token budget: three batches,
    // and the sequences come out in input order so the handler can reassemble them.
    let mut state = State::new(8, None);
    let rxs: Vec<_> = (0..6)
        .map(|i| {
            let (mut e, rx) = entry(4, BatchKind::Pooled);
            e.encoding.input_ids = vec![i; 4];
            state.append(e);
            rx
        })
        .collect();
    let batches: Vec<Vec<u32>> = std::iter::from_fn(|| state.next_batch(Lane::Bulk))
        .map(|b| b.batch.input_ids.chunks(4).map(|c| c[0]).collect())
        .collect();
    assert_eq!(batches, vec![vec![0, 1], vec![2, 3], vec![4, 5]]);
    drop(rxs);
}

#[test]
fn sequence_over_the_budget_runs_alone() {
    let mut state = State::new(4, None);
    let _rx = fill(&mut state, &[2, 6, 1]);
    assert_eq!(sizes(&mut state), vec![vec![2], vec![6], vec![1]]);
}

#[tokio::test]
async fn handle_wakes_the_consumer_and_drains_on_close() {
    let queue = Queue::new(100, None, ModelMetrics::only(Arc::new(Metrics::new(16))));
    let consumer = {
        let queue = queue.clone();
        tokio::spawn(async move {
            let mut n = 0;
            while let Some(b) = queue.next_batch(Take::Priority).await {
                n += b.metadata.len();
            }
            n
        })
    };
    let mut rxs = Vec::new();
    for _ in 0..3 {
        let (e, rx) = entry(2, BatchKind::Pooled);
        queue.append([e]);
        rxs.push(rx);
        tokio::task::yield_now().await;
    }
    queue.close();
    assert_eq!(consumer.await.unwrap(), 3);
}

#[test]
fn lanes_are_separated_and_keep_their_order() {
    let mut state = State::new(6, None);
    let (i, b) = (Lane::Interactive, Lane::Bulk);
    let _rx = fill_lanes(
        &mut state,
        &[(4, b), (2, i), (4, b), (3, i), (2, b), (3, i)],
    );
    assert_eq!(
        (state.lane_len(i), state.lane_len(b), state.len()),
        (3, 3, 6)
    );
    // Each lane packs only its own entries, in arrival order, under the usual budget.
    assert_eq!(
        drain(&mut state, Take::Lane(i)),
        vec![(i, vec![1, 3]), (i, vec![5])]
    );
    assert!(!state.has_work(Take::Lane(i)));
    assert!(state.has_work(Take::Lane(b)) && state.has_work(Take::Priority));
    assert_eq!(
        drain(&mut state, Take::Lane(b)),
        vec![(b, vec![0]), (b, vec![2, 4])]
    );
    assert!(state.is_empty());
}

#[test]
fn priority_packs_interactive_first_and_never_mixes_lanes() {
    let mut state = State::new(100, None);
    let (i, b) = (Lane::Interactive, Lane::Bulk);
    let _rx = fill_lanes(&mut state, &[(8, b), (8, b), (2, i), (2, i)]);
    // The queries arrived last but run first, in a batch of their own although the bulk
    // entries would fit beside them.
    assert_eq!(
        drain(&mut state, Take::Priority),
        vec![(i, vec![2, 3]), (b, vec![0, 1])]
    );
}

#[test]
fn priority_falls_through_to_bulk_when_every_query_was_dropped() {
    let mut state = State::new(100, None);
    let (i, b) = (Lane::Interactive, Lane::Bulk);
    let mut rxs = fill_lanes(&mut state, &[(4, b), (2, i), (2, i)]);
    drop(rxs.split_off(1));
    assert_eq!(drain(&mut state, Take::Priority), vec![(b, vec![0])]);
    assert_eq!(state.take_dropped(), 2);
}

#[test]
fn dropped_entries_are_counted_in_either_lane() {
    let mut state = State::new(100, None);
    let (i, b) = (Lane::Interactive, Lane::Bulk);
    let mut rxs = fill_lanes(&mut state, &[(1, i), (1, b), (1, i), (1, b)]);
    drop(rxs.remove(3));
    drop(rxs.remove(0));
    assert_eq!(drain(&mut state, Take::Lane(i)), vec![(i, vec![2])]);
    assert_eq!(state.take_dropped(), 1);
    assert_eq!(drain(&mut state, Take::Lane(b)), vec![(b, vec![1])]);
    assert_eq!(state.take_dropped(), 1);
}

#[tokio::test]
async fn each_lane_wakes_only_its_own_consumer() {
    let metrics = Arc::new(Metrics::new(16));
    let queue = Queue::new(100, None, ModelMetrics::only(metrics.clone()));
    let (e, _rx) = lane_entry(2, BatchKind::Pooled, Lane::Bulk);
    queue.append([e]);
    let interactive = tokio::time::timeout(
        Duration::from_millis(50),
        queue.wait_ready(Take::Lane(Lane::Interactive)),
    );
    assert!(interactive.await.is_err(), "woke for a bulk entry");
    assert!(queue.wait_ready(Take::Lane(Lane::Bulk)).await);
    let next = queue.try_next_batch(Take::Lane(Lane::Bulk), None).unwrap();
    assert_eq!(next.lane, Lane::Bulk);
    let text = metrics.render();
    assert!(
        text.contains("te_batch_next_size_count{lane=\"bulk\"} 1"),
        "{text}"
    );
    assert!(text.contains("te_queue_size 0"), "{text}");
    // Closing wakes every consumer, with nothing left to take.
    queue.close();
    assert!(!queue.wait_ready(Take::Lane(Lane::Interactive)).await);
    assert!(!queue.wait_ready(Take::Priority).await);
}

#[test]
fn paced_bulk_batches_follow_the_measured_speed_and_queries_keep_the_full_budget() {
    let mut state = State::new(5000, None);
    // Unpaced: the token budget alone.
    assert_eq!(state.batch_tokens(Lane::Bulk), 5000);
    state.pace_bulk(Duration::from_millis(100));
    // Before any batch has run: a small first batch.
    assert_eq!(state.batch_tokens(Lane::Bulk), PACED_FIRST_BATCH_TOKENS);
    // 4,000 tokens in 1 s: a 100 ms batch holds 400 tokens.
    state.record_bulk(4000, Duration::from_secs(1));
    assert_eq!(state.batch_tokens(Lane::Bulk), 400);
    assert_eq!(state.batch_tokens(Lane::Interactive), 5000);
    let _rx = fill(&mut state, &[150, 150, 150, 600, 10]);
    let _q = fill_lanes(
        &mut state,
        &[(60, Lane::Interactive), (60, Lane::Interactive)],
    );
    // Two 150-token entries fit in 400; a 600-token sequence still runs, alone.
    assert_eq!(
        sizes(&mut state),
        [vec![150, 150], vec![150], vec![600], vec![10]]
    );
    let queries = state.next_batch(Lane::Interactive).unwrap();
    assert_eq!(seq_lens(&queries), [60, 60]);
    // A slow batch never shrinks the budget below the floor.
    state.record_bulk(10, Duration::from_secs(10));
    assert_eq!(state.batch_tokens(Lane::Bulk), PACED_MIN_BATCH_TOKENS);
    // A faster device (10,000 tokens/s measured) earns bigger batches, up to the budget.
    for _ in 0..20 {
        state.record_bulk(10_000, Duration::from_secs(1));
    }
    assert!((990..=1000).contains(&state.batch_tokens(Lane::Bulk)));
    for _ in 0..20 {
        state.record_bulk(1_000_000, Duration::from_secs(1));
    }
    assert_eq!(state.batch_tokens(Lane::Bulk), 5000);
    // Nonsense measurements are ignored.
    state.record_bulk(0, Duration::from_secs(1));
    state.record_bulk(10, Duration::ZERO);
    assert_eq!(state.batch_tokens(Lane::Bulk), 5000);
}

#[test]
fn paced_priority_batches_top_queries_up_with_bulk_entries_of_their_kind() {
    let mut state = State::new(5000, None);
    state.pace_bulk(Duration::from_millis(100));
    state.record_bulk(4000, Duration::from_secs(1)); // a bulk batch holds 400 tokens
    let (i, b) = (Lane::Interactive, Lane::Bulk);
    let _rx = fill_lanes(
        &mut state,
        &[(150, b), (150, b), (150, b), (60, i), (60, i)],
    );
    let (other_kind, _other) = lane_entry(10, BatchKind::AllTokens, b);
    state.append(other_kind);
    let ids = |next: &NextBatch| {
        let mut ids = next.batch.input_ids.clone();
        ids.dedup();
        (next.lane, ids, next.paced)
    };
    // The queries first, then the bulk entries that fit in 400 tokens (60 + 60 + 150 + 150
    // would be 420).
    let first = state.take_batch(Take::Priority).unwrap();
    assert_eq!(ids(&first), (i, vec![3, 4, 0], true));
    assert_eq!(seq_lens(&first), [60, 60, 150]);
    // A query that comes later takes the next bulk entries along; the entry of another kind
    // waits for a batch of its own.
    let (mut late, _late) = lane_entry(10, BatchKind::Pooled, i);
    late.encoding.input_ids = vec![9; 10];
    state.append(late);
    let second = state.take_batch(Take::Priority).unwrap();
    assert_eq!(ids(&second), (i, vec![9, 1, 2], true));
    let third = state.take_batch(Take::Priority).unwrap();
    assert_eq!(
        (third.lane, third.kind, third.paced),
        (b, BatchKind::AllTokens, true)
    );
    assert!(state.take_batch(Take::Priority).is_none());
    // Unpaced, a priority batch holds queries only.
    let mut unpaced = State::new(5000, None);
    let _rx = fill_lanes(&mut unpaced, &[(150, b), (60, i)]);
    let first = unpaced.take_batch(Take::Priority).unwrap();
    assert_eq!(ids(&first), (i, vec![1], false));
}

/// The tokenizer pool is held back exactly while the backend bounds the bulk lane: a bulk
/// batch cut by its budget turns it on, one that takes everything queued (or the lane's
/// last entries leaving) turns it off; queries never count.
#[test]
fn the_tokenizer_pool_is_throttled_while_bulk_batches_leave_entries_waiting() {
    let queue = Queue::new(10, None, ModelMetrics::only(Arc::new(Metrics::new(16))));
    let throttle = Arc::new(PoolThrottle::for_pool(8));
    let vote = throttle.vote();
    queue.on_bulk_backlog(move |bounded| vote.set_bounded(bounded));
    let append = |len: usize, lane: Lane, request: RequestId| {
        let (mut e, rx) = lane_entry(len, BatchKind::Pooled, lane);
        e.metadata.request_id = request;
        queue.append([e]);
        rx
    };
    let bulk = Take::Lane(Lane::Bulk);
    let _rxs = [append(6, Lane::Bulk, 1), append(6, Lane::Bulk, 2)];
    assert!(!throttle.is_limited(), "no batch packed yet");
    assert_eq!(queue.try_next_batch(bulk, None).unwrap().metadata.len(), 1);
    assert!(
        throttle.is_limited(),
        "the 10-token batch left 6 tokens waiting"
    );
    let _more = append(3, Lane::Bulk, 3);
    assert!(throttle.is_limited(), "appends do not change it");
    assert_eq!(queue.try_next_batch(bulk, None).unwrap().metadata.len(), 2);
    assert!(!throttle.is_limited(), "that batch took everything queued");
    let _rxs = [append(6, Lane::Bulk, 4), append(6, Lane::Bulk, 5)];
    queue.try_next_batch(bulk, None).unwrap();
    assert!(throttle.is_limited());
    queue.remove_request(5);
    assert!(!throttle.is_limited(), "nothing waits any more");
    let _queries = [
        append(6, Lane::Interactive, 6),
        append(6, Lane::Interactive, 7),
    ];
    queue
        .try_next_batch(Take::Lane(Lane::Interactive), None)
        .unwrap();
    assert!(!throttle.is_limited(), "queries left waiting do not count");
}
