//! Inference orchestration: admission (permits), tokenization, lane choice, queueing, and the
//! post-processing the router owns (normalization, Matryoshka truncation, score activations).
//! The batching tasks that feed the backend threads live in [`batching`]; how they batch, and
//! how a query's handler waits, is the `schedule::ServingProfile` they are given.

mod batching;
mod hot_wait;
mod images;
mod outputs;
mod policy;
mod stalls;

use outputs::sparse_pairs;
pub use outputs::{activate, l2_normalize};
pub use policy::{
    lane_for, lane_for_request, parse_max_queue_ms, waiting_for_admission, with_max_queue,
    with_queue_deadline, Priority, MAX_QUEUE_MS_CAP,
};

use crate::backend::{
    BackendError, BackendHandle, BatchKind, DeviceStatus, Health, Lane, ModelInfo,
};
use crate::images::{ImageError, ImageFetcher, ImageLimits};
use crate::metrics::ModelMetrics;
use crate::queue::{Entry, InferResult, Metadata, Queue, QueueError, RequestId};
use crate::schedule::ServingProfile;
use crate::telemetry::record::{self, BatchRun, SequenceRun, Tokenized};
use crate::tokenization::{
    weighted_mean, EncodeOptions, EncodingInput, Tokenization, TokenizationError, ValidEncoding,
    INLINE_MAX_BYTES,
};
use futures_util::future::try_join_all;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use batching::Direct;
use hot_wait::HotWait;
use stalls::HandoverWatch;

#[derive(Debug, thiserror::Error)]
pub enum InferError {
    #[error(transparent)]
    Tokenization(#[from] TokenizationError),
    /// The request's `index`-th input could not be tokenized: the HTTP layer names it as the
    /// route's body does (`texts[3]`).
    #[error("{error}")]
    Input {
        index: usize,
        error: TokenizationError,
    },
    /// The request's `index`-th input is an image that was refused.
    #[error("{error}")]
    Image { index: usize, error: ImageError },
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("Model is overloaded: more than {0} requests are in flight, retry later")]
    Overloaded(usize),
    /// None of the request had started when its queue deadline (`X-Max-Queue-Ms`, else
    /// `--max-queue-ms`) passed: it was taken out of the queue and never ran.
    #[error(
        "Queue timeout: the request waited longer than its limit of {} ms in the queue \
         (X-Max-Queue-Ms or --max-queue-ms) and was not run; retry later or on another replica",
        .0.as_millis()
    )]
    QueueTimeout(Duration),
}

/// Per-sequence accounting, summed or averaged into the response headers.
#[derive(Debug, Clone, Copy, Default)]
pub struct InferMetadata {
    pub prompt_tokens: usize,
    pub tokenization: Duration,
    pub queue: Duration,
    /// See [`InferResult::handover`].
    pub handover: Duration,
    pub inference: Duration,
}

/// One input of a request: something to tokenize, or an image.
#[derive(Debug, Clone, PartialEq)]
pub enum InferInput {
    Text(EncodingInput),
    /// An `{"image": ...}` value (a data URL or base64), decoded and preprocessed on a
    /// worker thread. Only pooled embeddings take images.
    Image(String),
}

impl From<EncodingInput> for InferInput {
    fn from(input: EncodingInput) -> Self {
        Self::Text(input)
    }
}

impl InferInput {
    /// Bytes to tokenize (an image has none).
    fn text_bytes(&self) -> usize {
        match self {
            Self::Text(input) => input.byte_len(),
            Self::Image(_) => 0,
        }
    }
}

/// One client request's inputs and how to encode them. `batched` says whether the client sent
/// a list (the `method` label of `te_request_count`).
pub struct InferRequest {
    pub inputs: Vec<InferInput>,
    pub opts: EncodeOptions,
    pub batched: bool,
    /// The body's `priority`: overrides the lane the request's size gives it.
    pub priority: Option<Priority>,
}

