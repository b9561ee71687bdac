//! Cohere- and Jina-style rerank: `POST /v1/rerank` and `/v2/rerank`, served by the same
//! reranker path as TEI's `/rerank` ([`classify::rank`]).
//!
//! One body shape serves both APIs: Cohere's `id`, `results` and `meta`, plus Jina's `model`
//! and `usage` (each SDK ignores the other's fields). Errors come in the OpenAI shape, as on
//! every `/v1/` route (`{"error": {"message", "type", "code"}}`).

use super::body::OpenAIJson;
use super::classify::{self, Ranked};
use super::error::{ApiError, OpenAIErrorResponse};
use super::model_routes::Needs;
use super::openapi::OpenAIRefusals;
use super::response_meta::ResponseMeta;
use super::state::AppState;
use crate::tokenization::{EncodeOptions, TruncationDirection};
use axum::extract::State;
use axum::response::Response;
use axum::Json;
use serde::{de, Deserialize, Deserializer, Serialize};
use serde_json::Value;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime};
use utoipa::ToSchema;

/// `documents`: texts, given as strings or as objects with a `text` field (Cohere v1 and
/// Jina accept both; other fields of an object are ignored).
#[derive(Debug, Clone, PartialEq)]
pub struct Documents(pub Vec<String>);

const DOCUMENT_SHAPES: &str = "a string or an object with a string `text` field";

impl TryFrom<Value> for Documents {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        let Value::Array(items) = value else {
            return Err(format!(
                "`documents` must be a list, each item {DOCUMENT_SHAPES}; got {value}"
            ));
        };
        items
            .into_iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(s),
                Value::Object(mut o) => match o.remove("text") {
                    Some(Value::String(s)) => Ok(s),
                    _ => Err(format!(
                        "`documents[{i}]` must be {DOCUMENT_SHAPES}: the object has no string \
                         `text`"
                    )),
                },
                other => Err(format!(
                    "`documents[{i}]` must be {DOCUMENT_SHAPES}, got {other}"
                )),
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

impl<'de> Deserialize<'de> for Documents {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Documents::try_from(Value::deserialize(d)?).map_err(de::Error::custom)
    }
}

