//! Routes around inference: tokenize, decode, info, health and metrics.

use super::body::TeiJson;
use super::error::{ApiError, ErrorResponse, ErrorType};
use super::openapi::{AuthRefusal, BodyRefusals};
use super::state::AppState;
use super::types::*;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::try_join_all;

/// Tokenize inputs; offsets are character positions in the (prompted) input.
#[utoipa::path(
    post, path = "/tokenize", tag = "Text Embeddings Inference",
    request_body = TokenizeRequest,
    responses(
        (status = 200, description = "Tokenized ids", body = TokenizeResponse),
        (status = 400, description = "Empty input", body = ErrorResponse),
        (status = 422, description = "Invalid input: malformed body, more inputs than `--max-client-batch-size`, an unknown `prompt_name`, or the tokenizer failed", body = ErrorResponse),
        (status = 503, description = "The tokenization workers have stopped, or the server is shutting down", body = ErrorResponse),
        BodyRefusals,
    )
)]
pub async fn tokenize(State(state): State<AppState>, req: TeiJson<TokenizeRequest>) -> Response {
    let result = tokenize_answer(&state, req.0)
        .await
        .map(|tokens| Json(TokenizeResponse(tokens)));
    state.finish(result)
}

/// `/tokenize`'s answer to `req` (also the gRPC `Tokenize` call's): each input's tokens.
pub(crate) async fn tokenize_answer(
    state: &AppState,
    req: TokenizeRequest,
) -> Result<Vec<Vec<SimpleToken>>, ApiError> {
    let state = state.for_model(req.model.as_deref())?;
    let inputs = match req.inputs {
        TokenizeInput::Single(s) => vec![s],
        TokenizeInput::Batch(b) => b,
    };
    state.check_batch(inputs.len(), "inputs")?;
    let tokenization = state.infer.tokenization();
    let tokens = try_join_all(inputs.into_iter().map(|input| {
        tokenization.tokenize(input, req.add_special_tokens, req.prompt_name.clone())
    }))
    .await?;
    Ok(tokens
        .into_iter()
        .map(|seq| {
            seq.into_iter()
                .map(|t| SimpleToken {
                    id: t.id,
                    text: t.text,
                    special: t.special,
                    start: t.start,
                    stop: t.stop,
                })
                .collect()
        })
        .collect())
}

/// Decode token ids back to text.
#[utoipa::path(
    post, path = "/decode", tag = "Text Embeddings Inference",
    request_body = DecodeRequest,
    responses(
        (status = 200, description = "Decoded texts", body = DecodeResponse),
        (status = 400, description = "Empty input", body = ErrorResponse),
        (status = 422, description = "Invalid input: malformed body, more lists than `--max-client-batch-size`, token ids outside the vocabulary, or the tokenizer failed", body = ErrorResponse),
        (status = 503, description = "The tokenization workers have stopped, or the server is shutting down", body = ErrorResponse),
        BodyRefusals,
    )
)]
pub async fn decode(State(state): State<AppState>, req: TeiJson<DecodeRequest>) -> Response {
    let result = decode_answer(&state, req.0)
        .await
        .map(|texts| Json(DecodeResponse(texts)));
    state.finish(result)
}

/// `/decode`'s answer to `req` (also the gRPC `Decode` call's): each list's text.
pub(crate) async fn decode_answer(
    state: &AppState,
    req: DecodeRequest,
) -> Result<Vec<String>, ApiError> {
    let state = state.for_model(req.model.as_deref())?;
    let ids = match req.ids {
        InputIds::Single(ids) => vec![ids],
        InputIds::Batch(b) => b,
    };
    state.check_batch(ids.len(), "ids")?;
    if ids.iter().any(Vec::is_empty) {
        return Err(ApiError::empty("ids"));
    }
    let tokenization = state.infer.tokenization();
    Ok(try_join_all(
        ids.into_iter()
            .map(|ids| tokenization.decode(ids, req.skip_special_tokens)),
    )
    .await?)
}

