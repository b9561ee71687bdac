//! `GET /v1/models`: the served models in OpenAI's list format.

use super::openapi::AuthRefusal;
use super::state::AppState;
use crate::backend::ModelType;
use axum::extract::State;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

/// One served model, as OpenAI's `/v1/models` lists it (plus where it was loaded from).
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelCard {
    /// The name requests select it by (`model`).
    #[schema(example = "all-MiniLM-L6-v2")]
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// When the server started serving it (Unix seconds).
    pub created: u64,
    pub owned_by: &'static str,
    /// The hub id or folder it was loaded from.
    #[schema(example = "sentence-transformers/all-MiniLM-L6-v2")]
    pub root: String,
    /// `embedding`, `sparse` (SPLADE: `/embed_sparse`), `classifier` or `reranker`.
    pub model_type: &'static str,
    /// Whether requests that name no model go to it.
    pub default: bool,
    pub max_input_length: usize,
}

fn type_name(model_type: ModelType) -> &'static str {
    match model_type {
        ModelType::Embedding => "embedding",
        ModelType::Sparse => "sparse",
        ModelType::Classifier => "classifier",
        ModelType::Reranker => "reranker",
    }
}

/// OpenAI's list body.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelList {
    /// Always `list`.
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

/// The served models, the default first.
#[utoipa::path(
    get, path = "/v1/models", tag = "Text Embeddings Inference",
    responses(
        (status = 200, description = "The served models", body = ModelList),
        AuthRefusal,
    )
)]
pub async fn list(State(state): State<AppState>) -> Json<ModelList> {
    let directory = &state.models;
    let data = directory
        .entries()
        .iter()
        .enumerate()
        .map(|(index, entry)| ModelCard {
            id: entry.spec.name.clone(),
            object: "model",
            created: directory.started(),
            owned_by: "trt-tei-runtime",
            root: entry.spec.id.clone(),
            model_type: type_name(entry.infer.info().model_type),
            default: index == 0,
            max_input_length: entry.infer.info().max_input_length,
        })
        .collect();
    Json(ModelList {
        object: "list",
        data,
    })
}
