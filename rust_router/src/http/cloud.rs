//! Routes that take the body of whichever route the model serves: `POST /`, SageMaker's
//! `POST /invocations` (with `GET /ping`, the health probe) and Vertex AI's `POST /vertex`
//! (`{"instances": [body, ...]}` → `{"predictions": [answer, ...]}`).

use super::body::{Body, TeiJson};
use super::classify::{predict, rerank};
use super::embed::{embed, similarity};
use super::error::{ApiError, ErrorResponse};
use super::model_routes::{not_served, require, Needs};
use super::openapi::Refusals;
use super::response_meta::{as_one_request, ResponseMeta};
use super::sparse::{embed_sparse, EmbedSparseRequest};
use super::state::AppState;
use super::types::{EmbedRequest, PredictRequest};
use crate::backend::ModelType;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Instant;
use utoipa::openapi::schema::{AnyOfBuilder, Ref, Schema};
use utoipa::openapi::RefOr;
use utoipa::ToSchema;

/// `anyOf` the named component schemas: one body can fit several of them
/// (`{"inputs": "text"}` is an `/embed` and a `/predict` body), which `oneOf` would forbid.
fn any_of(names: &[&str]) -> RefOr<Schema> {
    names
        .iter()
        .fold(AnyOfBuilder::new(), |any, name| {
            any.item(Ref::from_schema_name(*name))
        })
        .into()
}

/// Documentation-only: the body of `/embed`, `/embed_sparse`, `/similarity`, `/predict` or
/// `/rerank`.
pub struct InvocationDoc;

impl utoipa::PartialSchema for InvocationDoc {
    fn schema() -> RefOr<Schema> {
        any_of(&[
            "EmbedRequest",
            "EmbedSparseRequest",
            "SimilarityRequest",
            "PredictRequest",
            "RerankRequest",
        ])
    }
}

impl ToSchema for InvocationDoc {}

/// Documentation-only: the answer of that route.
pub struct InvocationAnswerDoc;

impl utoipa::PartialSchema for InvocationAnswerDoc {
    fn schema() -> RefOr<Schema> {
        any_of(&[
            "EmbedResponse",
            "EmbedSparseResponse",
            "SimilarityResponse",
            "PredictResponse",
            "RerankResponse",
        ])
    }
}

impl ToSchema for InvocationAnswerDoc {}

#[derive(Debug, Deserialize, ToSchema)]
pub struct VertexRequest {
    /// One body per instance, each as `POST /` takes it.
    #[schema(value_type = Vec<InvocationDoc>, min_items = 1)]
    pub instances: Vec<Value>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct VertexResponse {
    /// One answer per instance, in order.
    #[schema(value_type = Vec<InvocationAnswerDoc>)]
    pub predictions: Vec<Value>,
}

fn bad_json(err: serde_json::Error) -> Response {
    ApiError::validation(format!("Failed to parse the JSON body: {err}")).into_response()
}

/// Runs `body` on the route it is shaped for. A rerank body (`query` + `texts`) and a
/// similarity body (`inputs: {source_sentence, ...}`) are told by their fields; any other
/// body is the model's own route's (`/embed`, `/embed_sparse` for SPLADE models, or
/// `/predict` for classifiers and rerankers).
/// A body of a route the model does not serve is 424, like that route itself. The body's
/// `model`, if any, picks the model first.
pub(crate) async fn dispatch(state: AppState, body: Value) -> Response {
    // The body's `model` picks the model whose type decides the route (the route's handler
    // selects it again from the same field).
    let named = body.get("model").and_then(Value::as_str);
    let model = match state.for_model(named) {
        Ok(selected) => selected.infer.info().model_type,
        Err(e) => return e.into_response(),
    };
    let is_rerank = body.get("query").is_some() && body.get("texts").is_some();
    let is_similarity = body
        .get("inputs")
        .is_some_and(|i| i.is_object() && i.get("source_sentence").is_some());
    if is_rerank {
        if let Err(e) = require(model, Needs::Reranker, "/rerank") {
            return e.into_response();
        }
        return match serde_json::from_value(body) {
            Ok(r) => rerank(State(state), Body(r)).await,
            Err(e) => bad_json(e),
        };
    }
    if is_similarity {
        if let Err(e) = require(model, Needs::Embedding, "/similarity") {
            return e.into_response();
        }
        return match serde_json::from_value(body) {
            Ok(r) => similarity(State(state), Body(r)).await,
            Err(e) => bad_json(e),
        };
    }
    if model == ModelType::Sparse {
        return match serde_json::from_value::<EmbedSparseRequest>(body) {
            Ok(r) => embed_sparse(State(state), Body(r)).await,
            Err(e) => bad_json(e),
        };
    }
    if model == ModelType::Embedding {
        match serde_json::from_value::<EmbedRequest>(body.clone()) {
            Ok(r) => embed(State(state), Body(r)).await,
            Err(_) if serde_json::from_value::<PredictRequest>(body).is_ok() => {
                not_served(model, "/predict").into_response()
            }
            Err(e) => bad_json(e),
        }
    } else {
        match serde_json::from_value::<PredictRequest>(body.clone()) {
            Ok(r) => predict(State(state), Body(r)).await,
            Err(_) if serde_json::from_value::<EmbedRequest>(body).is_ok() => {
                not_served(model, "/embed").into_response()
            }
            Err(e) => bad_json(e),
        }
    }
}

/// The body of `/embed`, `/similarity`, `/predict` or `/rerank`, by model type.
#[utoipa::path(
    post, path = "/", tag = "Text Embeddings Inference",
    request_body = InvocationDoc,
    responses(
        (status = 200, description = "The answer of the route the body is for", body = InvocationAnswerDoc),
        (status = 400, description = "Empty input", body = ErrorResponse),
        (status = 422, description = "Invalid input (as the route the body is for)", body = ErrorResponse),
        (status = 424, description = "Inference failed, or the body is for a route the model does not serve", body = ErrorResponse),
        Refusals,
    )
)]
pub async fn root(State(state): State<AppState>, req: TeiJson<Value>) -> Response {
    dispatch(state, req.0).await
}

