//! What every `tei.v1` call does around its route's logic: it is refused while the server
//! drains and, with `--api-key`, without `authorization: Bearer <key>` metadata; its
//! deadline (`grpc-timeout`) bounds its wait in the queue as `X-Max-Queue-Ms` does (or the
//! server's `--max-queue-ms`, whichever is shorter) and its whole answer; a call the client
//! cancels is counted as `dropped`, as an HTTP request whose client left.

use super::deadline::{parse_grpc_timeout, GRPC_TIMEOUT};
use super::status::{failed, QueueLimit};
use super::streams::{ordered, Answers};
use crate::http::auth::authorize;
use crate::http::error::{ApiError, ErrorType, DRAINING};
use crate::http::AppState;
use crate::infer::{waiting_for_admission, with_max_queue, with_queue_deadline};
use crate::shutdown::Phase;
use crate::telemetry::record::recording;
use crate::telemetry::spans::{caller_context, Outcome, RootSpan};
use crate::telemetry::RequestTracing;
use axum::http::HeaderMap;
use futures_util::future::{BoxFuture, Either};
use opentelemetry::{Context, KeyValue};
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status, Streaming};

/// The `tei.v1` services, over every served model (the default one, or the one a message's
/// `model` names).
#[derive(Clone)]
pub(crate) struct TeiApi {
    state: AppState,
}

/// A call let in, and when its answer is due.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    deadline: Option<Instant>,
}

impl TeiApi {
    pub fn new(state: AppState) -> Self {
        Self { state }
    }

    /// Lets a call in, or answers why not.
    pub fn open(&self, metadata: &MetadataMap) -> Result<Call, Status> {
        let refuse = |err| failed(&self.state.metrics, err, QueueLimit::Server);
        if self.state.shutdown.is_draining() {
            return Err(refuse(ApiError::new(ErrorType::ShuttingDown, DRAINING)));
        }
        let authorization = metadata.get("authorization").and_then(|v| v.to_str().ok());
        authorize(self.state.config.api_key.as_deref(), authorization).map_err(refuse)?;
        let Some(timeout) = metadata.get(GRPC_TIMEOUT) else {
            return Ok(Call { deadline: None });
        };
        let timeout = timeout
            .to_str()
            .map_err(|_| format!("`{GRPC_TIMEOUT}` must be text"))
            .and_then(parse_grpc_timeout)
            .map_err(|why| {
                refuse(ApiError::validation(format!(
                    "Input validation error: {why}"
                )))
            })?;
        // A deadline past what the clock can hold (centuries away) is none.
        Ok(Call {
            deadline: Instant::now().checked_add(timeout),
        })
    }

    /// `work`'s answer to a call let in, within its deadline; a failure as its status.
    pub async fn answer<T>(
        &self,
        call: Call,
        work: impl Future<Output = Result<T, ApiError>>,
    ) -> Result<T, Status> {
        let mut unanswered = Unanswered {
            state: &self.state,
            answered: false,
        };
        let (result, queue_limit) = match call.deadline {
            None => (work.await, QueueLimit::Server),
            Some(deadline) => self.within(deadline, work).await,
        };
        unanswered.answered = true;
        result.map_err(|err| failed(&self.state.metrics, err, queue_limit))
    }

    /// `work` bounded by `deadline`: its queue wait by the shorter of the time left and
    /// `--max-queue-ms`, its whole answer by the time left.
    async fn within<T>(
        &self,
        deadline: Instant,
        work: impl Future<Output = Result<T, ApiError>>,
    ) -> (Result<T, ApiError>, QueueLimit) {
        let left = deadline.saturating_duration_since(Instant::now());
        let (queue, limit) = match self.state.infer.default_max_queue() {
            Some(server) if server < left => (server, QueueLimit::Server),
            _ => (left, QueueLimit::Client),
        };
        // The queue wait ends by the deadline itself (not `queue` after the sequences were
        // queued, which follows tokenizing), so that `timeout_at`, which polls `work` first,
        // finds a call still queued answered as a queue timeout.
        let bounded = tokio::time::timeout_at(
            deadline.into(),
            with_queue_deadline(deadline, with_max_queue(queue, work)),
        );
        match bounded.await {
            Ok(result) => (result, limit),
            Err(_) => {
                let message = format!(
                    "Deadline exceeded: the call's deadline ({GRPC_TIMEOUT}) passed before \
                     its answer was ready"
                );
                (Err(ApiError::new(ErrorType::Timeout, message)), limit)
            }
        }
    }

