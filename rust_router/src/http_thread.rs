//! The thread that reads and writes every HTTP connection, and how it waits for requests.
//!
//! Connections are served by one thread with a tokio runtime of its own (current-thread),
//! apart from the workers that run the batching tasks and the handlers of large requests
//! (see [`Handlers`]). Two reasons, both a query's:
//!
//! - A thread asleep in `epoll_wait` is slow to wake when a request arrives after a pause:
//!   on an H200 guest (`benchmarks/experiments/bench_wake.py`, docs/journal/results-log.md) a
//!   loopback round trip every 20 ms took 152 µs p50 with the server asleep and 42 µs with it
//!   polling. A current-thread runtime whose task yields checks its sockets with a zero timeout
//!   before it polls that task again, so while requests keep arriving (within [`HotPoll::window`]
//!   of the last one) this thread polls its sockets and never sleeps. A multi-thread runtime cannot
//!   do this: its sockets are polled by whichever worker parks first, asleep.
//! - A backfill's large bodies are parsed by the other workers, so a query's bytes are not
//!   read after them.

use crate::backend::wait::IdleSince;
use crate::capped::Capped;
use crate::panics::panic_message;
use axum::body::HttpBody as _;
use axum::response::Response;
use axum::Router;
use futures_util::FutureExt as _;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::{oneshot, Notify};
use tower::ServiceExt;

/// Requests with a body of at most this many bytes (twice what tokenization encodes inline,
/// `tokenization::INLINE_MAX_BYTES`, for the JSON around the text) may run their handler on
/// the HTTP thread; larger ones, and bodies of unknown length, always run elsewhere.
pub const INLINE_BODY_BYTES: u64 = 2 * crate::tokenization::INLINE_MAX_BYTES as u64;

/// At most this many handlers run on the HTTP thread at once; past them, small requests'
/// handlers run elsewhere too. A query's handler waits for its result there, yielding (see
/// `infer::hot_wait`), so the thread still reads its sockets meanwhile; the cap keeps a
/// flood of small requests from making it the server's only core.
pub const INLINE_HANDLERS: usize = 2;

/// While the thread may not spin (see [`HotPoll::new`]'s `may_spin`), how often it asks
/// again, inside the window.
const RECHECK: Duration = Duration::from_millis(1);

/// Keeps the HTTP thread polling its sockets for `window` after each request's start.
pub struct HotPoll {
    window: Duration,
    /// Since when the thread has waited for the next request: since the last one started.
    since_request: IdleSince,
    arrived: Notify,
    may_spin: Box<dyn Fn() -> bool + Send + Sync>,
}

