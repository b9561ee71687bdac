//! Late interaction (ColBERT): `/embed_multivector` and MaxSim scoring for `/rerank`.
//!
//! The model's rules come from the runtime ([`LateInteraction`], PyLate's): an input is
//! tokenized, cut to its type's length less the prefix token, the prefix goes in after the
//! first token, and a query is padded with mask tokens when the model expands queries. The
//! runtime gives one normalized vector per token (`embed_all`); a document then drops the
//! vectors of its skiplist tokens. `/rerank` encodes the query that way, then has the runtime
//! score the documents against it where they run (`BatchKind::MaxSim`): only their scores
//! come back.

use super::body::TeiJson;
use super::error::{ApiError, ErrorResponse, InputNames};
use super::fields;
use super::model_routes::{not_served, Needs};
use super::openapi::{InputDoc, PriorityDoc, Refusals};
use super::quantize::to_base64;
use super::response_meta::{Answered, ResponseMeta};
use super::state::AppState;
use super::types::{Input, InputType};
use crate::backend::LateInteraction;
use crate::infer::{InferInput, InferMetadata, InferRequest, Priority};
use crate::tokenization::{EncodeOptions, EncodingInput};
use axum::extract::State;
use axum::response::Response;
use axum::Json;
use futures_util::future::try_join_all;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Instant;
use utoipa::ToSchema;

/// Which side of late interaction an input is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum MultivectorInputType {
    /// With the query prefix, padded with mask tokens to the query length when the model
    /// expands queries.
    Query,
    /// With the document prefix, without the vectors of punctuation (the skiplist).
    Document,
}

/// How the token vectors are written: `float` (a list of numbers per token) or `base64`
/// (per input, the little-endian float32 bytes of all its vectors, token after token).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum MultivectorFormat {
    #[default]
    Float,
    Base64,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct EmbedMultivectorRequest {
    /// The served model to run (`/v1/models`; a name or its full id); the default model
    /// when absent.
    #[serde(default)]
    pub model: Option<String>,
    /// Texts (token ids are refused: the model's rules need the text's own tokens).
    #[schema(value_type = InputDoc, example = "What is Deep Learning?")]
    pub inputs: Input,
    /// `query` or `document` (required).
    pub input_type: MultivectorInputType,
    /// Cut an input longer than its type's length (`query_length`/`document_length` in
    /// `/info`); default `--auto-truncate`, else such an input is refused with 422.
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub encoding_format: MultivectorFormat,
    /// `high`: the interactive lane whatever the request's size, `low`: the bulk lane;
    /// absent or `null`: by size (`--interactive-max-tokens`).
    #[serde(default, deserialize_with = "fields::priority")]
    #[schema(value_type = Option<PriorityDoc>, nullable)]
    pub priority: Option<Priority>,
}

/// One input's token vectors.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum TokenVectors {
    Float(Vec<Vec<f32>>),
    Base64(String),
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!([[[0.1, 0.2], [0.3, 0.4]]]))]
pub struct EmbedMultivectorResponse(pub Vec<TokenVectors>);

/// Per input, its token vectors (late interaction, ColBERT models).
#[utoipa::path(
    post, path = "/embed_multivector", tag = "Text Embeddings Inference",
    request_body = EmbedMultivectorRequest,
    responses(
        (status = 200, description = "Token vectors, one list per input", body = EmbedMultivectorResponse),
        (status = 400, description = "Empty input", body = ErrorResponse),
        (status = 422, description = "Invalid input: malformed body, `input_type` missing or other than `query`/`document`, token ids, more inputs than `--max-client-batch-size`, an input longer than its type's length without truncation", body = ErrorResponse),
        (status = 424, description = "Inference failed, or the model is not a late-interaction (ColBERT) model", body = ErrorResponse),
        Refusals,
    )
)]
pub async fn embed_multivector(
    State(state): State<AppState>,
    req: TeiJson<EmbedMultivectorRequest>,
) -> Response {
    let result = async {
        let req = req.0;
        let state = state.for_model(req.model.as_deref())?;
        let start = Instant::now();
        let late = late_interaction(&state, "/embed_multivector")?;
        let (batched, inputs) = req.inputs.into_vec();
        let names = InputNames::new("inputs", batched);
        let texts = texts_of(&state, inputs, names)?;
        let chars = texts.iter().map(|t| t.chars().count()).sum();
        let truncate = req.truncate.unwrap_or(state.config.auto_truncate);
        let (vectors, metas) = token_vectors(
            &state,
            &late,
            &texts,
            req.input_type,
            truncate,
            names,
            req.priority,
        )
        .await?;
        let meta = ResponseMeta::new(start, chars, &metas);
        let body = vectors
            .into_iter()
            .map(|rows| match req.encoding_format {
                MultivectorFormat::Float => TokenVectors::Float(rows),
                MultivectorFormat::Base64 => TokenVectors::Base64(to_base64(&rows.concat())),
            })
            .collect();
        let method = if batched { "batch" } else { "single" };
        let answered: Answered<Vec<TokenVectors>> = meta.answer(&state, method, body);
        Ok((
            answered.headers,
            Json(EmbedMultivectorResponse(answered.body)),
        ))
    }
    .await;
    state.finish(result)
}

