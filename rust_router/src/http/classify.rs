//! Classification routes: `/predict` and `/rerank`.

use super::body::TeiJson;
use super::error::{ApiError, ErrorResponse, InputNames, TRUNCATE_HINT};
use super::model_routes::Needs;
use super::multivector;
use super::openapi::Refusals;
use super::response_meta::{Answered, ResponseMeta};
use super::state::AppState;
use super::types::{
    PredictInput, PredictRequest, PredictResponse, Prediction, Rank, RerankRequest, RerankResponse,
    Sequence,
};
use crate::infer::{InferMetadata, InferRequest, Priority};
use crate::tokenization::{EncodeOptions, EncodingInput};
use axum::extract::State;
use axum::response::Response;
use axum::Json;
use std::cmp::Ordering;
use std::time::Instant;

fn descending(a: f32, b: f32) -> Ordering {
    b.partial_cmp(&a).unwrap_or(Ordering::Equal)
}

/// Classify texts or text pairs. Returns a 424 status code if the model is not a classifier.
#[utoipa::path(
    post, path = "/predict", tag = "Text Embeddings Inference",
    request_body = PredictRequest,
    responses(
        (status = 200, description = "Predictions, best first", body = PredictResponse),
        (status = 400, description = "Empty input", body = ErrorResponse),
        (status = 422, description = "Invalid input: malformed body, more inputs than `--max-client-batch-size`, an input longer than the model's `max_input_length` tokens without truncation", body = ErrorResponse),
        (status = 424, description = "Inference failed or wrong model type", body = ErrorResponse),
        Refusals,
    )
)]
pub async fn predict(State(state): State<AppState>, req: TeiJson<PredictRequest>) -> Response {
    let result = predict_answer(&state, req.0)
        .await
        .map(|a| (a.headers, Json(a.body)));
    state.finish(result)
}

/// `/predict`'s answer to `req` (also the gRPC `Predict` calls').
pub(crate) async fn predict_answer(
    state: &AppState,
    req: PredictRequest,
) -> Result<Answered<PredictResponse>, ApiError> {
    let state = state.for_model(req.model.as_deref())?;
    let start = Instant::now();
    state.require(Needs::Classifier, "/predict")?;
    let (batched, sequences) = match req.inputs {
        PredictInput::Single(s) => (false, vec![s]),
        PredictInput::Batch(b) => (true, b),
    };
    state.check_batch(sequences.len(), "inputs")?;
    let names = InputNames::new("inputs", batched);
    let empty = |s: &Sequence| match s {
        Sequence::Single(a) => a.is_empty(),
        Sequence::Pair(a, b) => a.is_empty() || b.is_empty(),
    };
    if let Some(index) = sequences.iter().position(empty) {
        return Err(ApiError::empty_input(names, index));
    }
    let inputs: Vec<EncodingInput> = sequences.into_iter().map(Into::into).collect();
    let chars = inputs.iter().map(EncodingInput::count_chars).sum();
    let opts = EncodeOptions {
        truncate: req.truncate.unwrap_or(state.config.auto_truncate),
        direction: req.truncation_direction,
        adapter: state.adapter,
        ..Default::default()
    };
    let request = InferRequest {
        inputs: inputs.into_iter().map(Into::into).collect(),
        opts,
        batched,
        priority: req.priority,
    };
    let results = state
        .infer
        .predict(request, req.raw_scores)
        .await
        .map_err(|e| ApiError::inference(e, names, TRUNCATE_HINT))?;
    let info = state.infer.info();
    let (predictions, metas): (Vec<Vec<Prediction>>, Vec<_>) = results
        .into_iter()
        .map(|(scores, meta)| {
            let mut p: Vec<Prediction> = scores
                .into_iter()
                .enumerate()
                .map(|(i, score)| Prediction {
                    score,
                    label: info.label(i),
                })
                .collect();
            p.sort_by(|a, b| descending(a.score, b.score));
            (p, meta)
        })
        .unzip();
    let meta = ResponseMeta::new(start, chars, &metas);
    let body = if batched {
        PredictResponse::Batch(predictions)
    } else {
        PredictResponse::Single(predictions.into_iter().next().unwrap_or_default())
    };
    let method = if batched { "batch" } else { "single" };
    Ok(meta.answer(&state, method, body))
}

/// Rank `texts` by relevance to `query`. A late-interaction (ColBERT) model scores each text
/// by MaxSim against the query's vectors, on the device (only the scores come back). Returns
/// a 424 status code if the model is neither a reranker (a sequence classifier with one
/// label) nor a late-interaction model.
#[utoipa::path(
    post, path = "/rerank", tag = "Text Embeddings Inference",
    request_body = RerankRequest,
    responses(
        (status = 200, description = "Ranks, best first", body = RerankResponse),
        (status = 400, description = "Empty input", body = ErrorResponse),
        (status = 422, description = "Invalid input: malformed body, more inputs than `--max-client-batch-size`, an input longer than the model's `max_input_length` tokens without truncation", body = ErrorResponse),
        (status = 424, description = "Inference failed or wrong model type", body = ErrorResponse),
        Refusals,
    )
)]
pub async fn rerank(State(state): State<AppState>, req: TeiJson<RerankRequest>) -> Response {
    let result = rerank_answer(&state, req.0)
        .await
        .map(|a| (a.headers, Json(RerankResponse(a.body))));
    state.finish(result)
}

