//! Accepting and serving HTTP/1.1 connections, with the limits that keep slow or idle clients
//! from holding the server: a deadline for a request's headers, an idle keep-alive timeout, a
//! cap on open connections (past it, a new connection gets a 503 and is closed at once), and
//! the connection side of the shutdown sequence (see [`crate::shutdown`]): while draining,
//! connections are still accepted and new requests answered 503 (by the HTTP layer) until no
//! accepted request is left; then the listeners close, and each connection closes once it has
//! nothing accepted to finish.
//!
//! hyper's own header timer also closes idle keep-alive connections (it starts whenever hyper
//! waits for a request head), so the two deadlines are kept here instead, from what the
//! connection reads and when its requests start and end. The body deadline belongs to the
//! handler that reads the body (`http::error::Body`).

use crate::http_thread::Handlers;
use crate::metrics::Metrics;
use crate::shutdown::{Phase, Shutdown};
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// After SIGTERM, how long a connection with no request in a handler may still start one (a
/// client that has just connected, or sends its next request on a kept-alive connection),
/// so requests already on their way are served rather than reset. Half-sent requests and idle
/// connections are closed after it.
pub const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// After the shutdown deadline, how long connections have to write the 503s before they are
/// closed.
pub const DEADLINE_FLUSH: Duration = Duration::from_secs(1);

/// Once the drain is done, the listeners close only after no connection arrived for this
/// long. Closing a listening socket resets every connection the kernel completed but the
/// server has not accepted yet, and a client that connected there sees its request reset
/// rather than refused; clients that reconnect after their 503 kept hitting that window.
pub const LISTEN_QUIET: Duration = Duration::from_millis(100);

/// The connection limits from the flags.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    pub keep_alive_timeout: Duration,
    pub max_connections: usize,
}

/// What a connection is doing, updated by its reads and by its requests' start and end.
#[derive(Debug)]
struct Activity {
    /// Requests whose handler is running.
    in_handler: usize,
    /// When the first byte of a request head arrived, while no handler runs.
    head_started: Option<Instant>,
    /// When the connection opened or its last request ended.
    idle_since: Instant,
    requests: u64,
}

type SharedActivity = Arc<Mutex<Activity>>;

fn lock(a: &SharedActivity) -> std::sync::MutexGuard<'_, Activity> {
    a.lock().unwrap_or_else(|p| p.into_inner())
}

/// A TCP stream that notes when bytes of a new request head arrive.
struct Watched {
    inner: TcpStream,
    activity: SharedActivity,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            let mut a = lock(&self.activity);
            if a.in_handler == 0 && a.head_started.is_none() {
                a.head_started = Some(Instant::now());
            }
        }
        poll
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Requests in a handler across every connection: the drain ends when none is left.
#[derive(Debug, Default)]
struct InFlight {
    count: std::sync::atomic::AtomicUsize,
    none_left: tokio::sync::Notify,
}

