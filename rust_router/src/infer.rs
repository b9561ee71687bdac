//! Inference orchestration: admission (permits), tokenization, lane choice, queueing, the
//! batching tasks that feed the backend threads, and the post-processing the router owns
//! (normalization, Matryoshka truncation, score activations).

use crate::backend::{
    BackendError, BackendHandle, BatchKind, Lane, ModelInfo, ModelType, Output, ScoreActivation,
};
use crate::metrics::Metrics;
use crate::queue::{Entry, InferResult, Metadata, NextBatch, Queue, Take};
use crate::tokenization::{
    EncodeOptions, EncodingInput, Tokenization, TokenizationError, ValidEncoding, INLINE_MAX_BYTES,
};
use futures_util::future::try_join_all;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

/// Requests in flight up to which small ones are tokenized inline (see [`Infer::inline_ok`]).
pub const INLINE_MAX_IN_FLIGHT: usize = 1;

#[derive(Debug, thiserror::Error)]
pub enum InferError {
    #[error(transparent)]
    Tokenization(#[from] TokenizationError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("Model is overloaded: more than {0} requests are in flight, retry later")]
    Overloaded(usize),
    #[error("Input validation error: {0}")]
    Validation(String),
    /// The route does not fit the loaded model (e.g. `/rerank` on an embedding model).
    #[error("{0}")]
    ModelType(String),
}

/// Per-sequence accounting, summed or averaged into the response headers.
#[derive(Debug, Clone, Copy, Default)]
pub struct InferMetadata {
    pub prompt_tokens: usize,
    pub tokenization: Duration,
    pub queue: Duration,
    pub inference: Duration,
}

/// The queueing and admission settings from the flags.
#[derive(Debug, Clone, Copy)]
pub struct InferConfig {
    pub max_batch_tokens: usize,
    pub max_batch_requests: Option<usize>,
    pub max_concurrent_requests: usize,
    /// Requests of at most this many tokens in all are interactive; 0: all are bulk.
    pub interactive_max_tokens: usize,
}

#[derive(Clone)]
pub struct Infer {
    tokenization: Tokenization,
    queue: Queue,
    backend: BackendHandle,
    permits: Arc<Semaphore>,
    max_concurrent_requests: usize,
    interactive_max_tokens: usize,
    info: Arc<ModelInfo>,
    metrics: Arc<Metrics>,
}

/// A request's lane, from the tokens of all its inputs together: a query's latency is what
/// the interactive lane protects, and a large request split into small inputs is no query.
pub fn lane_for(total_tokens: usize, interactive_max_tokens: usize) -> Lane {
    if interactive_max_tokens > 0 && total_tokens <= interactive_max_tokens {
        Lane::Interactive
    } else {
        Lane::Bulk
    }
}

/// One batching task per backend thread: a task per lane when the runtime has an interactive
/// lane (and it is on), else one task that packs in priority order for the only thread.
pub fn batching_takes(backend: &BackendHandle, interactive_max_tokens: usize) -> Vec<Take> {
    if backend.has_interactive_lane() && interactive_max_tokens > 0 {
        Lane::PRIORITY.into_iter().map(Take::Lane).collect()
    } else {
        vec![Take::Priority]
    }
}

/// Which routes a model serves, for errors that tell the client where to go instead.
pub fn served_routes(model_type: ModelType) -> &'static str {
    match model_type {
        ModelType::Embedding => "/embed, /embed_all, /similarity, /v1/embeddings",
        ModelType::Classifier => "/predict",
        ModelType::Reranker => "/rerank, /predict",
    }
}

pub fn l2_normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|x| (*x as f64) * (*x as f64))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        let scale = (1.0 / norm) as f32;
        v.iter_mut().for_each(|x| *x *= scale);
    }
}

pub fn activate(scores: &mut [f32], activation: ScoreActivation) {
    match activation {
        ScoreActivation::Sigmoid => scores
            .iter_mut()
            .for_each(|s| *s = 1.0 / (1.0 + (-*s).exp())),
        ScoreActivation::Softmax => {
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            scores.iter_mut().for_each(|s| *s /= sum);
        }
    }
}

