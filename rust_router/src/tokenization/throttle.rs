//! Lets part of the tokenizer pool stand aside while a backend bounds a backfill.
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
//!
//! The pool serves every model of the server, and each model's batching tasks say whether its
//! backend bounds its bulk lane ([`ThrottleVote`]). The throttle is on while any model's is:
//! the models of one server share its GPUs, so a backfill the GPU bounds for one model is one
//! the GPU bounds for the others too (a second model's backfill, whose tokenization would
//! keep up, still has `keep` threads, most of the pool).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A standing-aside thread looks again at least this often, so a missed wake-up costs little.
const RECHECK: Duration = Duration::from_millis(50);

#[derive(Debug)]
pub struct PoolThrottle {
    /// Threads with a smaller index never stand aside.
    keep: usize,
    /// The models whose backend bounds their bulk lane now. Read without the lock on every
    /// job; changed under it.
    bounded: AtomicUsize,
    lock: Mutex<()>,
    lifted: Condvar,
}

impl PoolThrottle {
    /// A throttle for a pool of `workers` threads: 5/8 of them (at least one) keep working
    /// while it is on, leaving the rest of the cores to the threads that answer queries.
    pub fn for_pool(workers: usize) -> Self {
        Self {
            keep: (workers * 5 / 8).max(1),
            bounded: AtomicUsize::new(0),
            lock: Mutex::new(()),
            lifted: Condvar::new(),
        }
    }

    /// How many threads keep working while the throttle is on.
    pub fn keep(&self) -> usize {
        self.keep
    }

    /// Whether the throttle is on: some model's backend bounds its bulk lane.
    pub fn is_limited(&self) -> bool {
        self.bounded.load(Ordering::Relaxed) > 0
    }

    /// One model's say in the throttle, not bounded yet.
    pub fn vote(self: &Arc<Self>) -> ThrottleVote {
        ThrottleVote {
            throttle: self.clone(),
            bounded: AtomicBool::new(false),
        }
    }

    /// Called by pool thread `worker` before it takes a job: returns at once unless the
    /// throttle is on and the thread is one that stands aside, else once it is off.
    pub fn wait_turn(&self, worker: usize) {
        if worker < self.keep || !self.is_limited() {
            return;
        }
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        while self.is_limited() {
            guard = match self.lifted.wait_timeout(guard, RECHECK) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

/// One model's say in the [`PoolThrottle`]: whether its backend bounds its bulk lane now.
/// Dropped while it says so (the model's batching tasks ended), it says so no more.
#[derive(Debug)]
pub struct ThrottleVote {
    throttle: Arc<PoolThrottle>,
    /// What this model says. Read without the lock on every change of its queue; changed under
    /// the throttle's lock, with the count of models that say so.
    bounded: AtomicBool,
}

impl ThrottleVote {
    /// Says whether the backend bounds this model's bulk lane (it has enough queued).
    pub fn set_bounded(&self, bounded: bool) {
        if self.bounded.load(Ordering::Relaxed) == bounded {
            return;
        }
        let throttle = &self.throttle;
        let _guard = throttle.lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.bounded.swap(bounded, Ordering::Relaxed) == bounded {
            return;
        }
        if bounded {
            throttle.bounded.fetch_add(1, Ordering::Relaxed);
        } else if throttle.bounded.fetch_sub(1, Ordering::Relaxed) == 1 {
            throttle.lifted.notify_all();
        }
    }
}

impl Drop for ThrottleVote {
    fn drop(&mut self) {
        self.set_bounded(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_five_eighths_of_the_pool_and_at_least_one() {
        assert_eq!(PoolThrottle::for_pool(16).keep(), 10);
        assert_eq!(PoolThrottle::for_pool(2).keep(), 1);
        assert_eq!(PoolThrottle::for_pool(1).keep(), 1);
    }

    #[test]
    fn only_the_threads_beyond_keep_wait_and_only_while_it_is_on() {
        let throttle = Arc::new(PoolThrottle::for_pool(8));
        let vote = throttle.vote();
        // Off: nobody waits.
        for worker in 0..8 {
            throttle.wait_turn(worker);
        }
        vote.set_bounded(true);
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
        vote.set_bounded(false);
        waiter.join().unwrap();
    }

    #[test]
    fn it_is_on_while_any_model_is_bounded_and_a_dropped_vote_lifts_its_own() {
        let throttle = Arc::new(PoolThrottle::for_pool(8));
        let (a, b) = (throttle.vote(), throttle.vote());
        a.set_bounded(true);
        a.set_bounded(true);
        b.set_bounded(true);
        a.set_bounded(false);
        assert!(throttle.is_limited(), "b is still bounded");
        b.set_bounded(false);
        assert!(!throttle.is_limited(), "a said it twice, and counted once");
        a.set_bounded(true);
        assert!(throttle.is_limited());
        drop(a);
        assert!(!throttle.is_limited(), "a's batching tasks ended");
        drop(b);
        assert!(!throttle.is_limited());
    }
}
