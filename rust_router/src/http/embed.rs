//! Embedding routes: `/embed`, `/embed_all`, `/similarity` (`/embed_sparse`: `sparse.rs`).

use super::body::TeiJson;
use super::error::{ApiError, ErrorResponse, InputNames, LONG_INPUT_HINT, TRUNCATE_HINT};
use super::model_routes::Needs;
use super::openapi::Refusals;
use super::response_meta::{Answered, ResponseMeta};
use super::state::AppState;
use super::types::{
    EmbedAllRequest, EmbedAllResponse, EmbedRequest, EmbedResponse, Embedding, InputType,
    SimilarityRequest, SimilarityResponse,
};
use crate::infer::{InferError, InferMetadata, InferRequest, Priority};
use crate::tokenization::{Chunking, EncodeOptions, LongInput};
use axum::extract::State;
use axum::response::Response;
use axum::Json;
use std::time::Instant;

/// Validates a list of inputs (`names`: as the route's body names them) and counts its
/// characters.
pub(crate) fn check_inputs(
    state: &AppState,
    inputs: &[InputType],
    names: InputNames,
) -> Result<usize, ApiError> {
    state.check_batch(inputs.len(), names.field())?;
    if let Some(index) = inputs.iter().position(InputType::is_empty) {
        return Err(ApiError::empty_input(names, index));
    }
    Ok(inputs.iter().map(InputType::count_chars).sum())
}

/// Pooled embeddings for every input, in input order.
pub(crate) async fn embed_inputs(
    state: &AppState,
    inputs: Vec<InputType>,
    batched: bool,
    opts: EncodeOptions,
    normalize: bool,
    dimensions: Option<usize>,
    priority: Option<Priority>,
) -> Result<(Vec<Vec<f32>>, Vec<InferMetadata>), InferError> {
    let request = InferRequest {
        inputs: inputs.into_iter().map(Into::into).collect(),
        opts,
        batched,
        priority,
    };
    // The queue may put the sequences in different batches; `Infer` reassembles them in order.
    let results = state
        .infer
        .embed_pooled(request, normalize, dimensions)
        .await?;
    Ok(results.into_iter().unzip())
}

pub(crate) fn encode_options(
    state: &AppState,
    truncate: Option<bool>,
    direction: crate::tokenization::TruncationDirection,
    prompt_name: Option<String>,
) -> EncodeOptions {
    EncodeOptions {
        truncate: truncate.unwrap_or(state.config.auto_truncate),
        chunking: None,
        direction,
        prompt_name,
        apply_prompts: true,
        inline: false,
        adapter: state.adapter,
    }
}

/// `opts` for an over-long input as the request says: its `long_input`, else its `truncate`,
/// else `--long-input` (whose `error` is `truncate` under `--auto-truncate`).
pub(crate) fn with_long_input(
    state: &AppState,
    mut opts: EncodeOptions,
    truncate: Option<bool>,
    long_input: Option<LongInput>,
    chunk_overlap: Option<i64>,
) -> Result<EncodeOptions, ApiError> {
    let mode = long_input
        .or(truncate.map(|t| {
            if t {
                LongInput::Truncate
            } else {
                LongInput::Error
            }
        }))
        .unwrap_or(match state.config.long_input {
            LongInput::Error if state.config.auto_truncate => LongInput::Truncate,
            mode => mode,
        });
    let overlap = chunk_overlap.unwrap_or(0);
    let overlap = usize::try_from(overlap).map_err(|_| {
        ApiError::validation(format!(
            "Input validation error: `chunk_overlap` must be at least 0, got {overlap}"
        ))
    })?;
    opts.truncate = mode == LongInput::Truncate;
    opts.chunking = (mode == LongInput::Chunk).then_some(Chunking {
        overlap,
        max_chunks: state.config.max_chunks,
    });
    Ok(opts)
}

/// Get embeddings. Returns a 424 status code if the model is not an embedding model.
#[utoipa::path(
    post, path = "/embed", tag = "Text Embeddings Inference",
    request_body = EmbedRequest,
    responses(
        (status = 200, description = "Embeddings", body = EmbedResponse),
        (status = 400, description = "Empty input", body = ErrorResponse),
        (status = 413, description = "An input needing more windows than `--max-chunks` under `long_input: chunk` (the body over `--payload-limit` too)", body = ErrorResponse),
        (status = 422, description = "Invalid input: malformed body, more inputs than `--max-client-batch-size`, an input longer than the model's `max_input_length` tokens with `long_input: error`, token ids outside the vocabulary, an unknown `prompt_name` or one with token ids, an unknown `long_input`, a negative `chunk_overlap` or one not below the window, `dimensions` over `hidden_size`, an unknown `encoding_format`, `quantization_ranges` that do not fit (or `int8`/`uint8` of unnormalized embeddings without them), an image input that is refused (not an image, truncated, over `--max-image-bytes` or `--max-image-pixels`, a URL, bad base64, a text-only model), named by its index", body = ErrorResponse),
        (status = 424, description = "Inference failed or wrong model type", body = ErrorResponse),
        Refusals,
    )
)]
pub async fn embed(State(state): State<AppState>, req: TeiJson<EmbedRequest>) -> Response {
    let result = embed_answer(&state, req.0)
        .await
        .map(|a| (a.headers, Json(EmbedResponse(a.body))));
    state.finish(result)
}

