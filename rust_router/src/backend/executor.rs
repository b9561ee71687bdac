//! The backend threads and the handle the async side reaches them through.
//!
//! One executor per device: a thread for bulk batches and health checks, plus a thread for
//! interactive batches when the runtime has that lane. Device 0's bulk thread is the one that
//! loaded the model. Each thread has a one-batch slot (the prefetch); [`BackendHandle::reserve`]
//! hands out the slot of whichever healthy device can take a batch soonest, so one queue feeds
//! every device. With one device that is exactly its own slot: no choice, no extra work.

use super::device::{DeviceFailure, DeviceState, DeviceStatus, Health};
use super::wait::{next_message, IdleSince, LaneWaits, WaitPolicy, WarmHook, Warming};
use super::{Backend, BackendError, Batch, BatchKind, Lane, Launched, Matrix, ModelInfo};
use crate::panics::panic_message;
use futures_util::future::{join_all, select_all};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

/// Result of one forward pass, with when it ran so requests can report queue vs inference time.
#[derive(Debug)]
pub struct Output {
    pub matrix: Matrix,
    pub started: Instant,
    pub duration: Duration,
}

/// A forward pass's result, with the batch handed back so that a failed batch can be re-run
/// in parts (or elsewhere, when its device failed before running it).
#[derive(Debug)]
pub struct Ran {
    pub batch: Batch,
    pub result: Result<Output, BackendError>,
    /// The device that ran (or refused) it.
    pub device: usize,
}

pub type ForwardReply = oneshot::Sender<Ran>;

enum Command {
    Forward {
        kind: BatchKind,
        batch: Batch,
        reply: ForwardReply,
        /// Released as soon as the backend thread picks the batch up, or with `hold_slot`
        /// once the batch has run.
        slot: OwnedSemaphorePermit,
        hold_slot: bool,
    },
    Health(oneshot::Sender<Result<(), BackendError>>),
}

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
struct LaneChannel {
    tx: mpsc::UnboundedSender<Command>,
    slots: Arc<Semaphore>,
    /// Set by the thread while a forward pass runs. Only a hint for choosing among devices
    /// (an idle one before a busy one's prefetch slot), so relaxed ordering is enough.
    busy: Arc<AtomicBool>,
}

