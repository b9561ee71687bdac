//! Wire types: TEI's request and response bodies, field for field, plus OpenAI embeddings.

use super::fields;
use super::openapi::{
    InputDoc, InputIdsDoc, PredictInputDoc, PriorityDoc, TextDoc, TokenizeBatchDoc,
};
use super::quantize::{Ranges, RangesDoc};
// Defined beside their code, named here with the other wire types.
pub use super::info::{
    ClassifierModel, DeviceInfo, DeviceRef, EmbeddingModel, HealthDegraded, Info, ModelTypeInfo,
};
pub use super::quantize::{Embedding, EncodingFormat};
use crate::infer::{InferInput, Priority};
use crate::tokenization::{EncodingInput, LongInput, TruncationDirection};
use serde::{de, Deserialize, Deserializer, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// One input: text (a string, or `{"text": ...}`), token ids the client already produced, or
/// an image (`{"image": ...}`: a data URL or base64).
#[derive(Debug, Clone, PartialEq)]
pub enum InputType {
    String(String),
    Ids(Vec<u32>),
    Image(String),
}

impl From<InputType> for InferInput {
    fn from(value: InputType) -> Self {
        match value {
            InputType::String(s) => Self::Text(EncodingInput::Single(s)),
            InputType::Ids(ids) => Self::Text(EncodingInput::Ids(ids)),
            InputType::Image(source) => Self::Image(source),
        }
    }
}

impl InputType {
    pub fn is_empty(&self) -> bool {
        match self {
            Self::String(s) | Self::Image(s) => s.is_empty(),
            Self::Ids(ids) => ids.is_empty(),
        }
    }

    /// Characters of a text, ids of a list of token ids (as [`EncodingInput::count_chars`]),
    /// without a copy of the input: a backfill request's texts are megabytes. An image has
    /// none.
    pub fn count_chars(&self) -> usize {
        match self {
            Self::String(s) => s.chars().count(),
            Self::Ids(ids) => ids.len(),
            Self::Image(_) => 0,
        }
    }
}

/// `inputs` of `/embed` and `input` of `/v1/embeddings`.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Single(InputType),
    Batch(Vec<InputType>),
}

impl Input {
    pub fn into_vec(self) -> (bool, Vec<InputType>) {
        match self {
            Self::Single(i) => (false, vec![i]),
            Self::Batch(b) => (true, b),
        }
    }
}

const INPUT_SHAPES: &str = "a string, a list of strings, a list of token ids, a list of lists \
     of token ids, or inputs as objects ({\"text\": ...} or {\"image\": ...}) alone or mixed in a list";

/// `{"text": "..."}` or `{"image": "<data URL or base64>"}`: exactly one key.
fn object_input(object: serde_json::Map<String, Value>) -> Result<InputType, String> {
    let mut entries = object.into_iter();
    let (Some((key, value)), None) = (entries.next(), entries.next()) else {
        return Err(format!(
            "expected {INPUT_SHAPES}: an input object has exactly one key, `text` or `image`"
        ));
    };
    let Value::String(value) = value else {
        return Err(format!("expected {INPUT_SHAPES}: `{key}` must be a string"));
    };
    match key.as_str() {
        "text" => Ok(InputType::String(value)),
        "image" => Ok(InputType::Image(value)),
        other => Err(format!(
            "expected {INPUT_SHAPES}: unknown input key `{other}` (expected `text` or `image`)"
        )),
    }
}

/// A token id: an integer from 0 to `u32::MAX`, written as `7` or `7.0` (JSON Schema calls
/// both integers, and some clients serialize whole numbers as floats).
fn token_id(x: &Value) -> Option<u32> {
    x.as_u64().and_then(|n| u32::try_from(n).ok()).or_else(|| {
        x.as_f64()
            .filter(|f| f.fract() == 0.0 && (0.0..=u32::MAX as f64).contains(f))
            .map(|f| f as u32)
    })
}

fn ids_from(v: &[Value]) -> Option<Vec<u32>> {
    v.iter().map(token_id).collect()
}