/// Text Embeddings Inference endpoint info.
#[utoipa::path(
    get, path = "/info", tag = "Text Embeddings Inference",
    params(ModelQuery),
    responses(
        (status = 200, description = "The default model's info, or with `?model=NAME` that model's", body = Info),
        (status = 404, description = "With several models served, `model` names none of them", body = ErrorResponse),
        (status = 503, description = "The server is shutting down", body = ErrorResponse),
        AuthRefusal,
    )
)]
pub async fn info(State(state): State<AppState>, Query(query): Query<ModelQuery>) -> Response {
    match info_answer(&state, query.model.as_deref()) {
        Ok(info) => Json(info).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `/info`'s answer for the model `model` names (also the gRPC `Info` call's).
pub(crate) fn info_answer(state: &AppState, model: Option<&str>) -> Result<Info, ApiError> {
    let state = state.for_model(model)?;
    let mut info = state.info.as_ref().clone();
    info.devices = state
        .infer
        .devices()
        .into_iter()
        .map(DeviceInfo::from)
        .collect();
    Ok(info)
}

/// `?model=NAME` of the GET routes that describe one model.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
pub struct ModelQuery {
    /// A served model's name (`/v1/models`); the default model when absent.
    pub model: Option<String>,
}

/// The base URL's probe (load balancers often probe `GET /`): as `/health`.
#[utoipa::path(
    get, path = "/", tag = "Text Embeddings Inference",
    responses(
        (status = 200, description = "Everything is working fine"),
        (status = 503, description = "The model cannot run, or the server is shutting down", body = ErrorResponse),
    )
)]
pub async fn root_probe(state: State<AppState>) -> Response {
    health(state).await
}

/// Health check: runs the model's own health method on every healthy device's backend thread.
#[utoipa::path(
    get, path = "/health", tag = "Text Embeddings Inference",
    responses(
        (status = 200, description = "At least one device serves. The body is empty while every device is healthy; with a device failed it is JSON naming the unhealthy ones (schema `HealthDegraded`): `{\"status\": \"degraded\", \"unhealthy_devices\": [{\"index\": 1, \"name\": \"cuda:1\"}]}`"),
        (status = 503, description = "No device can run the model (the message says why for each), or the server is shutting down", body = ErrorResponse),
    )
)]
pub async fn health(State(state): State<AppState>) -> Response {
    match serving(&state).await {
        Ok(degraded) if degraded.is_empty() => StatusCode::OK.into_response(),
        Ok(degraded) => {
            let body = HealthDegraded {
                status: "degraded",
                unhealthy_devices: degraded,
            };
            (StatusCode::OK, Json(body)).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// Whether the server serves (also the gRPC health service's answer): `Ok` with the devices
/// that failed while every model has one that serves, else why not.
pub(crate) async fn serving(state: &AppState) -> Result<Vec<DeviceRef>, ApiError> {
    if state.shutdown.is_draining() {
        // Answered at once, so a load balancer stops sending before connections close.
        return Err(ApiError::new(
            ErrorType::ShuttingDown,
            "the server is shutting down (SIGTERM received)",
        ));
    }
    // Every model's devices: the server serves while each model has a device that does.
    let several = state.models.entries().len() > 1;
    let mut degraded = Vec::new();
    for entry in state.models.entries() {
        let health = entry.infer.health().await;
        let model = &entry.spec.name;
        // Devices that failed before were logged then; only new failures are logged here.
        for f in health.failures.iter().filter(|f| !f.known) {
            match health.devices {
                1 => tracing::error!(model = %model, "health check failed: {}", f.error),
                _ => tracing::error!(
                    model = %model,
                    device = f.index,
                    name = %f.name,
                    "health check failed: {}",
                    f.error
                ),
            }
        }
        if !health.is_serving() {
            let message = match several {
                true => format!("model `{model}` is unhealthy: {}", health.message()),
                false => format!("unhealthy: {}", health.message()),
            };
            return Err(ApiError::new(ErrorType::Unhealthy, message));
        }
        degraded.extend(health.failures.into_iter().map(|f| DeviceRef {
            index: f.index,
            name: f.name,
            model: several.then(|| model.clone()),
        }));
    }
    Ok(degraded)
}

/// Prometheus metrics.
#[utoipa::path(
    get, path = "/metrics", tag = "Text Embeddings Inference",
    responses((status = 200, description = "Prometheus metrics", body = String))
)]
pub async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}
