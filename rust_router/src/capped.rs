//! A count of holders with a cap: how many queries' handlers may poll for their results at
//! once (`infer::hot_wait`), and how many handlers may run on the HTTP thread
//! (`http_thread`).

use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug)]
pub struct Capped {
    held: AtomicUsize,
    max: usize,
}

impl Capped {
    pub const fn new(max: usize) -> Self {
        Self {
            held: AtomicUsize::new(0),
            max,
        }
    }

    /// A place, held until the slot is dropped; `None` while `max` are held.
    pub fn take(&self) -> Option<CappedSlot<'_>> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| CappedSlot(&self.held))
    }

    /// How many places are held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

/// One place of a [`Capped`] count, given back when dropped.
pub struct CappedSlot<'a>(&'a AtomicUsize);

impl Drop for CappedSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_capped_and_given_back() {
        let capped = Capped::new(2);
        let held: Vec<_> = (0..2)
            .map(|_| capped.take().expect("a free place"))
            .collect();
        assert!(capped.take().is_none());
        assert_eq!(capped.held(), 2);
        drop(held);
        assert_eq!(capped.held(), 0);
        assert!(capped.take().is_some());
        assert!(Capped::new(0).take().is_none());
    }
}
