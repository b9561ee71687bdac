//! Lets part of the tokenizer pool stand aside while the backend bounds a backfill.
//!
//! A backfill's documents are tokenized in bursts on every pool thread. Where the GPU bounds
//! the backfill, that speed buys nothing (the tokens wait in the bulk queue), and it costs the
//! queries: with a thread busy on every core, even at idle priority, a query's threads (the
//! result's way back from its backend thread) waited for a core, one query in fifty by 1-3
//! ms (docs/journal/results-log.md; likely Linux cutting short its search for an idle core for a
//! waking thread when every core looks busy). So while bulk batches are full and leave entries waiting, only the first
//! `keep` threads take jobs; the others wait until a bulk batch takes everything queued.
//! Where tokenization bounds the backfill (a small model), every batch takes everything
//! queued, and every thread keeps working.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// A standing-aside thread looks again at least this often, so a missed wake-up costs little.
const RECHECK: Duration = Duration::from_millis(50);

#[derive(Debug)]
pub struct PoolThrottle {
    /// Threads with a smaller index never stand aside.
    keep: usize,
    /// Read without the lock on every job; changed under it.
    limited: AtomicBool,
    lock: Mutex<()>,
    lifted: Condvar,
}

impl PoolThrottle {
    /// A throttle for a pool of `workers` threads: 5/8 of them (at least one) keep working
    /// while it is on, leaving the rest of the cores to the threads that answer queries.
    pub fn for_pool(workers: usize) -> Self {
        Self {
            keep: (workers * 5 / 8).max(1),
            limited: AtomicBool::new(false),
            lock: Mutex::new(()),
            lifted: Condvar::new(),
        }
    }

    /// How many threads keep working while the throttle is on.
    pub fn keep(&self) -> usize {
        self.keep
    }

    pub fn is_limited(&self) -> bool {
        self.limited.load(Ordering::Relaxed)
    }

    /// Turns the throttle on (the backend has enough queued) or off.
    pub fn set_limited(&self, limited: bool) {
        if self.limited.load(Ordering::Relaxed) == limited {
            return;
        }
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.limited.store(limited, Ordering::Relaxed);
        if !limited {
            self.lifted.notify_all();
        }
    }

    /// Called by pool thread `worker` before it takes a job: returns at once unless the
    /// throttle is on and the thread is one that stands aside, else once it is off.
    pub fn wait_turn(&self, worker: usize) {
        if worker < self.keep || !self.is_limited() {
            return;
        }
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        while self.limited.load(Ordering::Relaxed) {
            guard = match self.lifted.wait_timeout(guard, RECHECK) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn keeps_five_eighths_of_the_pool_and_at_least_one() {
        assert_eq!(PoolThrottle::for_pool(16).keep(), 10);
        assert_eq!(PoolThrottle::for_pool(2).keep(), 1);
        assert_eq!(PoolThrottle::for_pool(1).keep(), 1);
    }

    #[test]
    fn only_the_threads_beyond_keep_wait_and_only_while_it_is_on() {
        let throttle = Arc::new(PoolThrottle::for_pool(8));
        // Off: nobody waits.
        for worker in 0..8 {
            throttle.wait_turn(worker);
        }
        throttle.set_limited(true);
        for worker in 0..throttle.keep() {
            throttle.wait_turn(worker);
        }
        let waiter = {
            let throttle = throttle.clone();
            std::thread::spawn(move || throttle.wait_turn(7))
        };
        std::thread::sleep(Duration::from_millis(150));
        assert!(
            !waiter.is_finished(),
            "thread 7 took a job while the throttle was on"
        );
        throttle.set_limited(false);
        waiter.join().unwrap();
    }
}
