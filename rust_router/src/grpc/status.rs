//! How an error answers a gRPC call: the HTTP routes' [`ApiError`], its message unchanged,
//! with the status code TEI's gRPC server gives its kind, and the kind itself in the
//! `error-type` trailer (the HTTP bodies' `error_type`). Counted in
//! `te_request_failure{err=...}` and logged as the HTTP routes' failures are.

use crate::http::error::{ApiError, ErrorType};
use crate::metrics::Metrics;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

/// The trailer that names the error's kind (`validation`, `overloaded`, ...).
pub(crate) const ERROR_TYPE: &str = "error-type";

/// Where a queue deadline that passed came from: it decides between
/// `DEADLINE_EXCEEDED` and `UNAVAILABLE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueLimit {
    /// The call's own deadline (`grpc-timeout`): it is exceeded.
    Client,
    /// The server's `--max-queue-ms`: the server is too busy for now, as over HTTP (503).
    Server,
}

/// The status code of an error of `kind`. TEI's kinds keep TEI's codes (a model error and a
/// tokenizer error are `FAILED_PRECONDITION` there); the others take the code nearest to
/// their HTTP status.
pub(crate) fn code(kind: ErrorType, queue_limit: QueueLimit) -> Code {
    match kind {
        ErrorType::Unhealthy => Code::Unavailable,
        ErrorType::Backend => Code::FailedPrecondition,
        ErrorType::Overloaded => Code::ResourceExhausted,
        ErrorType::Validation => Code::InvalidArgument,
        ErrorType::Tokenizer => Code::FailedPrecondition,
        ErrorType::Empty => Code::InvalidArgument,
        ErrorType::PayloadTooLarge => Code::ResourceExhausted,
        ErrorType::Unauthorized => Code::Unauthenticated,
        ErrorType::NotFound | ErrorType::MethodNotAllowed => Code::Unimplemented,
        // TEI answers a call its model cannot serve (`Rerank` on an embedding model) so.
        ErrorType::ModelType => Code::FailedPrecondition,
        ErrorType::ModelNotFound => Code::NotFound,
        ErrorType::Timeout => Code::DeadlineExceeded,
        ErrorType::Congested | ErrorType::ShuttingDown => Code::Unavailable,
        ErrorType::QueueTimeout => match queue_limit {
            QueueLimit::Client => Code::DeadlineExceeded,
            QueueLimit::Server => Code::Unavailable,
        },
    }
}

/// `err` as a call's status.
pub(crate) fn status(err: ApiError, queue_limit: QueueLimit) -> Status {
    let mut status = Status::new(code(err.kind, queue_limit), err.message);
    if let Ok(value) = MetadataValue::try_from(kind_name(err.kind)) {
        status.metadata_mut().insert(ERROR_TYPE, value);
    }
    status
}

/// `err` as a call's status, counted and logged as a failed request.
pub(crate) fn failed(metrics: &Metrics, err: ApiError, queue_limit: QueueLimit) -> Status {
    metrics.inc("te_request_failure", &[("err", err.kind.metric_label())]);
    let code = code(err.kind, queue_limit);
    let label = err.kind.metric_label();
    if matches!(
        code,
        Code::Unavailable | Code::FailedPrecondition | Code::Internal
    ) && err.kind != ErrorType::ShuttingDown
    {
        tracing::error!(code = ?code, error_type = label, "gRPC call failed: {}", err.message);
    } else {
        tracing::info!(code = ?code, error_type = label, "gRPC call refused: {}", err.message);
    }
    status(err, queue_limit)
}

/// The kind's name as the HTTP error bodies spell it (`error_type`).
fn kind_name(kind: ErrorType) -> String {
    match serde_json::to_value(kind) {
        Ok(serde_json::Value::String(name)) => name,
        _ => kind.metric_label().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn teis_kinds_keep_teis_codes() {
        let teis = [
            (ErrorType::Unhealthy, Code::Unavailable),
            (ErrorType::Backend, Code::FailedPrecondition),
            (ErrorType::Overloaded, Code::ResourceExhausted),
            (ErrorType::Validation, Code::InvalidArgument),
            (ErrorType::Tokenizer, Code::FailedPrecondition),
            (ErrorType::Empty, Code::InvalidArgument),
            (ErrorType::ModelType, Code::FailedPrecondition),
        ];
        for (kind, expected) in teis {
            assert_eq!(code(kind, QueueLimit::Server), expected, "{kind:?}");
        }
    }

    #[test]
    fn the_servers_own_kinds_have_codes() {
        let ours = [
            (ErrorType::Unauthorized, Code::Unauthenticated),
            (ErrorType::ModelNotFound, Code::NotFound),
            (ErrorType::ShuttingDown, Code::Unavailable),
            (ErrorType::Congested, Code::Unavailable),
            (ErrorType::PayloadTooLarge, Code::ResourceExhausted),
            (ErrorType::Timeout, Code::DeadlineExceeded),
        ];
        for (kind, expected) in ours {
            assert_eq!(code(kind, QueueLimit::Server), expected, "{kind:?}");
        }
    }

    #[test]
    fn a_queue_timeout_is_the_deadline_whose_it_was() {
        assert_eq!(
            code(ErrorType::QueueTimeout, QueueLimit::Client),
            Code::DeadlineExceeded
        );
        assert_eq!(
            code(ErrorType::QueueTimeout, QueueLimit::Server),
            Code::Unavailable
        );
    }

    #[test]
    fn the_status_keeps_the_message_and_names_the_kind() {
        let err = ApiError::validation("Input validation error: too long");
        let s = status(err, QueueLimit::Server);
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), "Input validation error: too long");
        assert_eq!(s.metadata().get(ERROR_TYPE).unwrap(), "validation");
        let s = status(ApiError::new(ErrorType::Backend, "x"), QueueLimit::Server);
        assert_eq!(s.metadata().get(ERROR_TYPE).unwrap(), "backend");
    }

    #[test]
    fn a_failure_is_counted() {
        let metrics = Metrics::new(16);
        failed(&metrics, ApiError::empty("inputs"), QueueLimit::Server);
        assert!(metrics
            .render()
            .contains("te_request_failure{err=\"empty\"} 1"));
    }
}
