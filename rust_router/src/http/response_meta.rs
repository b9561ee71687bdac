//! Timings of one HTTP request ([`ResponseMeta`]): reported in the answer's headers, the
//! debug log and the request metrics; `/vertex` records its instances as one request
//! ([`as_one_request`]). A route's answer before it is an HTTP response is an [`Answered`]:
//! the gRPC API answers from the same.

use super::state::AppState;
use crate::infer::InferMetadata;
use axum::http::{HeaderMap, HeaderValue};
use std::cell::RefCell;
use std::time::{Duration, Instant};

tokio::task_local! {
    /// Set while `/vertex` runs its instances through the routes' handlers: each instance's
    /// timings land here instead of in the request metrics, and `/vertex` records the
    /// request once ([`ResponseMeta::merged`]).
    static INSTANCES: RefCell<Vec<ResponseMeta>>;
}

/// Runs `instances` (the handlers of `/vertex`'s instances) as one request: returns their
/// output and their timings, which are not recorded one by one (see [`INSTANCES`]).
pub(crate) async fn as_one_request<F: std::future::Future>(
    state: &AppState,
    instances: F,
) -> (F::Output, Vec<ResponseMeta>) {
    let run = async {
        let output = instances.await;
        (output, INSTANCES.with(|metas| metas.take()))
    };
    let counted = state.infer.one_request(true, run);
    INSTANCES.scope(RefCell::default(), counted).await
}

/// A route's answer, recorded in the metrics: its body, the timing headers and the timings.
#[derive(Debug)]
pub(crate) struct Answered<T> {
    pub body: T,
    pub headers: HeaderMap,
    pub meta: ResponseMeta,
}

/// Timings of one HTTP request, reported in headers, logs and metrics.
#[derive(Debug, Clone)]
pub(crate) struct ResponseMeta {
    pub compute_chars: usize,
    pub compute_tokens: usize,
    /// The inputs (sequences) the times are averaged over.
    pub sequences: usize,
    pub start: Instant,
    pub tokenization: Duration,
    pub queue: Duration,
    /// The part of `queue` before a backend thread had the batch (the debug log's
    /// `handover_time`).
    pub handover: Duration,
    pub inference: Duration,
}

impl ResponseMeta {
    /// Token counts add up; per-sequence times are averaged over the request's inputs, as TEI
    /// reports them.
    pub fn new(start: Instant, compute_chars: usize, metas: &[InferMetadata]) -> Self {
        let n = metas.len().max(1) as u32;
        let sum = |f: fn(&InferMetadata) -> Duration| metas.iter().map(f).sum::<Duration>() / n;
        Self {
            compute_chars,
            compute_tokens: metas.iter().map(|m| m.prompt_tokens).sum(),
            sequences: metas.len(),
            start,
            tokenization: sum(|m| m.tokenization),
            queue: sum(|m| m.queue),
            handover: sum(|m| m.handover),
            inference: sum(|m| m.inference),
        }
    }

    /// One request of several parts (`/vertex`'s instances) that started at `start`: counts
    /// add up, per-sequence times are averaged over every part's sequences.
    pub fn merged(start: Instant, parts: &[ResponseMeta]) -> Self {
        let sequences: usize = parts.iter().map(|p| p.sequences).sum();
        let mean = |f: fn(&ResponseMeta) -> Duration| {
            let total: Duration = parts.iter().map(|p| f(p) * p.sequences as u32).sum();
            total / sequences.max(1) as u32
        };
        Self {
            compute_chars: parts.iter().map(|p| p.compute_chars).sum(),
            compute_tokens: parts.iter().map(|p| p.compute_tokens).sum(),
            sequences,
            start,
            tokenization: mean(|p| p.tokenization),
            queue: mean(|p| p.queue),
            handover: mean(|p| p.handover),
            inference: mean(|p| p.inference),
        }
    }

    /// A route's answer `body`, recorded as [`ResponseMeta::finish`] records it.
    pub fn answer<T>(self, state: &AppState, method: &str, body: T) -> Answered<T> {
        let headers = self.finish(state, method);
        Answered {
            body,
            headers,
            meta: self,
        }
    }

    /// The answer's timing headers; records the request in the metrics (and the debug log),
    /// unless it is an instance of a `/vertex` request, which records itself.
    pub fn finish(&self, state: &AppState, method: &str) -> HeaderMap {
        let instance = INSTANCES.try_with(|metas| metas.borrow_mut().push(self.clone()));
        if instance.is_err() {
            self.record(state, method);
        }
        self.headers(state)
    }

    fn record(&self, state: &AppState, method: &str) {
        let total = self.start.elapsed();
        let m = state.infer.metrics();
        m.inc("te_request_success", &[("method", method)]);
        m.observe("te_request_duration", &[], total.as_secs_f64());
        m.observe(
            "te_request_tokenization_duration",
            &[],
            self.tokenization.as_secs_f64(),
        );
        m.observe("te_request_queue_duration", &[], self.queue.as_secs_f64());
        m.observe(
            "te_request_inference_duration",
            &[],
            self.inference.as_secs_f64(),
        );
        tracing::debug!(
            total_time = ?total,
            tokenization_time = ?self.tokenization,
            queue_time = ?self.queue,
            handover_time = ?self.handover,
            inference_time = ?self.inference,
            compute_tokens = self.compute_tokens,
            "success"
        );
    }

    fn headers(&self, state: &AppState) -> HeaderMap {
        let total = self.start.elapsed();
        let ms = |d: Duration| HeaderValue::from(d.as_millis() as u64);
        let mut h = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&state.config.compute_type) {
            h.insert("x-compute-type", v);
        }
        h.insert("x-compute-time", ms(total));
        h.insert(
            "x-compute-characters",
            HeaderValue::from(self.compute_chars),
        );
        h.insert("x-compute-tokens", HeaderValue::from(self.compute_tokens));
        h.insert("x-total-time", ms(total));
        h.insert("x-tokenization-time", ms(self.tokenization));
        h.insert("x-queue-time", ms(self.queue));
        h.insert("x-inference-time", ms(self.inference));
        h
    }
}
