use super::*;
use crate::backend::fake::{FakeBackend, Gate, SeenBatch, HOLD_ID};
use crate::metrics::Metrics;
use crate::queue::Take;
use crate::schedule::{BackendFacts, PolicyFlags};
use crate::tokenization::tests::test_tokenization;
use std::sync::Mutex;

#[test]
fn lane_is_chosen_by_the_whole_request_and_zero_turns_it_off() {
    assert_eq!(lane_for(1, 256), Lane::Interactive);
    assert_eq!(lane_for(256, 256), Lane::Interactive);
    assert_eq!(lane_for(257, 256), Lane::Bulk);
    assert_eq!(lane_for(1, 0), Lane::Bulk);
}

/// An `Infer` over the fake backend, whose batches holding [`HOLD_ID`] ("g") wait at
/// `gate`.
pub(super) struct Harness {
    pub(super) infer: Infer,
    pub(super) seen: Arc<Mutex<Vec<SeenBatch>>>,
    pub(super) gate: Arc<Gate>,
    metrics: Arc<Metrics>,
}

/// The profile of an `Infer` over `backend`: the budget, the lane's limit and the bulk pacing
/// as given, the other flags' defaults.
pub(super) fn profile(
    backend: &BackendHandle,
    max_batch_tokens: usize,
    interactive_max_tokens: usize,
    max_bulk_batch_time: Option<Duration>,
) -> ServingProfile {
    let flags = PolicyFlags {
        max_batch_tokens,
        interactive_max_tokens,
        max_bulk_batch_ms: max_bulk_batch_time.map_or(0, |t| t.as_millis() as u64),
        ..crate::schedule::tests::defaults()
    };
    ServingProfile::resolve(&flags, BackendFacts::of(backend))
}

pub(super) fn harness(interactive_lane: bool, interactive_max_tokens: usize) -> Harness {
    paced_harness(interactive_lane, interactive_max_tokens, None)
}

/// [`harness`] with `max_bulk_batch_time` (bulk batches bounded by time where one thread runs
/// both lanes).
fn paced_harness(
    interactive_lane: bool,
    interactive_max_tokens: usize,
    max_bulk_batch_time: Option<Duration>,
) -> Harness {
    let gate = Arc::new(Gate::default());
    let mut fake = FakeBackend::new(ModelInfo {
        interactive_lane,
        ..FakeBackend::info()
    });
    fake.gate = Some(gate.clone());
    let seen = fake.seen.clone();
    let (backend, info, _threads) = BackendHandle::spawn(fake.into_factory()).unwrap();
    let metrics = Arc::new(Metrics::new(info.max_input_length));
    // Two 9-token requests never share a batch.
    let profile = profile(&backend, 16, interactive_max_tokens, max_bulk_batch_time);
    let (infer, _task) = Infer::new(
        test_tokenization(16, 0),
        backend,
        Arc::new(info),
        &profile,
        64,
        ModelMetrics::only(metrics.clone()),
    );
    Harness {
        infer,
        seen,
        gate,
        metrics,
    }
}

/// `texts` as one batched request with the default options.
pub(super) fn request_of(texts: &[&str]) -> InferRequest {
    InferRequest {
        inputs: texts
            .iter()
            .map(|t| EncodingInput::Single(t.to_string()).into())
            .collect(),
        opts: EncodeOptions::default(),
        batched: true,
        priority: None,
    }
}

impl Harness {
    /// Embeds `texts` as one request, on its own task.
    fn embed(&self, texts: &[&str]) -> JoinHandle<Result<usize, InferError>> {
        let infer = self.infer.clone();
        let request = request_of(texts);
        tokio::spawn(async move {
            let out = infer.embed_pooled(request, true, None).await?;
            Ok(out.len())
        })
    }

    /// (thread, first word's id) of every forward pass so far, in the order they began.
    fn passes(&self) -> Vec<(String, Option<u32>)> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .map(|b| (b.thread.clone(), b.first_id))
            .collect()
    }

    fn packed(&self, lane: Lane, n: usize) -> bool {
        let line = format!(
            "te_batch_next_size_count{{lane=\"{}\"}} {n}\n",
            lane.as_str()
        );
        self.metrics.render().contains(&line)
    }
}

pub(super) async fn until(what: &str, done: impl FnMut() -> bool) {
    until_within(what, Duration::from_secs(5), done).await
}

