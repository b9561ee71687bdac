//! `tei.v1.Predict` and `tei.v1.Rerank`, answered by `/predict` and `/rerank`'s logic.

use super::call::TeiApi;
use super::convert::{metadata, priority, truncate, truncation_direction, uint32};
use super::pb;
use super::streams::Answers;
use crate::http::classify::{predict_answer, rerank_answer, score_pairs};
use crate::http::error::{ApiError, ErrorType};
use crate::http::model_routes::Needs;
use crate::http::response_meta::ResponseMeta;
use crate::http::types::{PredictInput, PredictRequest, PredictResponse, Rank, RerankRequest};
use crate::http::AppState;
use crate::tokenization::EncodeOptions;
use axum::http::HeaderMap;
use std::time::Instant;
use tonic::{Request, Response, Status, Streaming};

#[tonic::async_trait]
impl pb::predict_server::Predict for TeiApi {
    async fn predict(
        &self,
        request: Request<pb::PredictRequest>,
    ) -> Result<Response<pb::PredictResponse>, Status> {
        self.unary("tei.v1.Predict/Predict", request, predict).await
    }

    async fn predict_pair(
        &self,
        request: Request<pb::PredictPairRequest>,
    ) -> Result<Response<pb::PredictResponse>, Status> {
        self.unary("tei.v1.Predict/PredictPair", request, predict_pair)
            .await
    }

    type PredictStreamStream = Answers<pb::PredictResponse>;

    async fn predict_stream(
        &self,
        request: Request<Streaming<pb::PredictRequest>>,
    ) -> Result<Response<Self::PredictStreamStream>, Status> {
        self.stream("tei.v1.Predict/PredictStream", request, predict)
    }

    type PredictPairStreamStream = Answers<pb::PredictResponse>;

    async fn predict_pair_stream(
        &self,
        request: Request<Streaming<pb::PredictPairRequest>>,
    ) -> Result<Response<Self::PredictPairStreamStream>, Status> {
        self.stream("tei.v1.Predict/PredictPairStream", request, predict_pair)
    }
}

#[tonic::async_trait]
impl pb::rerank_server::Rerank for TeiApi {
    async fn rerank(
        &self,
        request: Request<pb::RerankRequest>,
    ) -> Result<Response<pb::RerankResponse>, Status> {
        self.unary("tei.v1.Rerank/Rerank", request, rerank).await
    }

    async fn rerank_stream(
        &self,
        request: Request<Streaming<pb::RerankStreamRequest>>,
    ) -> Result<Response<pb::RerankResponse>, Status> {
        self.unary("tei.v1.Rerank/RerankStream", request, rerank_pairs)
            .await
    }
}

async fn predict(
    state: AppState,
    req: pb::PredictRequest,
) -> Result<(pb::PredictResponse, HeaderMap), ApiError> {
    let inputs = PredictInput::Single(crate::http::types::Sequence::Single(req.inputs));
    let request = PredictRequest {
        model: req.model,
        inputs,
        truncate: truncate(req.truncate),
        truncation_direction: truncation_direction(req.truncation_direction)?,
        raw_scores: req.raw_scores,
        priority: priority(req.priority)?,
    };
    answer_predict(&state, request).await
}

async fn predict_pair(
    state: AppState,
    req: pb::PredictPairRequest,
) -> Result<(pb::PredictResponse, HeaderMap), ApiError> {
    use crate::http::types::Sequence;
    let n = req.inputs.len();
    let mut texts = req.inputs.into_iter();
    let sequence = match (texts.next(), texts.next(), texts.next()) {
        (Some(text), None, None) => Sequence::Single(text),
        (Some(text), Some(pair), None) => Sequence::Pair(text, pair),
        _ => {
            return Err(ApiError::validation(format!(
                "Input validation error: `inputs` must hold one text or a pair of texts, got \
                 {n}"
            )))
        }
    };
    let request = PredictRequest {
        model: req.model,
        inputs: PredictInput::Single(sequence),
        truncate: truncate(req.truncate),
        truncation_direction: truncation_direction(req.truncation_direction)?,
        raw_scores: req.raw_scores,
        priority: priority(req.priority)?,
    };
    answer_predict(&state, request).await
}

