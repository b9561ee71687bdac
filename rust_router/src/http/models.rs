//! `GET /v1/models`: the served models in OpenAI's list format.

use super::openapi::OpenAIAuthRefusal;
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
    /// The hub id or folder it was loaded from (an adapter's: its PEFT folder).
    #[schema(example = "sentence-transformers/all-MiniLM-L6-v2")]
    pub root: String,
    /// For a LoRA adapter, the model it runs on; null for a model.
    pub parent: Option<String>,
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

/// The served models, the default first, then the LoRA adapters (each with its `parent`).
#[utoipa::path(
    get, path = "/v1/models", tag = "Text Embeddings Inference",
    responses(
        (status = 200, description = "The served models", body = ModelList),
        OpenAIAuthRefusal,
    )
)]
pub async fn list(State(state): State<AppState>) -> Json<ModelList> {
    let directory = &state.models;
    let card =
        |id: &str, root: &str, parent: Option<&str>, info: &crate::backend::ModelInfo| ModelCard {
            id: id.to_string(),
            object: "model",
            created: directory.started(),
            owned_by: "trt-tei-runtime",
            root: root.to_string(),
            parent: parent.map(str::to_string),
            model_type: type_name(info.model_type),
            default: parent.is_none() && id == directory.entries()[0].spec.name,
            max_input_length: info.max_input_length,
        };
    let entries = directory.entries();
    let models = entries
        .iter()
        .map(|e| card(&e.spec.name, &e.spec.id, None, e.infer.info()));
    let adapters = entries.iter().flat_map(|e| {
        e.adapters
            .iter()
            .map(|(a, _)| card(&a.name, &a.path, Some(&e.spec.name), e.infer.info()))
    });
    let data = models.chain(adapters).collect();
    Json(ModelList {
        object: "list",
        data,
    })
}
