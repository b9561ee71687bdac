//! The HTTP surface: `app()` builds the whole router from an [`AppState`], so handlers are
//! tested with `oneshot` and no socket; `server.rs` only binds and serves it.

mod classify;
mod cloud;
mod embed;
pub mod error;
mod fields;
mod info;
mod meta;
pub mod model_routes;
mod openai;
pub mod quantize;
pub mod rerank_compat;
mod sparse;
pub mod types;

#[cfg(test)]
pub(crate) mod test_util;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_cloud;
#[cfg(test)]
mod tests_compat;
#[cfg(test)]
mod tests_devices;
#[cfg(test)]
mod tests_errors;
#[cfg(test)]
mod tests_hardening;
#[cfg(test)]
mod tests_metrics;
#[cfg(test)]
mod tests_sparse;
#[cfg(test)]
mod tests_types;
#[cfg(test)]
mod tests_validation;

use crate::infer::{Infer, InferMetadata};
use crate::metrics::Metrics;
use crate::shutdown::{Phase, Shutdown};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use error::{ApiError, ErrorType};
use futures_util::FutureExt as _;
use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower_http::cors::{AllowOrigin, CorsLayer};
use types::Info;

/// Server settings the handlers need (the rest of the CLI stays in `server.rs`).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub max_client_batch_size: usize,
    pub auto_truncate: bool,
    pub served_model_name: String,
    pub api_key: Option<String>,
    pub payload_limit: usize,
    pub cors_allow_origin: Option<Vec<String>>,
    /// Value of the `x-compute-type` header (the backend's device).
    pub compute_type: String,
    /// How long a request's body may take to arrive (`--body-read-timeout`).
    pub body_read_timeout: Duration,
}

/// What the handlers share. axum clones the state for every handler and middleware call, so
/// it is one `Arc`: one reference count per clone, not one per field (those are cache lines
/// every core writes, which cost measurable throughput at many concurrent clients).
#[derive(Clone)]
pub struct AppState(Arc<AppContext>);

pub struct AppContext {
    pub infer: Infer,
    pub info: Arc<Info>,
    pub metrics: Arc<Metrics>,
    pub config: Arc<ServeConfig>,
    pub shutdown: Shutdown,
}

impl std::ops::Deref for AppState {
    type Target = AppContext;

    fn deref(&self) -> &AppContext {
        &self.0
    }
}

impl AppState {
    pub fn new(context: AppContext) -> Self {
        Self(Arc::new(context))
    }

    /// Rejects an empty request (400) and one over `--max-client-batch-size` (422).
    pub(crate) fn check_batch(&self, len: usize, field: &str) -> Result<(), ApiError> {
        if len == 0 {
            return Err(ApiError::empty(field));
        }
        let max = self.config.max_client_batch_size;
        if len > max {
            return Err(ApiError::validation(format!(
                "Input validation error: batch size {len} > maximum allowed batch size {max} \
                 (--max-client-batch-size)"
            )));
        }
        Ok(())
    }

    pub(crate) fn check_dimensions(&self, dimensions: Option<usize>) -> Result<(), ApiError> {
        let hidden = self.infer.info().hidden_size;
        match dimensions {
            Some(d) if d == 0 || d > hidden => Err(ApiError::validation(format!(
                "Input validation error: `dimensions` must be between 1 and {hidden} (the \
                 model's embedding size), got {d}"
            ))),
            _ => Ok(()),
        }
    }

    /// The output encoder of an embedding request, checked before any inference.
    pub(crate) fn encoder(
        &self,
        format: types::EncodingFormat,
        ranges: Option<quantize::Ranges>,
        normalized: bool,
        dimensions: Option<usize>,
    ) -> Result<quantize::Encoder, ApiError> {
        let dim = dimensions.unwrap_or(self.infer.info().hidden_size);
        quantize::Encoder::new(format, ranges, normalized, dim)
    }