impl LaneChannel {
    fn new(tx: mpsc::UnboundedSender<Command>, busy: Arc<AtomicBool>) -> Self {
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
struct Executor {
    bulk: LaneChannel,
    /// `None` when the runtime has no interactive lane: one thread serves both lanes.
    interactive: Option<LaneChannel>,
    state: Arc<DeviceState>,
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
    executors: Arc<[Executor]>,
}

/// One device's backends, as a [`BackendFactory`] loads them.
pub struct DeviceBackends {
    /// Runs bulk batches and health checks (device 0's on the thread that built it).
    pub bulk: Box<dyn Backend + Send>,
    /// Runs interactive batches on a thread of its own, at the same time as `bulk`; `None`
    /// when the runtime has no interactive lane (or it is turned off).
    pub interactive: Option<Box<dyn Backend + Send>>,
}

/// What a [`BackendFactory`] loads.
pub struct LoadedBackend {
    pub info: ModelInfo,
    /// One per device, in the order of [`ModelInfo::device_names`].
    pub devices: Vec<DeviceBackends>,
}

impl LoadedBackend {
    /// One set of backends per device the info names, all with the same lanes.
    fn check(self) -> Result<Self, BackendError> {
        let names = self.info.device_names();
        if self.devices.len() != names.len() {
            return Err(BackendError::Start(format!(
                "the backend loaded {} device(s) but info() lists {}: {names:?}",
                self.devices.len(),
                names.len()
            )));
        }
        let lanes = self.devices[0].interactive.is_some();
        if self
            .devices
            .iter()
            .any(|d| d.interactive.is_some() != lanes)
        {
            return Err(BackendError::Start(
                "every device must have an interactive lane, or none".into(),
            ));
        }
        Ok(self)
    }
}

/// Builds the backend on the backend thread (a Python object must be created where it is used).
pub type BackendFactory = Box<dyn FnOnce() -> Result<LoadedBackend, BackendError> + Send>;

/// The backend threads; join them after the handle and all its clones are dropped.
pub struct BackendThreads(pub(super) Vec<JoinHandle<()>>);

impl BackendThreads {
    /// Waits for every thread (not only up to a panicked one), and reports the first panic.
    pub fn join(self) -> std::thread::Result<()> {
        let mut first = Ok(());
        for thread in self.0 {
            let result = thread.join();
            if first.is_ok() {
                first = result;
            }
        }
        first
    }
}

fn spawn_named(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, BackendError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| BackendError::Start(format!("cannot spawn the {name} thread: {e}")))
}

/// A backend thread's name: `model-backend` / `model-interactive` for device 0 (the names of
/// a one-device server), with the index after them for the others.
fn thread_name(role: &str, device: usize) -> String {
    match device {
        0 => format!("model-{role}"),
        i => format!("model-{role}-{i}"),
    }
}

/// What a backend thread shares with the handle besides its channel.
struct Worker {
    state: Arc<DeviceState>,
    busy: Arc<AtomicBool>,
    idle: Arc<IdleSince>,
}

impl Worker {
    fn new(state: &Arc<DeviceState>) -> Self {
        Self {
            state: state.clone(),
            busy: Arc::default(),
            idle: Arc::default(),
        }
    }
}

/// A batch launched on a pipelining backend ([`Backend::pipelines`]) and not read back yet.
struct InFlight {
    launched: Launched,
    batch: Batch,
    reply: ForwardReply,
    started: Instant,
    /// The thread's time launching it; the time it then waits for its result is added.
    launching: Duration,
    held: Option<OwnedSemaphorePermit>,
}

/// One backend thread's life: run what its lane sends until every handle is gone.
///
/// On a backend that pipelines, a batch is launched, and read back only once the next one is
/// launched too, or once nothing else waits in the channel: the device never idles while the
/// host reads a result and prepares the next batch.
///
/// While it spins for its next batch, the thread re-runs its backend's and the hook's host
/// steps as `wait` says ([`Backend::warm`]).
fn serve_lane(
    mut backend: Box<dyn Backend>,
    mut rx: mpsc::UnboundedReceiver<Command>,
    wait: WaitPolicy,
    warming: Warming,
    worker: Worker,
) {
    let Worker { state, busy, idle } = worker;
    let lane = Replies {
        state: &state,
        busy: &busy,
    };
    let pipelines = backend.pipelines();
    let mut in_flight: Option<InFlight> = None;
    // Waiting here holds no interpreter lock: the Python backend attaches only inside
    // `forward` / `launch` / `health`.
    loop {
        let cmd = match in_flight.take() {
            None => {
                idle.waiting();
                let next = next_message(&mut rx, wait, &mut || warming.run(backend.as_mut()));
                idle.working();
                match next {
                    Some(cmd) => cmd,
                    None => break,
                }
            }
            Some(flight) => match rx.try_recv() {
                Ok(cmd) => {
                    in_flight = Some(flight);
                    cmd
                }
                // Nothing to launch meanwhile (or every handle gone): hand the result over.
                Err(_) => {
                    lane.finish(flight);
                    continue;
                }
            },
        };
        match cmd {
            Command::Forward {
                kind,
                batch,
                reply,
                slot,
                hold_slot,
            } => {
                // Busy before the slot frees, so a free slot never looks like an idle device.
                busy.store(true, Ordering::Relaxed);
                let held = if hold_slot {
                    Some(slot)
                } else {
                    drop(slot);
                    None
                };
                if !state.is_healthy() {
                    // The device failed after this batch was handed over: hand it back, to
                    // run on another device.
                    lane.settle(&mut in_flight);
                    busy.store(false, Ordering::Relaxed);
                    let result = Err(BackendError::Refused);
                    let _ = reply.send(Ran {
                        batch,
                        result,
                        device: state.index,
                    });
                    continue;
                }
                let started = Instant::now();
                if pipelines && !hold_slot {
                    let launched = guarded(|| backend.launch(kind, &batch));
                    let launching = started.elapsed();
                    lane.settle(&mut in_flight);
                    match launched {
                        Ok(launched) => {
                            busy.store(true, Ordering::Relaxed);
                            in_flight = Some(InFlight {
                                launched,
                                batch,
                                reply,
                                started,
                                launching,
                                held,
                            });
                        }
                        Err(err) => lane.reply(batch, reply, Err(err), started, launching),
                    }
                    continue;
                }
                lane.settle(&mut in_flight);
                busy.store(true, Ordering::Relaxed);
                let result = guarded(|| backend.forward(kind, &batch));
                lane.reply(batch, reply, result, started, started.elapsed());
                drop(held);
            }
            Command::Health(reply) => {
                lane.settle(&mut in_flight);
                let result = guarded(|| backend.health());
                if let Err(BackendError::Device(why)) = &result {
                    state.mark_failed(why);
                }
                let _ = reply.send(result);
            }
        }
    }
    lane.settle(&mut in_flight);
    tracing::debug!(device = state.index, "backend thread stopping");
}

/// Where a backend thread's forward passes are answered and counted.
struct Replies<'a> {
    state: &'a DeviceState,
    busy: &'a AtomicBool,
}

