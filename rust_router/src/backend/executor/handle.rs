//! [`BackendHandle`]: how the async side reaches the backend threads, one executor per
//! device, each lane with its one-batch [`Slot`].

use super::lane::{Command, ForwardReply};
use crate::backend::device::{DeviceFailure, DeviceState, DeviceStatus, Health};
use crate::backend::{BackendError, Batch, BatchKind, ImagePreprocessor, Lane};
use futures_util::future::{join_all, select_all};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

/// The right to hand one backend thread its next batch. Each thread has one such slot, freed
/// when the thread starts a batch, so exactly one batch waits while another runs (the
/// prefetch), and it is packed as late as possible. Health checks do not need a slot, so they
/// never wait behind an idle batching task.
pub struct Slot {
    permit: OwnedSemaphorePermit,
    tx: mpsc::UnboundedSender<Command>,
    device: usize,
}

impl Slot {
    /// The device whose thread this slot feeds.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Hands the thread a batch; its slot frees when the thread starts it, so that the next
    /// batch is packed while this one runs (the prefetch).
    pub fn send(self, kind: BatchKind, batch: Batch, reply: ForwardReply) {
        self.forward(kind, batch, reply, false);
    }

    /// Hands the thread a batch and keeps its slot taken until the batch has run: nothing is
    /// packed for the thread meanwhile, so a query queued during the batch runs right after
    /// it instead of after a prefetched batch too. For bulk batches on a thread that also
    /// runs queries (CPU), where one bulk batch is tens of milliseconds.
    pub fn send_exclusive(self, kind: BatchKind, batch: Batch, reply: ForwardReply) {
        self.forward(kind, batch, reply, true);
    }

    fn forward(self, kind: BatchKind, batch: Batch, reply: ForwardReply, hold_slot: bool) {
        // If the thread is gone the command (and `reply`) is dropped: the waiter sees
        // `Stopped`.
        let _ = self.tx.send(Command::Forward {
            kind,
            batch,
            reply,
            slot: self.permit,
            hold_slot,
        });
    }
}

/// The way to one backend thread: its command channel, its one-batch slot, and whether it is
/// running a batch now.
pub(super) struct LaneChannel {
    tx: mpsc::UnboundedSender<Command>,
    slots: Arc<Semaphore>,
    /// Set by the thread while a forward pass runs. Only a hint for choosing among devices
    /// (an idle one before a busy one's prefetch slot), so relaxed ordering is enough.
    busy: Arc<AtomicBool>,
}

impl LaneChannel {
    pub(super) fn new(tx: mpsc::UnboundedSender<Command>, busy: Arc<AtomicBool>) -> Self {
        Self {
            tx,
            slots: Arc::new(Semaphore::new(1)),
            busy,
        }
    }

    fn slot(&self, permit: OwnedSemaphorePermit, device: usize) -> Slot {
        Slot {
            permit,
            tx: self.tx.clone(),
            device,
        }
    }

    async fn reserve(&self, device: usize) -> Result<Slot, BackendError> {
        if self.tx.is_closed() {
            return Err(BackendError::Stopped);
        }
        let permit = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| BackendError::Stopped)?;
        Ok(self.slot(permit, device))
    }

    fn try_reserve(&self, device: usize) -> Option<Slot> {
        let permit = self.slots.clone().try_acquire_owned().ok()?;
        Some(self.slot(permit, device))
    }

    fn is_free(&self) -> bool {
        self.slots.available_permits() > 0
    }

    fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Relaxed)
    }
}

/// One device: its threads' channels and its shared state.
pub(super) struct Executor {
    pub(super) bulk: LaneChannel,
    /// `None` when the runtime has no interactive lane: one thread serves both lanes.
    pub(super) interactive: Option<LaneChannel>,
    pub(super) state: Arc<DeviceState>,
}

impl Executor {
    /// The thread that runs `lane`'s batches (the only one, without an interactive lane).
    fn lane(&self, lane: Lane) -> &LaneChannel {
        match (lane, &self.interactive) {
            (Lane::Interactive, Some(interactive)) => interactive,
            _ => &self.bulk,
        }
    }

    /// Whether this device can take `lane`'s batches at all.
    fn is_open(&self, lane: Lane) -> bool {
        self.state.is_healthy() && !self.lane(lane).tx.is_closed()
    }

    async fn reserve(&self, lane: Lane) -> Result<Slot, BackendError> {
        if !self.state.is_healthy() {
            return Err(self.state.unavailable());
        }
        self.lane(lane).reserve(self.state.index).await
    }

