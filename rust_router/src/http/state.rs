//! What the handlers share: the [`AppState`] every route gets, and the server settings they
//! read ([`ServeConfig`]).

use super::error::ApiError;
use super::model_routes;
use super::quantize;
use super::types::{self, Info};
use crate::infer::Infer;
use crate::metrics::Metrics;
use crate::models::{LoraSpec, ModelSpec};
use crate::shutdown::Shutdown;
use crate::telemetry::RequestTracing;
use axum::response::{IntoResponse, Response};
use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

tokio::task_local! {
    /// The served model a request was routed to (its index among the served models): the
    /// first one [`AppState::for_model`] selected for it. Noted only on servers with several
    /// models ([`AppState::noting_model`]), for the `model` label of its failure.
    static ROUTED: Cell<Option<usize>>;
}

/// Server settings the handlers need (the rest of the CLI stays in `server.rs`).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub max_client_batch_size: usize,
    pub auto_truncate: bool,
    /// `--long-input`: what an over-long embedding input gets when its request says nothing.
    pub long_input: crate::tokenization::LongInput,
    /// `--max-chunks`: the most windows one input is cut into under `long_input: chunk`.
    pub max_chunks: usize,
    pub served_model_name: String,
    pub api_key: Option<String>,
    pub payload_limit: usize,
    pub cors_allow_origin: Option<Vec<String>>,
    /// Value of the `x-compute-type` header (the backend's device).
    pub compute_type: String,
    /// How long a request's body may take to arrive (`--body-read-timeout`).
    pub body_read_timeout: Duration,
    /// Where request spans go (`--otlp-endpoint`); `None`: requests are not traced.
    pub tracing: Option<RequestTracing>,
}

/// What the handlers share. axum clones the state for every handler and middleware call, so
/// it is one `Arc`: one reference count per clone, not one per field (those are cache lines
/// every core writes, which cost measurable throughput at many concurrent clients).
#[derive(Clone)]
pub struct AppState(Arc<AppContext>);

/// What a handler sees: one model (the default, or the one its request named: see
/// [`AppState::for_model`]) and what every model shares.
pub struct AppContext {
    pub infer: Infer,
    pub info: Arc<Info>,
    pub metrics: Arc<Metrics>,
    pub config: Arc<ServeConfig>,
    pub shutdown: Shutdown,
    /// Every served model, the default first.
    pub models: Arc<ModelDirectory>,
    /// The LoRA adapter the request named (`model: NAME`), by its index in the model.
    pub adapter: Option<u32>,
}

/// One served model, as the handlers use it.
pub struct ModelEntry {
    pub spec: ModelSpec,
    /// Its LoRA adapters: (spec, index in the model).
    pub adapters: Vec<(LoraSpec, u32)>,
    pub infer: Infer,
    /// Its `/info` body.
    pub info: Arc<Info>,
    pub config: Arc<ServeConfig>,
}

/// The served models by name; the first is the default.
pub struct ModelDirectory {
    entries: Vec<ModelEntry>,
    /// When serving began (Unix seconds; `created` in `/v1/models`).
    started: u64,
}

impl ModelDirectory {
    pub fn new(entries: Vec<ModelEntry>) -> Self {
        assert!(!entries.is_empty(), "a server serves at least one model");
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self { entries, started }
    }

    pub fn started(&self) -> u64 {
        self.started
    }

    pub fn entries(&self) -> &[ModelEntry] {
        &self.entries
    }

    /// The model a request's `model` names. With one model, any name selects it (a client
    /// that sends its own model name, as OpenAI's SDKs always do, keeps working as with TEI);
    /// with several, a name that is none of theirs is a 404 listing them. The default model
    /// also answers to `--served-model-name`.
    pub fn find(&self, requested: Option<&str>) -> Result<(usize, Option<u32>), ApiError> {
        let Some(name) = requested else {
            return Ok((0, None));
        };
        // An adapter's name selects its model, with the adapter's index.
        for (index, entry) in self.entries.iter().enumerate() {
            if let Some((_, adapter)) = entry.adapters.iter().find(|(a, _)| a.name == name) {
                return Ok((index, Some(*adapter)));
            }
        }
        if self.entries.len() == 1 {
            return Ok((0, None));
        }
        self.entries
            .iter()
            .position(|e| e.spec.answers_to(name) || e.config.served_model_name == name)
            .map(|index| (index, None))
            .ok_or_else(|| ApiError::unknown_model(name, &self.names()))
    }