async fn answer_predict(
    state: &AppState,
    request: PredictRequest,
) -> Result<(pb::PredictResponse, HeaderMap), ApiError> {
    let answered = predict_answer(state, request).await?;
    let PredictResponse::Single(predictions) = answered.body else {
        return Err(ApiError::new(
            ErrorType::Backend,
            "one input was answered as a batch",
        ));
    };
    let predictions = predictions
        .into_iter()
        .map(|p| pb::Prediction {
            score: p.score,
            label: p.label,
        })
        .collect();
    let response = pb::PredictResponse {
        predictions,
        metadata: Some(metadata(&answered.meta)),
    };
    Ok((response, answered.headers))
}

async fn rerank(
    state: AppState,
    req: pb::RerankRequest,
) -> Result<(pb::RerankResponse, HeaderMap), ApiError> {
    let request = RerankRequest {
        model: req.model,
        query: req.query,
        texts: req.texts,
        truncate: truncate(req.truncate),
        truncation_direction: truncation_direction(req.truncation_direction)?,
        raw_scores: req.raw_scores,
        return_text: req.return_text,
        top_n: req.top_n.map(i64::from),
        priority: priority(req.priority)?,
    };
    let answered = rerank_answer(&state, request).await?;
    let response = pb::RerankResponse {
        ranks: answered.body.into_iter().map(rank).collect(),
        metadata: Some(metadata(&answered.meta)),
    };
    Ok((response, answered.headers))
}

fn rank(r: Rank) -> pb::Rank {
    pb::Rank {
        index: uint32(r.index),
        text: r.text,
        score: r.score,
    }
}

/// `RerankStream`: one (query, text) pair per message, ranked together once the stream
/// ends, as one `/rerank` request (at most `--max-client-batch-size` pairs). Every field but
/// the query and the text is the first message's.
async fn rerank_pairs(
    state: AppState,
    mut messages: Streaming<pb::RerankStreamRequest>,
) -> Result<(pb::RerankResponse, HeaderMap), ApiError> {
    let start = Instant::now();
    let unreadable = |status: Status| {
        ApiError::validation(format!(
            "Input validation error: cannot read the stream: {}",
            status.message()
        ))
    };
    let Some(first) = messages.message().await.map_err(unreadable)? else {
        return Err(ApiError::empty("texts"));
    };
    let state = state.for_model(first.model.as_deref())?;
    state.require(Needs::Reranker, "/rerank")?;
    let opts = EncodeOptions {
        truncate: truncate(first.truncate).unwrap_or(state.config.auto_truncate),
        direction: truncation_direction(first.truncation_direction)?,
        adapter: state.adapter,
        ..Default::default()
    };
    let (raw_scores, return_text) = (first.raw_scores, first.return_text);
    let priority = priority(first.priority)?;
    let mut pairs = Vec::new();
    let mut next = Some(first);
    while let Some(message) = next {
        let index = pairs.len();
        if message.query.is_empty() {
            return Err(ApiError::new(
                ErrorType::Empty,
                format!("`query` of message {index} cannot be empty"),
            ));
        }
        if message.text.is_empty() {
            return Err(ApiError::new(
                ErrorType::Empty,
                format!("`text` of message {index} cannot be empty"),
            ));
        }
        pairs.push((message.query, message.text));
        // Refused as soon as the stream is longer than one request may be, unread past that.
        state.check_batch(pairs.len(), "texts")?;
        next = messages.message().await.map_err(unreadable)?;
    }
    let texts: Vec<String> = match return_text {
        true => pairs.iter().map(|(_, text)| text.clone()).collect(),
        false => Vec::new(),
    };
    let ranked = score_pairs(&state, pairs, "texts", opts, raw_scores, priority).await?;
    let ranks = ranked
        .scores
        .into_iter()
        .map(|(index, score)| pb::Rank {
            index: uint32(index),
            text: texts.get(index).cloned(),
            score,
        })
        .collect();
    let meta = ResponseMeta::new(start, ranked.chars, &ranked.metas);
    let answered = meta.answer(&state, "batch", ranks);
    let response = pb::RerankResponse {
        ranks: answered.body,
        metadata: Some(metadata(&answered.meta)),
    };
    Ok((response, answered.headers))
}