/// The model's late-interaction rules, or the error that `route` is not served.
pub(crate) fn late_interaction(state: &AppState, route: &str) -> Result<LateInteraction, ApiError> {
    let info = state.infer.info();
    match &info.late_interaction {
        Some(late) => Ok(late.clone()),
        None => Err(not_served(info.model_type, route)),
    }
}

/// Whether `/rerank` scores by MaxSim (a late-interaction model) rather than a reranker.
pub(crate) fn needs_for_rerank(state: &AppState) -> Option<Needs> {
    match state.infer.info().late_interaction {
        Some(_) => None,
        None => Some(Needs::Reranker),
    }
}

fn texts_of(
    state: &AppState,
    inputs: Vec<InputType>,
    names: InputNames<'_>,
) -> Result<Vec<String>, ApiError> {
    state.check_batch(inputs.len(), names.field())?;
    inputs
        .into_iter()
        .enumerate()
        .map(|(i, input)| match input {
            InputType::String(s) if s.trim().is_empty() => Err(ApiError::empty_input(names, i)),
            InputType::String(s) => Ok(s),
            InputType::Ids(_) => Err(ApiError::validation(format!(
                "{}: token ids are not accepted by a late-interaction model; send the text",
                names.of(i)
            ))),
            InputType::Image(_) => Err(ApiError::validation(format!(
                "{}: a late-interaction model embeds texts only: it takes no images",
                names.of(i)
            ))),
        })
        .collect()
}

/// Every text's token ids as the model reads them (see the module docs), or the error of
/// one too long without `truncate`.
async fn model_ids(
    state: &AppState,
    late: &LateInteraction,
    texts: &[String],
    input_type: MultivectorInputType,
    truncate: bool,
    names: InputNames<'_>,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let tokenization = state.infer.tokenization();
    // sentence-transformers strips every text before tokenizing it.
    let tokens = try_join_all(
        texts
            .iter()
            .map(|text| tokenization.tokenize(text.trim().to_string(), true, None)),
    )
    .await?;
    let mut ids = Vec::with_capacity(tokens.len());
    for (i, seq) in tokens.into_iter().enumerate() {
        let seq: Vec<u32> = seq.into_iter().map(|t| t.id).collect();
        let limit = late.token_limit(input_type);
        if seq.len() > limit && !truncate {
            return Err(ApiError::validation(format!(
                "{} has {} tokens, more than the model's {} limit of {limit}; pass `truncate: true` to cut it",
                names.of(i),
                seq.len(),
                input_type.name()
            )));
        }
        ids.push(late.model_inputs(seq, input_type));
    }
    Ok(ids)
}

/// A request of sequences given as the model reads them (nothing added, nothing cut).
fn request_of(ids: &[Vec<u32>], priority: Option<Priority>) -> InferRequest {
    InferRequest {
        inputs: ids
            .iter()
            .map(|seq| InferInput::from(EncodingInput::Ids(seq.clone())))
            .collect(),
        opts: EncodeOptions {
            truncate: false,
            ..Default::default()
        },
        batched: true,
        priority,
    }
}

/// Every text's token vectors as the model's rules say (see the module docs).
async fn token_vectors(
    state: &AppState,
    late: &LateInteraction,
    texts: &[String],
    input_type: MultivectorInputType,
    truncate: bool,
    names: InputNames<'_>,
    priority: Option<Priority>,
) -> Result<(Vec<Vec<Vec<f32>>>, Vec<InferMetadata>), ApiError> {
    let ids = model_ids(state, late, texts, input_type, truncate, names).await?;
    let results = state
        .infer
        .embed_all(request_of(&ids, priority))
        .await
        .map_err(|e| ApiError::inference(e, names, ""))?;
    let mut vectors = Vec::with_capacity(results.len());
    let mut metas = Vec::with_capacity(results.len());
    for ((rows, meta), ids) in results.into_iter().zip(&ids) {
        vectors.push(late.kept_rows(rows, ids, input_type));
        metas.push(meta);
    }
    Ok((vectors, metas))
}