impl Infer {
    /// Starts the batching tasks; the returned task ends after [`Infer::shutdown`] once they
    /// have drained the queue.
    pub fn new(
        tokenization: Tokenization,
        backend: BackendHandle,
        info: Arc<ModelInfo>,
        config: InferConfig,
        metrics: Arc<Metrics>,
    ) -> (Self, JoinHandle<()>) {
        let queue = Queue::new(
            config.max_batch_tokens,
            config.max_batch_requests,
            metrics.clone(),
        );
        let tasks: Vec<_> = batching_takes(&backend, config.interactive_max_tokens)
            .into_iter()
            .map(|take| {
                tokio::spawn(batching_task(
                    queue.clone(),
                    backend.clone(),
                    take,
                    info.clone(),
                    metrics.clone(),
                ))
            })
            .collect();
        let all_tasks = tokio::spawn(async move {
            for task in tasks {
                let _ = task.await;
            }
        });
        let infer = Self {
            tokenization,
            queue,
            backend,
            permits: Arc::new(Semaphore::new(config.max_concurrent_requests)),
            max_concurrent_requests: config.max_concurrent_requests,
            interactive_max_tokens: config.interactive_max_tokens,
            info,
            metrics,
        };
        (infer, all_tasks)
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn tokenization(&self) -> &Tokenization {
        &self.tokenization
    }

    /// Admission control: refuse (429) rather than queue without bound.
    pub fn try_acquire_permit(&self) -> Result<OwnedSemaphorePermit, InferError> {
        self.permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| InferError::Overloaded(self.max_concurrent_requests))
    }

    /// Whether a request whose inputs total `total_bytes` should be tokenized inline on the
    /// calling tokio worker rather than on the pool: only small requests, and only while the
    /// server is nearly idle (at most [`INLINE_MAX_IN_FLIGHT`] requests in flight, this one
    /// included), where the pool's two thread hand-offs are most of the tokenization time.
    /// Under load the pool keeps tokenization off the workers that serve HTTP.
    pub fn inline_ok(&self, total_bytes: usize) -> bool {
        let in_flight = self.max_concurrent_requests - self.permits.available_permits();
        total_bytes <= INLINE_MAX_BYTES && in_flight <= INLINE_MAX_IN_FLIGHT
    }

    pub async fn health(&self) -> Result<(), BackendError> {
        self.backend.health().await
    }

    pub fn shutdown(&self) {
        self.queue.close();
    }

    fn require(&self, ok: bool, route: &str) -> Result<(), InferError> {
        if ok {
            return Ok(());
        }
        let (what, t) = match self.info.model_type {
            ModelType::Embedding => ("an embedding model", ModelType::Embedding),
            ModelType::Classifier => ("a classifier", ModelType::Classifier),
            ModelType::Reranker => ("a reranker", ModelType::Reranker),
        };
        Err(InferError::ModelType(format!(
            "`{route}` is not available: the model is {what} and serves {}",
            served_routes(t)
        )))
    }

    pub fn require_embedding(&self, route: &str) -> Result<(), InferError> {
        self.require(self.info.model_type == ModelType::Embedding, route)
    }

    pub fn require_classifier(&self, route: &str) -> Result<(), InferError> {
        self.require(self.info.model_type != ModelType::Embedding, route)
    }

    pub fn require_reranker(&self, route: &str) -> Result<(), InferError> {
        self.require(self.info.model_type == ModelType::Reranker, route)
    }

