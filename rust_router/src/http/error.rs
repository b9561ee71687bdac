//! HTTP errors: one table from error kind to status code, two body shapes (TEI and OpenAI),
//! and the error answers the layers under the handlers give too (the connections, the
//! handler runner). It imports nothing of the HTTP layer, so those layers can use it.

use crate::backend::BackendError;
use crate::infer::InferError;
use crate::tokenization::{ChunkError, TokenizationError};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    Unhealthy,
    Backend,
    Overloaded,
    Validation,
    Tokenizer,
    Empty,
    PayloadTooLarge,
    Unauthorized,
    NotFound,
    /// The route exists, not for this method (the `Allow` header lists those it takes).
    MethodNotAllowed,
    /// The route does not fit the loaded model.
    ModelType,
    /// The request's `model` is none of the served models.
    ModelNotFound,
    /// The request body did not arrive within `--body-read-timeout`.
    Timeout,
    /// Answers that their clients have not read fill `--response-buffer-limit`: new work
    /// waits until they are sent, or cut at `--send-timeout`.
    Congested,
    /// The server is shutting down: the request was half-sent when draining began, or was
    /// still running at the `--shutdown-timeout` deadline.
    ShuttingDown,
    /// The request waited in the queue past its deadline (`X-Max-Queue-Ms`, `--max-queue-ms`)
    /// and was dropped without running.
    QueueTimeout,
}

impl ErrorType {
    /// The single status table. OpenAI clients expect 500 for server-side failures and 400 for
    /// a request the model cannot serve; TEI clients expect 424 for both.
    pub fn status(self, openai: bool) -> StatusCode {
        match self {
            Self::Unhealthy => StatusCode::SERVICE_UNAVAILABLE,
            Self::Backend if openai => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Backend => StatusCode::FAILED_DEPENDENCY,
            Self::ModelType if openai => StatusCode::BAD_REQUEST,
            Self::ModelType => StatusCode::FAILED_DEPENDENCY,
            Self::Overloaded => StatusCode::TOO_MANY_REQUESTS,
            Self::Validation | Self::Tokenizer => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Empty => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::NotFound | Self::ModelNotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Timeout => StatusCode::REQUEST_TIMEOUT,
            Self::Congested => StatusCode::SERVICE_UNAVAILABLE,
            Self::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            Self::QueueTimeout => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Label for the `te_request_failure{err=...}` metric.
    pub fn metric_label(self) -> &'static str {
        match self {
            Self::Unhealthy => "unhealthy",
            Self::Backend => "inference",
            Self::Overloaded => "overloaded",
            Self::Validation => "validation",
            Self::Tokenizer => "tokenization",
            Self::Empty => "empty",
            Self::PayloadTooLarge => "payload_too_large",
            Self::Unauthorized => "unauthorized",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::ModelType => "model_type",
            Self::ModelNotFound => "model_not_found",
            Self::Timeout => "timeout",
            Self::Congested => "congested",
            Self::ShuttingDown => "shutting_down",
            Self::QueueTimeout => "queue_timeout",
        }
    }
}

/// TEI's error body.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorResponse {
    pub error: String,
    pub error_type: ErrorType,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OpenAIErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub error_type: ErrorType,
    pub code: u16,
}

/// OpenAI's error body: the `openai` SDK reads `error.message`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OpenAIErrorResponse {
    pub error: OpenAIErrorDetail,
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub kind: ErrorType,
    pub message: String,
    pub openai: bool,
    /// Answer with `Connection: close`: the rest of the request was never read.
    pub close_connection: bool,
}

impl ApiError {
    pub fn new(kind: ErrorType, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            openai: false,
            close_connection: false,
        }
    }

    pub fn openai(mut self, openai: bool) -> Self {
        self.openai = openai;
        self
    }

    pub fn close_connection(mut self) -> Self {
        self.close_connection = true;
        self
    }

    pub fn empty(field: &str) -> Self {
        Self::new(ErrorType::Empty, format!("`{field}` cannot be empty"))
    }

    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(ErrorType::Validation, message)
    }

    /// A request's `model` that no served model answers to.
    pub fn unknown_model(requested: &str, served: &[&str]) -> Self {
        Self::new(
            ErrorType::ModelNotFound,
            format!("model `{requested}` is not served here; served models: {served:?}"),
        )
    }

    pub fn status(&self) -> StatusCode {
        self.kind.status(self.openai)
    }
}