/// `/embed`'s answer to `req` (also the gRPC `Embed` call's).
pub(crate) async fn embed_answer(
    state: &AppState,
    req: EmbedRequest,
) -> Result<Answered<Vec<Embedding>>, ApiError> {
    let state = state.for_model(req.model.as_deref())?;
    let start = Instant::now();
    state.require(Needs::Embedding, "/embed")?;
    let (batched, inputs) = req.inputs.into_vec();
    let names = InputNames::new("inputs", batched);
    let chars = check_inputs(&state, &inputs, names)?;
    state.check_dimensions(req.dimensions)?;
    let encoder = state.encoder(
        req.encoding_format,
        req.quantization_ranges,
        req.normalize,
        req.dimensions,
    )?;
    let opts = encode_options(
        &state,
        req.truncate,
        req.truncation_direction,
        req.prompt_name,
    );
    let opts = with_long_input(
        &state,
        opts,
        req.truncate,
        req.long_input,
        req.chunk_overlap,
    )?;
    let (embeddings, metas) = embed_inputs(
        &state,
        inputs,
        batched,
        opts,
        req.normalize,
        req.dimensions,
        req.priority,
    )
    .await
    .map_err(|e| ApiError::inference(e, names, LONG_INPUT_HINT))?;
    let meta = ResponseMeta::new(start, chars, &metas);
    let method = if batched { "batch" } else { "single" };
    let embeddings = embeddings.into_iter().map(|e| encoder.encode(e)).collect();
    Ok(meta.answer(&state, method, embeddings))
}

/// Get all per-token embeddings (last hidden states, not pooled, not normalized).
#[utoipa::path(
    post, path = "/embed_all", tag = "Text Embeddings Inference",
    request_body = EmbedAllRequest,
    responses(
        (status = 200, description = "Embeddings", body = EmbedAllResponse),
        (status = 400, description = "Empty input", body = ErrorResponse),
        (status = 422, description = "Invalid input: malformed body, more inputs than `--max-client-batch-size`, an input longer than the model's `max_input_length` tokens without truncation, token ids outside the vocabulary, an unknown `prompt_name` or one with token ids", body = ErrorResponse),
        (status = 424, description = "Inference failed or wrong model type", body = ErrorResponse),
        Refusals,
    )
)]
pub async fn embed_all(State(state): State<AppState>, req: TeiJson<EmbedAllRequest>) -> Response {
    let result = embed_all_answer(&state, req.0)
        .await
        .map(|a| (a.headers, Json(EmbedAllResponse(a.body))));
    state.finish(result)
}

/// `/embed_all`'s answer to `req` (also the gRPC `EmbedAll` call's): per input, a row per
/// token.
pub(crate) async fn embed_all_answer(
    state: &AppState,
    req: EmbedAllRequest,
) -> Result<Answered<Vec<Vec<Vec<f32>>>>, ApiError> {
    let state = state.for_model(req.model.as_deref())?;
    let start = Instant::now();
    state.require(Needs::Embedding, "/embed_all")?;
    let (batched, inputs) = req.inputs.into_vec();
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
        .embed_all(request)
        .await
        .map_err(|e| ApiError::inference(e, names, TRUNCATE_HINT))?;
    let (embeddings, metas): (Vec<_>, Vec<_>) = results.into_iter().unzip();
    let meta = ResponseMeta::new(start, chars, &metas);
    let method = if batched { "batch" } else { "single" };
    Ok(meta.answer(&state, method, embeddings))
}

/// Cosine similarity of `source_sentence` with each of `sentences`.
#[utoipa::path(
    post, path = "/similarity", tag = "Text Embeddings Inference",
    request_body = SimilarityRequest,
    responses(
        (status = 200, description = "Similarities", body = SimilarityResponse),
        (status = 400, description = "Empty input", body = ErrorResponse),
        (status = 413, description = "An input needing more windows than `--max-chunks` under `long_input: chunk` (the body over `--payload-limit` too)", body = ErrorResponse),
        (status = 422, description = "Invalid input: malformed body, more inputs than `--max-client-batch-size`, an input longer than the model's `max_input_length` tokens with `long_input: error`, an unknown `prompt_name` or `long_input`, a negative `chunk_overlap` or one not below the window", body = ErrorResponse),
        (status = 424, description = "Inference failed or wrong model type", body = ErrorResponse),
        Refusals,
    )
)]
pub async fn similarity(
    State(state): State<AppState>,
    req: TeiJson<SimilarityRequest>,
) -> Response {
    let result = async {
        let req = req.0;
        let state = state.for_model(req.model.as_deref())?;
        let start = Instant::now();
        state.require(Needs::Embedding, "/similarity")?;
        if req.inputs.sentences.is_empty() {
            return Err(ApiError::empty("sentences"));
        }
        let mut inputs = vec![InputType::String(req.inputs.source_sentence)];
        inputs.extend(req.inputs.sentences.into_iter().map(InputType::String));
        let names = InputNames::Similarity;
        let chars = check_inputs(&state, &inputs, names)?;
        let params = req.parameters.unwrap_or_default();
        let opts = encode_options(
            &state,
            params.truncate,
            params.truncation_direction,
            params.prompt_name,
        );
        let opts = with_long_input(
            &state,
            opts,
            params.truncate,
            params.long_input,
            params.chunk_overlap,
        )?;
        let (embeddings, metas) =
            embed_inputs(&state, inputs, true, opts, true, None, req.priority)
                .await
                .map_err(|e| ApiError::inference(e, names, LONG_INPUT_HINT))?;
        // Normalized vectors: cosine similarity is the dot product.
        let source = &embeddings[0];
        let scores = embeddings[1..]
            .iter()
            .map(|e| e.iter().zip(source).map(|(a, b)| a * b).sum())
            .collect();
        let meta = ResponseMeta::new(start, chars, &metas);
        Ok((
            meta.finish(&state, "batch"),
            Json(SimilarityResponse(scores)),
        ))
    }
    .await;
    state.finish(result)
}
