//! The requests in a handler across every connection, HTTP/1.1 and HTTP/2: the drain ends
//! when none is left.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// Requests in a handler across every connection: the drain ends when none is left.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    count: AtomicUsize,
    none_left: Notify,
}

impl InFlight {
    /// Counts a request until the guard is dropped.
    pub fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count_one();
        InFlightGuard(self.clone())
    }

    /// Counts a request whose end [`InFlight::leave`] will count.
    pub fn count_one(&self) {
        self.count.fetch_add(1, Ordering::AcqRel);
    }

    pub fn leave(&self) {
        let before = self.count.fetch_sub(1, Ordering::AcqRel);
        if before == 1 {
            self.none_left.notify_waiters();
        }
    }

    pub async fn wait_until_none(&self) {
        loop {
            let notified = self.none_left.notified();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One request counted in [`InFlight`] until dropped.
pub(super) struct InFlightGuard(Arc<InFlight>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.leave();
    }
}