/// `/rerank`'s answer to `req` (also the gRPC `Rerank` call's): ranks, best first.
pub(crate) async fn rerank_answer(
    state: &AppState,
    req: RerankRequest,
) -> Result<Answered<Vec<Rank>>, ApiError> {
    let state = state.for_model(req.model.as_deref())?;
    let start = Instant::now();
    if let Some(needs) = multivector::needs_for_rerank(&state) {
        state.require(needs, "/rerank")?;
    }
    let top_n = top_n(req.top_n)?;
    let opts = EncodeOptions {
        truncate: req.truncate.unwrap_or(state.config.auto_truncate),
        direction: req.truncation_direction,
        adapter: state.adapter,
        ..Default::default()
    };
    let ranked = rank(
        &state,
        &req.query,
        &req.texts,
        "texts",
        opts,
        req.raw_scores,
        req.priority,
    )
    .await?;
    let ranks: Vec<Rank> = ranked
        .scores
        .into_iter()
        .take(top_n)
        .map(|(index, score)| Rank {
            index,
            text: req.return_text.then(|| req.texts[index].clone()),
            score,
        })
        .collect();
    let meta = ResponseMeta::new(start, ranked.chars, &ranked.metas);
    Ok(meta.answer(&state, "batch", ranks))
}

/// How many of the best results a rerank request asks for: `top_n`, all without it. At
/// least 1 on every rerank route (`0`, an answer with no results, is a client's mistake);
/// past the number of texts, all. Signed, so that a negative one gets this message.
pub(crate) fn top_n(top_n: Option<i64>) -> Result<usize, ApiError> {
    match top_n {
        Some(n) if n < 1 => Err(ApiError::validation(format!(
            "Input validation error: `top_n` must be at least 1, got {n}"
        ))),
        Some(n) => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        None => Ok(usize::MAX),
    }
}

/// Scores of `texts` against `query`, best first.
pub(crate) struct Ranked {
    /// `(index in texts, score)`.
    pub scores: Vec<(usize, f32)>,
    pub metas: Vec<InferMetadata>,
    pub chars: usize,
}

/// The reranker path of `/rerank` and the Cohere/Jina routes: validates the query and the
/// texts (`field` names them in errors), scores every (query, text) pair, sorts best first.
pub(crate) async fn rank(
    state: &AppState,
    query: &str,
    texts: &[String],
    field: &str,
    opts: EncodeOptions,
    raw_scores: bool,
    priority: Option<Priority>,
) -> Result<Ranked, ApiError> {
    if query.is_empty() {
        return Err(ApiError::empty("query"));
    }
    state.check_batch(texts.len(), field)?;
    if let Some(index) = texts.iter().position(String::is_empty) {
        return Err(ApiError::empty_input(InputNames::List(field), index));
    }
    if multivector::needs_for_rerank(state).is_none() {
        let (scores, metas) =
            multivector::maxsim_rank(state, query, texts, field, opts.truncate, priority).await?;
        let chars = query.chars().count() + texts.iter().map(|t| t.chars().count()).sum::<usize>();
        return Ok(Ranked {
            scores,
            metas,
            chars,
        });
    }
    let pairs = texts
        .iter()
        .map(|text| (query.to_string(), text.clone()))
        .collect();
    score_pairs(state, pairs, field, opts, raw_scores, priority).await
}

/// Scores each (query, text) pair, best first; `field` names the texts in errors. The pairs
/// are not checked here: [`rank`] checks one query's, the gRPC `RerankStream` each message's.
pub(crate) async fn score_pairs(
    state: &AppState,
    pairs: Vec<(String, String)>,
    field: &str,
    opts: EncodeOptions,
    raw_scores: bool,
    priority: Option<Priority>,
) -> Result<Ranked, ApiError> {
    let chars = pairs
        .iter()
        .map(|(query, text)| query.chars().count() + text.chars().count())
        .sum();
    let pairs = pairs
        .into_iter()
        .map(|(query, text)| EncodingInput::Pair(query, text).into())
        .collect();
    let request = InferRequest {
        inputs: pairs,
        opts,
        batched: true,
        priority,
    };
    let results = state
        .infer
        .predict(request, raw_scores)
        .await
        .map_err(|e| ApiError::inference(e, InputNames::Pairs(field), TRUNCATE_HINT))?;
    let (scores, metas): (Vec<f32>, Vec<InferMetadata>) = results
        .into_iter()
        .map(|(scores, meta)| (scores[0], meta))
        .unzip();
    let mut scores: Vec<(usize, f32)> = scores.into_iter().enumerate().collect();
    scores.sort_by(|a, b| descending(a.1, b.1));
    Ok(Ranked {
        scores,
        metas,
        chars,
    })
}
