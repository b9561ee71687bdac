//! How a backend thread waits for its next batch: optionally busy, for a while, then asleep.
//!
//! A thread that sleeps between batches wakes on a cold core, and the next batch's host-side
//! work (the Python call, graph launch, result copy) then runs slower. Measured on the GPU
//! machine (benchmarks/RESULTS.md): `Backend.embed` of a 24-token bert-large query took
//! 1.26 ms after a 0.7 ms sleep and 0.98 ms after a 0.7 ms busy-wait. Spinning keeps the
//! core awake for the next query, at the price of a busy core while traffic keeps arriving
//! within the window.

use std::time::{Duration, Instant};
use tokio::sync::mpsc::{error::TryRecvError, UnboundedReceiver};

/// How long a backend thread busy-waits for the next batch before it sleeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitPolicy {
    pub spin: Duration,
}

impl WaitPolicy {
    pub fn spin_micros(micros: u64) -> Self {
        Self {
            spin: Duration::from_micros(micros),
        }
    }
}

/// How each kind of backend thread waits: the bulk threads and the interactive ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaneWaits {
    pub bulk: WaitPolicy,
    pub interactive: WaitPolicy,
}

impl LaneWaits {
    /// How long an interactive thread spins by default: a query stream of at least
    /// 40 queries/s then always finds its thread awake. Measured on an H100
    /// (benchmarks/RESULTS.md): a 24-token all-MiniLM-L6-v2 query every 20 ms went from
    /// 2.50 to 1.94 ms p50, and its time waiting for the thread under a backfill from 3.4
    /// to 0.17 ms p99.
    pub const DEFAULT_INTERACTIVE_SPIN_US: u64 = 25_000;

    /// `--backend-spin-us`: every thread spins that long when given; by default only the
    /// interactive threads spin (they exist only where the runtime has an interactive
    /// lane, on a GPU), and bulk threads, whose batches are large, sleep at once.
    pub fn from_flag(spin_us: Option<u64>) -> Self {
        match spin_us {
            Some(us) => Self {
                bulk: WaitPolicy::spin_micros(us),
                interactive: WaitPolicy::spin_micros(us),
            },
            None => Self {
                bulk: WaitPolicy::default(),
                interactive: WaitPolicy::spin_micros(Self::DEFAULT_INTERACTIVE_SPIN_US),
            },
        }
    }
}

/// The next message, polling for `policy.spin` before blocking; `None` once every sender is
/// gone and the channel is empty.
pub fn next_message<T>(rx: &mut UnboundedReceiver<T>, policy: WaitPolicy) -> Option<T> {
    if !policy.spin.is_zero() {
        let until = Instant::now() + policy.spin;
        loop {
            match rx.try_recv() {
                Ok(message) => return Some(message),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) if Instant::now() < until => std::hint::spin_loop(),
                Err(TryRecvError::Empty) => break,
            }
        }
    }
    rx.blocking_recv()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    #[test]
    fn a_message_sent_while_spinning_is_taken_without_sleeping() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            tx.send(7).unwrap();
            tx
        });
        let started = Instant::now();
        assert_eq!(
            next_message(&mut rx, WaitPolicy::spin_micros(2_000_000)),
            Some(7)
        );
        // Taken as soon as it was sent, long before the spin window ran out.
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        drop(sender.join().unwrap());
        assert_eq!(next_message(&mut rx, WaitPolicy::spin_micros(1_000)), None);
    }

    #[test]
    fn after_the_window_it_blocks_until_a_message_comes() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            tx.send("late").unwrap();
        });
        // A 1 ms window ends before the message is sent: the blocking receive gets it.
        assert_eq!(
            next_message(&mut rx, WaitPolicy::spin_micros(1_000)),
            Some("late")
        );
        sender.join().unwrap();
        assert_eq!(next_message(&mut rx, WaitPolicy::default()), None);
    }

    #[test]
    fn no_spin_takes_queued_messages_in_order_then_ends() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        for i in 0..3 {
            tx.send(i).unwrap();
        }
        drop(tx);
        let policy = WaitPolicy::default();
        let got: Vec<_> = std::iter::from_fn(|| next_message(&mut rx, policy)).collect();
        assert_eq!(got, vec![0, 1, 2]);
    }

    #[test]
    fn by_default_only_interactive_threads_spin() {
        let waits = LaneWaits::from_flag(None);
        assert_eq!(waits.bulk, WaitPolicy::default());
        assert_eq!(
            waits.interactive,
            WaitPolicy::spin_micros(LaneWaits::DEFAULT_INTERACTIVE_SPIN_US)
        );
        let off = LaneWaits::from_flag(Some(0));
        assert_eq!(
            (off.bulk, off.interactive),
            (WaitPolicy::default(), WaitPolicy::default())
        );
        let both = LaneWaits::from_flag(Some(700));
        assert_eq!(both.bulk, WaitPolicy::spin_micros(700));
        assert_eq!(both.interactive, WaitPolicy::spin_micros(700));
    }

    #[test]
    fn a_closed_channel_ends_the_spin_at_once() {
        let (tx, mut rx) = mpsc::unbounded_channel::<u8>();
        drop(tx);
        let started = Instant::now();
        assert_eq!(
            next_message(&mut rx, WaitPolicy::spin_micros(5_000_000)),
            None
        );
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
