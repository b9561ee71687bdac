//! Several models on one device: whose bulk batch runs next.
//!
//! Each served model has its own queue, batching tasks and backend threads. On a device that
//! several models share, their bulk threads would otherwise launch batches side by side: the
//! device would split its time by how often each model's batches arrive, and every batch
//! would take as long as all of them together. A [`DeviceShare`] gives the device's bulk turn
//! to one model at a time, by start-time fair queueing over tokens:
//!
//! - each model's virtual time advances by a batch's tokens ÷ the model's weight;
//! - of the models waiting, the one whose next batch starts earliest in virtual time goes
//!   next (the first to ask, between equals);
//! - a model that was idle starts at the device's virtual time (that of the batch that took
//!   the turn last), so it cannot claim the turns it left unused;
//! - a model whose turn just ended is not idle yet: its thread asks for the next turn a few
//!   microseconds later, with its next batch. For [`REASK_GRACE`] after a turn ends, the
//!   device waits for that model if its next batch would start earlier than the waiting
//!   one's; otherwise whichever thread woke first after every turn would take the device.
//!
//! So two saturating models of weights 1 and 3 get a quarter and three quarters of the
//! device's bulk tokens, whatever their batch sizes. A turn lasts from a batch's launch until
//! its result is read back; a thread that launches its next batch before it reads the last one
//! back (a pipelining backend) holds two turns at once, unless another model is waiting with an
//! earlier start, in which case it reads the last one back first ([`Seat::try_take`]).
//!
//! Queries never take a turn: they run on their models' interactive lanes, and the runtime
//! holds every model's bulk batch between steps while any query is in flight on the device
//! (`runtime.preemption.QueriesInFlight`).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long after its turn ends a model's earlier start still counts against a waiting one:
/// far longer than a backend thread takes to ask again with its next batch (microseconds),
/// short beside a bulk batch (tens of milliseconds), and lost at most once when a model's
/// backlog ends.
pub const REASK_GRACE: Duration = Duration::from_millis(2);

/// The devices of a server with several models, each with its [`DeviceShare`], created as
/// the models load.
#[derive(Debug, Clone, Default)]
pub struct DeviceShares(Arc<Mutex<HashMap<DeviceKey, Arc<DeviceShare>>>>);

/// A device name, and which of the devices of that name in a model's list it is.
type DeviceKey = (String, usize);

impl DeviceShares {
    /// One [`Seat`] per device of `names` (a model's [`crate::backend::ModelInfo::device_names`]),
    /// for `model` with `weight`. A name that repeats (`cpu,cpu`) means one device per
    /// occurrence: the first `cpu` of every model is one device, the second another.
    pub fn seats(&self, names: &[String], model: usize, weight: f64) -> Vec<Seat> {
        let mut shares = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut seen: HashMap<&str, usize> = HashMap::new();
        names
            .iter()
            .map(|name| {
                let occurrence = seen.entry(name.as_str()).or_default();
                let key = (name.clone(), *occurrence);
                *occurrence += 1;
                Seat {
                    share: shares.entry(key).or_default().clone(),
                    model,
                    weight,
                }
            })
            .collect()
    }
}

/// A model's place in a server's [`DeviceShares`], for [`super::BackendHandle::spawn_with`].
#[derive(Debug, Clone)]
pub struct Sharing {
    pub shares: DeviceShares,
    /// The model's index among the served ones.
    pub model: usize,
    /// Its share of the device's bulk tokens, relative to the other models' (> 0).
    pub weight: f64,
}

impl Sharing {
    /// One seat per device of `names`.
    pub fn seats(&self, names: &[String]) -> Vec<Seat> {
        self.shares.seats(names, self.model, self.weight)
    }
}

