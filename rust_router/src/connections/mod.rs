//! Accepting and serving HTTP/1.1 connections (and HTTP/2 ones, for gRPC: [`http2`]), with the
//! limits that keep slow, idle or absent
//! clients from holding the server: a deadline for a request's headers, an idle keep-alive
//! timeout, a send deadline for answers the client does not read and a cap on the answer
//! bytes all connections hold ([`activity`]), a cap on open connections (past it, a new
//! connection gets a 503 and is closed, [`closing`]), half-closed clients told from departed
//! ones ([`peer`]), and the connection side of the shutdown sequence (see [`crate::shutdown`]):
//! while draining, connections are still accepted and new requests answered 503 (by the HTTP
//! layer) until no accepted request is left; then the listeners close, and each connection
//! closes once it has nothing accepted to finish. The body deadline belongs to the handler
//! that reads the body (`http::body::Body`).

mod activity;
mod closing;
mod http2;
mod in_flight;
mod peer;

pub use activity::{ConnectionLimits, UnsentBytes, DEADLINE_FLUSH};
pub use http2::Http2Service;

use crate::http::error::{is_openai_path, shutting_down, ApiError, ErrorType};
use crate::http_thread::Handlers;
use crate::metrics::Metrics;
use crate::shutdown::{Phase, Shutdown};
use activity::{
    answer_produced, head_bytes, lock, verdict, Activity, Close, SharedActivity, UnsentShare,
    Watched,
};
use axum::body::HttpBody as _;
use axum::response::{IntoResponse, Response};
use axum::Router;
use closing::{linger, refuse, Refusals, LINGER};
use http2::{sniff, Protocol, Unsniffed};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use in_flight::InFlight;
use peer::{PeerState, PeerWatch, PROBE_POLL};
use std::future::Future as _;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Once the drain is done, the listeners close only after no connection arrived for this
/// long. Closing a listening socket resets every connection the kernel completed but the
/// server has not accepted yet, and a client that connected there sees its request reset
/// rather than refused; clients that reconnect after their 503 kept hitting that window.
pub const LISTEN_QUIET: Duration = Duration::from_millis(100);

/// Marks a request's handler as running until dropped (also when the client goes away).
struct InHandler {
    activity: SharedActivity,
    in_flight: Arc<InFlight>,
}

impl InHandler {
    fn begin(activity: &SharedActivity, in_flight: &Arc<InFlight>, http11: bool) -> Self {
        let mut a = lock(activity);
        a.in_handler += 1;
        a.head_started = None;
        a.requests += 1;
        a.http11 = http11;
        drop(a);
        in_flight.count_one();
        Self {
            activity: activity.clone(),
            in_flight: in_flight.clone(),
        }
    }
}

impl Drop for InHandler {
    fn drop(&mut self) {
        let mut a = lock(&self.activity);
        a.in_handler -= 1;
        a.idle_since = Instant::now();
        drop(a);
        self.in_flight.leave();
    }
}

/// The shutdown deadline as one connection's requests see it: set by the connection's own
/// task, so a request waits on a signal no other connection touches (a server-wide one would
/// be a shared cache line written by every request on every core).
#[derive(Debug, Default)]
struct ConnDeadline {
    reached: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl ConnDeadline {
    fn reach(&self) {
        self.reached
            .store(true, std::sync::atomic::Ordering::Release);
        self.notify.notify_waiters();
    }

    /// `work`'s output, or `None` once the deadline is reached first.
    async fn race<T>(&self, work: impl std::future::Future<Output = T>) -> Option<T> {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        // Registered before the check, so a deadline between the two still wakes us.
        notified.as_mut().enable();
        if self.reached.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        tokio::select! {
            output = work => Some(output),
            _ = notified => None,
        }
    }
}

/// What [`serve`] serves.
pub struct Endpoints {
    /// The HTTP port's listeners: HTTP/1.1, and HTTP/2 when `http2` is set.
    pub http: Vec<TcpListener>,
    /// `--grpc-port`'s listeners: HTTP/2 only.
    pub grpc: Vec<TcpListener>,
    pub app: Router,
    /// What answers HTTP/2 requests (gRPC, and the app's routes); `None`: HTTP/1.1 only.
    pub http2: Option<Http2Service>,
}

impl Endpoints {
    /// `app` on `http`, HTTP/1.1 only.
    pub fn http1(http: Vec<TcpListener>, app: Router) -> Self {
        Self {
            http,
            grpc: Vec::new(),
            app,
            http2: None,
        }
    }
}

/// Everything the accept loop and the connections share.
struct Shared {
    app: Router,
    http2: Option<Http2Service>,
    limits: ConnectionLimits,
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
    open: Arc<Semaphore>,
    refusals: Refusals,
    in_flight: Arc<InFlight>,
    unsent: Arc<UnsentBytes>,
    handlers: Handlers,
}

impl Shared {
    fn open_connections(&self) -> usize {
        self.limits.max_connections - self.open.available_permits()
    }

