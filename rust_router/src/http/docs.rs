//! The API docs: the OpenAPI document of every route ([`ApiDoc`], served at `/openapi.json`
//! and `/api-doc/openapi.json`) and Swagger UI at `/docs`.

use super::error::{ErrorResponse, ErrorType, OpenAIErrorResponse};
use super::openapi::{InputDoc, InputIdsDoc, PredictInputDoc, PriorityDoc, QueueDeadlineHeader};
use super::state::AppState;
use super::types::*;
use super::{
    classify, cloud, embed, meta, models, multivector, openai, quantize, rerank_compat, sparse,
};
use crate::tokenization::TruncationDirection;
use axum::Json;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    paths(
        meta::info, meta::health, meta::metrics, meta::tokenize, meta::decode,
        embed::embed, embed::embed_all, multivector::embed_multivector, sparse::embed_sparse, embed::similarity,
        classify::predict, classify::rerank, openai::embeddings,
        rerank_compat::rerank_v1, rerank_compat::rerank_v2,
        cloud::root, cloud::invocations, cloud::vertex, meta::root_probe, models::list,
    ),
    components(schemas(
        InputDoc, PredictInputDoc, PriorityDoc, TruncationDirection, EmbedRequest, EmbedResponse,
        EmbedAllRequest, EmbedAllResponse, PredictRequest, Prediction, PredictResponse,
        RerankRequest, Rank, RerankResponse, SimilarityInput, SimilarityParameters,
        SimilarityRequest, SimilarityResponse, TokenizeInput, TokenizeRequest, SimpleToken,
        TokenizeResponse, InputIdsDoc, DecodeRequest, DecodeResponse, EncodingFormat,
        OpenAICompatRequest, Embedding, OpenAICompatEmbedding, OpenAICompatUsage,
        OpenAICompatResponse, quantize::RangesDoc, rerank_compat::CompatRerankRequest,
        rerank_compat::DocumentDoc, rerank_compat::DocumentText, rerank_compat::CompatRerankResult,
        rerank_compat::CompatRerankResponse, rerank_compat::RerankMeta, rerank_compat::ApiVersion,
        rerank_compat::BilledUnits, rerank_compat::MetaTokens, rerank_compat::RerankUsage,
        rerank_compat::RankFieldDoc, Info, ModelTypeInfo, EmbeddingModel, ClassifierModel,
        DeviceInfo, crate::backend::ImageInput, crate::backend::ImageSteps, crate::backend::ResizeTo,
        crate::backend::Resample, HealthDegraded, DeviceRef, models::ModelList,
        models::ModelCard,
        ErrorResponse, ErrorType, OpenAIErrorResponse,
        sparse::EmbedSparseRequest, sparse::SparseValue, sparse::EmbedSparseResponse,
        multivector::EmbedMultivectorRequest, multivector::MultivectorInputType,
        multivector::MultivectorFormat, multivector::TokenVectors,
        multivector::EmbedMultivectorResponse, crate::backend::LateInteraction,
        cloud::InvocationDoc, cloud::InvocationAnswerDoc, cloud::VertexRequest, cloud::VertexResponse,
    )),
    modifiers(&QueueDeadlineHeader),
    tags((name = "Text Embeddings Inference", description = "TEI-compatible API")),
    info(
        title = "trt-tei-runtime router",
        description = "Text Embeddings Inference and OpenAI compatible embedding server",
        license(name = "Apache 2.0", identifier = "Apache-2.0")
    )
)]
pub struct ApiDoc;

pub async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

/// Swagger UI at `/docs`, served from the assets built into the binary (a pinned Swagger UI
/// release vendored by `utoipa-swagger-ui`): it works with no internet access. Its spec
/// validator is off: opened from any host but localhost, Swagger UI would send the spec's URL
/// to `validator.swagger.io` for a badge, telling an outside service where the server is.
pub fn swagger_ui() -> axum::Router<AppState> {
    utoipa_swagger_ui::SwaggerUi::new("/docs")
        .url("/api-doc/openapi.json", ApiDoc::openapi())
        .config(utoipa_swagger_ui::Config::default().validator_url("none"))
        .into()
}
