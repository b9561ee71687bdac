//! Tests of the backend threads, with the fake backend.

use super::fake::{FakeBackend, Gate, SeenBatch, HOLD_ID, POISON_ID};
use super::wait::{LaneWaits, WaitPolicy};
use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

pub(super) fn batch(ids: &[&[u32]]) -> Batch {
    let mut b = Batch::empty();
    for seq in ids {
        let positions: Vec<u32> = (0..seq.len() as u32).collect();
        b.push_sequence(seq, &vec![0; seq.len()], &positions);
    }
    b
}

#[tokio::test]
async fn thread_runs_batches_and_survives_failures() {
    let (handle, info, thread) = BackendHandle::spawn(FakeBackend::factory()).unwrap();
    assert_eq!(info.model_type, ModelType::Embedding);

    let run = |b: Batch| {
        let handle = handle.clone();
        async move {
            let (tx, rx) = oneshot::channel();
            handle
                .reserve(Lane::Bulk)
                .await
                .unwrap()
                .send(BatchKind::Pooled, b, tx);
            rx.await.unwrap().result
        }
    };
    let out = run(batch(&[&[1, 2], &[3]])).await.unwrap();
    assert_eq!((out.matrix.rows, out.matrix.cols), (2, info.hidden_size));
    let err = run(batch(&[&[1, POISON_ID]])).await.unwrap_err();
    assert!(matches!(err, BackendError::Inference(_)), "{err:?}");
    // The failure did not kill the thread.
    assert!(run(batch(&[&[4]])).await.is_ok());
    assert!(handle.health().await.failures.is_empty());

    drop(handle);
    thread.join().unwrap();
}

/// Sends one pooled batch through `lane` and hands back the reply's receiver.
pub(super) async fn send(handle: &BackendHandle, lane: Lane, b: Batch) -> oneshot::Receiver<Ran> {
    let (tx, rx) = oneshot::channel();
    handle
        .reserve(lane)
        .await
        .unwrap()
        .send(BatchKind::Pooled, b, tx);
    rx
}

/// The name of the thread that ran each batch, in order.
pub(super) fn threads_that_ran(seen: &std::sync::Mutex<Vec<SeenBatch>>) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|b| b.thread.clone())
        .collect()
}

pub(super) async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn two_lane_fake(gate: &Arc<Gate>) -> FakeBackend {
    let mut fake = FakeBackend::new(ModelInfo {
        interactive_lane: true,
        ..FakeBackend::info()
    });
    fake.gate = Some(gate.clone());
    fake
}

#[tokio::test]
async fn interactive_lane_runs_while_a_bulk_batch_holds_its_thread() {
    let gate = Arc::new(Gate::default());
    let fake = two_lane_fake(&gate);
    let seen = fake.seen.clone();
    let (handle, _, threads) = BackendHandle::spawn(fake.into_factory()).unwrap();
    assert!(handle.has_interactive_lane());

    let mut bulk = send(&handle, Lane::Bulk, batch(&[&[2, HOLD_ID, 3]])).await;
    until("the bulk batch runs", || gate.held() == 1).await;
    // The interactive slot is free and its thread idle although the bulk one is busy.
    let query = send(&handle, Lane::Interactive, batch(&[&[2, 4, 3]])).await;
    let out = tokio::time::timeout(Duration::from_secs(5), query)
        .await
        .expect("the query waited for the bulk batch")
        .unwrap()
        .result
        .unwrap();
    assert_eq!(out.matrix.rows, 1);
    assert!(bulk.try_recv().is_err(), "the bulk batch ended first");

    gate.open();
    assert!(bulk.await.unwrap().result.is_ok());
    assert_eq!(
        threads_that_ran(&seen),
        ["model-backend", "model-interactive"]
    );
    drop(handle);
    threads.join().unwrap();
}