    fn set_open_gauge(&self) {
        self.metrics
            .gauge_set("te_connection_open", &[], self.open_connections() as f64);
    }
}

/// Serves `endpoints` until the shutdown sequence ends: after `Draining` no connection is
/// accepted and each one closes as soon as it has nothing accepted to finish; after
/// `Deadline` (+ [`DEADLINE_FLUSH`]) every one is closed. Each HTTP/1.1 request's handler
/// runs where `handlers` says; HTTP/2 connections are served on its `elsewhere` runtime.
pub async fn serve(
    endpoints: Endpoints,
    limits: ConnectionLimits,
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
    handlers: Handlers,
) {
    let Endpoints {
        http,
        grpc,
        app,
        http2,
    } = endpoints;
    // Each listener with whether it takes HTTP/2 only.
    let listeners: Vec<(TcpListener, bool)> = http
        .into_iter()
        .map(|l| (l, false))
        .chain(grpc.into_iter().map(|l| (l, true)))
        .collect();
    let shared = Arc::new(Shared {
        app,
        http2,
        limits,
        shutdown: shutdown.clone(),
        unsent: Arc::new(UnsentBytes::new(
            limits.response_buffer_limit,
            metrics.clone(),
        )),
        metrics,
        open: Arc::new(Semaphore::new(limits.max_connections)),
        refusals: Refusals::default(),
        in_flight: Arc::default(),
        handlers,
    });
    let mut connections = JoinSet::new();
    // While draining, connections are still accepted (a load balancer's health check sees
    // 503, a late request is answered 503 rather than refused), until no accepted request is
    // left or the deadline comes.
    let drained = async {
        shutdown.reached(Phase::Draining).await;
        tokio::select! {
            _ = shared.in_flight.wait_until_none() => {},
            _ = shutdown.reached(Phase::Deadline) => {},
        }
    };
    tokio::pin!(drained);
    loop {
        let accepted = tokio::select! {
            accepted = accept_any(&listeners) => accepted,
            _ = &mut drained => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        match accepted {
            Ok((stream, http2_only)) => admit(stream, http2_only, &shared, &mut connections),
            Err(e) => {
                // Out of file descriptors, usually: wait instead of spinning on the error.
                tracing::error!("cannot accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    // Connections the kernel completes before the listeners close are served like the others
    // (a client whose connect succeeded must not see a reset): keep accepting until the
    // listeners have been quiet for LISTEN_QUIET, or the deadline.
    let deadline = shutdown.reached(Phase::Deadline);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            accepted = tokio::time::timeout(LISTEN_QUIET, accept_any(&listeners)) => match accepted {
                Ok(Ok((stream, http2_only))) => admit(stream, http2_only, &shared, &mut connections),
                Ok(Err(_)) | Err(_) => break,
            },
            _ = &mut deadline => break,
        }
    }
    for (listener, http2_only) in &listeners {
        while let Some(Ok((stream, _))) = futures_util::FutureExt::now_or_never(listener.accept()) {
            admit(stream, *http2_only, &shared, &mut connections);
        }
    }
    drop(listeners);
    tracing::info!(
        open = connections.len(),
        "stopped accepting connections; waiting for accepted requests"
    );
    let all_closed = async { while connections.join_next().await.is_some() {} };
    tokio::select! {
        _ = all_closed => {},
        _ = async {
            shutdown.reached(Phase::Deadline).await;
            tokio::time::sleep(DEADLINE_FLUSH * 2).await;
        } => {
            tracing::warn!(open = connections.len(), "closing connections that outlived the deadline");
            connections.abort_all();
        }
    }
}

/// The next connection of any listener, with whether its listener takes HTTP/2 only.
async fn accept_any(listeners: &[(TcpListener, bool)]) -> io::Result<(TcpStream, bool)> {
    let accepts = listeners.iter().map(|(l, http2_only)| {
        Box::pin(async move { l.accept().await.map(|(stream, _)| (stream, *http2_only)) })
    });
    let (result, _, _) = futures_util::future::select_all(accepts).await;
    result
}

fn admit(stream: TcpStream, http2_only: bool, shared: &Arc<Shared>, connections: &mut JoinSet<()>) {
    match shared.open.clone().try_acquire_owned() {
        Ok(permit) => {
            shared.set_open_gauge();
            connections.spawn(serve_any(stream, http2_only, shared.clone(), permit));
        }
        Err(_) => refuse(
            stream,
            &shared.refusals,
            &shared.metrics,
            shared.limits.max_connections,
        ),
    }
}

/// The answer to new work while answers to other clients fill `--response-buffer-limit`.
fn congested(openai: bool) -> Response {
    ApiError::new(
        ErrorType::Congested,
        "The server holds too many answers that their clients have not read \
         (--response-buffer-limit); retry later",
    )
    .openai(openai)
    .into_response()
}

/// The bytes hyper writes for `response` to a request of `method`.
fn answer_bytes(response: &Response, method: &hyper::Method) -> u64 {
    let status = response.status();
    let bodyless = method == hyper::Method::HEAD
        || status.is_informational()
        || status == hyper::StatusCode::NO_CONTENT
        || status == hyper::StatusCode::NOT_MODIFIED;
    let body = if bodyless {
        0
    } else {
        response.body().size_hint().lower()
    };
    head_bytes(response) + body
}

/// Serves a connection in the protocol it speaks: HTTP/2 on an HTTP/2-only listener, else
/// as its first bytes tell when HTTP/2 is served at all, else HTTP/1.1.
async fn serve_any(
    stream: TcpStream,
    http2_only: bool,
    shared: Arc<Shared>,
    permit: OwnedSemaphorePermit,
) {
    let Some(service) = shared.http2.clone() else {
        return serve_connection(stream, shared, permit).await;
    };
    match sniff(&stream, &shared.limits, &shared.shutdown).await {
        // An HTTP/1.1 client on `--grpc-port`: closed unanswered.
        Ok(Protocol::Http1) if http2_only => {}
        Ok(Protocol::Http1) => return serve_connection(stream, shared, permit).await,
        Ok(Protocol::Http2) => {
            let served = http2::Served {
                service,
                shutdown: shared.shutdown.clone(),
                in_flight: shared.in_flight.clone(),
                limits: shared.limits,
            };
            http2::serve(stream, served, shared.handlers.elsewhere.clone()).await
        }
        Err(Unsniffed::Idle) => shared
            .metrics
            .inc("te_connection_timeout", &[("phase", "idle")]),
        Err(Unsniffed::Head) => shared
            .metrics
            .inc("te_connection_timeout", &[("phase", "header")]),
        Err(Unsniffed::Closed | Unsniffed::ShuttingDown) => {}
    }
    drop(permit);
    shared.set_open_gauge();
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>, permit: OwnedSemaphorePermit) {
    // Responses are written whole; do not let Nagle hold their last segment.
    let _ = stream.set_nodelay(true);
    let activity: SharedActivity = Arc::new(Mutex::new(Activity::new(Instant::now())));
    let send_stalled = Arc::new(Notify::new());
    let peer = PeerWatch::new(stream.as_raw_fd());
    let io = TokioIo::new(Watched {
        inner: stream,
        share: UnsentShare {
            activity: activity.clone(),
            all: shared.unsent.clone(),
            stalled: send_stalled.clone(),
        },
    });
    let app = shared.app.clone();
    let handlers = shared.handlers.clone();
    let service_activity = activity.clone();
    let in_flight = shared.in_flight.clone();
    let deadline = Arc::new(ConnDeadline::default());
    let service_deadline = deadline.clone();
    let service_shared = shared.clone();
    let service = service_fn(move |req: hyper::Request<Incoming>| {
        let http11 = req.version() == hyper::Version::HTTP_11;
        let in_handler = InHandler::begin(&service_activity, &in_flight, http11);
        let app = app.clone();
        let handlers = handlers.clone();
        let deadline = service_deadline.clone();
        let shared = service_shared.clone();
        let activity = service_activity.clone();
        // Boxed: the connection is taken apart once it ends (see below), which needs a
        // future that can move.
        Box::pin(async move {
            let openai = is_openai_path(req.uri().path());
            let method = req.method().clone();
            let response = if method == hyper::Method::POST && shared.unsent.over_limit() {
                shared.metrics.inc(
                    "te_request_failure",
                    &[("err", ErrorType::Congested.metric_label())],
                );
                congested(openai)
            } else {
                let answered = deadline
                    .race(handlers.respond(app, req.map(axum::body::Body::new), openai))
                    .await;
                match answered {
                    Some(response) => response,
                    None => shutting_down(
                        openai,
                        "The server is shutting down: the request did not finish within \
                         --shutdown-timeout",
                    ),
                }
            };
            answer_produced(&activity, &shared.unsent, answer_bytes(&response, &method));
            drop(in_handler);
            Ok::<_, std::convert::Infallible>(response)
        })
    });
    let mut conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .keep_alive(true)
        // A client that half-closes after its request still gets the answer; `peer` tells
        // it from one that left.
        .half_close(true)
        .serve_connection(io, service);
    let limits = shared.limits;
    let shutdown = &shared.shutdown;
    let mut drain_started = None;
    let mut deadline_at = None;
    let mut graceful = false;
    let mut peer_closed = false;
    let mut probed_request = None;
    let closed = loop {
        let mut check = verdict(
            &lock(&activity),
            Instant::now(),
            &limits,
            drain_started,
            deadline_at,
        );
        if peer_closed {
            check = check
                .and_then(|at| watch_departure(&activity, peer.as_ref(), &mut probed_request, at));
        }
        let next_check = match check {
            Ok(at) => at,
            Err(reason) => break Some(reason),
        };
        if drain_started.is_some() && !graceful && lock(&activity).in_handler > 0 {
            // Finish the request being served, then close instead of keeping alive.
            std::pin::Pin::new(&mut conn).graceful_shutdown();
            graceful = true;
        }
        tokio::select! {
            biased;
            // hyper flushes and sends the FIN; the socket is closed below, lingering.
            result = std::future::poll_fn(|cx| std::pin::Pin::new(&mut conn).poll(cx)) => {
                if let Err(e) = result {
                    tracing::debug!("connection ended: {e}");
                }
                break None;
            }
            _ = async { peer.as_ref().expect("watched").read_closed().await },
                if peer.is_some() && !peer_closed => {
                peer_closed = true;
            }
            _ = send_stalled.notified() => {}
            _ = tokio::time::sleep_until(next_check) => {}
            _ = shutdown.reached(Phase::Draining), if drain_started.is_none() => {
                drain_started = Some(Instant::now());
            }
            _ = shutdown.reached(Phase::Deadline), if deadline_at.is_none() => {
                deadline_at = Some(Instant::now());
                let unfinished = lock(&activity).in_handler;
                if unfinished > 0 {
                    shared.metrics.counter_add(
                        "te_request_failure",
                        &[("err", "shutting_down")],
                        unfinished as u64,
                    );
                }
                deadline.reach();
            }
        }
    };
    drop(peer);
    match closed {
        Some(reason) => {
            let requests = lock(&activity).requests;
            tracing::debug!(?reason, requests, "closing connection");
            if let Some(phase) = reason.timeout_phase() {
                shared
                    .metrics
                    .inc("te_connection_timeout", &[("phase", phase)]);
            }
            drop(conn);
        }
        None => {
            let Watched { inner, share } = conn.into_parts().io.into_inner();
            drop(share);
            tokio::select! {
                _ = linger(inner, LINGER) => {}
                _ = shutdown.reached(Phase::Deadline) => {}
            }
        }
    }
    drop(permit);
    shared.set_open_gauge();
}

/// While a client that closed its side has a request in a handler: probes it once (HTTP/1.1
/// only; an HTTP/1.0 client must not be sent an interim answer) and looks at the socket
/// every [`PROBE_POLL`] until the handler ends; `Err` once the client is gone.
fn watch_departure(
    activity: &SharedActivity,
    peer: Option<&PeerWatch>,
    probed_request: &mut Option<u64>,
    next_check: Instant,
) -> Result<Instant, Close> {
    let Some(peer) = peer else {
        return Ok(next_check);
    };
    let a = lock(activity);
    if a.in_handler == 0 || a.unsent > 0 {
        return Ok(next_check);
    }
    match peer.state() {
        PeerState::Gone => return Err(Close::PeerGone),
        PeerState::HalfClosed if a.http11 && *probed_request != Some(a.requests) => {
            *probed_request = Some(a.requests);
            peer.probe();
        }
        _ => {}
    }
    Ok(next_check.min(Instant::now() + PROBE_POLL))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod tests_clients;

#[cfg(test)]
mod tests_http2;
