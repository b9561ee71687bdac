//! Devices served by worker processes: one runtime process per device, started by the router.
//!
//! In one process every device's backend threads share one Python interpreter, and past two
//! GPUs they wait for its lock more than they run (docs/performance.md). With
//! `--device-workers processes` the router starts a worker process per device
//! ([`spawn`]); the router stays the one place that queues and batches, and each of its
//! backend threads talks to its device's worker through a [`client::WorkerLane`]: batches
//! and their rows cross in shared memory ([`region`]), small headers on a socket ([`wire`]),
//! and the worker runs them on its own backend ([`serve`]) exactly as a backend thread does in
//! one process.

pub mod client;
pub mod region;
pub mod serve;
#[cfg(feature = "pyo3")]
pub mod spawn;
pub mod wire;

use serde::{Deserialize, Serialize};

/// How the devices of a server are run (`--device-workers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DeviceWorkers {
    /// Worker processes when more than one GPU is served, else this process.
    Auto,
    /// Every device in this process, a backend thread per lane, one Python interpreter.
    Threads,
    /// One worker process per device, whatever the devices.
    Processes,
}

impl DeviceWorkers {
    /// Whether `devices` (the names the runtime gives them) are served by worker processes.
    pub fn uses_processes(self, devices: &[String]) -> bool {
        match self {
            DeviceWorkers::Threads => false,
            DeviceWorkers::Processes => true,
            DeviceWorkers::Auto => {
                devices.len() > 1 && devices.iter().all(|d| d.starts_with("cuda"))
            }
        }
    }
}

#[cfg(test)]
mod tests;
