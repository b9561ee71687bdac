//! A query's handler waits for its result awake.
//!
//! A handler that awaits its result parks its tokio worker; the backend thread's reply then
//! wakes a worker, and the kernel must find that thread a core. Under a backfill that keeps
//! every core busy (tokenizer threads, the clients), that took 1.1–1.7 ms at p99 on a GPU
//! machine ("the rest of the server total" in docs/journal/results-log.md) for a query whose
//! forward pass took 0.7 ms. A handler that polls its result instead keeps its worker
//! running, yielding to the worker's other tasks between polls, and finds the result as soon
//! as it is there. The price is that worker's core for the query's time, bounded by `spin`.

use crate::capped::{Capped, CappedSlot};
use std::time::{Duration, Instant};
use tokio::sync::oneshot::{self, error::TryRecvError};

/// Handlers that poll at once, at most. A query stream has one query in flight at a time;
/// with many in flight the workers are busy, so awake, anyway, and more polling handlers
/// would only take the cores their work needs.
pub const MAX_POLLING: usize = 2;

/// How queries' handlers wait for their results: polling for up to `spin`
/// (`schedule::ServingProfile::query_spin`), [`MAX_POLLING`] at a time, the others (and every
/// handler once its time is up) asleep.
#[derive(Debug)]
pub struct HotWait {
    spin: Duration,
    polling: Capped,
}

impl HotWait {
    pub fn new(spin: Duration) -> Self {
        Self {
            spin,
            polling: Capped::new(MAX_POLLING),
        }
    }

    /// `rx`'s value, polled for up to `spin` when `hot` and a polling slot is free
    /// (yielding to the worker's other tasks between polls), else awaited; None once its
    /// sender is gone.
    pub async fn receive<T>(&self, mut rx: oneshot::Receiver<T>, hot: bool) -> Option<T> {
        if let Some(_slot) = hot.then(|| self.slot()).flatten() {
            let until = Instant::now() + self.spin;
            loop {
                match rx.try_recv() {
                    Ok(value) => return Some(value),
                    Err(TryRecvError::Closed) => return None,
                    Err(TryRecvError::Empty) if Instant::now() < until => {
                        tokio::task::yield_now().await
                    }
                    Err(TryRecvError::Empty) => break,
                }
            }
        }
        rx.await.ok()
    }

    fn slot(&self) -> Option<CappedSlot<'_>> {
        if self.spin.is_zero() {
            return None;
        }
        self.polling.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_value_sent_while_polling_is_received() {
        let wait = HotWait::new(Duration::from_secs(5));
        let (tx, rx) = oneshot::channel();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(3));
            tx.send(5).unwrap();
        });
        let started = Instant::now();
        assert_eq!(wait.receive(rx, true).await, Some(5));
        assert!(started.elapsed() < Duration::from_secs(4));
        assert_eq!(wait.polling.held(), 0);
        sender.join().unwrap();
    }

    #[tokio::test]
    async fn past_the_spin_it_awaits_and_a_dropped_sender_is_none() {
        let wait = HotWait::new(Duration::from_millis(1));
        let (tx, rx) = oneshot::channel();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            tx.send("late").unwrap();
        });
        assert_eq!(wait.receive(rx, true).await, Some("late"));
        sender.join().unwrap();
        for (spin, hot) in [(0, true), (5_000, true), (5_000, false)] {
            let wait = HotWait::new(Duration::from_millis(spin));
            let (tx, rx) = oneshot::channel::<u8>();
            drop(tx);
            let started = Instant::now();
            assert_eq!(wait.receive(rx, hot).await, None);
            assert!(started.elapsed() < Duration::from_secs(1));
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn polling_lets_the_workers_other_tasks_run() {
        // On one thread, the sender is another task: it only runs if the poller yields.
        let wait = HotWait::new(Duration::from_secs(5));
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.send(9).unwrap();
        });
        assert_eq!(wait.receive(rx, true).await, Some(9));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn at_most_max_polling_handlers_poll_and_slots_come_back() {
        let wait = std::sync::Arc::new(HotWait::new(Duration::from_secs(5)));
        let mut senders = Vec::new();
        let mut handlers = Vec::new();
        for _ in 0..MAX_POLLING + 3 {
            let (tx, rx) = oneshot::channel::<u8>();
            senders.push(tx);
            let wait = wait.clone();
            handlers.push(tokio::spawn(async move { wait.receive(rx, true).await }));
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while wait.polling.held() < MAX_POLLING {
            assert!(Instant::now() < deadline, "the handlers never polled");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(wait.polling.held(), MAX_POLLING);
        for (i, tx) in senders.into_iter().enumerate() {
            tx.send(i as u8).unwrap();
        }
        for (i, handler) in handlers.into_iter().enumerate() {
            assert_eq!(handler.await.unwrap(), Some(i as u8));
        }
        assert_eq!(wait.polling.held(), 0);
    }
}