impl Replies<'_> {
    fn reply(
        &self,
        batch: Batch,
        reply: ForwardReply,
        result: Result<Matrix, BackendError>,
        started: Instant,
        duration: Duration,
    ) {
        self.busy.store(false, Ordering::Relaxed);
        self.state.record(&result);
        let result = result.map(|matrix| Output {
            matrix,
            started,
            duration,
        });
        let _ = reply.send(Ran {
            batch,
            result,
            device: self.state.index,
        });
    }

    /// Answers the batch in flight, if there is one: before the thread does anything that
    /// must come after it (a forward pass, a health check, a refusal, stopping).
    fn settle(&self, in_flight: &mut Option<InFlight>) {
        if let Some(flight) = in_flight.take() {
            self.finish(flight);
        }
    }

    /// Reads a launched batch's result back and replies with it.
    fn finish(&self, flight: InFlight) {
        let waited = Instant::now();
        let result = guarded(|| flight.launched.finish());
        let duration = flight.launching + waited.elapsed();
        self.reply(flight.batch, flight.reply, result, flight.started, duration);
        drop(flight.held);
    }
}

/// What the loading thread hands back once the model is loaded.
struct Ready {
    info: ModelInfo,
    states: Vec<Arc<DeviceState>>,
    /// Device 0's bulk thread is the loading thread itself.
    first_busy: Arc<AtomicBool>,
    first_idle: Arc<IdleSince>,
    first_interactive: Option<Box<dyn Backend + Send>>,
    others: Vec<DeviceBackends>,
}

/// Starts `backend`'s interactive thread, when it has one.
fn spawn_interactive(
    backend: Option<Box<dyn Backend + Send>>,
    state: &Arc<DeviceState>,
    wait: WaitPolicy,
    warm_hook: &WarmHook,
    bulk_idle: &Arc<IdleSince>,
    threads: &mut Vec<JoinHandle<()>>,
) -> Result<Option<LaneChannel>, BackendError> {
    let Some(backend) = backend else {
        return Ok(None);
    };
    let (tx, rx) = mpsc::unbounded_channel::<Command>();
    let worker = Worker::new(state);
    let busy = worker.busy.clone();
    let warming = Warming {
        hook: warm_hook.clone(),
        bulk_idle: Some(bulk_idle.clone()),
    };
    threads.push(spawn_named(
        &thread_name("interactive", state.index),
        move || serve_lane(backend, rx, wait, warming, worker),
    )?);
    Ok(Some(LaneChannel::new(tx, busy)))
}