    /// Tokenizes every input of one request, then queues them together in the request's lane
    /// and waits for all results, in input order. Queueing only once all are tokenized is
    /// what lets the lane depend on the whole request; it costs a large request at most its
    /// own tokenization time, small beside its forward passes.
    async fn run(
        &self,
        inputs: Vec<EncodingInput>,
        opts: EncodeOptions,
        kind: BatchKind,
    ) -> Result<Vec<(InferResult, InferMetadata)>, InferError> {
        let start = Instant::now();
        let encodings = try_join_all(
            inputs
                .into_iter()
                .map(|input| self.tokenization.encode(input, opts.clone())),
        )
        .await?;
        let total_tokens = encodings.iter().map(|e| e.input_ids.len()).sum();
        let lane = lane_for(total_tokens, self.interactive_max_tokens);
        let tokenization = start.elapsed();
        let waiting = self.enqueue(encodings, kind, lane, tokenization);
        // The first failure drops the other receivers, which makes the queue skip their
        // sequences.
        try_join_all(waiting.into_iter().map(|(prompt_tokens, rx)| async move {
            let result = rx.await.map_err(|_| BackendError::Stopped)??;
            let meta = InferMetadata {
                prompt_tokens,
                tokenization,
                queue: result.queue,
                inference: result.inference,
            };
            Ok::<_, InferError>((result, meta))
        }))
        .await
    }

    /// Queues one request's sequences in `lane`; returns each one's token count and receiver.
    fn enqueue(
        &self,
        encodings: Vec<ValidEncoding>,
        kind: BatchKind,
        lane: Lane,
        tokenization: Duration,
    ) -> Vec<(usize, oneshot::Receiver<Result<InferResult, BackendError>>)> {
        let queued_at = Instant::now();
        let mut waiting = Vec::with_capacity(encodings.len());
        let entries: Vec<Entry> = encodings
            .into_iter()
            .map(|encoding| {
                let prompt_tokens = encoding.input_ids.len();
                self.metrics
                    .observe("te_request_input_length", &[], prompt_tokens as f64);
                let (response_tx, rx) = oneshot::channel();
                waiting.push((prompt_tokens, rx));
                Entry {
                    encoding,
                    kind,
                    lane,
                    metadata: Metadata {
                        response_tx,
                        tokenization,
                        queued_at,
                    },
                }
            })
            .collect();
        self.queue.append(entries);
        waiting
    }

    /// Pooled embeddings, one per input: truncated to `dimensions` (Matryoshka) first, then
    /// normalized.
    pub async fn embed_pooled(
        &self,
        inputs: Vec<EncodingInput>,
        opts: EncodeOptions,
        normalize: bool,
        dimensions: Option<usize>,
    ) -> Result<Vec<(Vec<f32>, InferMetadata)>, InferError> {
        let results = self.run(inputs, opts, BatchKind::Pooled).await?;
        Ok(results
            .into_iter()
            .map(|(result, meta)| {
                let mut values = result.values;
                if let Some(d) = dimensions {
                    values.truncate(d);
                }
                if normalize {
                    l2_normalize(&mut values);
                }
                (values, meta)
            })
            .collect())
    }

    /// Per-token hidden states, one row per token, for each input.
    pub async fn embed_all(
        &self,
        inputs: Vec<EncodingInput>,
        opts: EncodeOptions,
    ) -> Result<Vec<(Vec<Vec<f32>>, InferMetadata)>, InferError> {
        let results = self.run(inputs, opts, BatchKind::AllTokens).await?;
        Ok(results
            .into_iter()
            .map(|(result, meta)| {
                let rows = result
                    .values
                    .chunks(result.cols.max(1))
                    .map(<[f32]>::to_vec)
                    .collect();
                (rows, meta)
            })
            .collect())
    }

    /// Classification scores, one per label, activated unless `raw_scores`, for each input.
    pub async fn predict(
        &self,
        inputs: Vec<EncodingInput>,
        opts: EncodeOptions,
        raw_scores: bool,
    ) -> Result<Vec<(Vec<f32>, InferMetadata)>, InferError> {
        let results = self.run(inputs, opts, BatchKind::Predict).await?;
        results
            .into_iter()
            .map(|(result, meta)| {
                let mut scores = result.values;
                if !raw_scores {
                    activate(&mut scores, self.info.activation());
                }
                if scores.iter().any(|s| s.is_nan()) {
                    let err = BackendError::Inference("the model returned NaN scores".into());
                    return Err(err.into());
                }
                Ok((scores, meta))
            })
            .collect()
    }
}

