//! Which routes the loaded model serves, and the errors that send clients to the right one.

use super::error::{ApiError, ErrorType};
use crate::backend::ModelType;

/// Which routes a model serves, for errors that tell the client where to go instead.
pub fn served_routes(model_type: ModelType) -> &'static str {
    match model_type {
        ModelType::Embedding => "/embed, /embed_all, /similarity, /v1/embeddings",
        ModelType::Classifier => "/predict",
        ModelType::Reranker => "/rerank, /v1/rerank, /v2/rerank, /predict",
        ModelType::Sparse => "/embed_sparse",
    }
}

fn describe(model_type: ModelType) -> &'static str {
    match model_type {
        ModelType::Embedding => "an embedding model",
        ModelType::Classifier => "a classifier",
        ModelType::Reranker => "a reranker",
        ModelType::Sparse => "a SPLADE (sparse embedding) model",
    }
}

/// What a route needs of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    Embedding,
    /// A classifier or a reranker (`/predict`).
    Classifier,
    Reranker,
    /// A SPLADE model (`/embed_sparse`).
    Sparse,
}

impl Needs {
    fn accepts(self, model_type: ModelType) -> bool {
        match self {
            Needs::Embedding => model_type == ModelType::Embedding,
            Needs::Classifier => {
                matches!(model_type, ModelType::Classifier | ModelType::Reranker)
            }
            Needs::Reranker => model_type == ModelType::Reranker,
            Needs::Sparse => model_type == ModelType::Sparse,
        }
    }
}

/// `Ok` when `route` fits the model, else a 424 (TEI) / 400 (OpenAI) naming what it serves.
pub fn require(model_type: ModelType, needs: Needs, route: &str) -> Result<(), ApiError> {
    if needs.accepts(model_type) {
        return Ok(());
    }
    Err(not_served(model_type, route))
}

/// `route` is not one the model serves: 424 (TEI) / 400 (OpenAI), naming what it serves.
pub fn not_served(model_type: ModelType, route: &str) -> ApiError {
    unavailable(route, describe(model_type), model_type)
}

fn unavailable(route: &str, what: &str, model_type: ModelType) -> ApiError {
    let hint = match route {
        "/embed_sparse" => " (`/embed_sparse` needs a SPLADE model: a `*ForMaskedLM` checkpoint)",
        _ => "",
    };
    ApiError::new(
        ErrorType::ModelType,
        format!(
            "`{route}` is not available: the model is {what} and serves {}{hint}",
            served_routes(model_type)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_fit_model_types() {
        assert!(require(ModelType::Embedding, Needs::Embedding, "/embed").is_ok());
        assert!(require(ModelType::Reranker, Needs::Classifier, "/predict").is_ok());
        let e = require(ModelType::Classifier, Needs::Reranker, "/rerank").unwrap_err();
        assert_eq!(e.kind, ErrorType::ModelType);
        assert!(e.message.contains("a classifier"), "{}", e.message);
        assert!(e.message.contains("/predict"), "{}", e.message);
        let e = require(ModelType::Embedding, Needs::Sparse, "/embed_sparse").unwrap_err();
        assert_eq!(e.kind, ErrorType::ModelType);
        assert!(e.message.contains("needs a SPLADE model"), "{}", e.message);
        let e = require(ModelType::Sparse, Needs::Embedding, "/embed").unwrap_err();
        assert!(
            e.message.contains("a SPLADE (sparse embedding) model"),
            "{}",
            e.message
        );
        assert!(e.message.contains("serves /embed_sparse"), "{}", e.message);
        assert!(require(ModelType::Sparse, Needs::Classifier, "/predict").is_err());
        assert!(require(ModelType::Sparse, Needs::Sparse, "/embed_sparse").is_ok());
    }
}
