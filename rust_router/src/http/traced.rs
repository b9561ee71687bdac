//! The span of each request to a route that runs the model (`--otlp-endpoint`): its caller's
//! `traceparent` honoured, its tokenization, queue waits and batches noted while it runs, its
//! spans built once it is answered ([`crate::telemetry`]).

use super::error::ErrorType;
use super::state::AppState;
use crate::telemetry::record::recording;
use crate::telemetry::spans::{caller_context, Outcome, RootSpan};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::KeyValue;
use std::time::Instant;

/// Traces the request (the layer of a server that exports spans).
pub(super) async fn traced(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(tracing) = state.config.tracing.clone() else {
        return next.run(req).await;
    };
    let start = Instant::now();
    let method = req.method().to_string();
    // The inference routes are plain paths, so the path is the route.
    let route = req.uri().path().to_string();
    let parent = caller_context(req.headers());
    let (response, record) = recording(next.run(req)).await;
    let status = response.status();
    let outcome = match response.extensions().get::<ErrorType>() {
        Some(kind) => Outcome::Error(kind.metric_label().to_string()),
        None if status.is_client_error() || status.is_server_error() => {
            Outcome::Error(status.to_string())
        }
        None => Outcome::Ok,
    };
    let root = RootSpan {
        name: format!("{method} {route}"),
        parent,
        start,
        attributes: vec![
            KeyValue::new("http.request.method", method),
            KeyValue::new("http.route", route),
            KeyValue::new("http.response.status_code", i64::from(status.as_u16())),
        ],
    };
    let model = state.model_name(AppState::routed_so_far());
    tracing.export(root, model, &record, &outcome);
    response
}