impl std::fmt::Debug for HotPoll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HotPoll")
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl HotPoll {
    /// `may_spin` is asked before each poll: while it says no, the thread sleeps between
    /// requests as before. The router says no while documents wait for a free tokenizer
    /// thread: requests then reach a host that is awake anyway, and the core is the
    /// tokenizers' ([`crate::server`]'s `hot_poll`).
    pub fn new(window: Duration, may_spin: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self {
            window,
            since_request: IdleSince::default(),
            arrived: Notify::new(),
            may_spin: Box::new(may_spin),
        }
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    /// What `may_spin` says now.
    pub fn may_spin_now(&self) -> bool {
        (self.may_spin)()
    }

    /// Called as each request starts.
    pub fn request_started(&self) {
        self.since_request.waiting();
        self.arrived.notify_one();
    }

    /// Whether the window after the last request is still open (none yet: not).
    fn within_window(&self) -> bool {
        self.since_request
            .idle_for()
            .is_some_and(|since| since < self.window)
    }

    /// Runs on the HTTP thread's runtime for as long as it lives: yields (the runtime then
    /// polls its sockets without blocking) while the window is open, and waits for the next
    /// request's start otherwise. `polls` counts the yields, for tests.
    pub async fn keep_polling(self: Arc<Self>, polls: Option<Arc<AtomicU64>>) {
        loop {
            // Registered before the check, so a request in between still wakes us.
            let arrived = self.arrived.notified();
            if !self.within_window() {
                arrived.await;
                continue;
            }
            if !self.may_spin_now() {
                tokio::time::sleep(RECHECK).await;
                continue;
            }
            if let Some(polls) = &polls {
                polls.fetch_add(1, Ordering::Relaxed);
            }
            tokio::task::yield_now().await;
        }
    }
}

/// Where each request's handler runs: on the HTTP thread (the connection's own task) when
/// the request is small and fewer than [`INLINE_HANDLERS`] run there, else on `elsewhere`.
#[derive(Debug, Clone)]
pub struct Handlers {
    /// The runtime of the batching tasks; `None`: every handler runs on the connection's
    /// task (tests, and a server without an HTTP thread of its own).
    pub elsewhere: Option<Handle>,
    /// Kept polling by each request's start, when the HTTP thread spins.
    pub hot: Option<Arc<HotPoll>>,
    inline: Arc<Capped>,
}

impl Default for Handlers {
    fn default() -> Self {
        Self::new(None, None)
    }
}

impl Handlers {
    pub fn new(elsewhere: Option<Handle>, hot: Option<Arc<HotPoll>>) -> Self {
        Self {
            elsewhere,
            hot,
            inline: Arc::new(Capped::new(INLINE_HANDLERS)),
        }
    }

    /// `app`'s response to `req`, from wherever its handler runs. A handler that panics is
    /// logged and answered as a server-side failure (500; TEI's 424), on either side; one
    /// whose answer is no longer awaited here (the client left, the shutdown deadline) is
    /// aborted on the workers too.
    pub async fn respond(
        &self,
        app: Router,
        req: axum::extract::Request,
        openai: bool,
    ) -> Response {
        if let Some(hot) = &self.hot {
            hot.request_started();
        }
        // Held until the handler has answered, when it runs here.
        let inline_slot = self
            .elsewhere
            .as_ref()
            .filter(|_| fits_inline(req.body().size_hint().exact()))
            .and_then(|_| self.inline.take());
        let answered = match &self.elsewhere {
            Some(elsewhere) if inline_slot.is_none() => {
                let mut handler = AbortOnDrop(elsewhere.spawn(app.oneshot(req)));
                handler.output().await.map_err(|e| e.to_string())
            }
            _ => AssertUnwindSafe(app.oneshot(req))
                .catch_unwind()
                .await
                .map_err(|panic| {
                    panic_message(panic.as_ref())
                        .unwrap_or("(no message)")
                        .to_string()
                }),
        };
        match answered {
            Ok(Ok(response)) => response,
            Ok(Err(never)) => match never {},
            Err(why) => {
                tracing::error!("a request's handler panicked: {why}");
                crate::http::error::handler_failed(openai)
            }
        }
    }
}

/// Whether a body of `length` bytes (`None`: unknown, chunked) is small enough to be
/// handled on the HTTP thread.
fn fits_inline(length: Option<u64>) -> bool {
    length.is_some_and(|n| n <= INLINE_BODY_BYTES)
}

/// A spawned task (a handler, an HTTP/2 connection) that is aborted when its output is no
/// longer awaited.
pub(crate) struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    pub(crate) fn new(task: tokio::task::JoinHandle<T>) -> Self {
        Self(task)
    }

    pub(crate) async fn output(&mut self) -> Result<T, tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `serve` on a new thread named `router-http` with a current-thread runtime (and
/// `hot`'s polling beside it, when given), and resolves with `serve`'s output once it ends.
pub async fn run<F, Fut>(hot: Option<Arc<HotPoll>>, serve: F) -> Result<Fut::Output, String>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future + 'static,
    Fut::Output: Send + 'static,
{
    let (done_tx, done_rx) = oneshot::channel();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the HTTP thread's runtime: {e}"))?;
    std::thread::Builder::new()
        .name("router-http".into())
        .spawn(move || {
            let output = runtime.block_on(async move {
                if let Some(hot) = hot {
                    tokio::spawn(hot.keep_polling(None));
                }
                serve().await
            });
            let _ = done_tx.send(output);
        })
        .map_err(|e| format!("cannot start the HTTP thread: {e}"))?;
    done_rx
        .await
        .map_err(|_| "the HTTP thread stopped unexpectedly".to_string())
}

#[cfg(test)]
#[path = "http_thread_tests.rs"]
mod tests;
