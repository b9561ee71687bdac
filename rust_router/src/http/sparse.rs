//! `/embed_sparse`: SPLADE sparse vectors, as TEI serves them.

use super::body::TeiJson;
use super::embed::{check_inputs, encode_options};
use super::error::{ApiError, ErrorResponse, InputNames, TRUNCATE_HINT};
use super::model_routes::Needs;
use super::openapi::InputDoc;
use super::openapi::Refusals;
use super::response_meta::{Answered, ResponseMeta};
use super::state::AppState;
use super::types::InputType;
use crate::infer::InferRequest;
use crate::tokenization::TruncationDirection;
use axum::extract::State;
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};
use std::time::Instant;
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
pub struct EmbedSparseRequest {
    /// The served model to run (`/v1/models`; a name or its full id); the default model
    /// when absent. With several models, any other name is refused with 404.
    #[serde(default)]
    pub model: Option<String>,
    #[schema(value_type = InputDoc, example = "What is Deep Learning?")]
    pub inputs: super::types::Input,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    /// A key of the model's `prompts` (listed in `/info`); any other name is refused with 422,
    /// and so is a prompt with token ids.
    #[serde(default)]
    pub prompt_name: Option<String>,
    /// `high`: the interactive lane whatever the request's size (up to one batch's
    /// `--max-batch-tokens`; a larger request runs in the bulk lane), `low`: the bulk lane even
    /// when small; absent or `null`: by size (`--interactive-max-tokens`).
    #[serde(default, deserialize_with = "super::fields::priority")]
    #[schema(value_type = Option<super::openapi::PriorityDoc>, nullable)]
    pub priority: Option<crate::infer::Priority>,
}

/// One active dimension of a sparse vector: a vocabulary index and its weight.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, ToSchema)]
pub struct SparseValue {
    pub index: usize,
    pub value: f32,
}

/// One list of active dimensions per input, in index order.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!([[{"index": 2023, "value": 1.42}, {"index": 7367, "value": 0.83}]]))]
pub struct EmbedSparseResponse(pub Vec<Vec<SparseValue>>);

/// Sparse (SPLADE) embeddings: the active vocabulary dimensions of each input. Served by
/// SPLADE models (`*ForMaskedLM` checkpoints, sentence-transformers `SparseEncoder` folders);
/// any other model answers 424.
#[utoipa::path(
    post, path = "/embed_sparse", tag = "Text Embeddings Inference",
    request_body = EmbedSparseRequest,
    responses(
        (status = 200, description = "Sparse embeddings", body = EmbedSparseResponse),
        (status = 400, description = "Empty input", body = ErrorResponse),
        (status = 422, description = "Invalid input: malformed body, more inputs than `--max-client-batch-size`, an input longer than the model's `max_input_length` tokens without truncation, token ids outside the vocabulary, an unknown `prompt_name` or one with token ids", body = ErrorResponse),
        (status = 424, description = "Inference failed, or not a SPLADE model", body = ErrorResponse),
        Refusals,
    )
)]
pub async fn embed_sparse(
    State(state): State<AppState>,
    req: TeiJson<EmbedSparseRequest>,
) -> Response {
    let result = embed_sparse_answer(&state, req.0)
        .await
        .map(|a| (a.headers, Json(EmbedSparseResponse(a.body))));
    state.finish(result)
}

/// `/embed_sparse`'s answer to `req` (also the gRPC `EmbedSparse` call's).
pub(crate) async fn embed_sparse_answer(
    state: &AppState,
    req: EmbedSparseRequest,
) -> Result<Answered<Vec<Vec<SparseValue>>>, ApiError> {
    let state = state.for_model(req.model.as_deref())?;
    let start = Instant::now();
    state.require(Needs::Sparse, "/embed_sparse")?;
    let (batched, inputs): (bool, Vec<InputType>) = req.inputs.into_vec();
    let names = InputNames::new("inputs", batched);
    let chars = check_inputs(&state, &inputs, names)?;
    let opts = encode_options(
        &state,
        req.truncate,
        req.truncation_direction,
        req.prompt_name,
    );
    let request = InferRequest {
        inputs: inputs.into_iter().map(Into::into).collect(),
        opts,
        batched,
        priority: req.priority,
    };
    let results = state
        .infer
        .embed_sparse(request)
        .await
        .map_err(|e| ApiError::inference(e, names, TRUNCATE_HINT))?;
    let (vectors, metas): (Vec<_>, Vec<_>) = results.into_iter().unzip();
    let vectors = vectors
        .into_iter()
        .map(|pairs| {
            pairs
                .into_iter()
                .map(|(index, value)| SparseValue {
                    index: index as usize,
                    value,
                })
                .collect()
        })
        .collect();
    let meta = ResponseMeta::new(start, chars, &metas);
    let method = if batched { "batch" } else { "single" };
    Ok(meta.answer(&state, method, vectors))
}
