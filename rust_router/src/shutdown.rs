//! The server's shutdown phases, shared by the signal handler, the connections and the
//! handlers.
//!
//! `Running` → (SIGTERM/SIGINT) `Draining`: `/health` answers 503 so a load balancer stops
//! sending, no new connection is accepted, idle and half-sent connections are closed, accepted
//! requests finish → (`--shutdown-timeout` later) `Deadline`: requests still running are
//! answered 503 and every connection is closed.

use std::time::Duration;
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Running,
    Draining,
    Deadline,
}

/// A cloneable view of the phase, with a way to move it forward.
#[derive(Debug, Clone)]
pub struct Shutdown {
    tx: std::sync::Arc<watch::Sender<Phase>>,
    rx: watch::Receiver<Phase>,
}

impl Default for Shutdown {
    fn default() -> Self {
        let (tx, rx) = watch::channel(Phase::Running);
        Self {
            tx: std::sync::Arc::new(tx),
            rx,
        }
    }
}

impl Shutdown {
    pub fn phase(&self) -> Phase {
        *self.rx.borrow()
    }

    pub fn is_draining(&self) -> bool {
        self.phase() >= Phase::Draining
    }

    /// Moves to `phase` (never backwards).
    pub fn advance(&self, phase: Phase) {
        self.tx.send_if_modified(|current| {
            let later = phase > *current;
            if later {
                *current = phase;
            }
            later
        });
    }

    /// Resolves once the phase is at least `phase`.
    pub async fn reached(&self, phase: Phase) {
        let mut rx = self.rx.clone();
        // The sender lives as long as any `Shutdown`, so this only fails if none is left, in
        // which case nothing can advance the phase: wait for ever.
        if rx.wait_for(|p| *p >= phase).await.is_err() {
            std::future::pending::<()>().await;
        }
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
