//! How a backend thread waits for its next batch: optionally busy, for a while, then asleep.
//!
//! A thread that sleeps between batches wakes on a cold core, and the next batch's host-side
//! work (the Python call, graph launch, result copy) then runs slower. Measured on the GPU
//! machine (docs/journal/results-log.md): `Backend.embed` of a 24-token bert-large query took
//! 1.26 ms after a 0.7 ms sleep and 0.98 ms after a 0.7 ms busy-wait. Spinning keeps the
//! core awake for the next query, at the price of a busy core while traffic keeps arriving
//! within the window.
//!
//! An awake core still loses a query's code and data from its caches in the 20 ms between
//! queries: measured on an H200 (`benchmarks/experiments/bench_cold_query.py`), tokenizing a
//! query and its direct path through the runtime took 0.48 ms after a 20 ms busy-wait, 0.32 ms when
//! the busy-wait repeated their host steps every millisecond, and 0.29 ms back to back. So
//! a spinning interactive thread also re-runs them every `warm_every` (the caller's `warm`:
//! the backend's `warm` and the [`WarmHook`]).

use super::Backend;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{error::TryRecvError, UnboundedReceiver};

/// How long a backend thread busy-waits for the next batch before it sleeps, and how often
/// it re-runs a query's host steps meanwhile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitPolicy {
    pub spin: Duration,
    /// Zero: never.
    pub warm_every: Duration,
}

impl WaitPolicy {
    pub fn spin_micros(micros: u64) -> Self {
        Self {
            spin: Duration::from_micros(micros),
            warm_every: Duration::ZERO,
        }
    }

    /// While spinning, runs the caller's `warm` every `micros` µs (0: never).
    pub fn warming_every(self, micros: u64) -> Self {
        Self {
            warm_every: Duration::from_micros(micros),
            ..self
        }
    }
}

/// A step a spinning interactive thread re-runs besides its backend's
/// ([`super::Backend::warm`]): the router's own part of a query, set once it exists (the
/// tokenizer loads after the backend threads start).
#[derive(Clone, Default)]
pub struct WarmHook(Arc<OnceLock<Box<dyn Fn() + Send + Sync>>>);

impl WarmHook {
    /// Sets the step; a second call is ignored.
    pub fn set(&self, step: impl Fn() + Send + Sync + 'static) {
        let _ = self.0.set(Box::new(step));
    }

    pub fn run(&self) {
        if let Some(step) = self.0.get() {
            step();
        }
    }
}

impl fmt::Debug for WarmHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WarmHook")
            .field(&self.0.get().is_some())
            .finish()
    }
}

/// Since when a thread has been waiting, while it waits: a backend thread for work, the HTTP
/// thread for the next request (`http_thread::HotPoll`).
#[derive(Debug)]
pub struct IdleSince {
    base: Instant,
    /// Nanoseconds after `base` plus one; 0 while the thread works.
    since: AtomicU64,
}

impl Default for IdleSince {
    fn default() -> Self {
        Self {
            base: Instant::now(),
            since: AtomicU64::new(0),
        }
    }
}

impl IdleSince {
    pub fn waiting(&self) {
        let nanos = self.base.elapsed().as_nanos() as u64 + 1;
        self.since.store(nanos, Ordering::Relaxed);
    }

    pub fn working(&self) {
        self.since.store(0, Ordering::Relaxed);
    }

    /// How long the thread has waited; None while it works.
    pub fn idle_for(&self) -> Option<Duration> {
        match self.since.load(Ordering::Relaxed) {
            0 => None,
            since => Some(
                self.base
                    .elapsed()
                    .saturating_sub(Duration::from_nanos(since - 1)),
            ),
        }
    }
}

/// What a spinning interactive thread re-runs between queries besides its backend's steps,
/// and when it holds off.
#[derive(Default)]
pub(super) struct Warming {
    pub(super) hook: WarmHook,
    /// How long the device's bulk thread has waited for work. Warming needs the interpreter
    /// and a core, which a bulk thread running batches needs too; and under a backfill
    /// queries reach a host that is awake anyway. Measured on an H200
    /// (docs/journal/results-log.md),
    /// warming while a backfill ran cost all-MiniLM-L6-v2's backfill 5-10 % of its speed and
    /// bert-large's query p99 ~0.5-1 ms.
    pub(super) bulk_idle: Option<Arc<IdleSince>>,
}

impl Warming {
    /// The bulk thread must have waited this long: between a backfill's batches it waits
    /// for a moment at most.
    const QUIET: Duration = Duration::from_millis(5);

    pub(super) fn run(&self, backend: &mut dyn Backend) {
        let quiet = |idle: &Arc<IdleSince>| idle.idle_for().is_some_and(|d| d >= Self::QUIET);
        if self.bulk_idle.as_ref().is_some_and(|idle| !quiet(idle)) {
            return;
        }
        backend.warm();
        self.hook.run();
    }
}

