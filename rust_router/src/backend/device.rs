//! What the router knows about each device it serves: healthy or failed, and how many batches
//! it ran. One [`DeviceState`] per device, shared by its backend threads (which update it) and
//! the handlers of `/health` and `/info` (which read it).
//!
//! A device is marked failed when its runtime raises `DeviceError` (the device itself broke:
//! a CUDA error, a lost GPU). Nothing marks it healthy again: a broken CUDA context does not
//! recover in-process, so the device takes no more batches and the others carry the load; the
//! orchestrator replaces the server once `/health` says 503 (every device failed).

use super::BackendError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// One device's shared state.
#[derive(Debug)]
pub struct DeviceState {
    /// Position in `info()["devices"]`: the index the runtime is called with (`device=i`).
    pub index: usize,
    /// The runtime's name for it (`cuda:1`, `cpu`); names may repeat (`cpu,cpu`).
    pub name: String,
    healthy: AtomicBool,
    /// Why it failed; set once, with `healthy` cleared after it.
    failure: Mutex<Option<String>>,
    batches: AtomicU64,
    failed_batches: AtomicU64,
}

/// A snapshot of one device, for `/info`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceStatus {
    pub index: usize,
    pub name: String,
    pub healthy: bool,
    /// Forward passes that returned a result.
    pub batches: u64,
    /// Forward passes that raised.
    pub failed_batches: u64,
    /// What made the device fail, when it has.
    pub error: Option<String>,
}

impl DeviceState {
    pub fn new(index: usize, name: impl Into<String>) -> Self {
        Self {
            index,
            name: name.into(),
            healthy: AtomicBool::new(true),
            failure: Mutex::new(None),
            batches: AtomicU64::new(0),
            failed_batches: AtomicU64::new(0),
        }
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    /// Takes the device out of service; the first call logs why, later ones change nothing.
    pub fn mark_failed(&self, why: &str) {
        let mut failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        if failure.is_some() {
            return;
        }
        *failure = Some(why.to_string());
        self.healthy.store(false, Ordering::Release);
        tracing::error!(
            device = self.index,
            name = %self.name,
            "device failed and takes no more batches: {why}"
        );
    }

    /// Counts one forward pass, and marks the device failed when the device itself broke.
    pub fn record<T>(&self, result: &Result<T, BackendError>) {
        match result {
            Ok(_) => self.batches.fetch_add(1, Ordering::Relaxed),
            Err(err) => {
                if let BackendError::Device(why) = err {
                    self.mark_failed(why);
                }
                self.failed_batches.fetch_add(1, Ordering::Relaxed)
            }
        };
    }

    /// `device 1 (cuda:1) has failed: <why>`.
    pub fn failure_text(&self) -> String {
        let failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        format!(
            "device {} ({}) has failed: {}",
            self.index,
            self.name,
            failure.as_deref().unwrap_or("unknown error")
        )
    }

    /// The error of a request or health check that a failed device refused.
    pub fn unavailable(&self) -> BackendError {
        BackendError::Unhealthy(self.failure_text())
    }

    pub fn status(&self) -> DeviceStatus {
        let error = self
            .failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        DeviceStatus {
            index: self.index,
            name: self.name.clone(),
            healthy: self.is_healthy(),
            batches: self.batches.load(Ordering::Relaxed),
            failed_batches: self.failed_batches.load(Ordering::Relaxed),
            error,
        }
    }
}

/// One device that did not pass a health check.
#[derive(Debug, Clone)]
pub struct DeviceFailure {
    pub index: usize,
    pub name: String,
    pub error: BackendError,
    /// It had failed before this check (and was logged then), so it was not called again.
    pub known: bool,
}

/// The outcome of one health check over every device.
#[derive(Debug, Clone)]
pub struct Health {
    pub devices: usize,
    pub failures: Vec<DeviceFailure>,
}

impl Health {
    /// At least one device passed: the server can answer requests.
    pub fn is_serving(&self) -> bool {
        self.failures.len() < self.devices
    }

    /// Why no device can serve, for the 503 body. With one device this is that device's own
    /// error, worded as before devices existed.
    pub fn message(&self) -> String {
        match &self.failures[..] {
            [only] if self.devices == 1 => only.error.to_string(),
            failures => {
                let each: Vec<String> = failures
                    .iter()
                    .map(|f| format!("device {} ({}): {}", f.index, f.name, f.error))
                    .collect();
                format!("every device failed: {}", each.join("; "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_error_marks_the_device_failed_once_and_counts_batches() {
        let d = DeviceState::new(1, "cuda:1");
        d.record(&Ok::<(), BackendError>(()));
        d.record::<()>(&Err(BackendError::Inference("ValueError: bad".into())));
        assert!(d.is_healthy(), "an input's failure is not the device's");
        d.record::<()>(&Err(BackendError::Device("DeviceError: lost".into())));
        d.record::<()>(&Err(BackendError::Device("DeviceError: again".into())));
        let s = d.status();
        assert!(!s.healthy);
        assert_eq!((s.batches, s.failed_batches), (1, 3));
        assert_eq!(s.error.as_deref(), Some("DeviceError: lost"));
        let err = d.unavailable().to_string();
        assert!(
            err.contains("device 1 (cuda:1)") && err.contains("lost"),
            "{err}"
        );
    }

    #[test]
    fn health_serves_while_one_device_passes() {
        let failure = |index| DeviceFailure {
            index,
            name: format!("cuda:{index}"),
            error: BackendError::Unhealthy("RuntimeError: CUDA error".into()),
            known: false,
        };
        let one = Health {
            devices: 2,
            failures: vec![failure(1)],
        };
        assert!(one.is_serving());
        let all = Health {
            devices: 2,
            failures: vec![failure(0), failure(1)],
        };
        assert!(!all.is_serving());
        let m = all.message();
        assert!(
            m.starts_with("every device failed: device 0 (cuda:0)"),
            "{m}"
        );
        let single = Health {
            devices: 1,
            failures: vec![failure(0)],
        };
        assert_eq!(
            single.message(),
            "model backend is unhealthy: RuntimeError: CUDA error"
        );
    }
}
