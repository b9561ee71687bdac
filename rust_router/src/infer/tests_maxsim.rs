//! MaxSim batches: documents of several requests share a batch, each scored against its own
//! request's query.

use super::tests::{harness, hold_two_batches, request_of, until, Harness};
use super::*;
use crate::backend::fake::HIDDEN;

/// Scores `documents` against `query` as one request, on its own task.
fn score(h: &Harness, query: Vec<f32>, documents: &[&str]) -> JoinHandle<Vec<f32>> {
    let infer = h.infer.clone();
    let request = request_of(documents);
    tokio::spawn(async move {
        let out = infer.maxsim(request, query.into()).await.unwrap();
        out.into_iter().map(|(score, _)| score).collect()
    })
}

fn query(rows: usize, phase: f32) -> Vec<f32> {
    (0..rows * HIDDEN)
        .map(|i| (i as f32 * 0.37 + phase).sin())
        .collect()
}

#[tokio::test]
async fn documents_of_two_queries_in_one_batch_get_each_their_own_scores() {
    let h = harness(false, 0);
    let held = hold_two_batches(&h).await;
    let (a, b) = (query(2, 0.0), query(3, 1.0));
    let first = score(&h, a.clone(), &["hello", "world"]);
    until("the first is queued", || h.infer.queue.len() == 2).await;
    let second = score(&h, b.clone(), &["hello"]);
    until("both are queued", || h.infer.queue.len() == 3).await;
    h.gate.open();
    for task in held {
        task.await.unwrap().unwrap();
    }
    let (together_a, together_b) = (first.await.unwrap(), second.await.unwrap());
    {
        let seen = h.seen.lock().unwrap();
        let shared = seen.last().unwrap();
        assert_eq!((shared.kind, shared.num_seqs), (BatchKind::MaxSim, 3));
    }
    // Alone, each request scores the same.
    let alone_a = score(&h, a, &["hello", "world"]).await.unwrap();
    let alone_b = score(&h, b, &["hello"]).await.unwrap();
    assert_eq!(together_a, alone_a);
    assert_eq!(together_b, alone_b);
    // The same document scores differently against the other query.
    assert_ne!(together_a[0], together_b[0]);
}
