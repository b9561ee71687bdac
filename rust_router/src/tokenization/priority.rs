//! How the pool's threads compete for cores: their scheduling class (`--tokenization-priority`;
//! the default is the profile's, `schedule`).

/// How the pool's threads compete for cores with the router's other threads (Linux; other
/// systems keep the default).
///
/// The pool has one thread per core by default, and a backfill keeps them all busy. A query's
/// own threads (its connection's task, the backend thread, the response) then wake up behind
/// them and may wait for a core: milliseconds at the p99 (docs/journal/results-log.md).
///
/// Ordered from the class that competes most to the one that yields most: the pool of
/// several models takes the first class any of them asks for ([`PoolPriority::for_models`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum PoolPriority {
    /// The operating system's default class, shared equally with every other thread.
    Normal,
    /// Nice 19: the pool gets a small share of a core that other threads also want.
    Low,
    /// `SCHED_IDLE`: the pool runs only on cores no other thread wants, and a thread that
    /// wakes up takes its core at once. Any core nobody else needs still tokenizes.
    Idle,
}

impl PoolPriority {
    /// The class of a pool that serves models which ask for `each` (`None`: no model): the
    /// one that competes most. Where one model's forward passes run on the host's cores (a
    /// CPU runtime asks for `Normal`), an idle-class pool would hardly run beside them.
    pub fn for_models(each: impl IntoIterator<Item = Self>) -> Option<Self> {
        each.into_iter().min()
    }

    /// Applies the class to the calling thread. A failure (a sandbox that forbids it) leaves
    /// the thread as it was.
    pub(super) fn apply(self) {
        #[cfg(target_os = "linux")]
        // SAFETY: plain system calls on the calling thread (pid 0 / its own tid) with valid
        // arguments.
        unsafe {
            match self {
                Self::Normal => {}
                Self::Low => {
                    libc::setpriority(libc::PRIO_PROCESS, current_tid(), 19);
                }
                Self::Idle => {
                    let param = libc::sched_param { sched_priority: 0 };
                    libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
                }
            }
        }
    }
}

/// The calling thread's kernel thread id.
#[cfg(target_os = "linux")]
pub(super) fn current_tid() -> libc::id_t {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as libc::id_t }
}
