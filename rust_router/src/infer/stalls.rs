//! Why a few microseconds of a handler's own work took milliseconds: the OS's count of what
//! the calling thread went through meanwhile (`getrusage(RUSAGE_THREAD)`, Linux only).
//!
//! A query's hand-over to its backend thread takes no lock that a backfill holds and runs for
//! a few microseconds, yet one in fifty took 1-3 ms under a GPU backfill
//! (docs/journal/results-log.md). Only the kernel can take that time: by preempting the thread
//! (an involuntary switch), by putting it to sleep (a voluntary one: a contended lock, or a
//! page fault that waits for the address space's lock), or by a page fault's own work. A debug
//! event names which, for every slow hand-over.

use std::time::{Duration, Instant};

/// Hand-overs at least this long are reported.
pub const SLOW_HANDOVER: Duration = Duration::from_micros(200);

/// The calling thread's counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadCounters {
    pub involuntary_switches: i64,
    pub voluntary_switches: i64,
    pub minor_faults: i64,
    pub major_faults: i64,
}

impl ThreadCounters {
    /// The calling thread's counters, where the OS keeps them per thread.
    #[cfg(target_os = "linux")]
    pub fn now() -> Option<Self> {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: `usage` is a valid, writable rusage; RUSAGE_THREAD reads the caller's own.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) };
        if rc != 0 {
            return None;
        }
        // SAFETY: getrusage filled it.
        let usage = unsafe { usage.assume_init() };
        Some(Self {
            involuntary_switches: usage.ru_nivcsw,
            voluntary_switches: usage.ru_nvcsw,
            minor_faults: usage.ru_minflt,
            major_faults: usage.ru_majflt,
        })
    }

    #[cfg(not(target_os = "linux"))]
    pub fn now() -> Option<Self> {
        None
    }

    fn since(self, before: Self) -> Self {
        Self {
            involuntary_switches: self.involuntary_switches - before.involuntary_switches,
            voluntary_switches: self.voluntary_switches - before.voluntary_switches,
            minor_faults: self.minor_faults - before.minor_faults,
            major_faults: self.major_faults - before.major_faults,
        }
    }
}

/// Watches one hand-over when debug logging of this module is on (two system calls, so not
/// otherwise).
pub struct HandoverWatch {
    start: Instant,
    before: ThreadCounters,
}

impl HandoverWatch {
    pub fn start() -> Option<Self> {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return None;
        }
        Some(Self {
            start: Instant::now(),
            before: ThreadCounters::now()?,
        })
    }

    /// Logs the hand-over of `request_id` (of `lane`) if it was slow; returns what it logged.
    pub fn finish(self, request_id: u64, lane: &str) -> Option<(Duration, ThreadCounters)> {
        let took = self.start.elapsed();
        if took < SLOW_HANDOVER {
            return None;
        }
        let during = ThreadCounters::now()?.since(self.before);
        tracing::debug!(
            request_id,
            lane,
            took_us = took.as_micros() as u64,
            involuntary_switches = during.involuntary_switches,
            voluntary_switches = during.voluntary_switches,
            minor_faults = during.minor_faults,
            major_faults = during.major_faults,
            "slow hand-over"
        );
        Some((took, during))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_sleep_counts_as_a_voluntary_switch() {
        let before = ThreadCounters::now().unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let during = ThreadCounters::now().unwrap().since(before);
        assert!(during.voluntary_switches >= 1, "{during:?}");
    }

    #[test]
    fn touching_new_memory_counts_minor_faults() {
        let before = ThreadCounters::now().unwrap();
        // 64 MiB written page by page: every page is a first touch.
        let mut pages = vec![0u8; 64 << 20];
        for i in (0..pages.len()).step_by(4096) {
            pages[i] = 1;
        }
        std::hint::black_box(&pages);
        let during = ThreadCounters::now().unwrap().since(before);
        assert!(during.minor_faults >= 1000, "{during:?}");
    }

    #[test]
    fn a_slow_hand_over_is_reported_only_with_debug_logging() {
        assert!(HandoverWatch::start().is_none());
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let fast = HandoverWatch::start().unwrap();
            assert!(fast.finish(1, "interactive").is_none());
            let slow = HandoverWatch::start().unwrap();
            std::thread::sleep(Duration::from_millis(1));
            let (took, during) = slow.finish(2, "interactive").unwrap();
            assert!(took >= Duration::from_millis(1));
            assert!(during.voluntary_switches >= 1, "{during:?}");
        });
    }
}