/// `/rerank` on a late-interaction model: MaxSim of the query's vectors against each text's,
/// best first as `(index in texts, score)`, with the metadata of every input run. The query
/// is encoded first; the documents are then scored where they run (`BatchKind::MaxSim`),
/// their vectors never leaving the device.
pub(crate) async fn maxsim_rank(
    state: &AppState,
    query: &str,
    texts: &[String],
    field: &str,
    truncate: bool,
    priority: Option<Priority>,
) -> Result<(Vec<(usize, f32)>, Vec<InferMetadata>), ApiError> {
    let late = late_interaction(state, "/rerank")?;
    let names = InputNames::List(field);
    let query_texts = [query.to_string()];
    // The documents are tokenized while the query runs.
    let (query_vectors, document_ids) = tokio::join!(
        token_vectors(
            state,
            &late,
            &query_texts,
            MultivectorInputType::Query,
            truncate,
            InputNames::One("query"),
            priority,
        ),
        model_ids(
            state,
            &late,
            texts,
            MultivectorInputType::Document,
            truncate,
            names
        ),
    );
    let (mut query_rows, mut metas) = query_vectors?;
    let document_ids = document_ids?;
    let query: Arc<[f32]> = query_rows.pop().unwrap_or_default().concat().into();
    let results = state
        .infer
        .maxsim(request_of(&document_ids, priority), query)
        .await
        .map_err(|e| ApiError::inference(e, names, ""))?;
    let mut scores = Vec::with_capacity(results.len());
    for (i, (score, meta)) in results.into_iter().enumerate() {
        scores.push((i, score));
        metas.push(meta);
    }
    scores.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok((scores, metas))
}

impl MultivectorInputType {
    pub fn name(self) -> &'static str {
        match self {
            Self::Query => "query",
            Self::Document => "document",
        }
    }
}

impl LateInteraction {
    fn length(&self, input_type: MultivectorInputType) -> usize {
        match input_type {
            MultivectorInputType::Query => self.query_length,
            MultivectorInputType::Document => self.document_length,
        }
    }

    fn prefix(&self, input_type: MultivectorInputType) -> Option<u32> {
        match input_type {
            MultivectorInputType::Query => self.query_prefix_id,
            MultivectorInputType::Document => self.document_prefix_id,
        }
    }

    /// Tokens an input may have (special tokens included) before its prefix goes in.
    pub fn token_limit(&self, input_type: MultivectorInputType) -> usize {
        self.length(input_type) - usize::from(self.prefix(input_type).is_some())
    }

    /// One input's tokens (special tokens included) as the model reads them: cut to
    /// `token_limit` keeping the last (special) token, the prefix after the first token, a
    /// query padded with mask tokens when the model expands queries.
    pub fn model_inputs(&self, mut ids: Vec<u32>, input_type: MultivectorInputType) -> Vec<u32> {
        let limit = self.token_limit(input_type);
        if ids.len() > limit {
            let last = ids[ids.len() - 1];
            ids.truncate(limit - 1);
            ids.push(last);
        }
        if let Some(prefix) = self.prefix(input_type) {
            ids.insert(1.min(ids.len()), prefix);
        }
        if input_type == MultivectorInputType::Query && self.expand_queries {
            ids.resize(self.query_length.max(ids.len()), self.mask_token_id);
        }
        ids
    }

    /// The rows kept of an input's vectors: all of a query's, a document's but those of
    /// skiplist tokens.
    pub fn kept_rows(
        &self,
        rows: Vec<Vec<f32>>,
        ids: &[u32],
        input_type: MultivectorInputType,
    ) -> Vec<Vec<f32>> {
        match input_type {
            MultivectorInputType::Query => rows,
            MultivectorInputType::Document => rows
                .into_iter()
                .zip(ids)
                .filter(|(_, id)| !self.skiplist_ids.contains(id))
                .map(|(row, _)| row)
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(expand: bool) -> LateInteraction {
        LateInteraction {
            query_prefix_id: Some(50),
            document_prefix_id: Some(51),
            query_length: 6,
            document_length: 5,
            expand_queries: expand,
            attend_to_expansion: false,
            mask_token_id: 4,
            skiplist_ids: vec![9],
            embedding_size: 2,
        }
    }

    #[test]
    fn queries_get_prefix_and_expansion() {
        let late = rules(true);
        let q = MultivectorInputType::Query;
        assert_eq!(late.model_inputs(vec![2, 7, 3], q), vec![2, 50, 7, 3, 4, 4]);
        // Cut to 5 tokens keeping [SEP], then the prefix: 6 tokens, no room for masks.
        assert_eq!(
            late.model_inputs(vec![2, 7, 8, 10, 11, 12, 3], q),
            vec![2, 50, 7, 8, 10, 3]
        );
        assert_eq!(
            rules(false).model_inputs(vec![2, 7, 3], q),
            vec![2, 50, 7, 3]
        );
    }

    #[test]
    fn documents_get_prefix_and_drop_the_skiplist() {
        let late = rules(true);
        let d = MultivectorInputType::Document;
        let ids = late.model_inputs(vec![2, 7, 9, 8, 3], d);
        assert_eq!(ids, vec![2, 51, 7, 9, 3]);
        let rows: Vec<Vec<f32>> = (0..5).map(|i| vec![i as f32, 0.0]).collect();
        let kept = late.kept_rows(rows, &ids, d);
        assert_eq!(
            kept.iter().map(|r| r[0]).collect::<Vec<_>>(),
            vec![0.0, 1.0, 2.0, 4.0]
        );
    }
}