    /// Every name a request may give: the models', then their adapters'.
    pub fn names(&self) -> Vec<&str> {
        let models = self.entries.iter().map(|e| e.spec.name.as_str());
        let adapters = self
            .entries
            .iter()
            .flat_map(|e| e.adapters.iter().map(|(a, _)| a.name.as_str()));
        models.chain(adapters).collect()
    }

    /// Closes every model's queue: each batching task ends once its queue has drained.
    pub fn shutdown(&self) {
        for entry in &self.entries {
            entry.infer.shutdown();
        }
    }
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

    /// The state of the default model.
    pub fn for_default(
        models: Arc<ModelDirectory>,
        metrics: Arc<Metrics>,
        shutdown: Shutdown,
    ) -> Self {
        Self::of((0, None), models, metrics, shutdown)
    }

    fn of(
        (index, adapter): (usize, Option<u32>),
        models: Arc<ModelDirectory>,
        metrics: Arc<Metrics>,
        shutdown: Shutdown,
    ) -> Self {
        let entry = &models.entries[index];
        Self::new(AppContext {
            infer: entry.infer.clone(),
            info: entry.info.clone(),
            config: entry.config.clone(),
            metrics,
            shutdown,
            models,
            adapter,
        })
    }

    /// The state of the model a request's `model` field names (`None`: the default one, this
    /// state itself when it is the default's). An unknown name is a 404 listing the served
    /// names.
    pub fn for_model(&self, requested: Option<&str>) -> Result<AppState, ApiError> {
        let selected = self.models.find(requested)?;
        if self.models.entries.len() > 1 {
            // Outside `noting_model` (a test's own route) there is nothing to note.
            let _ = ROUTED.try_with(|routed| {
                if routed.get().is_none() {
                    routed.set(Some(selected.0));
                }
            });
        }
        let same_model = Arc::ptr_eq(&self.info, &self.models.entries[selected.0].info);
        if same_model && selected.1 == self.adapter {
            return Ok(self.clone());
        }
        Ok(Self::of(
            selected,
            self.models.clone(),
            self.metrics.clone(),
            self.shutdown.clone(),
        ))
    }

    /// Runs `request` (all of one HTTP request's handling) and returns the served model it was
    /// routed to, where the server serves several; `None` where it reached none (an unknown
    /// route or model, a body that does not parse) or the server serves one model, whose
    /// series are unlabelled anyway.
    pub(crate) async fn noting_model<F: Future>(&self, request: F) -> (F::Output, Option<usize>) {
        if self.models.entries.len() == 1 {
            return (request.await, None);
        }
        let mut noted = std::pin::pin!(ROUTED.scope(Cell::new(None), request));
        let output = noted.as_mut().await;
        (
            output,
            noted.as_mut().take_value().and_then(Cell::into_inner),
        )
    }

    /// The model the request being handled has been routed to so far (see
    /// [`AppState::noting_model`]), for a request dropped before its answer.
    pub(crate) fn routed_so_far() -> Option<usize> {
        ROUTED.try_with(Cell::get).ok().flatten()
    }

    /// The served name of the model a request was `routed` to (the default one if none).
    pub(crate) fn model_name(&self, routed: Option<usize>) -> &str {
        let entries = self.models.entries();
        let entry = routed.and_then(|i| entries.get(i)).unwrap_or(&entries[0]);
        &entry.config.served_model_name
    }

    /// Counts a request's failure in `te_request_failure{err=...}`: in the series of the model
    /// it was `routed` to ([`AppState::noting_model`]), in the server's own where it reached
    /// none.
    pub(crate) fn count_failure(&self, routed: Option<usize>, err: &str) {
        match routed.and_then(|index| self.models.entries.get(index)) {
            Some(entry) => entry
                .infer
                .metrics()
                .inc("te_request_failure", &[("err", err)]),
            None => self.metrics.inc("te_request_failure", &[("err", err)]),
        }
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
