//! The server's shutdown phases, shared by the signal handler, the connections and the
//! handlers.
//!
//! `Running` → (SIGTERM/SIGINT) `Draining`: `/health` answers 503 so a load balancer stops
//! sending, no new connection is accepted, idle and half-sent connections are closed, accepted
//! requests finish → (`--shutdown-timeout` later) `Deadline`: requests still running are
//! answered 503 and every connection is closed.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// After SIGTERM, how long a connection with no request in a handler may still start one (a
/// client that has just connected, or sends its next request on a kept-alive connection),
/// so requests already on their way are served rather than reset. Half-sent requests and idle
/// connections are closed after it.
pub const DRAIN_GRACE: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Phase {
    Running = 0,
    Draining = 1,
    Deadline = 2,
}

/// A cloneable view of the phase, with a way to move it forward. Cloning is one reference
/// count and reading the phase one atomic load: every request reads it.
#[derive(Debug, Clone)]
pub struct Shutdown {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    phase: AtomicU8,
    /// Wakes the tasks waiting in [`Shutdown::reached`].
    tx: watch::Sender<Phase>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                phase: AtomicU8::new(Phase::Running as u8),
                tx: watch::channel(Phase::Running).0,
            }),
        }
    }
}

impl Phase {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Phase::Running,
            1 => Phase::Draining,
            _ => Phase::Deadline,
        }
    }
}

impl Shutdown {
    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.inner.phase.load(Ordering::Acquire))
    }

    pub fn is_draining(&self) -> bool {
        self.phase() >= Phase::Draining
    }

    /// Moves to `phase` (never backwards).
    pub fn advance(&self, phase: Phase) {
        self.inner.phase.fetch_max(phase as u8, Ordering::AcqRel);
        self.inner.tx.send_if_modified(|current| {
            let later = phase > *current;
            if later {
                *current = phase;
            }
            later
        });
    }

    /// Resolves once the phase is at least `phase`.
    pub async fn reached(&self, phase: Phase) {
        let mut rx = self.inner.tx.subscribe();
        // The sender lives as long as `self`, so this cannot fail while we wait.
        let _ = rx.wait_for(|p| *p >= phase).await;
    }

    /// Runs the whole sequence: waits for SIGINT/SIGTERM, drains, and moves to `Deadline`
    /// after `timeout`.
    pub async fn on_signal(self, timeout: Duration) {
        wait_for_signal().await;
        tracing::info!(
            "signal received: /health now answers 503, draining in-flight requests \
             (at most {:.0?})",
            timeout
        );
        self.advance(Phase::Draining);
        tokio::time::sleep(timeout).await;
        tracing::warn!(
            "shutdown deadline ({timeout:.0?}, --shutdown-timeout) reached: answering what \
             still runs with 503"
        );
        self.advance(Phase::Deadline);
    }
}

async fn wait_for_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot listen for SIGINT: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn phases_only_move_forward() {
        let s = Shutdown::default();
        assert_eq!(s.phase(), Phase::Running);
        assert!(!s.is_draining());
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.reached(Phase::Draining).await }
        });
        s.advance(Phase::Deadline);
        s.advance(Phase::Draining);
        assert_eq!(s.phase(), Phase::Deadline);
        assert!(s.is_draining());
        waiter.await.unwrap();
    }
}