// Mirrors one item of [`Documents`] in the OpenAPI document.
/// A document: its text, or an object with a `text` field.
#[allow(dead_code)]
#[derive(ToSchema)]
#[serde(untagged)]
pub enum DocumentDoc {
    Text(#[schema(inline)] super::openapi::TextDoc),
    Object(#[schema(inline)] DocumentText),
}

/// `POST /v1/rerank` and `/v2/rerank` (Cohere v1/v2, Jina). Other fields of those APIs
/// (`max_chunks_per_doc`, `max_tokens_per_doc`, ...) are ignored.
#[derive(Debug, Deserialize, ToSchema)]
pub struct CompatRerankRequest {
    /// The served model to run (`/v1/models`); the default model when absent. With one
    /// model served any name is accepted; with several, an unknown one is refused with 404.
    #[serde(default)]
    pub model: Option<String>,
    #[schema(min_length = 1, example = "What is Deep Learning?")]
    pub query: String,
    /// At least one non-empty document, at most `--max-client-batch-size` (`/info`).
    #[schema(
        value_type = Vec<DocumentDoc>, min_items = 1,
        example = json!(["Deep Learning is ...", {"text": "Paris is ..."}])
    )]
    pub documents: Documents,
    /// Return only the `top_n` best documents (at least 1; default all).
    #[serde(default, deserialize_with = "super::fields::top_n")]
    #[schema(minimum = 1)]
    pub top_n: Option<i64>,
    /// Return each document's text as `document: {text}` (default false, as Cohere; Jina's
    /// clients send `true` to get them).
    #[serde(default)]
    pub return_documents: bool,
    /// Cohere v1's fields of object documents to rank on: only `["text"]` is served.
    #[serde(default)]
    #[schema(value_type = Option<Vec<RankFieldDoc>>)]
    pub rank_fields: Option<Vec<String>>,
    /// Truncate documents longer than the model's limit (default true: Cohere and Jina
    /// truncate long documents rather than fail).
    #[serde(default)]
    pub truncate: Option<bool>,
    /// `high`: the interactive lane whatever the request's size (up to one batch's
    /// `--max-batch-tokens`; a larger request runs in the bulk lane), `low`: the bulk lane even
    /// when small; absent or `null`: by size (`--interactive-max-tokens`).
    #[serde(default, deserialize_with = "super::fields::priority")]
    #[schema(value_type = Option<super::openapi::PriorityDoc>, nullable)]
    pub priority: Option<crate::infer::Priority>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DocumentText {
    #[schema(min_length = 1)]
    pub text: String,
}

/// The one field of a document that is ranked.
#[allow(dead_code)]
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum RankFieldDoc {
    Text,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CompatRerankResult {
    /// Position of the document in the request's `documents`.
    pub index: usize,
    /// The reranker's score through its activation (sigmoid for one label): from 0 to 1.
    pub relevance_score: f32,
    /// With `return_documents: true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub document: Option<DocumentText>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ApiVersion {
    /// `1` on `/v1/rerank`, `2` on `/v2/rerank`.
    pub version: &'static str,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BilledUnits {
    /// Cohere's unit: one query with up to 100 documents.
    pub search_units: usize,
    pub input_tokens: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MetaTokens {
    pub input_tokens: usize,
    pub output_tokens: usize,
}

/// Cohere's `meta`.
#[derive(Debug, Serialize, ToSchema)]
pub struct RerankMeta {
    pub api_version: ApiVersion,
    pub billed_units: BilledUnits,
    pub tokens: MetaTokens,
}

/// Jina's `usage`.
#[derive(Debug, Serialize, ToSchema)]
pub struct RerankUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CompatRerankResponse {
    /// A fresh id per answer (UUID form).
    pub id: String,
    /// `--served-model-name`.
    pub model: String,
    /// Best first.
    pub results: Vec<CompatRerankResult>,
    pub meta: RerankMeta,
    pub usage: RerankUsage,
}

/// A UUID-shaped (version 4 layout) id, unique per answer: a process-wide counter and the
/// clock, hashed with a randomly keyed hasher (no extra dependency for a label).
fn response_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let keys = std::collections::hash_map::RandomState::new();
    let hi = keys.hash_one((n, nanos, 0u8));
    let lo = keys.hash_one((n, nanos, 1u8));
    let bits = ((hi as u128) << 64 | lo as u128) & !(0xf000u128 << 64) | (0x4000u128 << 64);
    let bits = bits & !(0xc << 60) | (0x8 << 60);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

async fn rerank(
    state: AppState,
    req: CompatRerankRequest,
    route: &str,
    version: &'static str,
) -> Response {
    let result = async {
        let state = state.for_model(req.model.as_deref())?;
        let start = Instant::now();
        state.require(Needs::Reranker, route)?;
        let top_n = classify::top_n(req.top_n)?;
        if let Some(fields) = &req.rank_fields {
            if fields.iter().any(|f| f != "text") {
                return Err(ApiError::validation(format!(
                    "Input validation error: `rank_fields` {fields:?}: only the `text` field of \
                     a document is ranked"
                )));
            }
        }
        let opts = EncodeOptions {
            truncate: req.truncate.unwrap_or(true),
            direction: TruncationDirection::Right,
            adapter: state.adapter,
            ..Default::default()
        };
        let texts = req.documents.0;
        let Ranked {
            scores,
            metas,
            chars,
        } = classify::rank(
            &state,
            &req.query,
            &texts,
            "documents",
            opts,
            false,
            req.priority,
        )
        .await?;
        let results = scores
            .into_iter()
            .take(top_n)
            .map(|(index, relevance_score)| CompatRerankResult {
                index,
                relevance_score,
                document: req.return_documents.then(|| DocumentText {
                    text: texts[index].clone(),
                }),
            })
            .collect();
        let meta = ResponseMeta::new(start, chars, &metas);
        let tokens = meta.compute_tokens;
        let body = CompatRerankResponse {
            id: response_id(),
            model: state.config.served_model_name.clone(),
            results,
            meta: RerankMeta {
                api_version: ApiVersion { version },
                billed_units: BilledUnits {
                    search_units: texts.len().div_ceil(100),
                    input_tokens: tokens,
                },
                tokens: MetaTokens {
                    input_tokens: tokens,
                    output_tokens: 0,
                },
            },
            usage: RerankUsage {
                prompt_tokens: tokens,
                total_tokens: tokens,
            },
        };
        Ok((meta.finish(&state, "batch"), Json(body)))
    }
    .await;
    state.finish(result.map_err(|e| e.openai(true)))
}

/// Cohere v1 / Jina rerank: rank `documents` by relevance to `query`.
#[utoipa::path(
    post, path = "/v1/rerank", tag = "Text Embeddings Inference",
    request_body = CompatRerankRequest,
    responses(
        (status = 200, description = "Results, best first", body = CompatRerankResponse),
        (status = 400, description = "Empty `query` or `documents`, or the model is not a reranker", body = OpenAIErrorResponse),
        (status = 422, description = "Invalid input: malformed body, a document that is neither a string nor `{text}`, `top_n` 0, `rank_fields` other than `text`, more documents than `--max-client-batch-size`, a document over the model's limit with `truncate: false`", body = OpenAIErrorResponse),
        (status = 500, description = "Inference failed", body = OpenAIErrorResponse),
        OpenAIRefusals,
    )
)]
pub async fn rerank_v1(
    State(state): State<AppState>,
    req: OpenAIJson<CompatRerankRequest>,
) -> Response {
    rerank(state, req.0, "/v1/rerank", "1").await
}

/// Cohere v2 rerank: as `/v1/rerank` (`meta.api_version.version` is `2`).
#[utoipa::path(
    post, path = "/v2/rerank", tag = "Text Embeddings Inference",
    request_body = CompatRerankRequest,
    responses(
        (status = 200, description = "Results, best first", body = CompatRerankResponse),
        (status = 400, description = "Empty `query` or `documents`, or the model is not a reranker", body = OpenAIErrorResponse),
        (status = 422, description = "Invalid input: malformed body, a document that is neither a string nor `{text}`, `top_n` 0, `rank_fields` other than `text`, more documents than `--max-client-batch-size`, a document over the model's limit with `truncate: false`", body = OpenAIErrorResponse),
        (status = 500, description = "Inference failed", body = OpenAIErrorResponse),
        OpenAIRefusals,
    )
)]
pub async fn rerank_v2(
    State(state): State<AppState>,
    req: OpenAIJson<CompatRerankRequest>,
) -> Response {
    rerank(state, req.0, "/v2/rerank", "2").await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_strings_or_text_objects() {
        let d: Documents = serde_json::from_str(r#"["a", {"text": "b", "title": "t"}]"#).unwrap();
        assert_eq!(d.0, vec!["a".to_string(), "b".to_string()]);
        let cases = [
            (r#"["a", 5]"#, "`documents[1]`"),
            (r#"[{"title": "t"}]"#, "no string `text`"),
            (r#"[{"text": 3}]"#, "no string `text`"),
            (r#""a""#, "must be a list"),
        ];
        for (body, expected) in cases {
            let e = serde_json::from_str::<Documents>(body)
                .unwrap_err()
                .to_string();
            assert!(e.contains(expected), "{body}: {e}");
        }
    }

    #[test]
    fn ids_are_uuid_shaped_and_fresh() {
        let (a, b) = (response_id(), response_id());
        assert_ne!(a, b);
        let parts: Vec<&str> = a.split('-').collect();
        let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        assert_eq!(lens, [8, 4, 4, 4, 12], "{a}");
        assert!(parts[2].starts_with('4'), "{a}");
        assert!("89ab".contains(&parts[3][..1]), "{a}");
    }
}
