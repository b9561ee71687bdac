//! What only the OpenAPI document uses: the documentation twins of the hand-written
//! deserializers of `types.rs` (the `*Doc` types: they describe the shapes those accept, and
//! their doc comments are the descriptions clients read), and the error answers every route
//! behind the gate shares (401, 408, 413, 429, 503), written once and listed by each route's
//! `responses(...)`.

use super::error::{ErrorResponse, OpenAIErrorResponse};
use std::collections::BTreeMap;
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{IntoResponses, ToSchema};

/// A text of at least one character (an empty one is refused with 400).
#[allow(dead_code)]
#[derive(ToSchema)]
#[schema(min_length = 1)]
pub struct TextDoc(String);

/// Token ids, at least one (an empty list is refused with 400); ids past the model's vocabulary
/// are refused with 422.
#[allow(dead_code)]
#[derive(ToSchema)]
#[schema(min_items = 1)]
pub struct TokenIdsDoc(Vec<u32>);

/// A text as an object, `{"text": "..."}`: the same as the string.
#[allow(dead_code)]
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TextInputDoc {
    #[schema(inline)]
    text: TextDoc,
}

/// An image, `{"image": "..."}` (`/embed` and `/v1/embeddings` of a text-and-image model
/// only; 422 elsewhere): a data URL (`data:image/png;base64,...`) or plain base64 of a PNG,
/// JPEG, WebP or GIF file, at most `--max-image-bytes` bytes and `--max-image-pixels` pixels;
/// or an `http(s)://` URL of a host that `--allowed-image-hosts` lists, fetched within
/// `--image-fetch-timeout` (any other URL: 422).
#[allow(dead_code)]
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageInputDoc {
    #[schema(min_length = 1, example = "data:image/png;base64,iVBORw0KGgo...")]
    image: String,
}