impl InFlight {
    async fn wait_until_none(&self) {
        loop {
            let notified = self.none_left.notified();
            if self.count.load(std::sync::atomic::Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Marks a request's handler as running until dropped (also when the client goes away).
struct InHandler {
    activity: SharedActivity,
    in_flight: Arc<InFlight>,
}

impl InHandler {
    fn begin(activity: &SharedActivity, in_flight: &Arc<InFlight>) -> Self {
        let mut a = lock(activity);
        a.in_handler += 1;
        a.head_started = None;
        a.requests += 1;
        drop(a);
        in_flight
            .count
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
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
        let before = self
            .in_flight
            .count
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        if before == 1 {
            self.in_flight.none_left.notify_waiters();
        }
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

/// Why a connection was closed by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Close {
    HeaderTimeout,
    IdleTimeout,
    Draining,
    Deadline,
}

impl Close {
    fn metric_label(self) -> &'static str {
        match self {
            Close::HeaderTimeout => "header",
            Close::IdleTimeout => "idle",
            Close::Draining => "draining",
            Close::Deadline => "deadline",
        }
    }
}

/// When to look at the connection next, or why to close it now.
fn verdict(
    a: &Activity,
    now: Instant,
    limits: &ConnectionLimits,
    drain_started: Option<Instant>,
    deadline_at: Option<Instant>,
) -> Result<Instant, Close> {
    if let Some(at) = deadline_at {
        let close_at = at + DEADLINE_FLUSH;
        if now >= close_at {
            return Err(Close::Deadline);
        }
        if a.in_handler > 0 {
            return Ok(close_at);
        }
    }
    if a.in_handler > 0 {
        // The handler owns the body deadline; look again later in case it ends.
        return Ok(now + limits.header_read_timeout.min(limits.keep_alive_timeout));
    }
    let (limit, reason) = match a.head_started {
        Some(t) => (t + limits.header_read_timeout, Close::HeaderTimeout),
        None => (a.idle_since + limits.keep_alive_timeout, Close::IdleTimeout),
    };
    let (limit, reason) = match drain_started {
        Some(t) if t + DRAIN_GRACE < limit => (t + DRAIN_GRACE, Close::Draining),
        _ => (limit, reason),
    };
    if now >= limit {
        Err(reason)
    } else {
        Ok(limit)
    }
}

/// Everything the accept loop and the connections share.
struct Shared {
    app: Router,
    limits: ConnectionLimits,
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
    open: Arc<Semaphore>,
    refusals: Mutex<RefusalLog>,
    in_flight: Arc<InFlight>,
    handlers: Handlers,
}

impl Shared {
    fn open_connections(&self) -> usize {
        self.limits.max_connections - self.open.available_permits()
    }

    fn set_open_gauge(&self) {
        self.metrics
            .gauge_set("te_connection_open", self.open_connections() as f64);
    }
}

/// Logs refused connections at most every few seconds, with how many since the last line.
#[derive(Debug, Default)]
struct RefusalLog {
    last: Option<Instant>,
    unlogged: u64,
}

const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// The answer to a connection past the cap: a complete HTTP response, so clients see why.
static REFUSAL: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let body = r#"{"error":"Too many open connections (--max-connections), retry later","error_type":"overloaded"}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
});

/// Serves `app` on every listener until the shutdown sequence ends: after `Draining` no
/// connection is accepted and each one closes as soon as it has nothing accepted to finish;
/// after `Deadline` (+ [`DEADLINE_FLUSH`]) every one is closed. Each request's handler runs
/// where `handlers` says.
pub async fn serve(
    listeners: Vec<TcpListener>,
    app: Router,
    limits: ConnectionLimits,
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
    handlers: Handlers,
) {
    let shared = Arc::new(Shared {
        app,
        limits,
        shutdown: shutdown.clone(),
        metrics,
        open: Arc::new(Semaphore::new(limits.max_connections)),
        refusals: Mutex::default(),
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
            Ok(stream) => admit(stream, &shared, &mut connections),
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
                Ok(Ok(stream)) => admit(stream, &shared, &mut connections),
                Ok(Err(_)) | Err(_) => break,
            },
            _ = &mut deadline => break,
        }
    }
    for listener in &listeners {
        while let Some(Ok((stream, _))) = futures_util::FutureExt::now_or_never(listener.accept()) {
            admit(stream, &shared, &mut connections);
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

async fn accept_any(listeners: &[TcpListener]) -> io::Result<TcpStream> {
    let accepts = listeners.iter().map(|l| Box::pin(l.accept()));
    let (result, _, _) = futures_util::future::select_all(accepts).await;
    result.map(|(stream, _)| stream)
}

fn admit(stream: TcpStream, shared: &Arc<Shared>, connections: &mut JoinSet<()>) {
    match shared.open.clone().try_acquire_owned() {
        Ok(permit) => {
            shared.set_open_gauge();
            connections.spawn(serve_connection(stream, shared.clone(), permit));
        }
        Err(_) => refuse(stream, shared),
    }
}

/// Past `--max-connections`: answer 503 without reading the request and close, never wait.
fn refuse(stream: TcpStream, shared: &Shared) {
    let _ = stream.try_write(&REFUSAL);
    drop(stream);
    shared.metrics.inc("te_connection_refused", &[]);
    let mut log = shared.refusals.lock().unwrap_or_else(|p| p.into_inner());
    log.unlogged += 1;
    let now = Instant::now();
    if log.last.is_none_or(|t| now - t >= REFUSAL_LOG_EVERY) {
        tracing::warn!(
            refused = log.unlogged,
            max_connections = shared.limits.max_connections,
            "refused connections: --max-connections are open"
        );
        log.last = Some(now);
        log.unlogged = 0;
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>, permit: OwnedSemaphorePermit) {
    // Responses are written whole; do not let Nagle hold their last segment.
    let _ = stream.set_nodelay(true);
    let activity: SharedActivity = Arc::new(Mutex::new(Activity {
        in_handler: 0,
        head_started: None,
        idle_since: Instant::now(),
        requests: 0,
    }));
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: activity.clone(),
    });
    let app = shared.app.clone();
    let handlers = shared.handlers.clone();
    let service_activity = activity.clone();
    let in_flight = shared.in_flight.clone();
    let deadline = Arc::new(ConnDeadline::default());
    let service_deadline = deadline.clone();
    let service = service_fn(move |req: hyper::Request<Incoming>| {
        let in_handler = InHandler::begin(&service_activity, &in_flight);
        let app = app.clone();
        let handlers = handlers.clone();
        let deadline = service_deadline.clone();
        async move {
            let openai = crate::http::is_openai_path(req.uri().path());
            let answered = deadline
                .race(handlers.respond(app, req.map(axum::body::Body::new), openai))
                .await;
            drop(in_handler);
            Ok::<_, std::convert::Infallible>(match answered {
                Some(response) => response,
                None => crate::http::shutting_down(
                    openai,
                    "The server is shutting down: the request did not finish within \
                     --shutdown-timeout",
                ),
            })
        }
    });
    // Boxed so that dropping it closes the socket before the connection's permit is released.
    let mut conn = Box::pin(
        http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            .keep_alive(true)
            .serve_connection(io, service),
    );
    let limits = shared.limits;
    let shutdown = &shared.shutdown;
    let mut drain_started = None;
    let mut deadline_at = None;
    let mut graceful = false;
    let closed = loop {
        let check = verdict(
            &lock(&activity),
            Instant::now(),
            &limits,
            drain_started,
            deadline_at,
        );
        let next_check = match check {
            Ok(at) => at,
            Err(reason) => break Some(reason),
        };
        if drain_started.is_some() && !graceful && lock(&activity).in_handler > 0 {
            // Finish the request being served, then close instead of keeping alive.
            conn.as_mut().graceful_shutdown();
            graceful = true;
        }
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("connection ended: {e}");
                }
                break None;
            }
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
    if let Some(reason) = closed {
        let requests = lock(&activity).requests;
        tracing::debug!(?reason, requests, "closing connection");
        if matches!(reason, Close::HeaderTimeout | Close::IdleTimeout) {
            shared
                .metrics
                .inc("te_connection_timeout", &[("phase", reason.metric_label())]);
        }
    }
    drop(conn);
    drop(permit);
    shared.set_open_gauge();
}

#[cfg(test)]
#[path = "connections_tests.rs"]
mod tests;
