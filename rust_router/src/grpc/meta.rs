//! `tei.v1.Info` and `tei.v1.Tokenize`, answered by `/info`, `/tokenize` and `/decode`'s
//! logic.

use super::call::TeiApi;
use super::convert::{only, uint32};
use super::pb;
use super::streams::Answers;
use crate::http::error::ApiError;
use crate::http::meta::{decode_answer, info_answer, tokenize_answer};
use crate::http::types::{DecodeRequest, InputIds, ModelTypeInfo, TokenizeInput, TokenizeRequest};
use crate::http::AppState;
use axum::http::HeaderMap;
use tonic::{Request, Response, Status, Streaming};

#[tonic::async_trait]
impl pb::info_server::Info for TeiApi {
    async fn info(
        &self,
        request: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        self.unary("tei.v1.Info/Info", request, info).await
    }
}

#[tonic::async_trait]
impl pb::tokenize_server::Tokenize for TeiApi {
    async fn tokenize(
        &self,
        request: Request<pb::EncodeRequest>,
    ) -> Result<Response<pb::EncodeResponse>, Status> {
        self.unary("tei.v1.Tokenize/Tokenize", request, tokenize)
            .await
    }

    type TokenizeStreamStream = Answers<pb::EncodeResponse>;

    async fn tokenize_stream(
        &self,
        request: Request<Streaming<pb::EncodeRequest>>,
    ) -> Result<Response<Self::TokenizeStreamStream>, Status> {
        self.stream("tei.v1.Tokenize/TokenizeStream", request, tokenize)
    }

    async fn decode(
        &self,
        request: Request<pb::DecodeRequest>,
    ) -> Result<Response<pb::DecodeResponse>, Status> {
        self.unary("tei.v1.Tokenize/Decode", request, decode).await
    }

    type DecodeStreamStream = Answers<pb::DecodeResponse>;

    async fn decode_stream(
        &self,
        request: Request<Streaming<pb::DecodeRequest>>,
    ) -> Result<Response<Self::DecodeStreamStream>, Status> {
        self.stream("tei.v1.Tokenize/DecodeStream", request, decode)
    }
}

async fn info(
    state: AppState,
    req: pb::InfoRequest,
) -> Result<(pb::InfoResponse, HeaderMap), ApiError> {
    let info = info_answer(&state, req.model.as_deref())?;
    // A SPLADE model is an embedding model here, as in `/info` and in TEI.
    let model_type = match info.model_type {
        ModelTypeInfo::Embedding(_) => pb::ModelType::Embedding,
        ModelTypeInfo::Classifier(_) => pb::ModelType::Classifier,
        ModelTypeInfo::Reranker(_) => pb::ModelType::Reranker,
    };
    let response = pb::InfoResponse {
        version: info.version.to_string(),
        sha: info.sha.map(str::to_string),
        docker_label: info.docker_label.map(str::to_string),
        model_id: info.model_id,
        model_sha: info.model_sha,
        model_dtype: info.model_dtype,
        model_type: model_type.into(),
        max_concurrent_requests: uint32(info.max_concurrent_requests),
        max_input_length: uint32(info.max_input_length),
        max_batch_tokens: uint32(info.max_batch_tokens),
        max_batch_requests: info.max_batch_requests.map(uint32),
        max_client_batch_size: uint32(info.max_client_batch_size),
        tokenization_workers: uint32(info.tokenization_workers),
    };
    Ok((response, HeaderMap::new()))
}

async fn tokenize(
    state: AppState,
    req: pb::EncodeRequest,
) -> Result<(pb::EncodeResponse, HeaderMap), ApiError> {
    let request = TokenizeRequest {
        model: req.model,
        inputs: TokenizeInput::Single(req.inputs),
        add_special_tokens: req.add_special_tokens,
        prompt_name: req.prompt_name,
    };
    let tokens = only(tokenize_answer(&state, request).await?)?
        .into_iter()
        .map(|t| pb::SimpleToken {
            id: t.id,
            text: t.text,
            special: t.special,
            start: t.start.map(uint32),
            stop: t.stop.map(uint32),
        })
        .collect();
    Ok((pb::EncodeResponse { tokens }, HeaderMap::new()))
}

async fn decode(
    state: AppState,
    req: pb::DecodeRequest,
) -> Result<(pb::DecodeResponse, HeaderMap), ApiError> {
    let request = DecodeRequest {
        model: req.model,
        ids: InputIds::Single(req.ids),
        skip_special_tokens: req.skip_special_tokens,
    };
    let text = only(decode_answer(&state, request).await?)?;
    Ok((pb::DecodeResponse { text }, HeaderMap::new()))
}
