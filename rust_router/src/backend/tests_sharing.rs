//! Several models' backends on one device ([`super::share`]): their bulk batches take turns,
//! their queries do not wait for them.

use super::fake::{FakeBackend, Gate, HOLD_ID};
use super::share::{DeviceShares, Sharing};
use super::tests::{batch, send, until};
use super::wait::LaneWaits;
use super::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// A model with an interactive lane on the device `cpu`, its bulk batches holding
/// [`HOLD_ID`] waiting at `gate`.
fn model(
    gate: &Arc<Gate>,
    shares: Option<&DeviceShares>,
    index: usize,
) -> (FakeBackend, BackendHandle, BackendThreads) {
    let mut fake = FakeBackend::new(ModelInfo {
        interactive_lane: true,
        ..FakeBackend::info()
    });
    fake.gate = Some(gate.clone());
    let sharing = shares.map(|shares| Sharing {
        shares: shares.clone(),
        model: index,
        weight: 1.0,
    });
    let (handle, _, threads) =
        BackendHandle::spawn_with(fake.clone().into_factory(), LaneWaits::default(), sharing)
            .unwrap();
    (fake, handle, threads)
}

async fn ran_within(rx: &mut oneshot::Receiver<Ran>, wait: Duration) -> Option<Ran> {
    tokio::time::timeout(wait, rx)
        .await
        .ok()
        .map(|ran| ran.expect("the backend thread dropped the batch"))
}

/// Embedder A holds the device with a long bulk batch; reranker B sends a bulk batch and a
/// query. Returns whether B's bulk batch ran before A's ended.
async fn other_bulk_runs_beside(shares: Option<DeviceShares>) -> bool {
    let gate = Arc::new(Gate::default());
    let (_, a, a_threads) = model(&gate, shares.as_ref(), 0);
    let (b_fake, b, b_threads) = model(&Arc::new(Gate::default()), shares.as_ref(), 1);
    let mut held = send(&a, Lane::Bulk, batch(&[&[2, HOLD_ID, 3]])).await;
    until("A's bulk batch holds the device", || gate.held() == 1).await;

    let mut bulk = send(&b, Lane::Bulk, batch(&[&[2, 4, 3]])).await;
    let beside = ran_within(&mut bulk, Duration::from_millis(100))
        .await
        .is_some();
    // B's query runs on its own lane, whatever A's backfill holds.
    let mut query = send(&b, Lane::Interactive, batch(&[&[2, 5, 3]])).await;
    let query = ran_within(&mut query, Duration::from_secs(5)).await;
    assert!(query
        .expect("B's query waited for A's bulk batch")
        .result
        .is_ok());

    gate.open();
    assert!(ran_within(&mut held, Duration::from_secs(5))
        .await
        .is_some());
    if !beside {
        let after = ran_within(&mut bulk, Duration::from_secs(5)).await;
        assert!(after.expect("B's bulk batch never ran").result.is_ok());
    }
    let threads: Vec<String> = b_fake
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.thread.clone())
        .collect();
    assert_eq!(threads.len(), 2, "{threads:?}");
    drop((a, b));
    a_threads.join().unwrap();
    b_threads.join().unwrap();
    beside
}

#[tokio::test]
async fn another_models_bulk_batch_waits_for_the_device_but_its_query_does_not() {
    assert!(!other_bulk_runs_beside(Some(DeviceShares::default())).await);
}

#[tokio::test]
async fn models_that_share_nothing_run_their_bulk_batches_side_by_side() {
    assert!(other_bulk_runs_beside(None).await);
}
