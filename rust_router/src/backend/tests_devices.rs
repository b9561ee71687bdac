//! Tests of several devices behind one handle, with one fake backend per device.

use super::fake::{FakeBackend, Gate, DEVICE_FAIL_ID, HOLD_ID};
use super::tests::{batch, send, threads_that_ran, until};
use super::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// `n` fake devices whose batches holding [`HOLD_ID`] wait at that device's own gate.
fn gated_devices(n: usize, info: ModelInfo) -> (Vec<FakeBackend>, Vec<Arc<Gate>>) {
    let mut fakes = FakeBackend::new(info).on_devices(n);
    let gates: Vec<Arc<Gate>> = (0..n).map(|_| Arc::new(Gate::default())).collect();
    for (fake, gate) in fakes.iter_mut().zip(&gates) {
        fake.gate = Some(gate.clone());
    }
    (fakes, gates)
}

async fn ran(rx: oneshot::Receiver<Ran>) -> Ran {
    tokio::time::timeout(Duration::from_secs(5), rx)
        .await
        .expect("the batch did not run")
        .expect("the backend thread dropped the batch")
}

#[tokio::test]
async fn an_idle_device_gets_the_batch_before_a_busy_ones_prefetch_slot() {
    let (fakes, gates) = gated_devices(2, FakeBackend::info());
    let seen = fakes[0].seen.clone();
    let (handle, info, threads) =
        BackendHandle::spawn(FakeBackend::devices_factory(fakes)).unwrap();
    assert_eq!(handle.num_devices(), 2);
    assert_eq!(info.device_names(), ["fake:0", "fake:1"]);

    let held = send(&handle, Lane::Bulk, batch(&[&[2, HOLD_ID, 3]])).await;
    until("device 0 runs the held batch", || gates[0].held() == 1).await;
    // Device 0's prefetch slot is free, but device 1 is idle: it takes the batch.
    let other = ran(send(&handle, Lane::Bulk, batch(&[&[2, 4, 3]])).await).await;
    assert_eq!(other.device, 1);
    assert!(other.result.is_ok());
    // Both busy with free prefetch slots: the lowest index first, then the other.
    let both = send(&handle, Lane::Bulk, batch(&[&[2, HOLD_ID, 3]])).await;
    until("device 1 runs a held batch", || gates[1].held() == 1).await;
    let a = handle.reserve(Lane::Bulk).await.unwrap();
    let b = handle.reserve(Lane::Bulk).await.unwrap();
    assert_eq!((a.device(), b.device()), (0, 1));
    drop((a, b));
    gates.iter().for_each(|g| g.open());
    assert_eq!(ran(held).await.device, 0);
    assert_eq!(ran(both).await.device, 1);
    assert_eq!(
        threads_that_ran(&seen),
        ["model-backend", "model-backend-1", "model-backend-1"]
    );
    let counts: Vec<u64> = handle.devices().iter().map(|d| d.batches).collect();
    assert_eq!(counts, [1, 2]);
    drop(handle);
    threads.join().unwrap();
}

#[tokio::test]
async fn a_device_error_takes_only_that_device_out_and_it_hands_back_its_next_batch() {
    let (fakes, gates) = gated_devices(2, FakeBackend::info());
    let (handle, _, threads) = BackendHandle::spawn(FakeBackend::devices_factory(fakes)).unwrap();
    let a = send(&handle, Lane::Bulk, batch(&[&[2, HOLD_ID, 3]])).await;
    until("device 0 is busy", || gates[0].held() == 1).await;
    // Device 1 breaks while it runs this one, at its gate.
    let failing = send(
        &handle,
        Lane::Bulk,
        batch(&[&[2, HOLD_ID, DEVICE_FAIL_ID, 3]]),
    )
    .await;
    until("device 1 is busy", || gates[1].held() == 1).await;
    let prefetch_0 = send(&handle, Lane::Bulk, batch(&[&[2, 4, 3]])).await;
    let slot = handle.reserve(Lane::Bulk).await.unwrap();
    assert_eq!(slot.device(), 1);
    let (reply, prefetch_1) = oneshot::channel();
    slot.send(BatchKind::Pooled, batch(&[&[2, 5, 3]]), reply);

    gates[1].open();
    let failed = ran(failing).await;
    assert!(
        matches!(failed.result, Err(BackendError::Device(_))),
        "{:?}",
        failed.result
    );
    // The batch waiting for device 1 comes back unrun, to be sent elsewhere.
    let refused = ran(prefetch_1).await;
    assert_eq!(refused.device, 1);
    assert!(matches!(refused.result, Err(BackendError::Refused)));
    assert_eq!(refused.batch.input_ids, [2, 5, 3]);

    let status = handle.devices();
    assert!(status[0].healthy && !status[1].healthy);
    assert!(status[1].error.as_deref().unwrap().contains("DeviceError"));
    assert_eq!(status[1].failed_batches, 1);

    gates[0].open();
    assert!(ran(a).await.result.is_ok());
    assert!(ran(prefetch_0).await.result.is_ok());
    // Health checks (which run on the bulk threads, so after device 0's held batch) skip the
    // failed device (known) and pass on the other: still serving.
    let health = handle.health().await;
    assert!(health.is_serving());
    assert_eq!(health.failures.len(), 1);
    assert!(health.failures[0].known && health.failures[0].index == 1);
    // From now on every batch goes to device 0.
    for _ in 0..3 {
        let r = ran(send(&handle, Lane::Bulk, batch(&[&[2, 4, 3]])).await).await;
        assert_eq!(r.device, 0);
    }
    drop(handle);
    threads.join().unwrap();
}

