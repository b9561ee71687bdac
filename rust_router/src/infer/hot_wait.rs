//! A query's handler waits for its result awake.
//!
//! A handler that awaits its result parks its tokio worker; the backend thread's reply then
//! wakes a worker, and the kernel must find that thread a core. Under a backfill that keeps
//! every core busy (tokenizer threads, the clients), that took 1.1–1.7 ms at p99 on a GPU
//! machine ("the rest of the server total" in benchmarks/RESULTS.md) for a query whose
//! forward pass took 0.7 ms. A handler that polls its result instead keeps its worker
//! running, yielding to the worker's other tasks between polls, and finds the result as soon
//! as it is there. The price is that worker's core for the query's time, bounded by `spin`.

use std::time::{Duration, Instant};
use tokio::sync::oneshot::{self, error::TryRecvError};

/// How long a query's handler polls by default where the runtime has an interactive lane:
/// longer than a small model's query under a backfill, short enough that a long one (a large
/// model's, waiting for a bulk step) does not hold a core throughout.
pub const DEFAULT_QUERY_SPIN: Duration = Duration::from_millis(5);

/// `rx`'s value, polled for up to `spin` (yielding between polls), then awaited; None once
/// its sender is gone.
pub async fn receive<T>(mut rx: oneshot::Receiver<T>, spin: Duration) -> Option<T> {
    if !spin.is_zero() {
        let until = Instant::now() + spin;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_value_sent_while_polling_is_received() {
        let (tx, rx) = oneshot::channel();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(3));
            tx.send(5).unwrap();
        });
        let started = Instant::now();
        assert_eq!(receive(rx, Duration::from_secs(5)).await, Some(5));
        assert!(started.elapsed() < Duration::from_secs(4));
        sender.join().unwrap();
    }

    #[tokio::test]
    async fn past_the_spin_it_awaits_and_a_dropped_sender_is_an_error() {
        let (tx, rx) = oneshot::channel();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            tx.send("late").unwrap();
        });
        assert_eq!(receive(rx, Duration::from_millis(1)).await, Some("late"));
        sender.join().unwrap();
        for spin in [Duration::ZERO, Duration::from_secs(5)] {
            let (tx, rx) = oneshot::channel::<u8>();
            drop(tx);
            let started = Instant::now();
            assert_eq!(receive(rx, spin).await, None);
            assert!(started.elapsed() < Duration::from_secs(1));
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn polling_lets_the_workers_other_tasks_run() {
        // On one thread, the sender is another task: it only runs if the poller yields.
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.send(9).unwrap();
        });
        assert_eq!(receive(rx, Duration::from_secs(5)).await, Some(9));
    }
}