async fn until_within(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

// In the test tokenizer every word is one token and `[CLS]`/`[SEP]` add two: "g a b c d e
// f" is 9 tokens (bulk under an 8-token limit, held at the gate), "hello" is 3.
const HELD_BULK: &str = "g a b c d e f";

#[tokio::test]
async fn a_query_finishes_while_a_bulk_batch_still_runs() {
    let h = harness(true, 8);
    let bulk = h.embed(&[HELD_BULK]);
    until("the bulk batch runs", || h.gate.held() == 1).await;
    let query = h.embed(&["hello"]);
    let answered = tokio::time::timeout(Duration::from_secs(5), query).await;
    let answered = answered.expect("the query waited for the bulk batch");
    assert_eq!(answered.unwrap().unwrap(), 1);
    assert!(!bulk.is_finished(), "the bulk batch ended before the query");

    h.gate.open();
    assert_eq!(bulk.await.unwrap().unwrap(), 1);
    assert_eq!(
        h.passes(),
        [
            ("model-backend".into(), Some(HOLD_ID)),
            ("model-interactive".into(), Some(4)),
        ]
    );
    assert!(h.packed(Lane::Interactive, 1) && h.packed(Lane::Bulk, 1));
}

#[tokio::test]
async fn the_lane_counts_every_input_of_a_request() {
    let h = harness(true, 8);
    // 3 + 3 tokens: a query. Three 4-token inputs: 12 tokens, bulk although each is small.
    assert_eq!(h.embed(&["hello", "world"]).await.unwrap().unwrap(), 2);
    assert_eq!(h.embed(&["a b", "a b", "a b"]).await.unwrap().unwrap(), 3);
    assert_eq!(
        h.passes(),
        [
            ("model-interactive".into(), Some(4)),
            ("model-backend".into(), Some(12)),
        ]
    );
}

#[tokio::test]
async fn one_thread_serves_both_lanes_queries_first() {
    let h = harness(false, 8);
    assert_eq!(
        profile(&h.infer.backend, 16, 8, None).batching.takes(),
        [Take::Priority],
        "one backend thread, one batching task"
    );
    // A runs (held); B is packed into the prefetch slot; C, then the query, wait.
    let a = h.embed(&[HELD_BULK]);
    until("A runs", || h.gate.held() == 1).await;
    let b = h.embed(&["b a b c d e f"]);
    until("B is prefetched", || h.packed(Lane::Bulk, 2)).await;
    let c = h.embed(&["c a b c d e f"]);
    until("C is queued", || h.infer.queue.len() == 1).await;
    let query = h.embed(&["hello"]);
    until("the query is queued", || h.infer.queue.len() == 2).await;

    h.gate.open();
    for task in [a, b, c, query] {
        assert_eq!(task.await.unwrap().unwrap(), 1);
    }
    let one_thread = |id| ("model-backend".to_string(), Some(id));
    // The query overtook C, which was queued before it, but not what was already packed.
    assert_eq!(
        h.passes(),
        [
            one_thread(HOLD_ID),
            one_thread(13),
            one_thread(4),
            one_thread(14)
        ]
    );
}

/// With paced bulk batches (one thread for both lanes, on a CPU) no bulk batch is packed
/// while one runs, so a query queued meanwhile runs right after the bulk batch in progress:
/// it waits for the rest of one bulk batch, not for a prefetched one as well. Its batch
/// takes the waiting bulk entries along, behind it, within the bulk budget.
#[tokio::test]
async fn a_query_waits_for_no_prefetched_bulk_batch_when_bulk_batches_are_paced() {
    let h = paced_harness(false, 8, Some(Duration::from_millis(40)));
    assert!(h.infer.queue.paces_bulk());
    let a = h.embed(&[HELD_BULK]);
    until("A runs", || h.gate.held() == 1).await;
    let b = h.embed(&["b a b c d e f"]);
    until("B is queued", || h.infer.queue.len() == 1).await;
    // Nothing is packed for the thread while A runs: B stays in the queue.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!h.packed(Lane::Bulk, 2), "B was prefetched behind A");
    assert_eq!(h.infer.queue.len(), 1);
    let query = h.embed(&["hello"]);
    until("the query is queued", || h.infer.queue.len() == 2).await;

    h.gate.open();
    for task in [a, b, query] {
        assert_eq!(task.await.unwrap().unwrap(), 1);
    }
    let one_thread = |id| ("model-backend".to_string(), Some(id));
    assert_eq!(
        h.passes(),
        [one_thread(HOLD_ID), one_thread(4)],
        "the query runs first, with B, which was queued before it, in its batch"
    );
    assert!(h.packed(Lane::Interactive, 1) && h.packed(Lane::Bulk, 1));
    let sizes = h.metrics.render();
    assert!(
        sizes.contains("te_batch_next_size_sum{lane=\"interactive\"} 2"),
        "{sizes}"
    );
}

/// Without pacing (`--max-bulk-batch-ms 0`) a query's batch holds queries only, as where
/// each lane has its own thread.
#[tokio::test]
async fn a_query_batch_is_not_topped_up_when_bulk_batches_are_not_paced() {
    let h = paced_harness(false, 8, None);
    let a = h.embed(&[HELD_BULK]);
    until("A runs", || h.gate.held() == 1).await;
    let b = h.embed(&["b a b c d e f"]);
    until("B is prefetched", || h.packed(Lane::Bulk, 2)).await;
    let c = h.embed(&["c a b c d e f"]);
    let query = h.embed(&["hello"]);
    until("C and the query are queued", || h.infer.queue.len() == 2).await;
    h.gate.open();
    for task in [a, b, c, query] {
        assert_eq!(task.await.unwrap().unwrap(), 1);
    }
    assert_eq!(h.passes().len(), 4, "{:?}", h.passes());
    let sizes = h.metrics.render();
    assert!(
        sizes.contains("te_batch_next_size_sum{lane=\"interactive\"} 1"),
        "{sizes}"
    );
}

#[tokio::test]
async fn zero_sends_everything_to_bulk_even_with_an_interactive_lane() {
    let h = harness(true, 0);
    assert_eq!(
        profile(&h.infer.backend, 16, 0, None).batching.takes(),
        [Take::Priority]
    );
    assert_eq!(h.embed(&["hello"]).await.unwrap().unwrap(), 1);
    assert_eq!(h.passes(), [("model-backend".into(), Some(4))]);
    assert!(h.packed(Lane::Bulk, 1));
}

/// Holds two bulk batches (one running, one prefetched) so that the requests queued next are
/// packed into one batch once the gate opens.
pub(super) async fn hold_two_batches(h: &Harness) -> [JoinHandle<Result<usize, InferError>>; 2] {
    let first = h.embed(&[HELD_BULK]);
    until("the first held batch runs", || h.gate.held() == 1).await;
    let second = h.embed(&["g b c d e f h"]);
    until("the second is prefetched", || h.packed(Lane::Bulk, 2)).await;
    [first, second]
}

fn counter(h: &Harness, line: &str) -> bool {
    h.metrics.render().lines().any(|l| l == line)
}

#[tokio::test]
async fn a_failing_request_does_not_fail_its_batch_neighbours() {
    let h = harness(false, 0);
    let held = hold_two_batches(&h).await;
    let bad = h.embed(&["poison"]);
    until("the poisoned request is queued first", || {
        h.infer.queue.len() == 1
    })
    .await;
    let good = [h.embed(&["hello"]), h.embed(&["world"])];
    until("all three are queued", || h.infer.queue.len() == 3).await;
    h.gate.open();
    for task in held {
        assert_eq!(task.await.unwrap().unwrap(), 1);
    }
    let err = bad.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("poison token"), "{err}");
    for task in good {
        assert_eq!(task.await.unwrap().unwrap(), 1, "a neighbour got the error");
    }
    // The batch of three failed; its halves ran apart: the poisoned one alone, then the rest.
    let seen = h.seen.lock().unwrap();
    let after_held: Vec<(usize, bool)> = seen[2..]
        .iter()
        .map(|b| (b.num_seqs, b.first_id == Some(20)))
        .collect();
    assert_eq!(after_held, [(3, true), (1, true), (2, false)]);
    drop(seen);
    assert!(
        counter(&h, "te_batch_isolation_pass 2"),
        "{}",
        h.metrics.render()
    );
}

