//! The boundary between the router and the model runtime.
//!
//! A [`Backend`] runs one packed batch at a time on a dedicated OS thread
//! ([`BackendHandle::spawn`]): tokio workers never touch the GIL, and the runtime sees one
//! caller per lane. Each device the runtime serves (`info()["devices"]`, one when it lists
//! none) is an executor of its own ([`executor`]): a thread for bulk batches and health checks
//! (device 0's is the thread that loaded the model), and, when the runtime has an interactive
//! lane, a second thread for small requests, so a query never waits for a corpus batch's
//! forward pass to end before its own can start. A device whose runtime raises `DeviceError`
//! is taken out of service ([`device`]); the others keep serving.

mod contract;
pub mod device;
mod executor;
#[cfg(test)]
pub(crate) mod fake;
mod image_steps;
mod model_info;
pub mod process;
#[cfg(feature = "pyo3")]
pub mod python;
pub mod share;
pub mod wait;

pub use device::{DeviceFailure, DeviceStatus, Health};
pub use executor::{
    BackendFactory, BackendHandle, BackendThreads, DeviceBackends, ForwardReply, LoadedBackend,
    Output, Ran, Slot,
};

pub use contract::{
    Backend, BackendError, Batch, BatchKind, ImagePreprocessor, Lane, Launched, Matrix,
};
pub use image_steps::{ImageSteps, Resample, ResizeTo};
pub use model_info::{ImageInput, LateInteraction, ModelInfo, ModelType, ScoreActivation};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_devices;
#[cfg(test)]
mod tests_pipelined;
#[cfg(test)]
mod tests_sharing;
