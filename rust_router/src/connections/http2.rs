//! HTTP/2 connections: gRPC (`tei.v1`, health, reflection) and, with prior knowledge, the
//! app's routes. On the HTTP port a connection is told HTTP/2 by the first bytes of its
//! client's preface, peeked once when it opens and left for the server to read, so an
//! HTTP/1.1 connection is served exactly as before; on `--grpc-port` every connection is
//! HTTP/2. An HTTP/2 connection is served on the workers' runtime, never on the HTTP thread,
//! which stays the HTTP/1.1 queries' (see `http_thread`).

use super::activity::{ConnectionLimits, DEADLINE_FLUSH};
use super::in_flight::InFlight;
use crate::shutdown::{Phase, Shutdown, DRAIN_GRACE};
use axum::extract::Request;
use axum::response::Response;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tower::util::BoxCloneSyncService;
use tower::ServiceExt as _;

/// What answers an HTTP/2 connection's requests (built by `grpc::http2_service`).
pub type Http2Service = BoxCloneSyncService<Request, Response, Infallible>;

/// The start of every HTTP/2 client's connection preface (`PRI * HTTP/2.0...`). No HTTP/1.1
/// method begins with these three bytes, so they decide.
const PREFACE_START: &[u8] = b"PRI";

/// While a new connection has sent part of [`PREFACE_START`] only, how long to wait before
/// looking again.
const PARTIAL_PREFACE_WAIT: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Protocol {
    Http1,
    Http2,
}

/// How an unsniffed connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unsniffed {
    /// The client closed it (or it failed) before sending a byte.
    Closed,
    /// It sent nothing within `--keep-alive-timeout`.
    Idle,
    /// It sent part of [`PREFACE_START`], then nothing more within `--header-read-timeout`.
    Head,
    /// The server is shutting down.
    ShuttingDown,
}

/// The protocol a new connection speaks, from its first bytes (peeked: the server still
/// reads them). A connection that sends nothing is closed after `limits`' keep-alive
/// timeout, one that stops within the preface's first bytes after its header timeout, and
/// either once the drain's grace has passed.
pub(super) async fn sniff(
    stream: &TcpStream,
    limits: &ConnectionLimits,
    shutdown: &Shutdown,
) -> Result<Protocol, Unsniffed> {
    tokio::select! {
        protocol = first_bytes(stream, limits.header_read_timeout) => protocol,
        _ = tokio::time::sleep(limits.keep_alive_timeout) => Err(Unsniffed::Idle),
        _ = async {
            shutdown.reached(Phase::Draining).await;
            tokio::time::sleep(DRAIN_GRACE).await;
        } => Err(Unsniffed::ShuttingDown),
    }
}

/// The protocol [`PREFACE_START`] tells, once enough of it has arrived (within
/// `head_timeout` of its first byte).
async fn first_bytes(stream: &TcpStream, head_timeout: Duration) -> Result<Protocol, Unsniffed> {
    let mut start = [0u8; PREFACE_START.len()];
    let mut first_byte_at = None;
    loop {
        let n = match stream.peek(&mut start).await {
            Ok(0) | Err(_) => return Err(Unsniffed::Closed),
            Ok(n) => n,
        };
        if let Some(protocol) = protocol_of(&start[..n]) {
            return Ok(protocol);
        }
        let since = *first_byte_at.get_or_insert_with(Instant::now);
        if since.elapsed() >= head_timeout {
            return Err(Unsniffed::Head);
        }
        // `peek` returns at once while the bytes it saw are still there.
        tokio::time::sleep(PARTIAL_PREFACE_WAIT).await;
    }
}

/// The protocol a connection's first bytes tell, `None` until enough have arrived.
pub(super) fn protocol_of(first: &[u8]) -> Option<Protocol> {
    let seen = first.len().min(PREFACE_START.len());
    if first[..seen] != PREFACE_START[..seen] {
        Some(Protocol::Http1)
    } else if seen == PREFACE_START.len() {
        Some(Protocol::Http2)
    } else {
        None
    }
}

/// What an HTTP/2 connection is served with.
pub(super) struct Served {
    pub service: Http2Service,
    pub shutdown: Shutdown,
    /// Each request counts here until it is answered.
    pub in_flight: Arc<InFlight>,
    pub limits: ConnectionLimits,
}

/// Serves one HTTP/2 connection until the client closes it, stops answering pings (sent
/// every `--keep-alive-timeout`, answered within `--send-timeout`), or the shutdown sequence
/// ends it: from the drain, the client is told to open no new stream (GOAWAY) and the
/// streams it has finish; at the deadline (+ [`DEADLINE_FLUSH`]) the connection is dropped.
/// Runs on `elsewhere` when given.
pub(super) async fn serve(stream: TcpStream, served: Served, elsewhere: Option<Handle>) {
    let Some(elsewhere) = elsewhere else {
        return serve_here(stream, served).await;
    };
    // A socket belongs to the runtime that registered it: hand it over unregistered.
    let stream = match stream.into_std() {
        Ok(stream) => stream,
        Err(e) => return tracing::debug!("cannot hand an HTTP/2 connection over: {e}"),
    };
    let task = elsewhere.spawn(async move {
        match TcpStream::from_std(stream) {
            Ok(stream) => serve_here(stream, served).await,
            Err(e) => tracing::debug!("cannot serve an HTTP/2 connection: {e}"),
        }
    });
    // Aborted with this task (the shutdown deadline aborts every connection's).
    let mut task = crate::http_thread::AbortOnDrop::new(task);
    let _ = task.output().await;
}

async fn serve_here(stream: TcpStream, served: Served) {
    let Served {
        service,
        shutdown,
        in_flight,
        limits,
    } = served;
    let _ = stream.set_nodelay(true);
    let requests = service_fn(move |req: hyper::Request<Incoming>| {
        let counted = in_flight.enter();
        let service = service.clone();
        async move {
            let response = service.oneshot(req.map(axum::body::Body::new)).await;
            drop(counted);
            response
        }
    });
    let conn = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.keep_alive_timeout)
        .keep_alive_timeout(limits.send_timeout)
        .serve_connection(TokioIo::new(stream), requests);
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => return log_end(result),
        _ = shutdown.reached(Phase::Draining) => {}
    }
    conn.as_mut().graceful_shutdown();
    tokio::select! {
        result = conn.as_mut() => log_end(result),
        _ = async {
            shutdown.reached(Phase::Deadline).await;
            tokio::time::sleep(DEADLINE_FLUSH).await;
        } => tracing::debug!("closing an HTTP/2 connection at the shutdown deadline"),
    }
}

fn log_end(result: Result<(), hyper::Error>) {
    if let Err(e) = result {
        tracing::debug!("HTTP/2 connection ended: {e}");
    }
}