#[derive(Clone)]
pub struct Infer {
    tokenization: Tokenization,
    queue: Queue,
    /// Sends interactive requests' batches from their handler when a thread can take one.
    direct: Direct,
    backend: BackendHandle,
    permits: Arc<Semaphore>,
    max_concurrent_requests: usize,
    interactive_max_tokens: usize,
    /// `--max-queue-ms`: the queue deadline of requests that set none.
    default_max_queue: Option<Duration>,
    /// How queries' handlers wait for their results (`ServingProfile::query_spin`).
    hot_wait: Arc<HotWait>,
    next_request_id: Arc<AtomicU64>,
    info: Arc<ModelInfo>,
    metrics: ModelMetrics,
    image_limits: ImageLimits,
    /// Image URLs from `--allowed-image-hosts` (none by default).
    image_fetcher: ImageFetcher,
    /// Bounds the images the runtime preprocesses at once to the cores: a backfill of images
    /// would otherwise fill tokio's blocking pool with threads that wait on each other.
    image_workers: Arc<Semaphore>,
}

tokio::task_local! {
    /// Set while inference calls run as parts of one client request ([`Infer::one_request`]).
    /// A task-local rather than an argument: the calls are made by the routes' handlers,
    /// which `/vertex` runs as they are.
    static PART_OF_A_REQUEST: ();
}

/// The `method` label of the request metrics: whether the client sent a list.
fn method(batched: bool) -> &'static str {
    if batched {
        "batch"
    } else {
        "single"
    }
}

/// Where a queued sequence's result arrives.
type Waiting = oneshot::Receiver<Result<InferResult, QueueError>>;

