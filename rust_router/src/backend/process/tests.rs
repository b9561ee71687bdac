//! The protocol end to end within one process: a worker lane served on a thread over a real
//! socket pair and shared-memory region, the router's [`WorkerLane`] on the other side.

use super::client::{Worker, WorkerLane};
use super::region::{Layout, Region};
use super::serve::serve_lane;
use super::DeviceWorkers;
use crate::backend::fake::{FakeBackend, DEVICE_FAIL_ID, HIDDEN, POISON_ID};
use crate::backend::{Backend, BackendError, Batch, BatchKind, ModelInfo};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;

struct NamedWorker;

impl Worker for NamedWorker {
    fn device(&self) -> &str {
        "fake:1"
    }
    fn why_stopped(&self) -> String {
        "it was killed by signal 9".into()
    }
}

/// A lane whose worker side serves `fake` on a thread; the thread ends when the lane is dropped.
fn lane_over(fake: FakeBackend, layout: Layout) -> (WorkerLane, JoinHandle<std::io::Result<()>>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let (region, fd) = Region::create("test-lane", layout).unwrap();
    let worker_region = Region::open(fd, layout).unwrap();
    let pipelines = fake.pipelined;
    let serving = std::thread::spawn(move || {
        serve_lane(Box::new(fake), theirs, worker_region, "test-worker-reply")
    });
    let lane = WorkerLane::new(ours, region, Arc::new(NamedWorker), pipelines);
    (lane, serving)
}

fn batch(seqs: &[&[u32]]) -> Batch {
    let mut batch = Batch::empty();
    for ids in seqs {
        let positions: Vec<u32> = (0..ids.len() as u32).collect();
        batch.push_sequence(ids, &vec![0; ids.len()], &positions);
    }
    batch
}

fn fake(info: ModelInfo, pipelined: bool) -> FakeBackend {
    FakeBackend {
        pipelined,
        ..FakeBackend::new(info)
    }
}

const ROOMY: Layout = Layout {
    input_slot: 1 << 16,
    output_slot: 1 << 16,
};

/// Slots too small for any batch: every payload travels on the socket.
const CRAMPED: Layout = Layout {
    input_slot: 8,
    output_slot: 8,
};

#[test]
fn every_kind_comes_back_as_the_backend_returns_it_through_slots_or_the_socket() {
    let input = batch(&[&[101, 7, 8, 102], &[101, 9, 102], &[101, 5, 6, 7, 8, 102]]);
    for layout in [ROOMY, CRAMPED] {
        for (info, kinds) in [
            (
                FakeBackend::info(),
                vec![BatchKind::Pooled, BatchKind::AllTokens],
            ),
            (FakeBackend::classifier_info(3), vec![BatchKind::Predict]),
            (FakeBackend::sparse_info(), vec![BatchKind::Sparse]),
        ] {
            let mut direct = FakeBackend::new(info.clone());
            let (mut lane, _serving) = lane_over(fake(info, false), layout);
            for kind in kinds {
                let want = direct.forward(kind, &input).unwrap();
                assert_eq!(
                    lane.forward(kind, &input).unwrap(),
                    want,
                    "{kind:?} {layout:?}"
                );
            }
        }
    }
}

/// Three images of 2x2x3 pixels, each its own values; 4 placeholder tokens an image.
fn image_batch() -> Batch {
    let mut batch = Batch::empty();
    for image in 0..3u32 {
        batch.push_sequence(&[0; 4], &[0; 4], &[0, 1, 2, 3]);
        batch
            .pixels
            .extend((0..12).map(|i| image as f32 + i as f32 / 16.0 - 0.5));
    }
    batch
}

#[test]
fn image_batches_carry_their_pixels_through_slots_or_the_socket() {
    let input = image_batch();
    for layout in [ROOMY, CRAMPED] {
        let mut direct = FakeBackend::new(FakeBackend::info());
        let (mut lane, _serving) = lane_over(fake(FakeBackend::info(), false), layout);
        let want = direct.forward(BatchKind::Images, &input).unwrap();
        assert_eq!(want.rows, 3);
        assert_ne!(want.data[..4], want.data[want.cols..want.cols + 4]);
        assert_eq!(
            lane.forward(BatchKind::Images, &input).unwrap(),
            want,
            "{layout:?}"
        );
    }
}

#[test]
fn maxsim_batches_cross_with_their_queries_through_slots_or_the_socket() {
    let mut input = Batch::empty();
    let query_a: Vec<f32> = (0..2 * HIDDEN).map(|i| (i as f32 * 0.3).sin()).collect();
    let query_b: Vec<f32> = (0..3 * HIDDEN).map(|i| (i as f32 * 0.7).cos()).collect();
    for (ids, query) in [
        (&[101, 7, 8, 102][..], &query_a),
        (&[101, 9, 102][..], &query_a),
        (&[101, 5, 6, 102][..], &query_b),
    ] {
        let positions: Vec<u32> = (0..ids.len() as u32).collect();
        input.push_sequence(ids, &vec![0; ids.len()], &positions);
        input.push_query(query);
    }
    for layout in [ROOMY, CRAMPED] {
        let mut direct = FakeBackend::new(FakeBackend::info());
        let (mut lane, _serving) = lane_over(fake(FakeBackend::info(), false), layout);
        let want = direct.forward(BatchKind::MaxSim, &input).unwrap();
        assert_eq!((want.rows, want.cols), (3, 1));
        // Each document against its own query: the third's score is not the first query's.
        assert_ne!(want.data[2], want.data[0]);
        assert_eq!(
            lane.forward(BatchKind::MaxSim, &input).unwrap(),
            want,
            "{layout:?}"
        );
    }
}

