//! Tests of a bulk thread on a backend that pipelines (a GPU runtime): batch k + 1 is
//! launched before batch k is read back, and a failure still reaches the batch it belongs to.

use super::fake::{self, FakeBackend, Gate, DEVICE_FAIL_ID, HOLD_ID, POISON_ID};
use super::tests::{batch, send, until};
use super::*;
use std::sync::Arc;

/// A pipelining fake whose batches holding [`HOLD_ID`] wait at `gate` while launched.
fn pipelined(gate: &Arc<Gate>) -> FakeBackend {
    FakeBackend {
        gate: Some(gate.clone()),
        pipelined: true,
        ..FakeBackend::new(FakeBackend::info())
    }
}

fn pooled_rows(ids: &[u32]) -> Vec<f32> {
    let positions: Vec<u32> = (0..ids.len() as u32).collect();
    fake::pooled(ids, &positions)
}

#[tokio::test]
async fn the_next_batch_is_launched_before_the_last_one_is_read_back() {
    let gate = Arc::new(Gate::default());
    let fake = pipelined(&gate);
    let finished = fake.finished.clone();
    let (handle, _, threads) = BackendHandle::spawn(fake.into_factory()).unwrap();
    let first = send(&handle, Lane::Bulk, batch(&[&[1, HOLD_ID]])).await;
    until("the first batch is launching", || gate.held() == 1).await;
    // Its slot freed as it started: the next batch waits in the thread's channel.
    let second = send(&handle, Lane::Bulk, batch(&[&[2, 3]])).await;
    gate.open();
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(
        first.result.unwrap().matrix.data,
        pooled_rows(&[1, HOLD_ID])
    );
    assert_eq!(second.result.unwrap().matrix.data, pooled_rows(&[2, 3]));
    // The first was read back once both had been launched; the second at once after, with
    // nothing left to launch.
    assert_eq!(
        *finished.lock().unwrap(),
        vec![(Some(HOLD_ID), 2), (Some(3), 2)]
    );
    drop(handle);
    threads.join().unwrap();
}

#[tokio::test]
async fn a_lone_batch_is_read_back_without_waiting_for_another() {
    let gate = Arc::new(Gate::default());
    gate.open();
    let fake = pipelined(&gate);
    let finished = fake.finished.clone();
    let (handle, _, threads) = BackendHandle::spawn(fake.into_factory()).unwrap();
    let ran = send(&handle, Lane::Bulk, batch(&[&[4, 5]])).await;
    let ran = tokio::time::timeout(std::time::Duration::from_secs(5), ran)
        .await
        .expect("a lone batch is answered")
        .unwrap();
    assert_eq!(ran.result.unwrap().matrix.data, pooled_rows(&[4, 5]));
    assert_eq!(*finished.lock().unwrap(), vec![(Some(5), 1)]);
    drop(handle);
    threads.join().unwrap();
}

#[tokio::test]
async fn bad_input_fails_only_its_own_batch() {
    let gate = Arc::new(Gate::default());
    let (handle, _, threads) = BackendHandle::spawn(pipelined(&gate).into_factory()).unwrap();
    let first = send(&handle, Lane::Bulk, batch(&[&[1, HOLD_ID]])).await;
    until("the first batch is launching", || gate.held() == 1).await;
    let poisoned = send(&handle, Lane::Bulk, batch(&[&[2, POISON_ID]])).await;
    gate.open();
    assert!(first.await.unwrap().result.is_ok());
    let err = poisoned.await.unwrap().result.unwrap_err();
    assert!(matches!(err, BackendError::Inference(_)), "{err:?}");
    // The thread goes on.
    let later = send(&handle, Lane::Bulk, batch(&[&[6]])).await;
    assert!(later.await.unwrap().result.is_ok());
    drop(handle);
    threads.join().unwrap();
}

#[tokio::test]
async fn a_device_lost_while_the_next_batch_launches_fails_the_batch_in_flight_too() {
    // A lost GPU fails every later CUDA call, the read-back of a batch that had already run
    // included: both batches report the device error (none is silently dropped), and the
    // device is out of service for the next one.
    let gate = Arc::new(Gate::default());
    let (handle, _, threads) = BackendHandle::spawn(pipelined(&gate).into_factory()).unwrap();
    let first = send(&handle, Lane::Bulk, batch(&[&[1, HOLD_ID]])).await;
    until("the first batch is launching", || gate.held() == 1).await;
    let breaking = send(&handle, Lane::Bulk, batch(&[&[2, DEVICE_FAIL_ID]])).await;
    gate.open();
    for ran in [first.await.unwrap(), breaking.await.unwrap()] {
        let err = ran.result.unwrap_err();
        assert!(matches!(err, BackendError::Device(_)), "{err:?}");
    }
    let health = handle.health().await;
    assert_eq!(health.failures.len(), 1, "{health:?}");
    drop(handle);
    threads.join().unwrap();
}
