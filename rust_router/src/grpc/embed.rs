//! `tei.v1.Embed`: one input per message, answered by `/embed`, `/embed_sparse` and
//! `/embed_all`'s logic.

use super::call::TeiApi;
use super::convert::{metadata, only, priority, truncate, truncation_direction, uint32};
use super::pb;
use super::streams::Answers;
use crate::http::embed::{embed_all_answer, embed_answer};
use crate::http::error::{ApiError, ErrorType};
use crate::http::sparse::{embed_sparse_answer, EmbedSparseRequest};
use crate::http::types::{
    EmbedAllRequest, EmbedRequest, Embedding, EncodingFormat, Input, InputType,
};
use crate::http::AppState;
use axum::http::HeaderMap;
use tonic::{Request, Response, Status, Streaming};

#[tonic::async_trait]
impl pb::embed_server::Embed for TeiApi {
    async fn embed(
        &self,
        request: Request<pb::EmbedRequest>,
    ) -> Result<Response<pb::EmbedResponse>, Status> {
        self.unary("tei.v1.Embed/Embed", request, embed).await
    }

    type EmbedStreamStream = Answers<pb::EmbedResponse>;

    async fn embed_stream(
        &self,
        request: Request<Streaming<pb::EmbedRequest>>,
    ) -> Result<Response<Self::EmbedStreamStream>, Status> {
        self.stream("tei.v1.Embed/EmbedStream", request, embed)
    }

    async fn embed_sparse(
        &self,
        request: Request<pb::EmbedSparseRequest>,
    ) -> Result<Response<pb::EmbedSparseResponse>, Status> {
        self.unary("tei.v1.Embed/EmbedSparse", request, embed_sparse)
            .await
    }

    type EmbedSparseStreamStream = Answers<pb::EmbedSparseResponse>;

    async fn embed_sparse_stream(
        &self,
        request: Request<Streaming<pb::EmbedSparseRequest>>,
    ) -> Result<Response<Self::EmbedSparseStreamStream>, Status> {
        self.stream("tei.v1.Embed/EmbedSparseStream", request, embed_sparse)
    }

    async fn embed_all(
        &self,
        request: Request<pb::EmbedAllRequest>,
    ) -> Result<Response<pb::EmbedAllResponse>, Status> {
        self.unary("tei.v1.Embed/EmbedAll", request, embed_all)
            .await
    }

    type EmbedAllStreamStream = Answers<pb::EmbedAllResponse>;

    async fn embed_all_stream(
        &self,
        request: Request<Streaming<pb::EmbedAllRequest>>,
    ) -> Result<Response<Self::EmbedAllStreamStream>, Status> {
        self.stream("tei.v1.Embed/EmbedAllStream", request, embed_all)
    }
}

fn one_text(text: String) -> Input {
    Input::Single(InputType::String(text))
}

async fn embed(
    state: AppState,
    req: pb::EmbedRequest,
) -> Result<(pb::EmbedResponse, HeaderMap), ApiError> {
    let request = EmbedRequest {
        model: req.model,
        inputs: one_text(req.inputs),
        truncate: truncate(req.truncate),
        truncation_direction: truncation_direction(req.truncation_direction)?,
        prompt_name: req.prompt_name,
        normalize: req.normalize,
        dimensions: req.dimensions.map(|d| d as usize),
        encoding_format: EncodingFormat::Float,
        quantization_ranges: None,
        priority: priority(req.priority)?,
        // Not in the proto: the server's `--long-input` applies.
        long_input: None,
        chunk_overlap: None,
    };
    let answered = embed_answer(&state, request).await?;
    let Embedding::Float(embeddings) = only(answered.body)? else {
        return Err(ApiError::new(
            ErrorType::Backend,
            "the embedding was not encoded as floats",
        ));
    };
    let response = pb::EmbedResponse {
        embeddings,
        metadata: Some(metadata(&answered.meta)),
    };
    Ok((response, answered.headers))
}

async fn embed_sparse(
    state: AppState,
    req: pb::EmbedSparseRequest,
) -> Result<(pb::EmbedSparseResponse, HeaderMap), ApiError> {
    let request = EmbedSparseRequest {
        model: req.model,
        inputs: one_text(req.inputs),
        truncate: truncate(req.truncate),
        truncation_direction: truncation_direction(req.truncation_direction)?,
        prompt_name: req.prompt_name,
        priority: priority(req.priority)?,
    };
    let answered = embed_sparse_answer(&state, request).await?;
    let sparse_embeddings = only(answered.body)?
        .into_iter()
        .map(|v| pb::SparseValue {
            index: uint32(v.index),
            value: v.value,
        })
        .collect();
    let response = pb::EmbedSparseResponse {
        sparse_embeddings,
        metadata: Some(metadata(&answered.meta)),
    };
    Ok((response, answered.headers))
}

async fn embed_all(
    state: AppState,
    req: pb::EmbedAllRequest,
) -> Result<(pb::EmbedAllResponse, HeaderMap), ApiError> {
    let request = EmbedAllRequest {
        model: req.model,
        inputs: one_text(req.inputs),
        truncate: truncate(req.truncate),
        truncation_direction: truncation_direction(req.truncation_direction)?,
        prompt_name: req.prompt_name,
        priority: priority(req.priority)?,
    };
    let answered = embed_all_answer(&state, request).await?;
    let token_embeddings = only(answered.body)?
        .into_iter()
        .map(|embeddings| pb::TokenEmbedding { embeddings })
        .collect();
    let response = pb::EmbedAllResponse {
        token_embeddings,
        metadata: Some(metadata(&answered.meta)),
    };
    Ok((response, answered.headers))
}