/// SageMaker's inference route: the same as `POST /`.
#[utoipa::path(
    post, path = "/invocations", tag = "Text Embeddings Inference",
    request_body = InvocationDoc,
    responses(
        (status = 200, description = "The answer of the route the body is for", body = InvocationAnswerDoc),
        (status = 400, description = "Empty input", body = ErrorResponse),
        (status = 422, description = "Invalid input (as the route the body is for)", body = ErrorResponse),
        (status = 424, description = "Inference failed, or the body is for a route the model does not serve", body = ErrorResponse),
        Refusals,
    )
)]
pub async fn invocations(State(state): State<AppState>, req: TeiJson<Value>) -> Response {
    dispatch(state, req.0).await
}

/// Vertex AI's prediction route: each instance runs as `POST /` would run it (at the same
/// time, so they batch together); the first failing instance's error is the answer. The
/// metrics count one request, however many instances it has: with several models served, one
/// of the model its first instance names.
#[utoipa::path(
    post, path = "/vertex", tag = "Text Embeddings Inference",
    request_body = VertexRequest,
    responses(
        (status = 200, description = "One prediction per instance", body = VertexResponse),
        (status = 400, description = "No instances, or an empty input", body = ErrorResponse),
        (status = 422, description = "Invalid input: more instances than `--max-client-batch-size`, or an invalid instance", body = ErrorResponse),
        (status = 424, description = "Inference failed, or an instance is for a route the model does not serve", body = ErrorResponse),
        Refusals,
    )
)]
pub async fn vertex(State(state): State<AppState>, req: TeiJson<VertexRequest>) -> Response {
    let start = Instant::now();
    let instances = req.0.instances;
    if let Err(e) = state.check_batch(instances.len(), "instances") {
        return e.into_response();
    }
    // An unknown name is the instance's own 404; the request then counts as the default's.
    let named = instances[0].get("model").and_then(Value::as_str);
    let counted = state.for_model(named).unwrap_or_else(|_| state.clone());
    let answers = join_all(
        instances
            .into_iter()
            .map(|body| dispatch(state.clone(), body)),
    );
    let (answers, metas) = as_one_request(&counted, answers).await;
    let mut predictions = Vec::with_capacity(answers.len());
    for answer in answers {
        if !answer.status().is_success() {
            return answer;
        }
        let bytes = match axum::body::to_bytes(answer.into_body(), usize::MAX).await {
            Ok(bytes) => bytes,
            Err(e) => {
                return ApiError::new(super::error::ErrorType::Backend, e.to_string())
                    .into_response()
            }
        };
        match serde_json::from_slice(&bytes) {
            Ok(value) => predictions.push(value),
            Err(e) => {
                return ApiError::new(super::error::ErrorType::Backend, e.to_string())
                    .into_response()
            }
        }
    }
    let headers = ResponseMeta::merged(start, &metas).finish(&counted, "batch");
    (headers, Json(VertexResponse { predictions })).into_response()
}
