//! Several devices behind one queue: a backfill spreads over all of them, results keep their
//! order, and a device failure fails its own batch only.

use super::*;
use crate::backend::fake::{FakeBackend, Gate, SeenBatch};
use crate::http::test_util::{assert_close, expected_embedding};
use crate::metrics::Metrics;
use crate::tokenization::tests::{test_tokenization, test_tokenizer};
use std::collections::BTreeSet;
use std::sync::Mutex;

/// An `Infer` over `n` fake devices, each with its own gate for batches holding "g".
struct Devices {
    infer: Infer,
    seen: Arc<Mutex<Vec<SeenBatch>>>,
    gates: Vec<Arc<Gate>>,
    metrics: Arc<Metrics>,
}

fn devices(n: usize, delay: Duration) -> Devices {
    let mut fake = FakeBackend::new(FakeBackend::info());
    fake.delay = delay;
    let seen = fake.seen.clone();
    let mut fakes = fake.on_devices(n);
    let gates: Vec<Arc<Gate>> = (0..n).map(|_| Arc::default()).collect();
    for (fake, gate) in fakes.iter_mut().zip(&gates) {
        fake.gate = Some(gate.clone());
    }
    let (backend, info, _threads) =
        BackendHandle::spawn(FakeBackend::devices_factory(fakes)).unwrap();
    let metrics = Arc::new(Metrics::new(info.max_input_length));
    // Two 9-token inputs never share a batch. Every request is bulk: one batching task feeds
    // every device.
    let profile = super::tests::profile(&backend, 16, 0, None);
    let (infer, _task) = Infer::new(
        test_tokenization(16, 0),
        backend,
        Arc::new(info),
        &profile,
        64,
        ModelMetrics::only(metrics.clone()),
    );
    Devices {
        infer,
        seen,
        gates,
        metrics,
    }
}

impl Devices {
    /// Embeds `texts` as one request, on its own task: its vectors in input order.
    fn embed(&self, texts: &[&str]) -> JoinHandle<Result<Vec<Vec<f32>>, InferError>> {
        let infer = self.infer.clone();
        let request = super::tests::request_of(texts);
        tokio::spawn(async move {
            let out = infer.embed_pooled(request, true, None).await?;
            Ok(out.into_iter().map(|(v, _)| v).collect())
        })
    }

    /// Batches packed so far, over every device.
    fn packed(&self) -> usize {
        self.metrics
            .render()
            .lines()
            .filter(|l| l.starts_with("te_batch_next_size_count"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
            .sum()
    }

    fn queued(&self, n: usize) -> bool {
        self.metrics
            .render()
            .contains(&format!("te_queue_size {n}\n"))
    }

    fn devices_that_ran(&self) -> BTreeSet<usize> {
        self.seen.lock().unwrap().iter().map(|b| b.device).collect()
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The test tokenizer's id of `word`.
fn id(word: &str) -> u32 {
    test_tokenizer().token_to_id(word).unwrap()
}

#[tokio::test]
async fn a_backfill_spreads_over_every_device_and_keeps_input_order() {
    let d = devices(3, Duration::from_millis(50));
    let words = [
        "a", "b", "c", "d", "e", "f", "hello", "world", "what", "is", "deep", "learning",
    ];
    // Twelve different 9-token inputs: twelve batches, no two alike.
    let texts: Vec<String> = (0..12)
        .map(|i| {
            (0..7)
                .map(|j| words[(i + j) % 12])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let got = d.embed(&refs).await.unwrap().unwrap();
    assert_eq!(got.len(), 12);
    for (text, vector) in texts.iter().zip(&got) {
        let mut ids = vec![id("[CLS]")];
        ids.extend(text.split(' ').map(id));
        ids.push(id("[SEP]"));
        assert_close(vector, &expected_embedding(&ids, None, true));
    }
    // The first three batches went to the three idle devices, and each device ran some.
    assert_eq!(d.devices_that_ran(), BTreeSet::from([0, 1, 2]));
    let counts: Vec<u64> = d.infer.devices().iter().map(|s| s.batches).collect();
    assert_eq!(counts.iter().sum::<u64>(), 12, "{counts:?}");
    let metrics = d.metrics.render();
    for device in 0..3 {
        let line = format!("te_batch_next_size_count{{lane=\"bulk\",device=\"{device}\"}}");
        assert!(metrics.contains(&line), "missing {line} in\n{metrics}");
    }
}

#[tokio::test]
async fn a_device_failure_fails_its_batch_without_rerunning_it_apart_and_the_others_serve() {
    let d = devices(2, Duration::ZERO);
    const HELD: &str = "g a b c d e f";
    // Both devices busy, both prefetch slots taken.
    let a = d.embed(&[HELD]);
    until("device 0 runs a", || d.gates[0].held() == 1).await;
    let b = d.embed(&[HELD]);
    until("device 1 runs b", || d.gates[1].held() == 1).await;
    let c = d.embed(&[HELD]);
    until("c waits for device 0", || d.packed() == 3).await;
    let prefetched = d.embed(&[HELD]);
    until("it waits for device 1", || d.packed() == 4).await;
    // Two requests queued together ("lost" breaks the device that runs it), and a third that
    // does not fit in their batch.
    let breaks = d.embed(&["lost"]);
    until("queued", || d.queued(1)).await;
    let neighbour = d.embed(&["hello"]);
    until("queued", || d.queued(2)).await;
    let later = d.embed(&["a b c d e f a b c d"]);
    until("queued", || d.queued(3)).await;

    // Device 1 finishes, takes the two queued requests as one batch and breaks on it.
    d.gates[1].open();
    for request in [breaks, neighbour] {
        let err = request.await.unwrap().unwrap_err();
        assert!(
            matches!(err, InferError::Backend(BackendError::Device(ref m)) if m.contains("DeviceError")),
            "{err:?}"
        );
    }
    assert!(b.await.unwrap().is_ok());
    assert!(prefetched.await.unwrap().is_ok());
    until("device 1 is out", || !d.infer.devices()[1].healthy).await;

    // Device 0 serves everything else, the request queued behind the failure included.
    d.gates[0].open();
    for request in [a, c, later] {
        assert!(request.await.unwrap().is_ok());
    }
    let after = d.embed(&["hello world"]).await.unwrap().unwrap();
    assert_close(&after[0], &expected_embedding(&[2, 4, 5, 3], None, true));
    assert_eq!(d.seen.lock().unwrap().last().unwrap().device, 0);
    // No input was to blame: the failed batch was not re-run apart.
    let metrics = d.metrics.render();
    assert!(!metrics.contains("te_batch_isolation_pass"), "{metrics}");
    assert!(
        metrics.contains("te_batch_inference_failure{device=\"1\"} 1"),
        "{metrics}"
    );
    let status = d.infer.devices();
    assert!(status[0].healthy && !status[1].healthy);
}