    /// Turns a handler result into a response (failures are counted by [`record_failures`]).
    pub(crate) fn finish<T: IntoResponse>(&self, result: Result<T, ApiError>) -> Response {
        match result {
            Ok(r) => r.into_response(),
            Err(e) => e.into_response(),
        }
    }

    /// `Ok` when `route` fits the loaded model.
    pub(crate) fn require(&self, needs: model_routes::Needs, route: &str) -> Result<(), ApiError> {
        model_routes::require(self.infer.info().model_type, needs, route)
    }
}

/// Counts every error answer in `te_request_failure{err=...}` and logs it, whichever layer
/// produced it (a handler, the body extractor, auth, the router's fallback). Its state is
/// the metrics alone: a middleware's state is cloned for every request.
async fn record_failures(
    State(metrics): State<Arc<Metrics>>,
    req: Request,
    next: Next,
) -> Response {
    let response = next.run(req).await;
    if let Some(kind) = response.extensions().get::<ErrorType>().copied() {
        metrics.inc("te_request_failure", &[("err", kind.metric_label())]);
        let status = response.status().as_u16();
        if response.status().is_server_error() || kind == ErrorType::Backend {
            tracing::error!(status, error_type = kind.metric_label(), "request failed");
        } else {
            tracing::info!(status, error_type = kind.metric_label(), "request refused");
        }
    }
    response
}

/// A 503 `shutting_down` answer that closes the connection.
pub(crate) fn shutting_down(openai: bool, message: &str) -> Response {
    ApiError::new(ErrorType::ShuttingDown, message)
        .openai(openai)
        .close_connection()
        .into_response()
}

/// The answer to a request whose handler failed unexpectedly (it panicked).
pub(crate) fn handler_failed(openai: bool) -> Response {
    ApiError::new(
        ErrorType::Backend,
        "The request's handler failed unexpectedly; the server logged why",
    )
    .openai(openai)
    .into_response()
}

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
        let m = &state.metrics;
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

/// The gate in front of every route but the probes (`GET /`, `/health`, `/ping`), metrics and
/// docs. Once the server is draining, a request that arrives is answered 503 at once: the
/// work accepted before the signal finishes, nothing new starts (the client retries
/// elsewhere, as the load balancer does once `/health` says 503). Then, with `--api-key`,
/// `Authorization: Bearer <key>`. A request let through whose client leaves before the
/// answer is counted once in `te_request_failure{err="dropped"}` ([`Unanswered`]).
async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if state.shutdown.is_draining() {
        return shutting_down(
            is_openai_path(req.uri().path()),
            "The server is shutting down and takes no new requests; retry on another replica",
        );
    }
    let Some(key) = state.config.api_key.as_deref() else {
        return Unanswered::run(&state, next, req).await;
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    // Compare without an early exit so response time does not leak the key's prefix.
    let ok = given.is_some_and(|g| {
        g.len() == key.len()
            && g.bytes()
                .zip(key.bytes())
                .fold(0u8, |a, (x, y)| a | (x ^ y))
                == 0
    });
    if ok {
        return Unanswered::run(&state, next, req).await;
    }
    let message = match given {
        None => "Unauthorized: missing `Authorization: Bearer <api key>` header",
        Some(_) => "Unauthorized: invalid API key",
    };
    let openai = is_openai_path(req.uri().path());
    ApiError::new(ErrorType::Unauthorized, message)
        .openai(openai)
        .into_response()
}

/// The token of an `Authorization: Bearer <token>` value. The scheme is case-insensitive
/// (RFC 9110, 11.1: `bearer` and `BEARER` too), and one or more spaces separate it from the
/// token.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

/// A request let through the gate, until it is answered. Dropped before that, its client
/// left (the connection closed and the server dropped the handler): the request is counted
/// once in `te_request_failure{err="dropped"}`, however many inputs it had (`/vertex`:
/// however many instances). Not at the shutdown deadline, which drops the handlers it
/// answers itself and counts them as `shutting_down`, nor when the handler panics (the
/// panic goes on to the HTTP layer, which answers it).
struct Unanswered<'a> {
    state: &'a AppState,
    answered: bool,
}

