//! Starting the backend threads: device 0's bulk thread loads the model, then every other
//! thread starts (the interactive lanes', the other devices'), and the handle to them all is
//! built.

use super::handle::{BackendHandle, Executor, LaneChannel};
use super::lane::{serve_lane, spawn_named, thread_name, Command, Worker};
use crate::backend::device::DeviceState;
use crate::backend::share::{Seat, Sharing};
use crate::backend::wait::{IdleSince, LaneWaits, WaitPolicy, WarmHook, Warming};
use crate::backend::{Backend, BackendError, ImagePreprocessor, ModelInfo};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use tokio::sync::mpsc;

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
    /// How images become pixels, for a model that takes images and a runtime in this
    /// process (worker processes' runtimes are out of the router's reach).
    pub images: Option<Arc<dyn ImagePreprocessor>>,
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
pub struct BackendThreads(pub(in crate::backend) Vec<JoinHandle<()>>);

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

/// What the loading thread hands back once the model is loaded.
struct Ready {
    info: ModelInfo,
    images: Option<Arc<dyn ImagePreprocessor>>,
    states: Vec<Arc<DeviceState>>,
    /// Device 0's bulk thread is the loading thread itself.
    first_busy: Arc<AtomicBool>,
    first_idle: Arc<IdleSince>,
    first_interactive: Option<Box<dyn Backend + Send>>,
    others: Vec<DeviceBackends>,
    /// The other devices' bulk threads' seats, where the model shares its devices.
    other_seats: Vec<Option<Seat>>,
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
        Self::spawn_with(factory, LaneWaits::default(), None)
    }

    /// [`BackendHandle::spawn`], with the threads waiting for work as `waits` says, and the
    /// bulk threads taking turns on each device with other models' as `sharing` says.
    pub fn spawn_with(
        factory: BackendFactory,
        waits: LaneWaits,
        sharing: Option<Sharing>,
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
                Ok(LoadedBackend {
                    info,
                    devices,
                    images,
                }) => {
                    let names = info.device_names();
                    let mut seats: Vec<Option<Seat>> = match &sharing {
                        Some(sharing) => sharing.seats(&names).into_iter().map(Some).collect(),
                        None => vec![None; names.len()],
                    };
                    let other_seats = seats.split_off(1);
                    let states: Vec<Arc<DeviceState>> = names
                        .into_iter()
                        .enumerate()
                        .map(|(i, name)| Arc::new(DeviceState::new(i, name)))
                        .collect();
                    let mut devices = devices.into_iter();
                    let first = devices.next().expect("checked: one backend per device");
                    let worker = Worker::new(&states[0]).sharing(seats.pop().flatten());
                    let _ = ready_tx.send(Ok(Ready {
                        info,
                        images,
                        states,
                        first_busy: worker.busy.clone(),
                        first_idle: worker.idle.clone(),
                        first_interactive: first.interactive,
                        others: devices.collect(),
                        other_seats,
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
            images,
            states,
            first_busy,
            first_idle,
            first_interactive,
            others,
            other_seats,
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
        for ((device, state), seat) in others.into_iter().zip(&states[1..]).zip(other_seats) {
            let (tx, rx) = mpsc::unbounded_channel::<Command>();
            let worker = Worker::new(state).sharing(seat);
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
            images,
        };
        Ok((handle, info, BackendThreads(threads)))
    }
}