/// Feeds one backend thread with what `take` packs: wait for work, reserve the thread's one
/// free slot, then pack the next batch. Packing only after a slot is free means exactly one
/// batch waits while another runs (prefetch), and that batch is as full as the queue allows at
/// that moment (and, in priority order, holds the queries that arrived meanwhile). Waiting for
/// work *before* the slot means an idle backend frees its slot with nobody waiting on it, so
/// the backend thread wakes no tokio worker in front of its forward pass.
async fn batching_task(
    queue: Queue,
    backend: BackendHandle,
    take: Take,
    info: Arc<ModelInfo>,
    metrics: Arc<Metrics>,
) {
    loop {
        if !queue.wait_ready(take).await {
            return;
        }
        let slot = match backend.reserve(take.backend_lane()).await {
            Ok(slot) => slot,
            Err(err) => {
                fail_everything_queued(&queue, take, err).await;
                return;
            }
        };
        // `None`: every queued entry's client went away; the slot goes back unused.
        let Some(NextBatch {
            kind,
            batch,
            metadata,
            ..
        }) = queue.try_next_batch(take)
        else {
            continue;
        };
        let (reply, rx) = oneshot::channel();
        let cu_seqlens = batch.cu_seqlens.clone();
        slot.send(kind, batch, reply);
        // Splitting results runs beside the next forward pass, not in front of it.
        tokio::spawn(dispatch(
            kind,
            cu_seqlens,
            metadata,
            rx,
            info.clone(),
            metrics.clone(),
        ));
    }
}

/// The backend is gone: fail everything that is or will be queued for `take` instead of
/// leaving clients waiting forever.
async fn fail_everything_queued(queue: &Queue, take: Take, err: BackendError) {
    tracing::error!("{err}; failing queued requests");
    while let Some(next) = queue.next_batch(take).await {
        for m in next.metadata {
            let _ = m.response_tx.send(Err(err.clone()));
        }
    }
}

fn check_shape(
    out: &Output,
    kind: BatchKind,
    cu_seqlens: &[u32],
    info: &ModelInfo,
) -> Result<(), BackendError> {
    let rows = match kind {
        BatchKind::AllTokens => *cu_seqlens.last().unwrap_or(&0) as usize,
        _ => cu_seqlens.len() - 1,
    };
    let cols = info.output_cols(kind);
    let m = &out.matrix;
    if m.rows != rows || m.cols != cols || m.data.len() != rows * cols {
        return Err(BackendError::Inference(format!(
            "the backend returned a [{}, {}] array for a {kind:?} batch, expected [{rows}, {cols}]",
            m.rows, m.cols
        )));
    }
    Ok(())
}