#[tokio::test]
async fn with_every_device_failed_reservations_and_health_say_why() {
    let fakes = FakeBackend::new(FakeBackend::info()).on_devices(2);
    let broken: Vec<_> = fakes.iter().map(|f| f.broken.clone()).collect();
    let (handle, _, threads) = BackendHandle::spawn(FakeBackend::devices_factory(fakes)).unwrap();
    broken[1].store(true, std::sync::atomic::Ordering::SeqCst);
    let health = handle.health().await;
    assert!(health.is_serving());
    assert_eq!(health.failures[0].index, 1);
    assert!(!health.failures[0].known, "this check found it");
    assert!(matches!(health.failures[0].error, BackendError::Device(_)));

    broken[0].store(true, std::sync::atomic::Ordering::SeqCst);
    let health = handle.health().await;
    assert!(!health.is_serving());
    let message = health.message();
    assert!(
        message.contains("device 0 (fake:0)") && message.contains("device 1 (fake:1)"),
        "{message}"
    );
    let err = handle.reserve(Lane::Bulk).await.err().unwrap();
    assert!(err.to_string().contains("every device has failed"), "{err}");
    drop(handle);
    threads.join().unwrap();
}

#[tokio::test]
async fn every_device_has_its_own_interactive_lane() {
    let info = ModelInfo {
        interactive_lane: true,
        ..FakeBackend::info()
    };
    let (fakes, gates) = gated_devices(2, info);
    let seen = fakes[0].seen.clone();
    let (handle, _, threads) = BackendHandle::spawn(FakeBackend::devices_factory(fakes)).unwrap();
    assert_eq!(threads.0.len(), 4);
    let held = send(&handle, Lane::Interactive, batch(&[&[2, HOLD_ID, 3]])).await;
    until("device 0's interactive lane is busy", || {
        gates[0].held() == 1
    })
    .await;
    // The next query takes the first free interactive lane: device 1's.
    let query = ran(send(&handle, Lane::Interactive, batch(&[&[2, 4, 3]])).await).await;
    assert_eq!(query.device, 1);
    gates[0].open();
    assert_eq!(ran(held).await.device, 0);
    assert_eq!(
        threads_that_ran(&seen),
        ["model-interactive", "model-interactive-1"]
    );
    drop(handle);
    threads.join().unwrap();
}

#[test]
fn the_backends_must_match_the_devices_info_lists() {
    let mut fakes = FakeBackend::new(FakeBackend::info()).on_devices(2);
    fakes.pop();
    let lone = fakes.pop().unwrap();
    // Info lists two devices, the factory loaded one.
    let err = BackendHandle::spawn(FakeBackend::devices_factory(vec![lone]))
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .contains("loaded 1 device(s) but info() lists 2"),
        "{err}"
    );
}

#[test]
fn one_device_or_none_listed_is_one_executor() {
    let mut info = FakeBackend::info();
    assert_eq!(info.device_names(), ["cpu"]);
    info.devices = Some(vec![]);
    assert_eq!(info.device_names(), ["cpu"]);
    info.devices = Some(vec!["cuda:3".into()]);
    assert_eq!(info.device_names(), ["cuda:3"]);
    info.device = None;
    info.devices = None;
    assert_eq!(info.device_names(), ["default"]);
    let parsed: ModelInfo = serde_json::from_str(
        r#"{"model_type": "embedding", "tokenizer_path": "t", "max_input_length": 8,
            "hidden_size": 4, "devices": ["cpu", "cpu"]}"#,
    )
    .unwrap();
    assert_eq!(parsed.device_names(), ["cpu", "cpu"]);
}