/// Takes a request's sequences out of the queue when its handler is dropped before they ran
/// (the client went away, or the shutdown deadline answered it), so they cost no compute and
/// `te_queue_size` stops counting them at once.
struct Abandoned<'a> {
    queue: &'a Queue,
    request: RequestId,
    finished: bool,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.queue.remove_request(self.request);
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
        profile: &ServingProfile,
        max_concurrent_requests: usize,
        metrics: ModelMetrics,
    ) -> (Self, JoinHandle<()>) {
        let queue = Queue::new(
            profile.max_batch_tokens,
            profile.max_batch_requests,
            metrics.clone(),
        );
        if let Some(target) = profile.batching.bulk_pacing() {
            queue.pace_bulk(target);
        }
        let throttle = profile
            .tokenizer_pool
            .throttled
            .then(|| tokenization.throttle());
        let (tasks, direct) = batching::spawn_tasks(
            &queue,
            &backend,
            profile.batching.takes(),
            throttle,
            &info,
            &metrics,
        );
        let infer = Self {
            tokenization,
            queue,
            direct,
            backend,
            permits: Arc::new(Semaphore::new(max_concurrent_requests)),
            max_concurrent_requests,
            interactive_max_tokens: profile.interactive_max_tokens,
            default_max_queue: profile.max_queue,
            hot_wait: Arc::new(HotWait::new(profile.query_spin)),
            next_request_id: Arc::default(),
            info,
            metrics,
            image_limits: ImageLimits::default(),
            image_fetcher: ImageFetcher::default(),
            image_workers: Arc::new(Semaphore::new(
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            )),
        };
        (infer, tasks)
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn tokenization(&self) -> &Tokenization {
        &self.tokenization
    }

    /// The model's series in the server's metrics.
    pub fn metrics(&self) -> &ModelMetrics {
        &self.metrics
    }

    /// Runs `calls`, several inference calls that answer one client request together
    /// (`/vertex`'s instances), counting that request once in `te_request_count`: each call
    /// is admitted and run as usual, but not counted.
    pub async fn one_request<F: Future>(&self, batched: bool, calls: F) -> F::Output {
        self.metrics
            .inc("te_request_count", &[("method", method(batched))]);
        PART_OF_A_REQUEST.scope((), calls).await
    }

    /// Admission control: refuse (429) rather than queue without bound; a gRPC stream's
    /// message waits instead ([`waiting_for_admission`]).
    async fn admit(&self, batched: bool) -> Result<OwnedSemaphorePermit, InferError> {
        // Outside [`Infer::one_request`], a call is a client request of its own.
        if PART_OF_A_REQUEST.try_with(|_| ()).is_err() {
            self.metrics
                .inc("te_request_count", &[("method", method(batched))]);
        }
        let overloaded = || InferError::Overloaded(self.max_concurrent_requests);
        if policy::waits_for_admission() {
            return self
                .permits
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| overloaded());
        }
        self.permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| overloaded())
    }

    /// `--max-queue-ms`: the queue deadline of requests that set none.
    pub fn default_max_queue(&self) -> Option<Duration> {
        self.default_max_queue
    }

    /// Whether a request whose inputs total `total_bytes` is tokenized inline on the calling
    /// tokio worker rather than on the pool: every small request (a query), busy server or
    /// not. The pool is a FIFO that a backfill fills with thousands of documents; a query sent
    /// there waits behind all of them (on real text, longer than its own forward pass). Inline,
    /// it waits for nothing, and its cost is bounded by [`INLINE_MAX_BYTES`] (tens of
    /// microseconds), about what parsing its JSON body costs the same worker.
    fn inline_ok(&self, total_bytes: usize) -> bool {
        total_bytes <= INLINE_MAX_BYTES
    }

    /// Every healthy device's health check (a failed device is not called again).
    pub async fn health(&self) -> Health {
        self.backend.health().await
    }

    /// Every device's health and batch counts.
    pub fn devices(&self) -> Vec<DeviceStatus> {
        self.backend.devices()
    }

    pub fn shutdown(&self) {
        self.queue.close();
    }

    /// Admits one request, tokenizes every input, then queues them together in the request's
    /// lane and waits for all results, in input order. Queueing only once all are tokenized
    /// is what lets the lane depend on the whole request; it costs a large request at most its
    /// own tokenization time, small beside its forward passes.
    /// `query`: the vectors every sequence of a [`BatchKind::MaxSim`] request is scored
    /// against.
    async fn run(
        &self,
        request: InferRequest,
        kind: BatchKind,
        query: Option<Arc<[f32]>>,
    ) -> Result<Vec<(InferResult, InferMetadata)>, InferError> {
        if request.opts.chunking.is_some() && kind != BatchKind::Pooled {
            // Only a pooled vector has a mean over windows; routes set chunking for those.
            return Err(TokenizationError::Tokenizer(
                "`long_input: chunk` applies to pooled embeddings only".into(),
            )
            .into());
        }
        let _permit = self.admit(request.batched).await?;
        let start = Instant::now();
        let mut opts = request.opts;
        opts.inline = self.inline_ok(request.inputs.iter().map(InferInput::text_bytes).sum());
        let per_input = try_join_all(request.inputs.into_iter().enumerate().map(
            |(index, input)| {
                let opts = opts.clone();
                async move {
                    match input {
                        InferInput::Text(text) => self
                            .tokenization
                            .encode_windows(text, opts)
                            .await
                            .map(|windows| (kind, windows))
                            .map_err(|error| InferError::Input { index, error }),
                        InferInput::Image(source) => self
                            .image_window(source, kind)
                            .await
                            .map(|window| (BatchKind::Images, vec![window]))
                            .map_err(|error| InferError::Image { index, error }),
                    }
                }
            },
        ))
        .await?;
        // An input cut into windows (`long_input: chunk`) is several sequences, which the
        // queue packs like any others; they are put back together by input below.
        let mut weights = Vec::with_capacity(per_input.len());
        let mut encodings = Vec::with_capacity(per_input.len());
        for (kind, windows) in per_input {
            weights.push(windows.iter().map(|w| w.weight).collect::<Vec<_>>());
            encodings.extend(windows.into_iter().map(|w| {
                let mut encoding = w.encoding;
                encoding.query.clone_from(&query);
                (kind, encoding)
            }));
        }
        let total_tokens = encodings.iter().map(|(_, e)| e.input_ids.len()).sum();
        let fits_one_batch = self
            .queue
            .fits_one_query_batch(encodings.len(), total_tokens);
        let lane = lane_for_request(
            request.priority,
            total_tokens,
            fits_one_batch,
            self.interactive_max_tokens,
        );
        let tokenization = start.elapsed();
        record::note(|r| {
            r.tokenized.push(Tokenized {
                start,
                end: start + tokenization,
                inputs: weights.len(),
                tokens: total_tokens,
                lane: lane.as_str(),
            })
        });
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let limit = policy::max_queue(self.default_max_queue);
        let (waiting, deadline) = self.enqueue(encodings, lane, request_id, limit);
        let sequences = waiting.len();
        let mut abandoned = Abandoned {
            queue: &self.queue,
            request: request_id,
            finished: false,
        };
        let hot = lane == Lane::Interactive;
        // The first failure drops the other receivers, which makes the queue skip their
        // sequences.
        let joined = try_join_all(waiting.into_iter().map(|(prompt_tokens, rx)| async move {
            let result = self
                .hot_wait
                .receive(rx, hot)
                .await
                .unwrap_or(Err(QueueError::Backend(BackendError::Stopped)))
                .map_err(|e| match e {
                    QueueError::Backend(e) => InferError::Backend(e),
                    QueueError::Expired => InferError::QueueTimeout(limit.unwrap_or_default()),
                })?;
            self.note_run(prompt_tokens, lane, &result);
            let meta = InferMetadata {
                prompt_tokens,
                tokenization,
                queue: result.queue,
                handover: result.handover,
                inference: result.inference,
            };
            Ok::<_, InferError>((result, meta))
        }));
        let results = match (deadline, limit) {
            (Some(at), Some(limit)) => {
                self.until_deadline(joined, at, limit, request_id, sequences)
                    .await
            }
            _ => joined.await,
        };
        let timed_out = matches!(results, Err(InferError::QueueTimeout(_)));
        if timed_out {
            self.metrics.inc("te_queue_timeout_count", &[]);
        }
        // Timed out, none of it is queued any more.
        abandoned.finished = results.is_ok() || timed_out;
        Ok(by_input(results?, &weights))
    }

    /// Notes the batch that ran one of a recorded request's sequences.
    fn note_run(&self, tokens: usize, lane: Lane, result: &InferResult) {
        if !record::is_recording() {
            return;
        }
        let device = self
            .info
            .device_names()
            .get(result.device)
            .cloned()
            .unwrap_or_else(|| result.device.to_string());
        let batch = BatchRun {
            started: result.started,
            duration: result.inference,
            device,
            size: result.batch_size,
            tokens: result.batch_tokens,
        };
        record::note(|r| {
            r.sequences.push(SequenceRun {
                tokens,
                queued_at: result.started - result.queue,
                lane: lane.as_str(),
                batch,
            })
        });
    }

    /// Awaits `results`, a request's, whose sequences may not start after `deadline`: at the
    /// deadline, the request is taken out of the queue and answered
    /// [`InferError::QueueTimeout`] if none of it has started (packing answers sequences
    /// found expired the same way, so none reaches the backend late; this answers the client
    /// on time even while no batch is packed); if some of it has, it runs to the end.
    async fn until_deadline<T>(
        &self,
        results: impl Future<Output = Result<T, InferError>>,
        deadline: Instant,
        limit: Duration,
        request_id: RequestId,
        sequences: usize,
    ) -> Result<T, InferError> {
        let mut results = std::pin::pin!(results);
        tokio::select! {
            biased;
            done = &mut results => return done,
            _ = tokio::time::sleep_until(deadline.into()) => {}
        }
        if self.queue.expire_request(request_id, sequences) {
            return Err(InferError::QueueTimeout(limit));
        }
        results.await
    }

    /// Queues one request's sequences (each of its kind) in `lane`, to start within `limit` if given; returns
    /// each one's token count and receiver, and the deadline.
    fn enqueue(
        &self,
        encodings: Vec<(BatchKind, ValidEncoding)>,
        lane: Lane,
        request_id: RequestId,
        limit: Option<Duration>,
    ) -> (Vec<(usize, Waiting)>, Option<Instant>) {
        let watch = HandoverWatch::start();
        let queued_at = Instant::now();
        let deadline = policy::queue_deadline(queued_at, limit);
        let mut waiting = Vec::with_capacity(encodings.len());
        let entries: Vec<Entry> = encodings
            .into_iter()
            .map(|(kind, encoding)| {
                let (response_tx, rx) = oneshot::channel();
                waiting.push((encoding.input_ids.len(), rx));
                Entry {
                    encoding,
                    kind,
                    lane,
                    metadata: Metadata {
                        response_tx,
                        request_id,
                        queued_at,
                        deadline,
                    },
                }
            })
            .collect();
        if lane == Lane::Interactive {
            self.direct.submit(entries);
        } else {
            self.queue.append(entries);
        }
        if let Some(watch) = watch {
            watch.finish(request_id, lane.as_str());
        }
        // Recorded once the sequences are on their way: a query waits for nothing else.
        for (prompt_tokens, _) in &waiting {
            self.metrics
                .observe("te_request_input_length", &[], *prompt_tokens as f64);
        }
        (waiting, deadline)
    }

    /// Pooled embeddings, one per input: truncated to `dimensions` (Matryoshka) first, then
    /// normalized.
    pub async fn embed_pooled(
        &self,
        request: InferRequest,
        normalize: bool,
        dimensions: Option<usize>,
    ) -> Result<Vec<(Vec<f32>, InferMetadata)>, InferError> {
        let results = self.run(request, BatchKind::Pooled, None).await?;
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
        request: InferRequest,
    ) -> Result<Vec<(Vec<Vec<f32>>, InferMetadata)>, InferError> {
        let results = self.run(request, BatchKind::AllTokens, None).await?;
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

    /// Late interaction: each input's MaxSim score against `query` (row-major vectors of the
    /// model's embedding size), computed where the inputs run. The inputs are documents as
    /// the model reads them (prefix in, cut to length); the runtime drops their skiplist
    /// tokens' vectors. Documents of other requests may share their batches.
    pub async fn maxsim(
        &self,
        request: InferRequest,
        query: Arc<[f32]>,
    ) -> Result<Vec<(f32, InferMetadata)>, InferError> {
        let results = self.run(request, BatchKind::MaxSim, Some(query)).await?;
        Ok(results
            .into_iter()
            .map(|(result, meta)| (result.values.first().copied().unwrap_or(0.0), meta))
            .collect())
    }

    /// SPLADE sparse vectors, one per input: the active dimensions as (vocabulary index,
    /// value), in index order.
    pub async fn embed_sparse(
        &self,
        request: InferRequest,
    ) -> Result<Vec<(Vec<(u32, f32)>, InferMetadata)>, InferError> {
        let results = self.run(request, BatchKind::Sparse, None).await?;
        Ok(results
            .into_iter()
            .map(|(result, meta)| (sparse_pairs(&result.values), meta))
            .collect())
    }

    /// Classification scores, one per label, activated unless `raw_scores`, for each input.
    pub async fn predict(
        &self,
        request: InferRequest,
        raw_scores: bool,
    ) -> Result<Vec<(Vec<f32>, InferMetadata)>, InferError> {
        let results = self.run(request, BatchKind::Predict, None).await?;
        Ok(results
            .into_iter()
            .map(|(result, meta)| {
                let mut scores = result.values;
                if !raw_scores {
                    activate(&mut scores, self.info.activation());
                }
                (scores, meta)
            })
            .collect())
    }
}

/// Each input's result from its sequences' (in order, `weights[i]` for input `i`'s windows):
/// an input of several windows gets the mean of their vectors weighted by their token counts,
/// the sum of their tokens, and the longest of their waits.
fn by_input(
    results: Vec<(InferResult, InferMetadata)>,
    weights: &[Vec<usize>],
) -> Vec<(InferResult, InferMetadata)> {
    let mut results = results.into_iter();
    weights
        .iter()
        .map(|weights| {
            let mut windows = results.by_ref().take(weights.len());
            let (mut result, mut meta) = windows.next().expect("every input has a window");
            if weights.len() == 1 {
                return (result, meta);
            }
            let mut vectors = vec![std::mem::take(&mut result.values)];
            for (r, m) in windows {
                meta.prompt_tokens += m.prompt_tokens;
                meta.queue = meta.queue.max(m.queue);
                meta.handover = meta.handover.max(m.handover);
                meta.inference = meta.inference.max(m.inference);
                result.queue = result.queue.max(r.queue);
                result.inference = result.inference.max(r.inference);
                vectors.push(r.values);
            }
            result.values = weighted_mean(&vectors, weights);
            (result, meta)
        })
        .collect()
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_devices;
#[cfg(test)]
mod tests_maxsim;