#[tokio::test]
async fn a_non_finite_output_fails_only_its_request() {
    let h = harness(false, 0);
    let held = hold_two_batches(&h).await;
    let nan = h.embed(&["nan"]);
    let good = [h.embed(&["hello"]), h.embed(&["world"])];
    until("all three are queued", || h.infer.queue.len() == 3).await;
    h.gate.open();
    for task in held {
        task.await.unwrap().unwrap();
    }
    let err = nan.await.unwrap().unwrap_err();
    assert!(
        matches!(err, InferError::Backend(BackendError::NonFinite)),
        "{err}"
    );
    for task in good {
        assert_eq!(task.await.unwrap().unwrap(), 1);
    }
    // One forward pass served all three: no re-runs.
    assert_eq!(h.passes().len(), 3);
    assert!(
        counter(&h, "te_inference_non_finite 1"),
        "{}",
        h.metrics.render()
    );
}

#[tokio::test]
async fn a_request_whose_client_left_leaves_the_queue_at_once() {
    let h = harness(false, 0);
    let held = hold_two_batches(&h).await;
    let gone = h.embed(&["a b c d", "a b c d"]);
    until("it is queued", || h.infer.queue.len() == 2).await;
    assert!(counter(&h, "te_queue_size 2"));
    gone.abort();
    until("its entries are gone", || h.infer.queue.is_empty()).await;
    assert!(counter(&h, "te_queue_size 0"), "{}", h.metrics.render());
    // Not counted per sequence here: the HTTP layer counts the request, once.
    assert!(!h.metrics.render().contains("dropped"));
    h.gate.open();
    for task in held {
        task.await.unwrap().unwrap();
    }
    assert_eq!(h.passes().len(), 2, "the abandoned request ran");
}