#[tokio::test]
async fn only_a_spinning_interactive_thread_warms_and_runs_the_hook() {
    for warm_us in [1_000, 0] {
        let fake = two_lane_fake(&Arc::new(Gate::default()));
        let warmed = fake.warmed.clone();
        // The default: the interactive thread spins 25 ms, warming every `warm_us`.
        let waits = LaneWaits {
            interactive: WaitPolicy::spin_micros(25_000).warming_every(warm_us),
            ..LaneWaits::default()
        };
        let hook_runs = Arc::new(AtomicUsize::new(0));
        let runs = hook_runs.clone();
        waits.warm_hook.set(move || {
            runs.fetch_add(1, Ordering::Relaxed);
        });
        let (handle, _, threads) =
            BackendHandle::spawn_with(fake.into_factory(), waits, None).unwrap();
        for lane in Lane::PRIORITY {
            let rx = send(&handle, lane, batch(&[&[2, 4, 3]])).await;
            assert!(rx.await.unwrap().result.is_ok());
        }
        if warm_us > 0 {
            until("the interactive thread warms", || {
                warmed.lock().unwrap().len() >= 3
            })
            .await;
            assert!(hook_runs.load(Ordering::Relaxed) >= 3);
        } else {
            // Past the spin window: nothing warmed in it.
            tokio::time::sleep(Duration::from_millis(40)).await;
            assert_eq!(hook_runs.load(Ordering::Relaxed), 0);
            assert!(warmed.lock().unwrap().is_empty());
        }
        let threads_seen = warmed.lock().unwrap().clone();
        assert!(
            threads_seen.iter().all(|t| t == "model-interactive"),
            "{threads_seen:?}"
        );
        drop(handle);
        threads.join().unwrap();
    }
}

#[tokio::test]
async fn no_warming_while_the_bulk_thread_runs_a_batch() {
    let gate = Arc::new(Gate::default());
    let fake = two_lane_fake(&gate);
    let warmed = fake.warmed.clone();
    let waits = LaneWaits {
        bulk: WaitPolicy::spin_micros(200_000),
        interactive: WaitPolicy::spin_micros(200_000).warming_every(500),
        ..LaneWaits::default()
    };
    let (handle, _, threads) = BackendHandle::spawn_with(fake.into_factory(), waits, None).unwrap();
    let bulk = send(&handle, Lane::Bulk, batch(&[&[2, HOLD_ID, 3]])).await;
    until("the bulk batch runs", || gate.held() == 1).await;
    let query = send(&handle, Lane::Interactive, batch(&[&[2, 4, 3]])).await;
    assert!(query.await.unwrap().result.is_ok());
    // The interactive thread spins (200 ms) while the bulk one is busy: it does not warm.
    warmed.lock().unwrap().clear();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(warmed.lock().unwrap().is_empty());
    gate.open();
    assert!(bulk.await.unwrap().result.is_ok());
    until("the interactive thread warms", || {
        !warmed.lock().unwrap().is_empty()
    })
    .await;
    drop(handle);
    threads.join().unwrap();
}

#[tokio::test]
async fn without_an_interactive_lane_both_lanes_share_one_thread() {
    let fake = FakeBackend::new(FakeBackend::info());
    let seen = fake.seen.clone();
    let (handle, info, threads) = BackendHandle::spawn(fake.into_factory()).unwrap();
    assert!(!info.interactive_lane && !handle.has_interactive_lane());
    for lane in Lane::PRIORITY {
        let rx = send(&handle, lane, batch(&[&[2, 4, 3]])).await;
        assert!(rx.await.unwrap().result.is_ok());
    }
    assert_eq!(threads_that_ran(&seen), ["model-backend", "model-backend"]);
    assert_eq!(threads.0.len(), 1);
    drop(handle);
    threads.join().unwrap();
}

#[test]
fn load_failure_is_reported() {
    let factory: BackendFactory = Box::new(|| Err(BackendError::Start("no weights".into())));
    let err = BackendHandle::spawn(factory).err().unwrap();
    assert_eq!(err, BackendError::Start("no weights".into()));
}

#[test]
fn info_validation() {
    let mut info = FakeBackend::info();
    assert!(info.validate().is_ok());
    info.model_type = ModelType::Reranker;
    info.num_labels = 3;
    assert!(info.validate().is_err());
    info.num_labels = 1;
    assert!(info.validate().is_ok());
    assert_eq!(info.activation(), ScoreActivation::Sigmoid);
    assert_eq!(info.label(0), "LABEL_0");
}

#[test]
fn select_repacks_the_chosen_sequences() {
    let b = batch(&[&[1, 2], &[3], &[4, 5, 6]]);
    let s = b.select(&[0, 2]);
    assert_eq!(s.input_ids, [1, 2, 4, 5, 6]);
    assert_eq!(s.cu_seqlens, [0, 2, 5]);
    assert_eq!(s.position_ids.len(), 5);
    assert_eq!(b.select(&[1]).cu_seqlens, [0, 1]);
}