async fn dispatch(
    kind: BatchKind,
    cu_seqlens: Vec<u32>,
    metadata: Vec<Metadata>,
    rx: oneshot::Receiver<Result<Output, BackendError>>,
    info: Arc<ModelInfo>,
    metrics: Arc<Metrics>,
) {
    let result = rx
        .await
        .unwrap_or(Err(BackendError::Stopped))
        .and_then(|out| check_shape(&out, kind, &cu_seqlens, &info).map(|_| out));
    let out = match result {
        Ok(out) => out,
        Err(err) => {
            metrics.inc("te_batch_inference_failure", &[]);
            tracing::error!(batch_size = metadata.len(), "{err}");
            for m in metadata {
                let _ = m.response_tx.send(Err(err.clone()));
            }
            return;
        }
    };
    metrics.inc("te_batch_inference_success", &[]);
    metrics.observe(
        "te_batch_inference_duration",
        &[],
        out.duration.as_secs_f64(),
    );
    metrics.observe("te_batch_inference_size", &[], metadata.len() as f64);
    let cols = out.matrix.cols;
    for (i, m) in metadata.into_iter().enumerate() {
        let (a, b) = match kind {
            BatchKind::AllTokens => (cu_seqlens[i] as usize, cu_seqlens[i + 1] as usize),
            _ => (i, i + 1),
        };
        let _ = m.response_tx.send(Ok(InferResult {
            values: out.matrix.data[a * cols..b * cols].to_vec(),
            cols,
            queue: out.started.saturating_duration_since(m.queued_at),
            inference: out.duration,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fake::{FakeBackend, Gate, SeenBatch, HOLD_ID};
    use crate::tokenization::tests::test_tokenization;
    use std::sync::Mutex;

    #[test]
    fn normalization_and_activations() {
        let mut v = vec![3.0, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut zero = vec![0.0, 0.0];
        l2_normalize(&mut zero);
        assert_eq!(zero, vec![0.0, 0.0]);

        let mut s = vec![0.0];
        activate(&mut s, ScoreActivation::Sigmoid);
        assert_eq!(s, vec![0.5]);
        let mut s = vec![1.0, 1.0, 1000.0];
        activate(&mut s, ScoreActivation::Softmax);
        assert!((s.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(s[2] > 0.999 && s[0].is_finite());
    }

    #[test]
    fn lane_is_chosen_by_the_whole_request_and_zero_turns_it_off() {
        assert_eq!(lane_for(1, 256), Lane::Interactive);
        assert_eq!(lane_for(256, 256), Lane::Interactive);
        assert_eq!(lane_for(257, 256), Lane::Bulk);
        assert_eq!(lane_for(1, 0), Lane::Bulk);
    }

    /// An `Infer` over the fake backend, whose batches holding [`HOLD_ID`] ("g") wait at
    /// `gate`.
    struct Harness {
        infer: Infer,
        seen: Arc<Mutex<Vec<SeenBatch>>>,
        gate: Arc<Gate>,
        metrics: Arc<Metrics>,
    }

    fn harness(interactive_lane: bool, interactive_max_tokens: usize) -> Harness {
        let gate = Arc::new(Gate::default());
        let mut fake = FakeBackend::new(ModelInfo {
            interactive_lane,
            ..FakeBackend::info()
        });
        fake.gate = Some(gate.clone());
        let seen = fake.seen.clone();
        let (backend, info, _threads) = BackendHandle::spawn(fake.into_factory()).unwrap();
        let metrics = Arc::new(Metrics::new(info.max_input_length));
        let config = InferConfig {
            // Two 9-token requests never share a batch.
            max_batch_tokens: 16,
            max_batch_requests: None,
            max_concurrent_requests: 64,
            interactive_max_tokens,
        };
        let (infer, _task) = Infer::new(
            test_tokenization(16, 0),
            backend,
            Arc::new(info),
            config,
            metrics.clone(),
        );
        Harness {
            infer,
            seen,
            gate,
            metrics,
        }
    }

    impl Harness {
        /// Embeds `texts` as one request, on its own task.
        fn embed(&self, texts: &[&str]) -> JoinHandle<Result<usize, InferError>> {
            let infer = self.infer.clone();
            let inputs = texts
                .iter()
                .map(|t| EncodingInput::Single(t.to_string()))
                .collect();
            tokio::spawn(async move {
                let out = infer
                    .embed_pooled(inputs, EncodeOptions::default(), true, None)
                    .await?;
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

    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
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
            batching_takes(&h.infer.backend, 8),
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

    #[tokio::test]
    async fn zero_sends_everything_to_bulk_even_with_an_interactive_lane() {
        let h = harness(true, 0);
        assert_eq!(batching_takes(&h.infer.backend, 0), [Take::Priority]);
        assert_eq!(h.embed(&["hello"]).await.unwrap().unwrap(), 1);
        assert_eq!(h.passes(), [("model-backend".into(), Some(4))]);
        assert!(h.packed(Lane::Bulk, 1));
    }
}
