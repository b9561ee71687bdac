//! A request's `priority` (its lane) and queue deadline, through `Infer` over the fake backend
//! (the harness of `tests.rs`, whose child this is).

use super::*;

#[test]
fn priority_overrides_the_size_rule_within_one_batch() {
    use super::super::Priority::{High, Low};
    // Absent: by size, as `lane_for`.
    assert_eq!(lane_for_request(None, 8, true, 8), Lane::Interactive);
    assert_eq!(lane_for_request(None, 9, true, 8), Lane::Bulk);
    // Low: bulk whatever the size.
    assert_eq!(lane_for_request(Some(Low), 1, true, 8), Lane::Bulk);
    // High: interactive whatever the size, while it fits one interactive batch.
    assert_eq!(
        lane_for_request(Some(High), 1000, true, 8),
        Lane::Interactive
    );
    assert_eq!(lane_for_request(Some(High), 1000, false, 8), Lane::Bulk);
    // The lane turned off by the operator stays off.
    assert_eq!(lane_for_request(Some(High), 1, true, 0), Lane::Bulk);
}

#[test]
fn queue_deadlines_are_whole_milliseconds_from_one_to_an_hour() {
    assert_eq!(parse_max_queue_ms("1"), Ok(Duration::from_millis(1)));
    assert_eq!(
        parse_max_queue_ms(" 3600000 "),
        Ok(Duration::from_secs(3600))
    );
    for bad in [
        "0",
        "3600001",
        "-5",
        "1.5",
        "abc",
        "",
        "99999999999999999999999",
    ] {
        let err = parse_max_queue_ms(bad).unwrap_err();
        assert!(err.contains("3600000"), "{bad}: {err}");
    }
}

impl Harness {
    /// Embeds `texts` as one request with `priority` and, if given, a queue deadline as the
    /// HTTP layer sets it, on its own task.
    fn embed_with(
        &self,
        texts: &[&str],
        priority: Option<Priority>,
        max_queue: Option<Duration>,
    ) -> JoinHandle<Result<usize, InferError>> {
        let infer = self.infer.clone();
        let inputs = texts
            .iter()
            .map(|t| EncodingInput::Single(t.to_string()).into())
            .collect();
        let run = async move {
            let request = InferRequest {
                inputs,
                opts: EncodeOptions::default(),
                batched: true,
                priority,
            };
            let out = infer.embed_pooled(request, true, None).await?;
            Ok(out.len())
        };
        tokio::spawn(async move {
            match max_queue {
                Some(limit) => with_max_queue(limit, run).await,
                None => run.await,
            }
        })
    }

    fn threads(&self) -> Vec<String> {
        self.passes()
            .into_iter()
            .map(|(thread, _)| thread)
            .collect()
    }
}

#[tokio::test]
async fn high_takes_the_interactive_lane_and_low_the_bulk_lane() {
    let h = harness(true, 8);
    // 12 tokens: bulk by size (over 8), interactive when high (one batch holds 16).
    let high = h.embed_with(&["a b", "a b", "a b"], Some(Priority::High), None);
    assert_eq!(high.await.unwrap().unwrap(), 3);
    // 3 tokens: interactive by size, bulk when low.
    let low = h.embed_with(&["hello"], Some(Priority::Low), None);
    assert_eq!(low.await.unwrap().unwrap(), 1);
    // Absent: by size again.
    assert_eq!(
        h.embed_with(&["hello"], None, None).await.unwrap().unwrap(),
        1
    );
    assert_eq!(
        h.threads(),
        ["model-interactive", "model-backend", "model-interactive"]
    );
    assert!(h.packed(Lane::Interactive, 2) && h.packed(Lane::Bulk, 1));
}

#[tokio::test]
async fn high_over_one_batch_runs_in_the_bulk_lane() {
    let h = harness(true, 8);
    // Two 10-token inputs: 20 tokens, over the 16-token batch.
    let texts = ["a b c d e f h i", "a b c d e f h i"];
    let high = h.embed_with(&texts, Some(Priority::High), None);
    assert_eq!(high.await.unwrap().unwrap(), 2);
    assert!(
        h.threads().iter().all(|t| t == "model-backend"),
        "{:?}",
        h.passes()
    );
    assert!(!h.packed(Lane::Interactive, 1));
}

/// A bulk request queued behind a held backfill, with a 1 ms deadline: answered
/// `QueueTimeout` at its deadline while the backfill still runs (the gate is never opened
/// before), counted once, taken out of the queue, and never run.
#[tokio::test]
async fn a_request_past_its_deadline_is_answered_without_running() {
    let h = harness(true, 8);
    let held = hold_two_batches(&h).await;
    let late = h.embed_with(
        &["c a b c d e f", "d a b"],
        Some(Priority::Low),
        Some(Duration::from_millis(1)),
    );
    let answered = tokio::time::timeout(Duration::from_secs(5), late).await;
    let err = answered
        .expect("the deadline was not enforced while no batch was packed")
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, InferError::QueueTimeout(d) if d == Duration::from_millis(1)));
    assert!(err.to_string().contains("1 ms"), "{err}");
    assert_eq!(h.infer.queue.len(), 0, "its sequences are still queued");
    assert!(
        counter(&h, "te_queue_timeout_count 1"),
        "{}",
        h.metrics.render()
    );
    // A request with a deadline it meets is served as usual.
    let patient = h.embed_with(&["hello"], None, Some(Duration::from_secs(60)));
    h.gate.open();
    for task in held {
        assert_eq!(task.await.unwrap().unwrap(), 1);
    }
    assert_eq!(patient.await.unwrap().unwrap(), 1);
    assert_eq!(
        h.passes().len(),
        3,
        "the expired request ran: {:?}",
        h.passes()
    );
    assert!(counter(&h, "te_queue_timeout_count 1"));
}

/// The server's default (`--max-queue-ms`) applies to requests that set none; a request's
/// own deadline overrides it.
#[tokio::test]
async fn the_server_default_applies_unless_the_request_sets_its_own() {
    let mut h = harness(true, 8);
    h.infer.default_max_queue = Some(Duration::from_millis(1));
    let held = hold_two_batches(&h).await;
    let defaulted = h.embed_with(&["c a b c d e f"], None, None);
    let err = defaulted.await.unwrap().unwrap_err();
    assert!(matches!(err, InferError::QueueTimeout(_)), "{err}");
    let overridden = h.embed_with(&["d a b c d e f"], None, Some(Duration::from_secs(60)));
    until("the overriding request is queued", || {
        h.infer.queue.len() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    h.gate.open();
    for task in held {
        assert_eq!(task.await.unwrap().unwrap(), 1);
    }
    assert_eq!(overridden.await.unwrap().unwrap(), 1);
    assert!(
        counter(&h, "te_queue_timeout_count 1"),
        "{}",
        h.metrics.render()
    );
}
