//! Inference orchestration: admission (permits), tokenization, queueing, the batching task that
//! feeds the backend thread, and the post-processing the router owns (normalization, Matryoshka
//! truncation, score activations).

use crate::backend::{
    BackendError, BackendHandle, BatchKind, ModelInfo, ModelType, Output, ScoreActivation,
};
use crate::metrics::Metrics;
use crate::queue::{Entry, InferResult, Metadata, NextBatch, Queue};
use crate::tokenization::{
    EncodeOptions, EncodingInput, Tokenization, TokenizationError, INLINE_MAX_BYTES,
};
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

#[derive(Clone)]
pub struct Infer {
    tokenization: Tokenization,
    queue: Queue,
    backend: BackendHandle,
    permits: Arc<Semaphore>,
    max_concurrent_requests: usize,
    info: Arc<ModelInfo>,
    metrics: Arc<Metrics>,
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
    /// Starts the batching task; it ends after [`Infer::shutdown`] once the queue is drained.
    pub fn new(
        tokenization: Tokenization,
        backend: BackendHandle,
        info: Arc<ModelInfo>,
        max_batch_tokens: usize,
        max_batch_requests: Option<usize>,
        max_concurrent_requests: usize,
        metrics: Arc<Metrics>,
    ) -> (Self, JoinHandle<()>) {
        let queue = Queue::new(max_batch_tokens, max_batch_requests, metrics.clone());
        let task = tokio::spawn(batching_task(
            queue.clone(),
            backend.clone(),
            info.clone(),
            metrics.clone(),
        ));
        let infer = Self {
            tokenization,
            queue,
            backend,
            permits: Arc::new(Semaphore::new(max_concurrent_requests)),
            max_concurrent_requests,
            info,
            metrics,
        };
        (infer, task)
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

    async fn run(
        &self,
        input: EncodingInput,
        opts: EncodeOptions,
        kind: BatchKind,
    ) -> Result<(InferResult, InferMetadata), InferError> {
        let start = Instant::now();
        let encoding = self.tokenization.encode(input, opts).await?;
        let prompt_tokens = encoding.input_ids.len();
        self.metrics
            .observe("te_request_input_length", &[], prompt_tokens as f64);
        let (response_tx, response_rx) = oneshot::channel();
        self.queue.append(Entry {
            encoding,
            kind,
            metadata: Metadata {
                response_tx,
                tokenization: start.elapsed(),
                queued_at: Instant::now(),
            },
        });
        let tokenization = start.elapsed();
        let result = response_rx.await.map_err(|_| BackendError::Stopped)??;
        let meta = InferMetadata {
            prompt_tokens,
            tokenization,
            queue: result.queue,
            inference: result.inference,
        };
        Ok((result, meta))
    }

    /// A pooled embedding: truncated to `dimensions` (Matryoshka) first, then normalized.
    pub async fn embed_pooled(
        &self,
        input: EncodingInput,
        opts: EncodeOptions,
        normalize: bool,
        dimensions: Option<usize>,
    ) -> Result<(Vec<f32>, InferMetadata), InferError> {
        let (result, meta) = self.run(input, opts, BatchKind::Pooled).await?;
        let mut values = result.values;
        if let Some(d) = dimensions {
            values.truncate(d);
        }
        if normalize {
            l2_normalize(&mut values);
        }
        Ok((values, meta))
    }

    /// Per-token hidden states, one row per token.
    pub async fn embed_all(
        &self,
        input: EncodingInput,
        opts: EncodeOptions,
    ) -> Result<(Vec<Vec<f32>>, InferMetadata), InferError> {
        let (result, meta) = self.run(input, opts, BatchKind::AllTokens).await?;
        let rows = result
            .values
            .chunks(result.cols.max(1))
            .map(<[f32]>::to_vec)
            .collect();
        Ok((rows, meta))
    }

    /// Classification scores, one per label, activated unless `raw_scores`.
    pub async fn predict(
        &self,
        input: EncodingInput,
        opts: EncodeOptions,
        raw_scores: bool,
    ) -> Result<(Vec<f32>, InferMetadata), InferError> {
        let (result, meta) = self.run(input, opts, BatchKind::Predict).await?;
        let mut scores = result.values;
        if !raw_scores {
            activate(&mut scores, self.info.activation());
        }
        if scores.iter().any(|s| s.is_nan()) {
            return Err(BackendError::Inference("the model returned NaN scores".into()).into());
        }
        Ok((scores, meta))
    }
}

/// Feeds the backend thread: wait for work, reserve the backend's one free slot, then pack the
/// next batch. Packing only after a slot is free means exactly one batch waits while another
/// runs (prefetch), and that batch is as full as the queue allows at that moment. Waiting for
/// work *before* the slot means an idle backend frees its slot with nobody waiting on it, so
/// the backend thread wakes no tokio worker in front of its forward pass.
async fn batching_task(
    queue: Queue,
    backend: BackendHandle,
    info: Arc<ModelInfo>,
    metrics: Arc<Metrics>,
) {
    loop {
        if !queue.wait_ready().await {
            return;
        }
        let slot = match backend.reserve().await {
            Ok(slot) => slot,
            Err(err) => {
                // The backend is gone: fail everything that is or will be queued instead of
                // leaving clients waiting forever.
                tracing::error!("{err}; failing queued requests");
                while let Some(next) = queue.next_batch().await {
                    for m in next.metadata {
                        let _ = m.response_tx.send(Err(err.clone()));
                    }
                }
                return;
            }
        };
        // `None`: every queued entry's client went away; the slot goes back unused.
        let Some(NextBatch {
            kind,
            batch,
            metadata,
        }) = queue.try_next_batch()
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
}
