//! What one connection is doing (reading a head, running a handler, sending a response, idle)
//! and which deadline applies to it: [`verdict`].
//!
//! hyper's own header timer also closes idle keep-alive connections (it starts whenever hyper
//! waits for a request head), so the deadlines are kept here instead, from what the
//! connection reads and writes and when its requests start and end.

use crate::metrics::Metrics;
use crate::shutdown::DRAIN_GRACE;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

/// After the shutdown deadline, how long connections have to write the 503s before they are
/// closed.
pub const DEADLINE_FLUSH: Duration = Duration::from_secs(1);

/// The connection limits from the flags.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    pub keep_alive_timeout: Duration,
    /// How long an answer may wait for the client to take any of its bytes.
    pub send_timeout: Duration,
    /// Answer bytes all connections may hold unsent before new work is refused.
    pub response_buffer_limit: u64,
    pub max_connections: usize,
}

/// What a connection is doing, updated by its reads and writes and by its requests' start
/// and end.
#[derive(Debug)]
pub(super) struct Activity {
    /// Requests whose handler is running.
    pub in_handler: usize,
    /// When the first byte of a request head arrived, while no handler runs.
    pub head_started: Option<Instant>,
    /// When the connection opened, or its last request ended and its answer was sent.
    pub idle_since: Instant,
    pub requests: u64,
    /// Bytes of answers produced and not yet taken by the socket. A lower bound: the head is
    /// counted without the `date` and `content-length` headers hyper adds, so it reaches 0
    /// when at most those few bytes are left in hyper's buffer.
    pub unsent: u64,
    /// When the socket last took bytes of an answer, or the answer was produced.
    pub last_sent: Instant,
    /// The socket refused bytes of an answer (the client is not reading); cleared when it
    /// takes some again.
    pub send_stalled: bool,
    /// The running request is HTTP/1.1: it may be sent an interim `100 Continue`.
    pub http11: bool,
}

impl Activity {
    pub fn new(now: Instant) -> Self {
        Self {
            in_handler: 0,
            head_started: None,
            idle_since: now,
            requests: 0,
            unsent: 0,
            last_sent: now,
            send_stalled: false,
            http11: true,
        }
    }
}

pub(super) type SharedActivity = Arc<Mutex<Activity>>;

pub(super) fn lock(a: &SharedActivity) -> MutexGuard<'_, Activity> {
    a.lock().unwrap_or_else(|p| p.into_inner())
}

const GAUGE: &str = "te_response_unsent_bytes";

/// Bytes of answers produced and not yet taken by their sockets, over every connection:
/// what slow or absent readers make the server hold. Past `limit`, new work is refused.
/// Shown as the gauge `te_response_unsent_bytes`.
#[derive(Debug)]
pub struct UnsentBytes {
    total: AtomicU64,
    limit: u64,
    metrics: Arc<Metrics>,
}

impl UnsentBytes {
    pub fn new(limit: u64, metrics: Arc<Metrics>) -> Self {
        metrics.gauge_set(GAUGE, &[], 0.0);
        Self {
            total: AtomicU64::new(0),
            limit,
            metrics,
        }
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    pub fn over_limit(&self) -> bool {
        self.total() > self.limit
    }

    fn add(&self, bytes: u64) {
        let total = self.total.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.metrics.gauge_set(GAUGE, &[], total as f64);
    }

    fn sub(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let total = self.total.fetch_sub(bytes, Ordering::Relaxed) - bytes;
        self.metrics.gauge_set(GAUGE, &[], total as f64);
    }
}

/// Counts an answer of `bytes` (head and body) that `activity`'s connection is about to
/// write.
pub(super) fn answer_produced(activity: &SharedActivity, all: &UnsentBytes, bytes: u64) {
    let mut a = lock(activity);
    a.unsent += bytes;
    a.last_sent = Instant::now();
    drop(a);
    all.add(bytes);
}

/// A connection's share of [`UnsentBytes`]; what is still counted when the connection
/// closes is given back then.
pub(super) struct UnsentShare {
    pub activity: SharedActivity,
    pub all: Arc<UnsentBytes>,
    /// Woken when the socket first refuses an answer's bytes, so the connection's send
    /// deadline is armed from then.
    pub stalled: Arc<Notify>,
}

impl UnsentShare {
    /// The socket took `written` bytes.
    fn taken(&self, written: usize) {
        let mut a = lock(&self.activity);
        if a.unsent == 0 || written == 0 {
            return;
        }
        let counted = a.unsent.min(written as u64);
        a.unsent -= counted;
        let now = Instant::now();
        a.last_sent = now;
        a.send_stalled = false;
        if a.unsent == 0 && a.in_handler == 0 {
            a.idle_since = now;
        }
        drop(a);
        self.all.sub(counted);
    }

