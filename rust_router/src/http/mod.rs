//! The HTTP surface: `app()` builds the whole router from an [`AppState`], so handlers are
//! tested with `oneshot` and no socket; `server.rs` only binds and serves it.

pub(crate) mod auth;
mod body;
pub(crate) mod classify;
mod cloud;
mod docs;
pub(crate) mod embed;
pub mod error;
mod fields;
mod info;
pub(crate) mod meta;
pub mod model_routes;
pub mod models;
pub mod multivector;
mod openai;
mod openapi;
pub mod quantize;
pub mod rerank_compat;
pub(crate) mod response_meta;
pub(crate) mod sparse;
pub mod state;
mod traced;
pub mod types;

pub use state::{AppContext, AppState, ModelDirectory, ModelEntry, ServeConfig};

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
mod tests_long_input;
#[cfg(test)]
mod tests_metrics;
#[cfg(test)]
mod tests_models;
#[cfg(test)]
mod tests_priority;
#[cfg(test)]
mod tests_sparse;
#[cfg(test)]
mod tests_types;
#[cfg(test)]
mod tests_validation;

use crate::shutdown::Phase;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use error::{is_openai_path, shutting_down, ApiError, ErrorType};
use futures_util::FutureExt as _;
use std::panic::AssertUnwindSafe;
use tower_http::cors::{AllowOrigin, CorsLayer};

/// Counts every error answer in `te_request_failure{err=...}` and logs it, whichever layer
/// produced it (a handler, the body extractor, auth, the router's fallback); with several
/// models served, in the series of the model the request was routed to, if it reached one.
/// (A middleware's state is cloned for every request: `AppState` is one `Arc`.)
async fn record_failures(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let (response, routed) = state.noting_model(next.run(req)).await;
    if let Some(kind) = response.extensions().get::<ErrorType>().copied() {
        state.count_failure(routed, kind.metric_label());
        let status = response.status().as_u16();
        if response.status().is_server_error() || kind == ErrorType::Backend {
            tracing::error!(status, error_type = kind.metric_label(), "request failed");
        } else {
            tracing::info!(status, error_type = kind.metric_label(), "request refused");
        }
    }
    response
}

/// The gate in front of every route but the probes (`GET /`, `/health`, `/ping`), metrics and
/// docs. Once the server is draining, a request that arrives is answered 503 at once: the
/// work accepted before the signal finishes, nothing new starts (the client retries
/// elsewhere, as the load balancer does once `/health` says 503). Then, with `--api-key`,
/// `Authorization: Bearer <key>`. A request let through whose client leaves before the
/// answer is counted once in `te_request_failure{err="dropped"}` ([`Unanswered`]).
async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if state.shutdown.is_draining() {
        return shutting_down(is_openai_path(req.uri().path()), error::DRAINING);
    }
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match auth::authorize(state.config.api_key.as_deref(), authorization) {
        Ok(()) => Unanswered::run(&state, next, req).await,
        Err(e) => e.openai(is_openai_path(req.uri().path())).into_response(),
    }
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
                .count_failure(AppState::routed_so_far(), "dropped");
        }
    }
}

/// The request header that bounds a request's wait in the queue (over `--max-queue-ms`).
pub(crate) const MAX_QUEUE_HEADER: &str = "x-max-queue-ms";

/// Reads `X-Max-Queue-Ms` on the routes that run the model and makes it the queue deadline of
/// every inference call the handler makes; a value that is not a whole number of milliseconds
/// from 1 to `infer::MAX_QUEUE_MS_CAP` is refused with 422 before the body is read.
async fn queue_deadline(req: Request, next: Next) -> Response {
    let Some(value) = req.headers().get(MAX_QUEUE_HEADER) else {
        return next.run(req).await;
    };
    let limit = value
        .to_str()
        .map_err(|_| "must be a whole number of milliseconds, got bytes that are not text".into())
        .and_then(crate::infer::parse_max_queue_ms);
    match limit {
        Ok(limit) => crate::infer::with_max_queue(limit, next.run(req)).await,
        Err(why) => ApiError::validation(format!(
            "Input validation error: header `X-Max-Queue-Ms` {why}"
        ))
        .openai(is_openai_path(req.uri().path()))
        .into_response(),
    }
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
        .allow_headers([
            header::CONTENT_TYPE,
            header::AUTHORIZATION,
            HeaderName::from_static(MAX_QUEUE_HEADER),
        ])
        .allow_origin(allow_origin)
}

/// The whole HTTP application.
pub fn app(state: AppState) -> Router {
    // The routes that run the model (`openapi::INFERENCE_ROUTES`), which take a queue deadline.
    let inference = Router::new()
        .route("/", post(cloud::root))
        .route("/invocations", post(cloud::invocations))
        .route("/vertex", post(cloud::vertex))
        .route("/embed", post(embed::embed))
        .route("/embed_all", post(embed::embed_all))
        .route("/embed_multivector", post(multivector::embed_multivector))
        .route("/embed_sparse", post(sparse::embed_sparse))
        .route("/similarity", post(embed::similarity))
        .route("/predict", post(classify::predict))
        .route("/rerank", post(classify::rerank))
        .route("/v1/rerank", post(rerank_compat::rerank_v1))
        .route("/v2/rerank", post(rerank_compat::rerank_v2))
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/embeddings", post(openai::embeddings))
        .route_layer(middleware::from_fn(queue_deadline));
    // Only a server that exports spans has the layer: without `--otlp-endpoint`, requests
    // pass through nothing more.
    let inference = match &state.config.tracing {
        Some(_) => inference.route_layer(middleware::from_fn_with_state(
            state.clone(),
            traced::traced,
        )),
        None => inference,
    };
    let protected = inference
        .route("/info", get(meta::info))
        .route("/v1/models", get(models::list))
        .route("/tokenize", post(meta::tokenize))
        .route("/decode", post(meta::decode))
        .route_layer(middleware::from_fn_with_state(state.clone(), guard));
    // Probes and scrapers must work without the key.
    let public = Router::new()
        .route("/", get(meta::root_probe))
        .route("/health", get(meta::health))
        .route("/ping", get(meta::health))
        .route("/metrics", get(meta::metrics))
        .route("/openapi.json", get(docs::openapi))
        // `/docs` and `/api-doc/openapi.json`.
        .merge(docs::swagger_ui());
    let payload_limit = state.config.payload_limit;
    let cors = cors_layer(state.config.cors_allow_origin.as_deref());
    protected
        .merge(public)
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            record_failures,
        ))
        .with_state(state)
        .layer(DefaultBodyLimit::max(payload_limit))
        .layer(cors)
}