#[test]
fn a_pipelined_lane_launches_the_next_batch_before_the_last_is_read() {
    let worker_side = FakeBackend {
        ready_after_launches: 2,
        ..fake(FakeBackend::info(), true)
    };
    let launched = worker_side.seen.clone();
    let finished = worker_side.finished.clone();
    let (mut lane, _serving) = lane_over(worker_side, ROOMY);
    assert!(lane.pipelines());
    let (a, b, c) = (
        batch(&[&[1, 11, 2]]),
        batch(&[&[1, 12, 2]]),
        batch(&[&[1, 13, 2]]),
    );
    let mut direct = FakeBackend::new(FakeBackend::info());
    let first = lane.launch(BatchKind::Pooled, &a).unwrap();
    let second = lane.launch(BatchKind::Pooled, &b).unwrap();
    assert_eq!(
        first.finish().unwrap(),
        direct.forward(BatchKind::Pooled, &a).unwrap()
    );
    // Slot 0 again: the first batch was read back, so its slots are free.
    let third = lane.launch(BatchKind::Pooled, &c).unwrap();
    assert_eq!(
        second.finish().unwrap(),
        direct.forward(BatchKind::Pooled, &b).unwrap()
    );
    assert_eq!(
        third.finish().unwrap(),
        direct.forward(BatchKind::Pooled, &c).unwrap()
    );
    assert_eq!(launched.lock().unwrap().len(), 3);
    // The worker launched the second batch before it read the first one back.
    let first_read = finished.lock().unwrap()[0];
    assert_eq!(first_read.0, Some(11));
    assert!(first_read.1 >= 2, "{first_read:?}");
}

#[test]
fn backend_errors_cross_unchanged_and_the_lane_keeps_serving() {
    let (mut lane, _serving) = lane_over(fake(FakeBackend::info(), true), ROOMY);
    let poisoned = lane.forward(BatchKind::Pooled, &batch(&[&[1, POISON_ID, 2]]));
    assert!(matches!(poisoned, Err(BackendError::Inference(m)) if m.contains("poison")));
    lane.health().unwrap();
    let ok = lane.forward(BatchKind::Pooled, &batch(&[&[1, 5, 2]]));
    assert!(ok.is_ok());
    let lost = lane.launch(BatchKind::Pooled, &batch(&[&[1, DEVICE_FAIL_ID, 2]]));
    let lost = lost.and_then(|launched| launched.finish());
    assert!(matches!(lost, Err(BackendError::Device(m)) if m.contains("was lost")));
    assert!(matches!(lane.health(), Err(BackendError::Device(_))));
}

#[test]
fn warm_ups_reach_the_worker_and_are_not_answered() {
    let worker_side = fake(FakeBackend::info(), false);
    let warmed = worker_side.warmed.clone();
    let (mut lane, _serving) = lane_over(worker_side, ROOMY);
    lane.warm();
    lane.warm();
    // The next call's reply is its own, not a warm-up's.
    lane.health().unwrap();
    assert_eq!(warmed.lock().unwrap().len(), 2);
}

#[test]
fn a_worker_that_goes_away_fails_its_device_with_the_reason_and_at_once_after() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let (region, _fd) = Region::create("test-lane", ROOMY).unwrap();
    let mut lane = WorkerLane::new(ours, region, Arc::new(NamedWorker), true);
    let launched = lane
        .launch(BatchKind::Pooled, &batch(&[&[1, 5, 2]]))
        .unwrap();
    drop(theirs); // the worker process died with the batch
    let err = launched.finish().unwrap_err();
    assert_eq!(
        err,
        BackendError::Device(
            "the worker process of fake:1 stopped: it was killed by signal 9".into()
        )
    );
    assert_eq!(lane.health().unwrap_err(), err);
    assert_eq!(
        lane.forward(BatchKind::Pooled, &batch(&[&[1, 2]]))
            .unwrap_err(),
        err
    );
}

#[test]
fn the_worker_side_ends_when_the_router_closes_the_lane() {
    let (lane, serving) = lane_over(fake(FakeBackend::info(), true), ROOMY);
    drop(lane);
    serving.join().unwrap().unwrap();
}

#[test]
fn auto_uses_processes_for_several_gpus_only() {
    let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let two_gpus = names(&["cuda:0", "cuda:1"]);
    assert!(DeviceWorkers::Auto.uses_processes(&two_gpus));
    assert!(!DeviceWorkers::Auto.uses_processes(&names(&["cuda:0"])));
    assert!(!DeviceWorkers::Auto.uses_processes(&names(&["cpu", "cpu"])));
    assert!(!DeviceWorkers::Threads.uses_processes(&two_gpus));
    assert!(DeviceWorkers::Processes.uses_processes(&names(&["cpu"])));
}