    async fn health(&self) -> Result<(), BackendError> {
        if !self.state.is_healthy() {
            return Err(self.state.unavailable());
        }
        let (reply, rx) = oneshot::channel();
        self.bulk
            .tx
            .send(Command::Health(reply))
            .map_err(|_| BackendError::Stopped)?;
        rx.await.map_err(|_| BackendError::Stopped)?
    }
}

/// Cheap, cloneable handle the async side uses to reach the backend threads of every device.
#[derive(Clone)]
pub struct BackendHandle {
    /// One per device, by index.
    pub(super) executors: Arc<[Executor]>,
    pub(super) images: Option<Arc<dyn ImagePreprocessor>>,
}

impl BackendHandle {
    /// How images become pixels; `None` for a text model, or one whose runtime runs in
    /// worker processes.
    pub fn images(&self) -> Option<&Arc<dyn ImagePreprocessor>> {
        self.images.as_ref()
    }

    /// Whether interactive batches have their own threads (else they share the bulk ones).
    pub fn has_interactive_lane(&self) -> bool {
        self.executors[0].interactive.is_some()
    }

    pub fn num_devices(&self) -> usize {
        self.executors.len()
    }

    /// Waits until a healthy device's `lane` thread (its only thread, without an interactive
    /// lane) can take the next batch. Fails once no device is left.
    pub async fn reserve(&self, lane: Lane) -> Result<Slot, BackendError> {
        match &self.executors[..] {
            [only] => only.reserve(lane).await,
            all => reserve_any(all, lane).await,
        }
    }

    /// A slot of `lane` that is free now, chosen as [`BackendHandle::reserve`] chooses one,
    /// without waiting: `None` when every healthy device's thread has a batch waiting.
    pub fn try_reserve(&self, lane: Lane) -> Option<Slot> {
        try_reserve_free(self.executors.iter(), lane)
    }

    /// Runs every healthy device's health check, at once.
    pub async fn health(&self) -> Health {
        let checks = self.executors.iter().map(|e| async move {
            let known = !e.state.is_healthy();
            let error = e.health().await.err()?;
            Some(DeviceFailure {
                index: e.state.index,
                name: e.state.name.clone(),
                error,
                known,
            })
        });
        Health {
            devices: self.executors.len(),
            failures: join_all(checks).await.into_iter().flatten().collect(),
        }
    }

    /// Every device's health and batch counts.
    pub fn devices(&self) -> Vec<DeviceStatus> {
        self.executors.iter().map(|e| e.state.status()).collect()
    }
}

/// The slot of the device that can run a batch soonest: an idle one first (lowest index, so a
/// lone query always takes the first free lane), then one that is running a batch and has its
/// prefetch slot free; when every slot is taken, the first to free.
async fn reserve_any(executors: &[Executor], lane: Lane) -> Result<Slot, BackendError> {
    loop {
        let open: Vec<&Executor> = executors.iter().filter(|e| e.is_open(lane)).collect();
        if open.is_empty() {
            return Err(none_left(executors));
        }
        // None also when another reservation (a re-run) took the free slot in between: the
        // wait below then returns at once for any slot still free.
        if let Some(slot) = try_reserve_free(open.iter().copied(), lane) {
            return Ok(slot);
        }
        let waits = open
            .iter()
            .map(|e| Box::pin(e.lane(lane).reserve(e.state.index)));
        let (slot, _, _) = select_all(waits).await;
        let slot = slot?;
        // The device may have failed while we waited for it.
        if executors[slot.device].state.is_healthy() {
            return Ok(slot);
        }
    }
}

/// A free slot of `lane` on an open device, the least busy one (`min_by_key` keeps the first of
/// equals: the lowest index); `None` when none is free now.
fn try_reserve_free<'a>(
    executors: impl IntoIterator<Item = &'a Executor>,
    lane: Lane,
) -> Option<Slot> {
    executors
        .into_iter()
        .filter(|e| e.is_open(lane) && e.lane(lane).is_free())
        .min_by_key(|e| e.lane(lane).is_busy())
        .and_then(|e| e.lane(lane).try_reserve(e.state.index))
}

/// Why no device can take a batch: the failed devices' errors, or `Stopped` when the threads
/// are gone.
fn none_left(executors: &[Executor]) -> BackendError {
    let failed: Vec<String> = executors
        .iter()
        .filter(|e| !e.state.is_healthy())
        .map(|e| e.state.failure_text())
        .collect();
    if failed.is_empty() {
        return BackendError::Stopped;
    }
    BackendError::Unhealthy(format!("every device has failed: {}", failed.join("; ")))
}