#[test]
fn select_keeps_each_image_with_its_pixels() {
    let mut b = Batch::empty();
    for image in 0..3u32 {
        let encoding = crate::tokenization::ValidEncoding::image(2, vec![image as f32; 4]);
        b.push_sequence(
            &encoding.input_ids,
            &encoding.token_type_ids,
            &encoding.position_ids,
        );
        b.push_pixels(&encoding.pixels);
    }
    assert_eq!((b.num_seqs(), b.num_tokens(), b.pixels.len()), (3, 6, 12));
    let s = b.select(&[0, 2]);
    assert_eq!(s.pixels, [0.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0]);
    assert_eq!(s.cu_seqlens, [0, 2, 4]);
    // The fake runs an image batch to a row per image.
    let mut fake = FakeBackend::new(FakeBackend::info());
    let m = fake.forward(BatchKind::Images, &s).unwrap();
    assert_eq!(m.rows, 2);
    assert_eq!((m.data[0], m.data[m.cols]), (0.0, 2.0));
}

#[test]
fn the_contract_lists_every_field_and_only_three_are_required() {
    let json = serde_json::to_value(FakeBackend::info()).unwrap();
    let keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut fields = ModelInfo::FIELDS.to_vec();
    fields.sort();
    let mut keys = keys.clone();
    keys.sort();
    assert_eq!(keys, fields);
    let minimal: ModelInfo = serde_json::from_str(
        r#"{"model_type": "embedding", "tokenizer_path": "t.json", "max_input_length": 8, "hidden_size": 4}"#,
    )
    .unwrap();
    assert!(minimal.validate().is_ok());
    assert_eq!(minimal.position_offset, 0);
    let missing = serde_json::from_str::<ModelInfo>(r#"{"model_type": "embedding"}"#);
    assert!(missing.unwrap_err().to_string().contains("tokenizer_path"));
}

/// One backend thread over the fake, whose batches holding [`HOLD_ID`] wait at the gate.
fn one_gated_thread() -> (BackendHandle, Arc<Gate>, BackendThreads) {
    let gate = Arc::new(Gate::default());
    let mut fake = FakeBackend::new(FakeBackend::info());
    fake.gate = Some(gate.clone());
    let (handle, _info, thread) = BackendHandle::spawn(fake.into_factory()).unwrap();
    (handle, gate, thread)
}

/// A batch sent with `send` frees its thread's slot as it starts (the next batch can be
/// packed meanwhile); one sent with `send_exclusive` keeps it until the batch has run.
#[tokio::test]
async fn an_exclusive_batch_keeps_its_slot_until_it_has_run() {
    let (handle, gate, _thread) = one_gated_thread();
    let (tx, prefetched) = oneshot::channel();
    let slot = handle.reserve(Lane::Bulk).await.unwrap();
    slot.send(BatchKind::Pooled, batch(&[&[HOLD_ID]]), tx);
    until("the batch runs", || gate.held() == 1).await;
    let free = handle.try_reserve(Lane::Bulk);
    assert!(
        free.is_some(),
        "the slot stayed taken while a plain batch ran"
    );
    drop(free);
    gate.open();
    assert!(prefetched.await.unwrap().result.is_ok());

    let (handle, gate, _thread) = one_gated_thread();
    let (tx, exclusive) = oneshot::channel();
    let slot = handle.reserve(Lane::Bulk).await.unwrap();
    slot.send_exclusive(BatchKind::Pooled, batch(&[&[HOLD_ID]]), tx);
    until("the batch runs", || gate.held() == 1).await;
    assert!(
        handle.try_reserve(Lane::Bulk).is_none(),
        "the slot freed while an exclusive batch ran"
    );
    gate.open();
    assert!(exclusive.await.unwrap().result.is_ok());
    // Freed once the reply is out.
    until("the slot frees", || {
        handle.try_reserve(Lane::Bulk).is_some()
    })
    .await;
}

#[test]
fn a_request_s_documents_share_their_query_and_select_keeps_each_its_own() {
    let mut b = batch(&[&[1, 2], &[3], &[4, 5]]);
    b.query_spans.clear();
    let (q1, q2) = ([1.0, 2.0], [3.0, 4.0, 5.0, 6.0]);
    for query in [&q1[..], &q1[..], &q2[..]] {
        b.push_query(query);
    }
    // The first query is stored once for its two documents.
    assert_eq!(b.queries, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(b.query_spans, vec![0, 2, 0, 2, 2, 6]);
    let picked = b.select(&[0, 2]);
    assert_eq!(picked.query_of(0), &q1);
    assert_eq!(picked.query_of(1), &q2);
    assert_eq!(picked.input_ids, vec![1, 2, 4, 5]);
    assert!(batch(&[&[1]]).select(&[0]).query_spans.is_empty());
}