    /// The socket refused bytes.
    fn refused(&self) {
        let mut a = lock(&self.activity);
        if a.unsent > 0 && !a.send_stalled {
            a.send_stalled = true;
            drop(a);
            self.stalled.notify_one();
        }
    }
}

impl Drop for UnsentShare {
    fn drop(&mut self) {
        let left = std::mem::take(&mut lock(&self.activity).unsent);
        self.all.sub(left);
    }
}

/// The bytes hyper writes for `response`'s head, at least: the status line, its headers and
/// the blank line (hyper may add `date` and `content-length`).
pub(super) fn head_bytes(response: &axum::response::Response) -> u64 {
    let headers: usize = response
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    let status_line = "HTTP/1.1 200 \r\n".len()
        + response
            .status()
            .canonical_reason()
            .map_or(0, |reason| reason.len());
    (status_line + headers + 2) as u64
}

/// A TCP stream that notes when bytes of a new request head arrive and how much of each
/// answer the socket has taken.
pub(super) struct Watched {
    pub inner: TcpStream,
    pub share: UnsentShare,
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
            let mut a = lock(&self.share.activity);
            if a.in_handler == 0 && a.head_started.is_none() {
                a.head_started = Some(Instant::now());
            }
        }
        poll
    }
}

impl Watched {
    fn note_write(&self, poll: &Poll<io::Result<usize>>) {
        match poll {
            Poll::Ready(Ok(written)) => self.share.taken(*written),
            Poll::Pending => self.share.refused(),
            Poll::Ready(Err(_)) => {}
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note_write(&poll);
        poll
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note_write(&poll);
        poll
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

/// Why a connection was closed by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Close {
    HeaderTimeout,
    IdleTimeout,
    /// The client took none of an answer's bytes for `--send-timeout`.
    SendTimeout,
    Draining,
    Deadline,
    /// The client closed its side mid-request and then refused the interim answer.
    PeerGone,
}

impl Close {
    /// The `phase` of `te_connection_timeout`, for the closes that are timeouts.
    pub fn timeout_phase(self) -> Option<&'static str> {
        match self {
            Close::HeaderTimeout => Some("header"),
            Close::IdleTimeout => Some("idle"),
            Close::SendTimeout => Some("send"),
            Close::Draining | Close::Deadline | Close::PeerGone => None,
        }
    }
}

/// When to look at the connection next, or why to close it now.
///
/// An idle connection is looked at again at least every `--header-read-timeout`: a head's
/// first byte does not wake the connection's task, so that is how the header deadline is
/// seen in time whatever the keep-alive timeout is.
pub(super) fn verdict(
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
        if a.in_handler > 0 || a.unsent > 0 {
            return Ok(close_at);
        }
    }
    if a.unsent > 0 {
        // An answer being sent is accepted work: the drain lets it finish, the send
        // deadline does not.
        let limit = a.last_sent + limits.send_timeout;
        return if now >= limit {
            Err(Close::SendTimeout)
        } else {
            Ok(limit)
        };
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
    } else if a.head_started.is_none() {
        Ok(limit.min(now + limits.header_read_timeout))
    } else {
        Ok(limit)
    }
}