/// One input of a batch: a text (a string or `{"text": ...}`), a list of token ids, or an
/// image (`{"image": ...}`).
#[allow(dead_code)]
#[derive(ToSchema)]
#[serde(untagged)]
pub enum InputItemDoc {
    String(#[schema(inline)] TextDoc),
    Ids(#[schema(inline)] TokenIdsDoc),
    Text(#[schema(inline)] TextInputDoc),
    Image(#[schema(inline)] ImageInputDoc),
}

/// A batch of at least one input (an empty one is refused with 400) and at most
/// `--max-client-batch-size` (`max_client_batch_size` of `/info`; more are refused with 422).
#[allow(dead_code)]
#[derive(ToSchema)]
#[schema(min_items = 1)]
pub struct InputBatchDoc(#[schema(inline)] Vec<InputItemDoc>);

// Mirrors `types::Input`.
/// A text, a list of token ids, an image, or a batch whose items are texts (strings or
/// `{"text": ...}`), lists of token ids or images (`{"image": ...}`), mixed; the answer has
/// one row per input in input order. Each text input has at most the model's
/// `max_input_length` tokens (`/info`) unless it is truncated; a longer one is refused with
/// 422.
#[allow(dead_code)]
#[derive(ToSchema)]
#[serde(untagged)]
pub enum InputDoc {
    String(#[schema(inline)] TextDoc),
    Ids(#[schema(inline)] TokenIdsDoc),
    Text(#[schema(inline)] TextInputDoc),
    Image(#[schema(inline)] ImageInputDoc),
    Batch(#[schema(inline)] InputBatchDoc),
}

/// One sequence: `[text]` or `[text, text_pair]`.
#[allow(dead_code)]
#[derive(ToSchema)]
#[schema(min_items = 1, max_items = 2)]
pub struct SequenceDoc(#[schema(inline)] Vec<TextDoc>);

/// At least one sequence, at most `--max-client-batch-size` (`/info`).
#[allow(dead_code)]
#[derive(ToSchema)]
#[schema(min_items = 1)]
pub struct SequenceBatchDoc(#[schema(inline)] Vec<SequenceDoc>);

// Mirrors `types::PredictInput`.
/// A text, one sequence `[text]` or `[text, text_pair]`, or a batch of sequences.
#[allow(dead_code)]
#[derive(ToSchema)]
#[serde(untagged)]
pub enum PredictInputDoc {
    Single(#[schema(inline)] TextDoc),
    Pair(#[schema(inline)] SequenceDoc),
    Batch(#[schema(inline)] SequenceBatchDoc),
}

/// At least one string (an empty list is refused with 400), at most `--max-client-batch-size`
/// (`/info`).
#[allow(dead_code)]
#[derive(ToSchema)]
#[schema(min_items = 1)]
pub struct TokenizeBatchDoc(Vec<String>);

/// At least one list of token ids, at most `--max-client-batch-size` (`/info`).
#[allow(dead_code)]
#[derive(ToSchema)]
#[schema(min_items = 1)]
pub struct TokenIdsBatchDoc(#[schema(inline)] Vec<TokenIdsDoc>);

// Mirrors `types::InputIds`.
/// A list of token ids or a batch of them.
#[allow(dead_code)]
#[derive(ToSchema)]
#[serde(untagged)]
pub enum InputIdsDoc {
    Single(#[schema(inline)] TokenIdsDoc),
    Batch(#[schema(inline)] TokenIdsBatchDoc),
}

// Mirrors `infer::Priority`.
/// Which lane the request takes: `high`, the interactive lane (queries) whatever its size, up
/// to one batch (`--max-batch-tokens`; a larger request takes the bulk lane); `low`, the bulk
/// lane even when small. Left out or `null`: by size (`--interactive-max-tokens`).
#[allow(dead_code)]
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum PriorityDoc {
    High,
    Low,
}

/// Adds the `X-Max-Queue-Ms` header to every route that runs the model.
pub struct QueueDeadlineHeader;

/// The routes that run the model, which take `X-Max-Queue-Ms` (`http::app` layers them).
pub const INFERENCE_ROUTES: &[&str] = &[
    "/",
    "/invocations",
    "/vertex",
    "/embed",
    "/embed_all",
    "/embed_multivector",
    "/embed_sparse",
    "/similarity",
    "/predict",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/v1/embeddings",
    "/embeddings",
];

impl utoipa::Modify for QueueDeadlineHeader {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        use utoipa::openapi::Required;
        let header = ParameterBuilder::new()
            .name("X-Max-Queue-Ms")
            .parameter_in(ParameterIn::Header)
            .required(Required::False)
            .description(Some(format!(
                "Longest the request may wait in the queue before it starts running, in \
                 milliseconds (1 to {}; overrides `--max-queue-ms`). Past it the request is \
                 answered 503 `queue_timeout` without running; once any of its inputs has \
                 started, it runs to the end. Any other value is refused with 422.",
                crate::infer::MAX_QUEUE_MS_CAP
            )))
            .schema(Some(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(1))
                    .maximum(Some(crate::infer::MAX_QUEUE_MS_CAP)),
            ))
            .build();
        for route in INFERENCE_ROUTES {
            if let Some(op) = openapi
                .paths
                .paths
                .get_mut(*route)
                .and_then(|item| item.post.as_mut())
            {
                op.parameters
                    .get_or_insert_with(Vec::new)
                    .push(RefOr::T(header.clone()));
            }
        }
    }
}

const UNAUTHORIZED: (&str, &str) = ("401", "Missing or invalid API key (with `--api-key`)");
const BODY_TIMEOUT: (&str, &str) = (
    "408",
    "The request body did not arrive within `--body-read-timeout`",
);
const PAYLOAD_TOO_LARGE: (&str, &str) = ("413", "The request body is over `--payload-limit`");
const OVERLOADED: (&str, &str) = ("429", "Model is overloaded");
const UNAVAILABLE: (&str, &str) = (
    "503",
    "The model cannot run, the server is shutting down, or the request waited in the queue \
     past its deadline (`X-Max-Queue-Ms`, `--max-queue-ms`) and was not run (`queue_timeout`)",
);

/// `(status, description)` rows answered with the error body `B`.
fn rows<B: ToSchema>(rows: &[(&str, &str)]) -> BTreeMap<String, RefOr<Response>> {
    rows.iter()
        .map(|&(status, description)| {
            let body = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(B::name())))
                .build();
            let response = ResponseBuilder::new()
                .description(description)
                .content("application/json", body)
                .build();
            (status.to_string(), RefOr::T(response))
        })
        .collect()
}

/// The refusals of a route that runs the model, in TEI's error body: no or a wrong API key
/// (401), a body late (408) or too large (413), the queue full (429), no device or the
/// shutdown (503).
pub struct Refusals;

impl IntoResponses for Refusals {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        rows::<ErrorResponse>(&[
            UNAUTHORIZED,
            BODY_TIMEOUT,
            PAYLOAD_TOO_LARGE,
            OVERLOADED,
            UNAVAILABLE,
        ])
    }
}

/// [`Refusals`] in OpenAI's error body (the OpenAI and Cohere/Jina routes).
pub struct OpenAIRefusals;

impl IntoResponses for OpenAIRefusals {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        rows::<OpenAIErrorResponse>(&[
            UNAUTHORIZED,
            BODY_TIMEOUT,
            PAYLOAD_TOO_LARGE,
            OVERLOADED,
            UNAVAILABLE,
        ])
    }
}

/// The refusals of a route that takes a body and runs no model (`/tokenize`, `/decode`):
/// 401, 408, 413.
pub struct BodyRefusals;

impl IntoResponses for BodyRefusals {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        rows::<ErrorResponse>(&[UNAUTHORIZED, BODY_TIMEOUT, PAYLOAD_TOO_LARGE])
    }
}

/// The refusal of a route behind the gate that takes no body (`/info`): 401.
pub struct AuthRefusal;

impl IntoResponses for AuthRefusal {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        rows::<ErrorResponse>(&[UNAUTHORIZED])
    }
}

/// The API key's refusal on an OpenAI-style GET route (`/v1/models`), in OpenAI's shape.
pub struct OpenAIAuthRefusal;

impl IntoResponses for OpenAIAuthRefusal {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        rows::<OpenAIErrorResponse>(&[UNAUTHORIZED])
    }
}