/// How each kind of backend thread waits: the bulk threads and the interactive ones, and
/// the router's step the interactive ones re-run while they spin. The policies come from
/// `schedule::ServingProfile::backend_waits`; the default (`Default`) never spins.
#[derive(Debug, Clone, Default)]
pub struct LaneWaits {
    pub bulk: WaitPolicy,
    pub interactive: WaitPolicy,
    pub warm_hook: WarmHook,
}

/// The next message, polling for `policy.spin` before blocking (and calling `warm` every
/// `policy.warm_every` while it polls); `None` once every sender is gone and the channel is
/// empty.
pub fn next_message<T>(
    rx: &mut UnboundedReceiver<T>,
    policy: WaitPolicy,
    warm: &mut dyn FnMut(),
) -> Option<T> {
    if !policy.spin.is_zero() {
        let started = Instant::now();
        let until = started + policy.spin;
        // Not at once: right after a batch its code is in the caches anyway.
        let mut warm_at = (!policy.warm_every.is_zero()).then(|| started + policy.warm_every);
        loop {
            match rx.try_recv() {
                Ok(message) => return Some(message),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => {
                    let now = Instant::now();
                    if now >= until {
                        break;
                    }
                    match warm_at {
                        Some(at) if now >= at => {
                            warm();
                            warm_at = Some(Instant::now() + policy.warm_every);
                        }
                        _ => std::hint::spin_loop(),
                    }
                }
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
            next_message(&mut rx, WaitPolicy::spin_micros(2_000_000), &mut || {}),
            Some(7)
        );
        // Taken as soon as it was sent, long before the spin window ran out.
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        drop(sender.join().unwrap());
        assert_eq!(
            next_message(&mut rx, WaitPolicy::spin_micros(1_000), &mut || {}),
            None
        );
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
            next_message(&mut rx, WaitPolicy::spin_micros(1_000), &mut || {}),
            Some("late")
        );
        sender.join().unwrap();
        assert_eq!(
            next_message(&mut rx, WaitPolicy::default(), &mut || {}),
            None
        );
    }

    #[test]
    fn no_spin_takes_queued_messages_in_order_then_ends() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        for i in 0..3 {
            tx.send(i).unwrap();
        }
        drop(tx);
        let policy = WaitPolicy::default();
        let got: Vec<_> =
            std::iter::from_fn(|| next_message(&mut rx, policy, &mut || {})).collect();
        assert_eq!(got, vec![0, 1, 2]);
    }

    #[test]
    fn a_spinning_thread_warms_every_interval_until_a_message_comes() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(40));
            tx.send(1).unwrap();
            tx
        });
        let mut warms = 0;
        let policy = WaitPolicy::spin_micros(5_000_000).warming_every(1_000);
        let started = Instant::now();
        assert_eq!(next_message(&mut rx, policy, &mut || warms += 1), Some(1));
        // One a millisecond at most, none in the first; fewer where the machine keeps the
        // thread off its core for a while.
        let most = started.elapsed().as_millis();
        assert!(warms >= 3 && warms <= most, "{warms} warms in {most} ms");
        let _tx = sender.join().unwrap();
        // A message already there is taken before any warming.
        warms = 0;
        _tx.send(2).unwrap();
        assert_eq!(next_message(&mut rx, policy, &mut || warms += 1), Some(2));
        assert_eq!(warms, 0);
    }

    #[test]
    fn no_warming_without_an_interval_or_once_the_thread_sleeps() {
        for (policy, most) in [
            (WaitPolicy::spin_micros(5_000), 0),
            // Only within the 2 ms window: at most one warm each 500 µs of it.
            (WaitPolicy::spin_micros(2_000).warming_every(500), 4),
            (WaitPolicy::default().warming_every(100), 0),
        ] {
            let (tx, mut rx) = mpsc::unbounded_channel();
            let sender = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                tx.send(()).unwrap();
            });
            let mut warms = 0;
            assert_eq!(next_message(&mut rx, policy, &mut || warms += 1), Some(()));
            assert!(warms <= most, "{policy:?}: {warms} warms");
            sender.join().unwrap();
        }
    }

    #[test]
    fn the_hook_runs_its_step_once_set() {
        let hook = WarmHook::default();
        hook.run();
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = count.clone();
        hook.clone().set(move || {
            seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        hook.set(|| panic!("a second step is ignored"));
        hook.run();
        hook.run();
        assert_eq!(count.load(std::sync::atomic::Ordering::Relaxed), 2);
    }

    #[test]
    fn a_closed_channel_ends_the_spin_at_once() {
        let (tx, mut rx) = mpsc::unbounded_channel::<u8>();
        drop(tx);
        let started = Instant::now();
        assert_eq!(
            next_message(&mut rx, WaitPolicy::spin_micros(5_000_000), &mut || {}),
            None
        );
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn idle_since_counts_from_the_last_wait_and_not_while_working() {
        let idle = IdleSince::default();
        assert_eq!(idle.idle_for(), None);
        idle.waiting();
        std::thread::sleep(Duration::from_millis(5));
        assert!(idle.idle_for().unwrap() >= Duration::from_millis(5));
        idle.working();
        assert_eq!(idle.idle_for(), None);
        idle.waiting();
        assert!(idle.idle_for().unwrap() < Duration::from_millis(5));
    }
}