/// A query is tokenized while a backfill's documents fill the tokenization pool: it does not
/// wait in the pool's queue behind them, even with other requests in flight.
#[tokio::test]
async fn a_query_is_tokenized_while_a_backfill_is_being_tokenized() {
    let h = harness(true, 8);
    // 16 documents of 100,000 words each, truncated to the limit: the pool's two workers
    // take a second or two over them (the tokenizer reads every word before truncating),
    // and many more on a 2-core machine busy with other builds.
    let document = format!("g {}", "a b c d ".repeat(25_000));
    let infer = h.infer.clone();
    let backfill = tokio::spawn(async move {
        let request = InferRequest {
            inputs: vec![EncodingInput::Single(document).into(); 16],
            opts: EncodeOptions {
                truncate: true,
                ..Default::default()
            },
            batched: true,
            priority: None,
        };
        let started = Instant::now();
        let out = infer.embed_pooled(request, true, None).await?;
        Ok::<_, InferError>((out.len(), started.elapsed()))
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    let query = h.embed(&["hello"]).await.unwrap().unwrap();
    let query_took = started.elapsed();
    assert_eq!(query, 1);
    // The backfill's sequences reach the queue only once all 16 are tokenized.
    assert!(
        h.gate.held() == 0 && h.infer.queue.is_empty() && !backfill.is_finished(),
        "the backfill was tokenized before the query was answered ({query_took:?})"
    );
    let busy_machine = Duration::from_secs(120);
    until_within("the backfill reaches the backend", busy_machine, || {
        h.gate.held() == 1
    })
    .await;
    h.gate.open();
    let (n, backfill_took) = backfill.await.unwrap().unwrap();
    assert_eq!(n, 16);
    assert!(
        query_took * 4 < backfill_took,
        "{query_took:?} vs {backfill_took:?}"
    );
}

/// Bulk batches are bounded by time only where one backend thread serves both lanes: with an
/// interactive lane the runtime pauses bulk batches for queries itself.
#[tokio::test]
async fn bulk_batches_are_paced_only_without_an_interactive_lane() {
    for (interactive_lane, paced) in [(false, true), (true, false)] {
        let fake = FakeBackend::new(ModelInfo {
            interactive_lane,
            ..FakeBackend::info()
        });
        let (backend, info, _threads) = BackendHandle::spawn(fake.into_factory()).unwrap();
        let metrics = Arc::new(Metrics::new(info.max_input_length));
        let profile = profile(&backend, 4096, 8, Some(Duration::from_millis(50)));
        let (infer, _task) = Infer::new(
            test_tokenization(16, 0),
            backend,
            Arc::new(info),
            &profile,
            64,
            ModelMetrics::only(metrics),
        );
        let expected = if paced {
            crate::queue::PACED_FIRST_BATCH_TOKENS
        } else {
            4096
        };
        assert_eq!(infer.queue.batch_tokens(Lane::Bulk), expected);
        assert_eq!(infer.queue.batch_tokens(Lane::Interactive), 4096);
    }
}

/// A query queued while its backend thread can take a batch is sent by the caller itself
/// (`batching::Direct`), not after a wake-up of the batching task: the test runtime's only
/// thread is blocked until the batch has run, so the batching task cannot have sent it.
#[tokio::test]
async fn a_query_is_sent_by_its_caller_when_its_thread_is_free() {
    for interactive_lane in [true, false] {
        let h = harness(interactive_lane, 8);
        let opts = EncodeOptions {
            inline: true,
            ..Default::default()
        };
        let encoding = h
            .infer
            .tokenization
            .encode(EncodingInput::Single("hello".into()), opts)
            .await
            .unwrap();
        let (waiting, _) = h.infer.enqueue(
            vec![(BatchKind::Pooled, encoding)],
            Lane::Interactive,
            7,
            None,
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while h.passes().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the query waited for the batching task (interactive lane: {interactive_lane})"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let thread = if interactive_lane {
            "model-interactive"
        } else {
            "model-backend"
        };
        assert_eq!(h.passes(), [(thread.into(), Some(4))]);
        let [(tokens, rx)]: [_; 1] = waiting.try_into().unwrap();
        assert_eq!(tokens, 3);
        let hidden = h.infer.info().hidden_size;
        assert_eq!(rx.await.unwrap().unwrap().values.len(), hidden);
    }
}

/// A query whose thread is free reaches it while the queue's lock is held (by a backfill's
/// append, or the packing of a 16k-token batch): it never enters the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
// The lock is held across the wait on purpose: it stands for a packer's, on another thread.
#[allow(clippy::await_holding_lock)]
async fn a_query_reaches_a_free_thread_while_the_queue_is_locked() {
    let h = harness(true, 8);
    // A first query: the batching tasks have then looked at the queue and wait for an
    // append. A task still on its way there would block its worker thread on the lock
    // below; there are workers to spare for that, but none should be needed.
    assert_eq!(h.embed(&["hello"]).await.unwrap().unwrap(), 1);
    let queue = h.infer.queue.clone();
    let locked = queue.lock();
    let query = h.embed(&["world"]);
    let answered = tokio::time::timeout(Duration::from_secs(5), query).await;
    drop(locked);
    let answered = answered.expect("the query waited for the queue's lock");
    assert_eq!(answered.unwrap().unwrap(), 1);
    assert!(h.packed(Lane::Interactive, 2));
    let passes = h.passes();
    assert_eq!(passes.len(), 2, "{passes:?}");
    assert!(passes
        .iter()
        .all(|(thread, _)| thread == "model-interactive"));
}

/// Once a batch waits for the interactive thread (its slot is taken), the next queries are
/// left to the batching task, which packs them together when the slot frees.
#[tokio::test]
async fn queries_wait_for_the_batching_task_while_a_batch_waits_for_their_thread() {
    let h = harness(true, 8);
    let held = h.embed(&["g"]);
    until("the held query runs", || h.gate.held() == 1).await;
    let second = h.embed(&["hello"]);
    until("the second query takes the free slot", || {
        h.packed(Lane::Interactive, 2)
    })
    .await;
    let third = h.embed(&["world"]);
    let fourth = h.embed(&["hello world"]);
    until("both wait in the queue", || h.infer.queue.len() == 2).await;
    h.gate.open();
    for task in [held, second, third, fourth] {
        assert_eq!(task.await.unwrap().unwrap(), 1);
    }
    let passes = h.passes();
    assert_eq!(passes.len(), 3, "{passes:?}");
    assert!(passes.iter().all(|(t, _)| t == "model-interactive"));
    assert_eq!(passes[0].1, Some(HOLD_ID));
    assert!(h.packed(Lane::Interactive, 3));
}

/// A query's queue time splits at the hand-over to its backend thread: one sent to the free
/// slot while another batch runs waits after its hand-over; one queued while that slot is
/// taken waits before it.
#[tokio::test]
async fn queue_time_splits_at_the_hand_over_to_the_backend_thread() {
    let h = harness(true, 8);
    let embed = |text: &'static str| {
        let infer = h.infer.clone();
        tokio::spawn(async move {
            let request = InferRequest {
                inputs: vec![EncodingInput::Single(text.into()).into()],
                opts: EncodeOptions::default(),
                batched: false,
                priority: None,
            };
            let mut out = infer.embed_pooled(request, true, None).await.unwrap();
            out.pop().unwrap().1
        })
    };
    let held = embed("g");
    until("the held query runs", || h.gate.held() == 1).await;
    let handed_over = embed("hello");
    until("the second query takes the free slot", || {
        h.packed(Lane::Interactive, 2)
    })
    .await;
    let waiting = embed("world");
    until("the third waits in the queue", || h.infer.queue.len() == 1).await;
    let pause = Duration::from_millis(100);
    tokio::time::sleep(pause).await;
    h.gate.open();
    held.await.unwrap();
    let (handed_over, waiting) = (handed_over.await.unwrap(), waiting.await.unwrap());
    for meta in [&handed_over, &waiting] {
        assert!(meta.handover <= meta.queue, "{meta:?}");
    }
    assert!(
        handed_over.queue >= pause && handed_over.queue - handed_over.handover >= pause,
        "the second query waited after its hand-over: {handed_over:?}"
    );
    assert!(
        waiting.handover >= pause,
        "the third query waited before its hand-over: {waiting:?}"
    );
}

#[path = "tests_priority.rs"]
mod priority;
