//! OpenAI-compatible `POST /v1/embeddings`.

use super::body::OpenAIJson;
use super::embed::{check_inputs, embed_inputs, encode_options, with_long_input};
use super::error::{ApiError, InputNames, OpenAIErrorResponse};
use super::model_routes::Needs;
use super::openapi::OpenAIRefusals;
use super::response_meta::ResponseMeta;
use super::state::AppState;
use super::types::{
    OpenAICompatEmbedding, OpenAICompatRequest, OpenAICompatResponse, OpenAICompatUsage,
};
use crate::tokenization::TruncationDirection;
use axum::extract::State;
use axum::response::Response;
use axum::Json;
use std::time::Instant;

/// OpenAI's request has no `truncate` field: what helps with an over-long input here.
const AUTO_TRUNCATE_HINT: &str = "Shorten the input, send `long_input: \"chunk\"` to embed it \
     whole, or start the server with `--auto-truncate` to truncate over-long inputs";

/// OpenAI compatible embeddings: normalized, optionally shortened with `dimensions`.
#[utoipa::path(
    post, path = "/v1/embeddings", tag = "Text Embeddings Inference",
    request_body = OpenAICompatRequest,
    responses(
        (status = 200, description = "Embeddings", body = OpenAICompatResponse),
        (status = 400, description = "Empty input or wrong model type", body = OpenAIErrorResponse),
        (status = 413, description = "An input needing more windows than `--max-chunks` under `long_input: chunk` (the body over `--payload-limit` too)", body = OpenAIErrorResponse),
        (status = 422, description = "Invalid input: malformed body, more inputs than `--max-client-batch-size`, an input longer than the model's `max_input_length` tokens with `long_input: error`, token ids outside the vocabulary, an unknown `long_input`, a negative `chunk_overlap` or one not below the window, `dimensions` over `hidden_size`, an unknown `encoding_format`, `quantization_ranges` that do not fit, an image input that is refused (not an image, truncated, over `--max-image-bytes` or `--max-image-pixels`, a URL, bad base64, a text-only model), named by its index", body = OpenAIErrorResponse),
        (status = 500, description = "Inference failed", body = OpenAIErrorResponse),
        OpenAIRefusals,
    )
)]
pub async fn embeddings(
    State(state): State<AppState>,
    req: OpenAIJson<OpenAICompatRequest>,
) -> Response {
    let result = async {
        let req = req.0;
        let state = state.for_model(req.model.as_deref())?;
        let start = Instant::now();
        state.require(Needs::Embedding, "/v1/embeddings")?;
        let (batched, inputs) = req.input.into_vec();
        let names = InputNames::new("input", batched);
        let chars = check_inputs(&state, &inputs, names)?;
        state.check_dimensions(req.dimensions)?;
        let encoder = state.encoder(
            req.encoding_format,
            req.quantization_ranges,
            true,
            req.dimensions,
        )?;
        let opts = encode_options(&state, None, TruncationDirection::Right, None);
        let opts = with_long_input(&state, opts, None, req.long_input, req.chunk_overlap)?;
        let (embeddings, metas) = embed_inputs(
            &state,
            inputs,
            batched,
            opts,
            true,
            req.dimensions,
            req.priority,
        )
        .await
        .map_err(|e| ApiError::inference(e, names, AUTO_TRUNCATE_HINT))?;
        let meta = ResponseMeta::new(start, chars, &metas);
        let data = embeddings
            .into_iter()
            .enumerate()
            .map(|(index, e)| OpenAICompatEmbedding {
                object: "embedding",
                embedding: encoder.encode(e),
                index,
            })
            .collect();
        let body = OpenAICompatResponse {
            object: "list",
            data,
            model: state.config.served_model_name.clone(),
            usage: OpenAICompatUsage {
                prompt_tokens: meta.compute_tokens,
                total_tokens: meta.compute_tokens,
            },
        };
        let method = if batched { "batch" } else { "single" };
        Ok::<_, ApiError>((meta.finish(&state, method), Json(body)))
    }
    .await;
    state.finish(result.map_err(|e| e.openai(true)))
}
