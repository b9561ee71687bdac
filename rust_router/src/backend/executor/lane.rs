//! A backend thread: it runs the batches and health checks its lane's channel brings, one
//! forward pass at a time (or launched ahead, on a backend that pipelines), and answers each
//! with a [`Ran`].

use crate::backend::contract::guarded;
use crate::backend::device::DeviceState;
use crate::backend::share::{Seat, Turn};
use crate::backend::wait::{next_message, IdleSince, WaitPolicy, Warming};
use crate::backend::{Backend, BackendError, Batch, BatchKind, Launched, Matrix};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

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

pub(super) enum Command {
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

pub(super) fn spawn_named(
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
pub(super) fn thread_name(role: &str, device: usize) -> String {
    match device {
        0 => format!("model-{role}"),
        i => format!("model-{role}-{i}"),
    }
}

/// What a backend thread shares with the handle besides its channel.
pub(super) struct Worker {
    state: Arc<DeviceState>,
    pub(super) busy: Arc<AtomicBool>,
    pub(super) idle: Arc<IdleSince>,
    /// A bulk thread's place at its device's share, where other models use the device too.
    seat: Option<Seat>,
}

impl Worker {
    pub(super) fn new(state: &Arc<DeviceState>) -> Self {
        Self {
            state: state.clone(),
            busy: Arc::default(),
            idle: Arc::default(),
            seat: None,
        }
    }

    /// A bulk thread that takes turns with the other models' bulk threads on its device.
    pub(super) fn sharing(self, seat: Option<Seat>) -> Self {
        Self { seat, ..self }
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
    /// The device's turn, ended once the result is read back.
    turn: Option<Turn>,
}

/// One backend thread's life: run what its lane sends until every handle is gone.
///
/// On a backend that pipelines, a batch is launched, and read back only once the next one is
/// launched too, or once nothing else waits in the channel: the device never idles while the
/// host reads a result and prepares the next batch.
///
/// While it spins for its next batch, the thread re-runs its backend's and the hook's host
/// steps as `wait` says ([`Backend::warm`]).
pub(super) fn serve_lane(
    mut backend: Box<dyn Backend>,
    mut rx: mpsc::UnboundedReceiver<Command>,
    wait: WaitPolicy,
    warming: Warming,
    worker: Worker,
) {
    let Worker {
        state,
        busy,
        idle,
        seat,
    } = worker;
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
                let turn = seat
                    .as_ref()
                    .map(|seat| lane.take_turn(seat, batch.num_tokens(), &mut in_flight));
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
                                turn,
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
                drop(turn);
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
        drop(flight.turn);
    }

    /// The device's turn for a batch of `tokens`. Where another model's batch goes first,
    /// the batch in flight is read back before waiting: its turn must end for the other's to
    /// begin.
    fn take_turn(&self, seat: &Seat, tokens: usize, in_flight: &mut Option<InFlight>) -> Turn {
        seat.try_take(tokens).unwrap_or_else(|| {
            self.settle(in_flight);
            seat.take(tokens)
        })
    }
}