/// How a route's body names its inputs, for a message about one of them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum InputNames<'a> {
    /// One input sent alone: the field itself (`inputs`).
    One(&'a str),
    /// A list: the field and the index (`inputs[2]`).
    List(&'a str),
    /// Each item of the list paired with `query` (the reranker's inputs).
    Pairs(&'a str),
    /// `/similarity`: the source sentence, then each of `sentences`.
    Similarity,
}

impl<'a> InputNames<'a> {
    /// `field` as the client sent it: a list (`batched`) or one input.
    pub fn new(field: &'a str, batched: bool) -> Self {
        if batched {
            InputNames::List(field)
        } else {
            InputNames::One(field)
        }
    }

    /// The list field (`inputs`, `texts`, `sentences`).
    pub fn field(self) -> &'a str {
        match self {
            Self::One(field) | Self::List(field) | Self::Pairs(field) => field,
            Self::Similarity => "sentences",
        }
    }

    /// The request's `index`-th input, quoted as the route's body names it.
    pub fn of(self, index: usize) -> String {
        match self {
            Self::One(field) => format!("`{field}`"),
            Self::List(field) => format!("`{field}[{index}]`"),
            Self::Pairs(field) => format!("`{field}[{index}]` (paired with `query`)"),
            Self::Similarity if index == 0 => "`inputs.source_sentence`".to_string(),
            Self::Similarity => format!("`inputs.sentences[{}]`", index - 1),
        }
    }
}

impl ApiError {
    /// 400 for the request's `index`-th input, which is empty.
    pub(crate) fn empty_input(names: InputNames, index: usize) -> Self {
        Self::new(
            ErrorType::Empty,
            format!("{} cannot be empty", names.of(index)),
        )
    }

    /// An inference failure, its input named as the route's body names it. `hint` says what
    /// helps with an input over the model's limit on this route.
    pub(crate) fn inference(err: InferError, names: InputNames, hint: &str) -> Self {
        match err {
            InferError::Input {
                index,
                error: TokenizationError::TooLong { max, given },
            } => Self::validation(format!(
                "Input validation error: {} must have at most {max} tokens (the model's \
                 limit). Given: {given}. {hint}",
                names.of(index)
            )),
            InferError::Input {
                index,
                error:
                    TokenizationError::Chunk(ChunkError::TooManyChunks {
                        needed,
                        window,
                        max,
                    }),
            } => Self::new(
                ErrorType::PayloadTooLarge,
                format!(
                    "{} needs {needed} windows of {window} tokens under `long_input: chunk`, \
                     more than `--max-chunks` ({max}); shorten it or send it as several inputs",
                    names.of(index)
                ),
            ),
            InferError::Image { index, error } => Self::validation(format!(
                "Input validation error: {} is refused: {error}",
                names.of(index)
            )),
            other => other.into(),
        }
    }
}

/// What helps with an over-long input on TEI's embedding routes.
pub(crate) const LONG_INPUT_HINT: &str =
    "Send `truncate: true` to truncate it, or `long_input: \"chunk\"` to embed it whole";

/// What helps with an over-long input on TEI's routes.
pub(crate) const TRUNCATE_HINT: &str = "Send `truncate: true` to truncate it";

impl From<InferError> for ApiError {
    /// TEI's shape, the input named as TEI's `/embed` names it; routes name their own inputs
    /// with [`ApiError::inference`].
    fn from(err: InferError) -> Self {
        let kind = match &err {
            InferError::Tokenization(e) | InferError::Input { error: e, .. } => match e {
                TokenizationError::Tokenizer(_) => ErrorType::Tokenizer,
                TokenizationError::Stopped => ErrorType::Unhealthy,
                TokenizationError::Chunk(ChunkError::TooManyChunks { .. }) => {
                    ErrorType::PayloadTooLarge
                }
                _ => ErrorType::Validation,
            },
            InferError::Image { .. } => ErrorType::Validation,
            InferError::Overloaded(_) => ErrorType::Overloaded,
            InferError::QueueTimeout(_) => ErrorType::QueueTimeout,
            // A device failure is no fault of the request: 503 tells the client to retry,
            // and another device answers.
            InferError::Backend(
                BackendError::Stopped
                | BackendError::Unhealthy(_)
                | BackendError::Device(_)
                | BackendError::Refused,
            ) => ErrorType::Unhealthy,
            InferError::Backend(_) => ErrorType::Backend,
        };
        let mut message = err.to_string();
        if let InferError::Tokenization(TokenizationError::TooLong { .. })
        | InferError::Input {
            error: TokenizationError::TooLong { .. },
            ..
        } = err
        {
            message.push_str(". ");
            message.push_str(TRUNCATE_HINT);
        }
        Self::new(kind, message)
    }
}

impl From<TokenizationError> for ApiError {
    fn from(err: TokenizationError) -> Self {
        InferError::from(err).into()
    }
}

impl IntoResponse for ApiError {
    /// The response carries its [`ErrorType`] as an extension, which the metrics middleware
    /// counts (`te_request_failure`), whichever layer produced the error.
    fn into_response(self) -> Response {
        let status = self.status();
        let kind = self.kind;
        let close = self.close_connection;
        let mut response = if self.openai {
            let body = OpenAIErrorResponse {
                error: OpenAIErrorDetail {
                    message: self.message,
                    error_type: self.kind,
                    code: status.as_u16(),
                },
            };
            (status, Json(body)).into_response()
        } else {
            let body = ErrorResponse {
                error: self.message,
                error_type: self.kind,
            };
            (status, Json(body)).into_response()
        };
        response.extensions_mut().insert(kind);
        if close {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// Why a request that arrives once the server is draining is refused.
pub(crate) const DRAINING: &str =
    "The server is shutting down and takes no new requests; retry on another replica";

/// A 503 `shutting_down` answer that closes the connection.
pub(crate) fn shutting_down(openai: bool, message: &str) -> Response {
    ApiError::new(ErrorType::ShuttingDown, message)
        .openai(openai)
        .close_connection()
        .into_response()
}

/// The answer to a request whose handler failed unexpectedly (it panicked).
pub(crate) fn handler_failed(openai: bool) -> Response {
    ApiError::new(
        ErrorType::Backend,
        "The request's handler failed unexpectedly; the server logged why",
    )
    .openai(openai)
    .into_response()
}

/// Routes that answer errors in the OpenAI shape: OpenAI's, and the Cohere/Jina rerank.
pub(crate) fn is_openai_path(path: &str) -> bool {
    path.starts_with("/v1/") || path == "/embeddings" || path == "/v2/rerank"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_table() {
        let cases = [
            (ErrorType::Empty, false, 400),
            (ErrorType::Validation, false, 422),
            (ErrorType::Tokenizer, false, 422),
            (ErrorType::PayloadTooLarge, false, 413),
            (ErrorType::Unauthorized, false, 401),
            (ErrorType::Overloaded, false, 429),
            (ErrorType::Unhealthy, false, 503),
            (ErrorType::Backend, false, 424),
            (ErrorType::Backend, true, 500),
            (ErrorType::ModelType, false, 424),
            (ErrorType::ModelType, true, 400),
            (ErrorType::NotFound, true, 404),
            (ErrorType::MethodNotAllowed, false, 405),
            (ErrorType::Timeout, false, 408),
            (ErrorType::ShuttingDown, true, 503),
            (ErrorType::Congested, false, 503),
            (ErrorType::QueueTimeout, false, 503),
            (ErrorType::QueueTimeout, true, 503),
        ];
        for (kind, openai, status) in cases {
            assert_eq!(
                kind.status(openai).as_u16(),
                status,
                "{kind:?} openai={openai}"
            );
        }
    }

    #[test]
    fn infer_errors_map_to_kinds() {
        let e: ApiError = InferError::Overloaded(4).into();
        assert_eq!(e.kind, ErrorType::Overloaded);
        let e: ApiError = TokenizationError::TooLong { max: 4, given: 9 }.into();
        assert_eq!(e.kind, ErrorType::Validation);
        let e: ApiError = InferError::Backend(BackendError::Inference("x".into())).into();
        assert_eq!(e.kind, ErrorType::Backend);
        let e: ApiError = InferError::Backend(BackendError::Stopped).into();
        assert_eq!(e.kind, ErrorType::Unhealthy);
    }
}