impl TryFrom<Value> for Input {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        let item = |v: Value| match v {
            Value::String(s) => Ok(InputType::String(s)),
            Value::Object(o) => object_input(o),
            Value::Array(a) => ids_from(&a)
                .map(InputType::Ids)
                .ok_or_else(|| format!("expected {INPUT_SHAPES}")),
            other => Err(format!("expected {INPUT_SHAPES}, got {other}")),
        };
        match value {
            Value::String(s) => Ok(Self::Single(InputType::String(s))),
            Value::Object(o) => object_input(o).map(Self::Single),
            // `[]` is an empty batch; `[1, 2]` is one tokenized input.
            Value::Array(a) if a.is_empty() => Ok(Self::Batch(vec![])),
            Value::Array(a) if a[0].is_number() => ids_from(&a)
                .map(|ids| Self::Single(InputType::Ids(ids)))
                .ok_or_else(|| format!("expected {INPUT_SHAPES}: token ids are u32 integers")),
            Value::Array(a) => a
                .into_iter()
                .map(item)
                .collect::<Result<_, _>>()
                .map(Self::Batch),
            other => Err(format!("expected {INPUT_SHAPES}, got {other}")),
        }
    }
}

impl<'de> Deserialize<'de> for Input {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Input::try_from(Value::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// A classification input: one text or a (text, text_pair).
#[derive(Debug, Clone, PartialEq)]
pub enum Sequence {
    Single(String),
    Pair(String, String),
}

impl From<Sequence> for EncodingInput {
    fn from(value: Sequence) -> Self {
        match value {
            Sequence::Single(s) => Self::Single(s),
            Sequence::Pair(a, b) => Self::Pair(a, b),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum PredictInput {
    Single(Sequence),
    Batch(Vec<Sequence>),
}

const PREDICT_SHAPES: &str =
    "a string, a pair of strings [string, string] or a batch [[string], [string, string], ...]";

impl TryFrom<Value> for PredictInput {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        let strings = |a: Vec<Value>| -> Option<Vec<String>> {
            a.into_iter()
                .map(|v| match v {
                    Value::String(s) => Some(s),
                    _ => None,
                })
                .collect()
        };
        let sequence = |mut v: Vec<String>| match v.len() {
            1 => Ok(Sequence::Single(v.remove(0))),
            2 => {
                let b = v.remove(1);
                Ok(Sequence::Pair(v.remove(0), b))
            }
            n => Err(format!(
                "expected {PREDICT_SHAPES}: a sequence has 1 or 2 texts, got {n}"
            )),
        };
        match value {
            Value::String(s) => Ok(Self::Single(Sequence::Single(s))),
            Value::Array(a) if a.is_empty() => Ok(Self::Batch(vec![])),
            Value::Array(a) if a[0].is_string() => strings(a)
                .ok_or_else(|| format!("expected {PREDICT_SHAPES}"))
                .and_then(sequence)
                .map(Self::Single),
            Value::Array(a) => a
                .into_iter()
                .map(|v| match v {
                    Value::Array(inner) => strings(inner)
                        .ok_or_else(|| format!("expected {PREDICT_SHAPES}"))
                        .and_then(sequence),
                    _ => Err(format!("expected {PREDICT_SHAPES}")),
                })
                .collect::<Result<_, _>>()
                .map(Self::Batch),
            other => Err(format!("expected {PREDICT_SHAPES}, got {other}")),
        }
    }
}

impl<'de> Deserialize<'de> for PredictInput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        PredictInput::try_from(Value::deserialize(d)?).map_err(de::Error::custom)
    }
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct EmbedRequest {
    /// The served model to run (`/v1/models`; a name or its full id); the default model
    /// when absent. With several models, any other name is refused with 404.
    #[serde(default)]
    pub model: Option<String>,
    #[schema(value_type = InputDoc, example = "What is Deep Learning?")]
    pub inputs: Input,
    /// Truncate inputs longer than the model's limit instead of failing; defaults to
    /// `--auto-truncate`.
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    /// A key of the model's `prompts` (config_sentence_transformers.json, listed in `/info`)
    /// to prepend; any other name is refused with 422, and so is a prompt with token ids.
    /// For models with task adapters (jina-embeddings-v3: `retrieval.query`,
    /// `retrieval.passage`, `separation`, `classification`, `text-matching`) it also picks
    /// the adapter the inputs run with.
    #[serde(default)]
    pub prompt_name: Option<String>,
    /// What to do with an input longer than the model's limit: `error` (422), `truncate` (as
    /// `truncate: true`) or `chunk` (embed it whole: the weighted mean of windows of the
    /// limit's size, see docs/server.md "Long inputs"). Takes precedence over `truncate`;
    /// defaults to `--long-input`.
    #[serde(default)]
    #[schema(value_type = Option<LongInput>, nullable)]
    pub long_input: Option<LongInput>,
    /// With `long_input: chunk`: tokens each window shares with the previous one, from 0
    /// (default) to less than the window; ignored otherwise.
    #[serde(default, deserialize_with = "fields::chunk_overlap")]
    #[schema(minimum = 0)]
    pub chunk_overlap: Option<i64>,
    #[serde(default = "default_true")]
    #[schema(default = true)]
    pub normalize: bool,
    /// Keep the first `dimensions` values (Matryoshka), before normalization: from 1 to the
    /// model's `hidden_size` (`/info`); more is refused with 422.
    #[serde(default, deserialize_with = "fields::dimensions")]
    #[schema(minimum = 1)]
    pub dimensions: Option<usize>,
    /// `float` (default) returns numbers; `base64`, `int8`, `uint8`, `binary`, `ubinary` as on
    /// `/v1/embeddings` (each vector a base64 string or a list of integers); `null` is `float`.
    #[serde(default, deserialize_with = "fields::null_is_default")]
    #[schema(nullable)]
    pub encoding_format: EncodingFormat,
    /// Calibration ranges of the `int8`/`uint8` encodings: needed when `normalize` is false,
    /// `[-1, 1]` by default otherwise; refused with 422 with any other encoding.
    #[serde(default)]
    #[schema(value_type = Option<RangesDoc>)]
    pub quantization_ranges: Option<Ranges>,
    /// `high`: the interactive lane whatever the request's size (up to one batch's
    /// `--max-batch-tokens`; a larger request runs in the bulk lane), `low`: the bulk lane even
    /// when small; absent or `null`: by size (`--interactive-max-tokens`).
    #[serde(default, deserialize_with = "fields::priority")]
    #[schema(value_type = Option<PriorityDoc>, nullable)]
    pub priority: Option<Priority>,
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct EmbedAllRequest {
    /// The served model to run (`/v1/models`; a name or its full id); the default model
    /// when absent. With several models, any other name is refused with 404.
    #[serde(default)]
    pub model: Option<String>,
    #[schema(value_type = InputDoc, example = "What is Deep Learning?")]
    pub inputs: Input,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    /// A key of the model's `prompts` (listed in `/info`); any other name is refused with 422,
    /// and so is a prompt with token ids.
    #[serde(default)]
    pub prompt_name: Option<String>,
    /// `high`: the interactive lane whatever the request's size (up to one batch's
    /// `--max-batch-tokens`; a larger request runs in the bulk lane), `low`: the bulk lane even
    /// when small; absent or `null`: by size (`--interactive-max-tokens`).
    #[serde(default, deserialize_with = "fields::priority")]
    #[schema(value_type = Option<PriorityDoc>, nullable)]
    pub priority: Option<Priority>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!([[0.0, 1.0, 2.0]]))]
pub struct EmbedResponse(pub Vec<Embedding>);

#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!([[[0.0, 1.0, 2.0]]]))]
pub struct EmbedAllResponse(pub Vec<Vec<Vec<f32>>>);

#[derive(Debug, Deserialize, ToSchema)]
pub struct PredictRequest {
    /// The served model to run (`/v1/models`; a name or its full id); the default model
    /// when absent. With several models, any other name is refused with 404.
    #[serde(default)]
    pub model: Option<String>,
    #[schema(value_type = PredictInputDoc, example = "I like you.")]
    pub inputs: PredictInput,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    /// Return logits instead of sigmoid / softmax scores.
    #[serde(default)]
    pub raw_scores: bool,
    /// `high`: the interactive lane whatever the request's size (up to one batch's
    /// `--max-batch-tokens`; a larger request runs in the bulk lane), `low`: the bulk lane even
    /// when small; absent or `null`: by size (`--interactive-max-tokens`).
    #[serde(default, deserialize_with = "fields::priority")]
    #[schema(value_type = Option<PriorityDoc>, nullable)]
    pub priority: Option<Priority>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Prediction {
    pub score: f32,
    pub label: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum PredictResponse {
    Single(Vec<Prediction>),
    Batch(Vec<Vec<Prediction>>),
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct RerankRequest {
    /// The served model to run (`/v1/models`; a name or its full id); the default model
    /// when absent. With several models, any other name is refused with 404.
    #[serde(default)]
    pub model: Option<String>,
    #[schema(min_length = 1, example = "What is Deep Learning?")]
    pub query: String,
    /// At least one non-empty text, at most `--max-client-batch-size` (`/info`).
    #[schema(
        value_type = Vec<TextDoc>, inline, min_items = 1,
        example = json!(["Deep Learning is ..."])
    )]
    pub texts: Vec<String>,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    #[serde(default)]
    pub raw_scores: bool,
    #[serde(default)]
    pub return_text: bool,
    /// Return only the `top_n` best texts (at least 1; default all).
    #[serde(default, deserialize_with = "fields::top_n")]
    #[schema(minimum = 1)]
    pub top_n: Option<i64>,
    /// `high`: the interactive lane whatever the request's size (up to one batch's
    /// `--max-batch-tokens`; a larger request runs in the bulk lane), `low`: the bulk lane even
    /// when small; absent or `null`: by size (`--interactive-max-tokens`).
    #[serde(default, deserialize_with = "fields::priority")]
    #[schema(value_type = Option<PriorityDoc>, nullable)]
    pub priority: Option<Priority>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Rank {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    pub score: f32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RerankResponse(pub Vec<Rank>);

#[derive(Debug, Deserialize, ToSchema)]
pub struct SimilarityInput {
    /// The sentence the others are compared with.
    #[schema(min_length = 1, example = "What is Deep Learning?")]
    pub source_sentence: String,
    /// At least one non-empty sentence; with `source_sentence`, at most
    /// `--max-client-batch-size` (`/info`).
    #[schema(
        value_type = Vec<TextDoc>, inline, min_items = 1,
        example = json!(["What is Machine Learning?"])
    )]
    pub sentences: Vec<String>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct SimilarityParameters {
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    /// A key of the model's `prompts` (listed in `/info`); any other name is refused with 422.
    #[serde(default)]
    pub prompt_name: Option<String>,
    /// What to do with an input longer than the model's limit: `error` (422), `truncate` (as
    /// `truncate: true`) or `chunk` (embed it whole: the weighted mean of windows of the
    /// limit's size, see docs/server.md "Long inputs"). Takes precedence over `truncate`;
    /// defaults to `--long-input`.
    #[serde(default)]
    #[schema(value_type = Option<LongInput>, nullable)]
    pub long_input: Option<LongInput>,
    /// With `long_input: chunk`: tokens each window shares with the previous one, from 0
    /// (default) to less than the window; ignored otherwise.
    #[serde(default, deserialize_with = "fields::chunk_overlap")]
    #[schema(minimum = 0)]
    pub chunk_overlap: Option<i64>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct SimilarityRequest {
    /// The served model to run (`/v1/models`; a name or its full id); the default model
    /// when absent. With several models, any other name is refused with 404.
    #[serde(default)]
    pub model: Option<String>,
    pub inputs: SimilarityInput,
    #[serde(default)]
    pub parameters: Option<SimilarityParameters>,
    /// `high`: the interactive lane whatever the request's size (up to one batch's
    /// `--max-batch-tokens`; a larger request runs in the bulk lane), `low`: the bulk lane even
    /// when small; absent or `null`: by size (`--interactive-max-tokens`).
    #[serde(default, deserialize_with = "fields::priority")]
    #[schema(value_type = Option<PriorityDoc>, nullable)]
    pub priority: Option<Priority>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!([0.0, 1.0, 0.5]))]
pub struct SimilarityResponse(pub Vec<f32>);

/// `inputs` of `/tokenize`: one string or a list of strings (an empty string is tokenized).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum TokenizeInput {
    Single(String),
    #[schema(value_type = TokenizeBatchDoc)]
    Batch(Vec<String>),
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct TokenizeRequest {
    /// The served model to run (`/v1/models`; a name or its full id); the default model
    /// when absent. With several models, any other name is refused with 404.
    #[serde(default)]
    pub model: Option<String>,
    pub inputs: TokenizeInput,
    #[serde(default = "default_true")]
    #[schema(default = true)]
    pub add_special_tokens: bool,
    /// A key of the model's `prompts` (listed in `/info`); any other name is refused with 422.
    #[serde(default)]
    pub prompt_name: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SimpleToken {
    pub id: u32,
    pub text: String,
    pub special: bool,
    pub start: Option<usize>,
    pub stop: Option<usize>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TokenizeResponse(pub Vec<Vec<SimpleToken>>);

/// `ids` of `/decode`: one list of token ids or a list of them.
#[derive(Debug, Clone, PartialEq)]
pub enum InputIds {
    Single(Vec<u32>),
    Batch(Vec<Vec<u32>>),
}

const IDS_SHAPES: &str = "a list of token ids or a list of lists of token ids";

fn token_ids(v: &[Value]) -> Result<Vec<u32>, String> {
    v.iter()
        .map(|x| {
            token_id(x)
                .ok_or_else(|| format!("token ids are integers from 0 to {}, got {x}", u32::MAX))
        })
        .collect()
}

impl TryFrom<Value> for InputIds {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        match value {
            Value::Array(a) if a.is_empty() => Ok(Self::Batch(vec![])),
            Value::Array(a) if a[0].is_array() => a
                .iter()
                .map(|v| match v {
                    Value::Array(ids) => token_ids(ids),
                    other => Err(format!("expected {IDS_SHAPES}, got {other}")),
                })
                .collect::<Result<_, _>>()
                .map(Self::Batch),
            Value::Array(a) => token_ids(&a).map(Self::Single),
            other => Err(format!("expected {IDS_SHAPES}, got {other}")),
        }
    }
}

impl<'de> Deserialize<'de> for InputIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        InputIds::try_from(Value::deserialize(d)?).map_err(de::Error::custom)
    }
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct DecodeRequest {
    /// The served model to run (`/v1/models`; a name or its full id); the default model
    /// when absent. With several models, any other name is refused with 404.
    #[serde(default)]
    pub model: Option<String>,
    #[schema(value_type = InputIdsDoc, example = json!([101, 7592, 102]))]
    pub ids: InputIds,
    #[serde(default = "default_true")]
    #[schema(default = true)]
    pub skip_special_tokens: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!(["test"]))]
pub struct DecodeResponse(pub Vec<String>);

#[derive(Debug, Deserialize, ToSchema)]
pub struct OpenAICompatRequest {
    #[schema(value_type = InputDoc, example = "What is Deep Learning?")]
    pub input: Input,
    /// The served model to run (`/v1/models`); the default model when absent. With one
    /// model served any name is accepted (as OpenAI's SDKs always send one); with several,
    /// an unknown one is refused with 404.
    #[serde(default)]
    pub model: Option<String>,
    /// `float` (default, also for `null`), `base64`, or a quantized encoding as on `/embed`.
    #[serde(default, deserialize_with = "fields::null_is_default")]
    #[schema(nullable)]
    pub encoding_format: EncodingFormat,
    /// Calibration ranges of the `int8`/`uint8` encodings (default `[-1, 1]`); refused with
    /// 422 with any other encoding.
    #[serde(default)]
    #[schema(value_type = Option<RangesDoc>)]
    pub quantization_ranges: Option<Ranges>,
    /// Keep the first `dimensions` values: from 1 to the model's `hidden_size` (`/info`); more
    /// is refused with 422.
    #[serde(default, deserialize_with = "fields::dimensions")]
    #[schema(minimum = 1)]
    pub dimensions: Option<usize>,
    #[serde(default)]
    pub user: Option<String>,
    /// `high`: the interactive lane whatever the request's size (up to one batch's
    /// `--max-batch-tokens`; a larger request runs in the bulk lane), `low`: the bulk lane even
    /// when small; absent or `null`: by size (`--interactive-max-tokens`).
    #[serde(default, deserialize_with = "fields::priority")]
    #[schema(value_type = Option<PriorityDoc>, nullable)]
    pub priority: Option<Priority>,
    /// What to do with an input longer than the model's limit: `error` (422), `truncate` (as
    /// `truncate: true`) or `chunk` (embed it whole: the weighted mean of windows of the
    /// limit's size, see docs/server.md "Long inputs"). Defaults to `--long-input`.
    #[serde(default)]
    #[schema(value_type = Option<LongInput>, nullable)]
    pub long_input: Option<LongInput>,
    /// With `long_input: chunk`: tokens each window shares with the previous one, from 0
    /// (default) to less than the window; ignored otherwise.
    #[serde(default, deserialize_with = "fields::chunk_overlap")]
    #[schema(minimum = 0)]
    pub chunk_overlap: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAICompatEmbedding {
    pub object: &'static str,
    pub embedding: Embedding,
    pub index: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAICompatUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAICompatResponse {
    pub object: &'static str,
    pub data: Vec<OpenAICompatEmbedding>,
    pub model: String,
    pub usage: OpenAICompatUsage,
}
