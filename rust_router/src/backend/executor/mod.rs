//! The backend threads and the handle the async side reaches them through.
//!
//! One executor per device: a thread for bulk batches and health checks, plus a thread for
//! interactive batches when the runtime has that lane. Device 0's bulk thread is the one that
//! loaded the model. Each thread has a one-batch slot (the prefetch); [`BackendHandle::reserve`]
//! hands out the slot of whichever healthy device can take a batch soonest, so one queue feeds
//! every device. With one device that is exactly its own slot: no choice, no extra work.

mod handle;
mod lane;
mod start;

pub use handle::{BackendHandle, Slot};
pub use lane::{ForwardReply, Output, Ran};
pub use start::{BackendFactory, BackendThreads, DeviceBackends, LoadedBackend};