    /// A unary call: `handle`'s answer to its message, with `handle`'s headers (the HTTP
    /// routes' `x-*` timings) as the response's metadata.
    /// `method` (`tei.v1.Embed/Embed`) names its span.
    pub async fn unary<Req, Res, F, Fut>(
        &self,
        method: &'static str,
        request: Request<Req>,
        handle: F,
    ) -> Result<Response<Res>, Status>
    where
        Res: Send,
        F: FnOnce(AppState, Req) -> Fut,
        Fut: Future<Output = Result<(Res, HeaderMap), ApiError>> + Send,
    {
        let call = self.open(request.metadata())?;
        let caller = self.caller(request.metadata());
        let work = handle(self.state.clone(), request.into_inner());
        let (body, headers) = self.traced(method, caller, self.answer(call, work)).await?;
        let mut response = Response::new(body);
        *response.metadata_mut() = MetadataMap::from_headers(headers);
        Ok(response)
    }

    /// A stream call: let in once, then each message answered by `handle` as a call of its
    /// own ([`ordered`]), within the call's deadline. A message that finds the server at
    /// `--max-concurrent-requests` waits for a turn instead of ending the stream.
    pub fn stream<Req, Res, F, Fut>(
        &self,
        method: &'static str,
        request: Request<Streaming<Req>>,
        handle: F,
    ) -> Result<Response<Answers<Res>>, Status>
    where
        Req: Send + 'static,
        Res: Send + 'static,
        F: Fn(AppState, Req) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(Res, HeaderMap), ApiError>> + Send + 'static,
    {
        let call = self.open(request.metadata())?;
        let caller = self.caller(request.metadata());
        let api = self.clone();
        let handle = Arc::new(handle);
        let answers = ordered(request.into_inner(), move |message| {
            let api = api.clone();
            let caller = caller.clone();
            let work = waiting_for_admission(handle(api.state.clone(), message));
            async move {
                let answer = api.answer(call, work);
                api.traced(method, caller, answer)
                    .await
                    .map(|(body, _)| body)
            }
        });
        Ok(Response::new(answers))
    }
}

impl TeiApi {
    /// The caller's span from the call's `traceparent` metadata, where the server traces;
    /// `None` where it does not.
    fn caller(&self, metadata: &MetadataMap) -> Option<Context> {
        self.state.config.tracing.as_ref()?;
        Some(caller_context(&metadata.clone().into_headers()))
    }

    /// `answer`, a call's (or a stream message's), as the span `method`, child of `caller`,
    /// where the server traces. Not an `async fn`: the untraced answer stays the future it
    /// was, not one held inside another (stream futures are deep enough already).
    fn traced<'a, T, F>(
        &'a self,
        method: &'static str,
        caller: Option<Context>,
        answer: F,
    ) -> Either<F, BoxFuture<'a, Result<T, Status>>>
    where
        T: Send + 'a,
        F: Future<Output = Result<T, Status>> + Send + 'a,
    {
        match (caller, self.state.config.tracing.clone()) {
            (Some(parent), Some(tracing)) => {
                Either::Right(Box::pin(self.exporting(method, parent, tracing, answer)))
            }
            _ => Either::Left(answer),
        }
    }

    async fn exporting<T>(
        &self,
        method: &'static str,
        parent: Context,
        tracing: RequestTracing,
        answer: impl Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        let start = Instant::now();
        let ((result, routed), record) = recording(self.state.noting_model(answer)).await;
        let (code, outcome) = match &result {
            Ok(_) => (Code::Ok, Outcome::Ok),
            Err(status) => (status.code(), Outcome::Error(status.message().to_string())),
        };
        let (service, rpc) = method.split_once('/').unwrap_or((method, ""));
        let root = RootSpan {
            name: method.to_string(),
            parent,
            start,
            attributes: vec![
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", service),
                KeyValue::new("rpc.method", rpc),
                KeyValue::new("rpc.grpc.status_code", code as i64),
            ],
        };
        tracing.export(root, self.state.model_name(routed), &record, &outcome);
        result
    }
}

/// A call let in, until it is answered: dropped before that, its client cancelled it, and
/// it is counted once in `te_request_failure{err="dropped"}` (not at the shutdown deadline,
/// which drops what still runs).
struct Unanswered<'a> {
    state: &'a AppState,
    answered: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.answered && self.state.shutdown.phase() < Phase::Deadline {
            self.state
                .metrics
                .inc("te_request_failure", &[("err", "dropped")]);
        }
    }
}