/// Whose bulk batches run on one device.
#[derive(Debug, Default)]
pub struct DeviceShare {
    state: Mutex<ShareState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct ShareState {
    /// The model whose bulk batches run now, and how many of them.
    owner: Option<usize>,
    running: usize,
    /// The virtual time of the batch that took the turn last.
    now: f64,
    /// Per model: the earliest virtual time its next batch may start at.
    next_start: HashMap<usize, f64>,
    /// Per model: when its last turn ended.
    ended: HashMap<usize, Instant>,
    waiting: Vec<Waiting>,
    asked: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Decision {
    Run,
    Wait(Option<Instant>),
}

#[derive(Debug, Clone, Copy)]
struct Waiting {
    model: usize,
    start: f64,
    /// When it asked, to serve equal starts in order.
    asked: u64,
}

impl ShareState {
    fn start_of(&self, model: usize) -> f64 {
        self.next_start
            .get(&model)
            .copied()
            .unwrap_or(0.0)
            .max(self.now)
    }

    /// Whether `model`'s batch starting at `start` (asked at `asked`) may run now: the device
    /// is free or runs this model's batches, no other model waits with an earlier start, and
    /// none whose turn just ended would start earlier ([`REASK_GRACE`]). `Wait(Some(t))`:
    /// ask again by `t` at the latest, when that grace ends.
    fn may_run(&self, model: usize, start: f64, asked: u64) -> Decision {
        if self.owner.is_some_and(|owner| owner != model) {
            return Decision::Wait(None);
        }
        let overtaken = self
            .waiting
            .iter()
            .any(|w| w.model != model && (w.start, w.asked) < (start, asked));
        if overtaken {
            return Decision::Wait(None);
        }
        let now = Instant::now();
        let grace_until = self
            .ended
            .iter()
            .filter(|&(&other, &ended)| {
                other != model
                    && now < ended + REASK_GRACE
                    && self.start_of(other) < start
                    && !self.waiting.iter().any(|w| w.model == other)
            })
            .map(|(_, &ended)| ended + REASK_GRACE)
            .max();
        match grace_until {
            Some(until) => Decision::Wait(Some(until)),
            None => Decision::Run,
        }
    }

    fn run(&mut self, model: usize, start: f64, tokens: usize, weight: f64) {
        self.owner = Some(model);
        self.running += 1;
        self.now = start;
        self.next_start
            .insert(model, start + tokens as f64 / weight);
    }
}

/// One model's place at one device's [`DeviceShare`].
#[derive(Debug, Clone)]
pub struct Seat {
    share: Arc<DeviceShare>,
    model: usize,
    weight: f64,
}

impl Seat {
    fn state(&self) -> MutexGuard<'_, ShareState> {
        self.share
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The turn for a batch of `tokens`, if it may run now without waiting.
    pub fn try_take(&self, tokens: usize) -> Option<Turn> {
        let mut state = self.state();
        let start = state.start_of(self.model);
        if state.may_run(self.model, start, u64::MAX) != Decision::Run {
            return None;
        }
        state.run(self.model, start, tokens, self.weight);
        Some(self.turn())
    }

    /// The turn for a batch of `tokens`, once the device is this model's by the fair order.
    /// The caller must hold no turn of this device (see [`Seat::try_take`]).
    pub fn take(&self, tokens: usize) -> Turn {
        let mut state = self.state();
        let start = state.start_of(self.model);
        let asked = state.asked;
        state.asked += 1;
        state.waiting.push(Waiting {
            model: self.model,
            start,
            asked,
        });
        loop {
            let changed = &self.share.changed;
            state = match state.may_run(self.model, start, asked) {
                Decision::Run => break,
                Decision::Wait(None) => changed.wait(state).unwrap_or_else(PoisonError::into_inner),
                Decision::Wait(Some(until)) => {
                    let timeout = until.saturating_duration_since(Instant::now());
                    let waited = changed.wait_timeout(state, timeout);
                    waited.unwrap_or_else(PoisonError::into_inner).0
                }
            };
        }
        state.waiting.retain(|w| w.asked != asked);
        state.run(self.model, start, tokens, self.weight);
        self.turn()
    }

    fn turn(&self) -> Turn {
        Turn {
            share: self.share.clone(),
            model: self.model,
        }
    }
}

/// The right to run one bulk batch on the device; the turn ends when it is dropped.
#[derive(Debug)]
pub struct Turn {
    share: Arc<DeviceShare>,
    model: usize,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut state = self
            .share
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.running -= 1;
        if state.running == 0 {
            state.owner = None;
        }
        state.ended.insert(self.model, Instant::now());
        drop(state);
        self.share.changed.notify_all();
    }
}

#[cfg(test)]
#[path = "tests_share.rs"]
mod tests;
