//! What the handlers share: the [`AppState`] every route gets, and the server settings they
//! read ([`ServeConfig`]).

use super::error::ApiError;
use super::model_routes;
use super::quantize;
use super::types::{self, Info};
use crate::infer::Infer;
use crate::metrics::Metrics;
use crate::shutdown::Shutdown;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::time::Duration;

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

    /// Turns a handler result into a response (failures are counted by
    /// [`record_failures`](super::record_failures)).
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