impl BackendHandle {
    /// Starts the backend thread, waits for the model to load, starts the other threads (the
    /// interactive lane's, the other devices') and returns the handle, the model's info and
    /// the threads. The threads sleep as soon as they have nothing to do.
    pub fn spawn(
        factory: BackendFactory,
    ) -> Result<(BackendHandle, ModelInfo, BackendThreads), BackendError> {
        Self::spawn_with(factory, LaneWaits::default())
    }

    /// [`BackendHandle::spawn`], with the threads waiting for work as `waits` says.
    pub fn spawn_with(
        factory: BackendFactory,
        waits: LaneWaits,
    ) -> Result<(BackendHandle, ModelInfo, BackendThreads), BackendError> {
        let LaneWaits {
            bulk: wait,
            interactive: interactive_wait,
            warm_hook,
        } = waits;
        let (tx, rx) = mpsc::unbounded_channel::<Command>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<Ready, BackendError>>();
        let loader = spawn_named(&thread_name("backend", 0), move || {
            match factory().and_then(LoadedBackend::check) {
                Ok(LoadedBackend { info, devices }) => {
                    let states: Vec<Arc<DeviceState>> = info
                        .device_names()
                        .into_iter()
                        .enumerate()
                        .map(|(i, name)| Arc::new(DeviceState::new(i, name)))
                        .collect();
                    let mut devices = devices.into_iter();
                    let first = devices.next().expect("checked: one backend per device");
                    let worker = Worker::new(&states[0]);
                    let _ = ready_tx.send(Ok(Ready {
                        info,
                        states,
                        first_busy: worker.busy.clone(),
                        first_idle: worker.idle.clone(),
                        first_interactive: first.interactive,
                        others: devices.collect(),
                    }));
                    serve_lane(first.bulk, rx, wait, Warming::default(), worker);
                }
                Err(err) => {
                    let _ = ready_tx.send(Err(err));
                }
            }
        })?;
        let ready = match ready_rx.recv() {
            Ok(Ok(ready)) => ready,
            Ok(Err(err)) => {
                let _ = loader.join();
                return Err(err);
            }
            Err(_) => {
                let _ = loader.join();
                return Err(BackendError::Start(
                    "the backend thread panicked while loading".into(),
                ));
            }
        };
        ready.info.validate()?;
        let Ready {
            info,
            states,
            first_busy,
            first_idle,
            first_interactive,
            others,
        } = ready;
        let mut threads = vec![loader];
        let mut executors = Vec::with_capacity(states.len());
        executors.push(Executor {
            interactive: spawn_interactive(
                first_interactive,
                &states[0],
                interactive_wait,
                &warm_hook,
                &first_idle,
                &mut threads,
            )?,
            bulk: LaneChannel::new(tx, first_busy),
            state: states[0].clone(),
        });
        for (device, state) in others.into_iter().zip(&states[1..]) {
            let (tx, rx) = mpsc::unbounded_channel::<Command>();
            let worker = Worker::new(state);
            let busy = worker.busy.clone();
            let bulk_idle = worker.idle.clone();
            let bulk = device.bulk;
            threads.push(spawn_named(
                &thread_name("backend", state.index),
                move || serve_lane(bulk, rx, wait, Warming::default(), worker),
            )?);
            executors.push(Executor {
                interactive: spawn_interactive(
                    device.interactive,
                    state,
                    interactive_wait,
                    &warm_hook,
                    &bulk_idle,
                    &mut threads,
                )?,
                bulk: LaneChannel::new(tx, busy),
                state: state.clone(),
            });
        }
        let handle = BackendHandle {
            executors: executors.into(),
        };
        Ok((handle, info, BackendThreads(threads)))
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

/// A panic inside one forward pass must fail that batch, not take the server down.
fn guarded<T>(f: impl FnOnce() -> Result<T, BackendError>) -> Result<T, BackendError> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let msg = panic_message(panic.as_ref()).unwrap_or("unknown panic");
        tracing::error!("backend panicked: {msg}");
        Err(BackendError::Inference(format!("backend panicked: {msg}")))
    })
}