impl Unanswered<'_> {
    async fn run(state: &AppState, next: Next, req: Request) -> Response {
        let mut unanswered = Unanswered {
            state,
            answered: false,
        };
        let response = AssertUnwindSafe(next.run(req)).catch_unwind().await;
        unanswered.answered = true;
        response.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.answered && self.state.shutdown.phase() < Phase::Deadline {
            self.state
                .metrics
                .inc("te_request_failure", &[("err", "dropped")]);
        }
    }
}

/// Routes that answer errors in the OpenAI shape: OpenAI's, and the Cohere/Jina rerank.
pub(crate) fn is_openai_path(path: &str) -> bool {
    path.starts_with("/v1/") || path == "/embeddings" || path == "/v2/rerank"
}

/// A route asked with a method it does not take: 405 in the route's error shape. axum adds
/// the `Allow` header, which lists the methods it takes.
async fn method_not_allowed(req: Request) -> Response {
    let path = req.uri().path();
    ApiError::new(
        ErrorType::MethodNotAllowed,
        format!(
            "Method not allowed: {path} does not take {} (the `Allow` header lists the \
             methods it takes)",
            req.method()
        ),
    )
    .openai(is_openai_path(path))
    .into_response()
}

async fn not_found(req: Request) -> Response {
    let path = req.uri().path().to_string();
    ApiError::new(
        ErrorType::NotFound,
        format!("Not found: no route for {} {path}", req.method()),
    )
    .openai(is_openai_path(&path))
    .into_response()
}

fn cors_layer(origins: Option<&[String]>) -> CorsLayer {
    let allow_origin = match origins {
        Some(list) if !list.iter().any(|o| o == "*") => {
            AllowOrigin::list(list.iter().filter_map(|o| o.parse::<HeaderValue>().ok()))
        }
        // TEI's default: any origin (auth, if wanted, is the API key's job).
        _ => AllowOrigin::any(),
    };
    CorsLayer::new()
        .allow_methods([Method::GET, Method::POST])
        .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION])
        .allow_origin(allow_origin)
}

/// The whole HTTP application.
pub fn app(state: AppState) -> Router {
    let protected = Router::new()
        .route("/", post(cloud::root))
        .route("/invocations", post(cloud::invocations))
        .route("/vertex", post(cloud::vertex))
        .route("/info", get(meta::info))
        .route("/embed", post(embed::embed))
        .route("/embed_all", post(embed::embed_all))
        .route("/embed_sparse", post(sparse::embed_sparse))
        .route("/similarity", post(embed::similarity))
        .route("/predict", post(classify::predict))
        .route("/rerank", post(classify::rerank))
        .route("/v1/rerank", post(rerank_compat::rerank_v1))
        .route("/v2/rerank", post(rerank_compat::rerank_v2))
        .route("/tokenize", post(meta::tokenize))
        .route("/decode", post(meta::decode))
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/embeddings", post(openai::embeddings))
        .route_layer(middleware::from_fn_with_state(state.clone(), guard));
    // Probes and scrapers must work without the key.
    let public = Router::new()
        .route("/", get(meta::root_probe))
        .route("/health", get(meta::health))
        .route("/ping", get(meta::health))
        .route("/metrics", get(meta::metrics))
        .route("/openapi.json", get(meta::openapi))
        // `/docs` and `/api-doc/openapi.json`.
        .merge(meta::swagger_ui());
    let payload_limit = state.config.payload_limit;
    let cors = cors_layer(state.config.cors_allow_origin.as_deref());
    protected
        .merge(public)
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            state.metrics.clone(),
            record_failures,
        ))
        .with_state(state)
        .layer(DefaultBodyLimit::max(payload_limit))
        .layer(cors)
}
