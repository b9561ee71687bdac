//! The JSON body extractor of every route that takes a body: read within the body deadline
//! (and the drain's grace), parsed off the tokio workers when large, its failures answered in
//! the route's error shape.

use super::error::{ApiError, ErrorType};
use super::state::AppState;
use crate::shutdown::{Phase, DRAIN_GRACE};
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;

/// A JSON body extractor whose failures come back in the route's error shape.
///
/// It does not insist on `Content-Type: application/json` (TEI's own examples are often sent
/// with curl's default form type); any body that parses as the expected JSON is accepted.
pub struct Body<T, const OPENAI: bool>(pub T);

pub type TeiJson<T> = Body<T, false>;
pub type OpenAIJson<T> = Body<T, true>;

/// 413, closing the connection: the rest of the body is never read.
fn payload_too_large() -> ApiError {
    ApiError::new(
        ErrorType::PayloadTooLarge,
        "Payload too large: the request body is over the server's limit (--payload-limit)",
    )
    .close_connection()
}

/// Why a body could not be read: over `--payload-limit` (413, and the connection closes), or
/// the connection failed.
fn body_rejection(rejection: axum::extract::rejection::BytesRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        payload_too_large()
    } else {
        ApiError::validation(format!("cannot read the request body: {rejection}"))
    }
}

/// Bodies larger than this are parsed on a blocking-pool thread: a backfill request of 32
/// long documents is 100 KB or more (a 2 MB one takes milliseconds to parse), and parsing
/// it on a tokio worker would hold up the queries that worker serves meanwhile.
pub const BLOCKING_PARSE_BYTES: usize = 64 * 1024;

impl<T, const OPENAI: bool> FromRequest<AppState> for Body<T, OPENAI>
where
    T: DeserializeOwned + Send + 'static,
{
    type Rejection = ApiError;

    /// Reads the whole body within `--body-read-timeout` (408 otherwise) and, once the server
    /// is draining, within [`DRAIN_GRACE`] (503 otherwise): a half-sent request must not hold
    /// a connection, or the shutdown, open.
    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        // A body declared over the limit is refused before any of it is read, instead of
        // being read up to the limit (or the body deadline, for a client that never sends it).
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > state.config.payload_limit as u64) {
            return Err(payload_too_large().openai(OPENAI));
        }
        let read = Bytes::from_request(req, state);
        let mut read = std::pin::pin!(read);
        // A small body usually arrives with the head and is complete at the first poll; the
        // deadlines below are only armed when it is not. Arming the body timer costs more
        // than its own bookkeeping: a deadline earlier than the timer driver's next one makes
        // tokio wake the worker parked in the driver to re-arm it (an eventfd write and a
        // spurious wake-up a request).
        let bytes = match futures_util::poll!(read.as_mut()) {
            std::task::Poll::Ready(bytes) => bytes.map_err(body_rejection),
            std::task::Poll::Pending => {
                let limit = state.config.body_read_timeout;
                let draining_too_long = async {
                    state.shutdown.reached(Phase::Draining).await;
                    tokio::time::sleep(DRAIN_GRACE).await;
                };
                tokio::select! {
                    bytes = read => bytes.map_err(body_rejection),
                    _ = tokio::time::sleep(limit) => Err(ApiError::new(
                        ErrorType::Timeout,
                        format!(
                            "Request timeout: the body did not arrive within {}s \
                             (--body-read-timeout)",
                            limit.as_secs_f64()
                        ),
                    )
                    .close_connection()),
                    _ = draining_too_long => Err(ApiError::new(
                        ErrorType::ShuttingDown,
                        "The server is shutting down: the request body was not complete",
                    )
                    .close_connection()),
                }
            }
        }
        .map_err(|e| e.openai(OPENAI))?;
        let large = bytes.len() > BLOCKING_PARSE_BYTES;
        let parse = move || serde_json::from_slice::<T>(&bytes);
        let parsed = if large {
            tokio::task::spawn_blocking(parse)
                .await
                .map_err(|e| ApiError::validation(format!("cannot parse the body: {e}")))?
        } else {
            parse()
        };
        parsed.map(Body).map_err(|err| {
            ApiError::validation(format!("Failed to parse the JSON body: {err}")).openai(OPENAI)
        })
    }
}
