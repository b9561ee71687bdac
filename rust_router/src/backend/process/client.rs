//! The router's side of a worker's lane: a [`Backend`] whose batches run in the worker
//! process. A batch's arrays go into the lane's input slot, a header down the socket; the
//! reply's header comes back on the socket and its rows in the output slot.

use super::region::{Inputs, Outputs, Region};
use super::wire::{decode_matrix, encode_batch, Op, Reply, Request};
use crate::backend::{Backend, BackendError, Batch, BatchKind, Launched, Matrix};
use std::collections::VecDeque;
use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};

/// What the lanes know of the process behind them.
pub trait Worker: Send + Sync {
    /// The device it serves, for messages.
    fn device(&self) -> &str;
    /// Why it stopped answering (its exit status, once it has one).
    fn why_stopped(&self) -> String;
}

/// One lane of one worker, as the router's backend thread for that lane sees it.
pub struct WorkerLane {
    channel: Arc<Mutex<Channel>>,
    worker: Arc<dyn Worker>,
    pipelines: bool,
}

struct Channel {
    socket: UnixStream,
    inputs: Inputs,
    outputs: Outputs,
    next_seq: u32,
    /// Sent and not answered yet, oldest first (at most two: see `region`).
    outstanding: VecDeque<u32>,
    /// Once the socket failed, every later call fails with this at once.
    broken: Option<BackendError>,
}

impl WorkerLane {
    pub fn new(
        socket: UnixStream,
        region: Region,
        worker: Arc<dyn Worker>,
        pipelines: bool,
    ) -> Self {
        let (inputs, outputs) = region.split();
        Self {
            channel: Arc::new(Mutex::new(Channel {
                socket,
                inputs,
                outputs,
                next_seq: 0,
                outstanding: VecDeque::new(),
                broken: None,
            })),
            worker,
            pipelines,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Channel> {
        lock(&self.channel)
    }

    fn call(&self, op: Op, batch: Option<&Batch>) -> Result<Matrix, BackendError> {
        let mut channel = self.lock();
        let seq = channel.send(op, batch, self.worker.as_ref())?;
        channel.receive(seq, self.worker.as_ref())
    }
}

/// The lane's channel. A panic while it was held left the lane in an unknown state: it is
/// treated as broken.
fn lock(channel: &Mutex<Channel>) -> MutexGuard<'_, Channel> {
    channel.lock().unwrap_or_else(|poisoned| {
        let mut channel = poisoned.into_inner();
        channel.broken.get_or_insert(BackendError::Device(
            "a backend thread panicked while talking to the worker".into(),
        ));
        channel
    })
}

impl Channel {
    fn send(
        &mut self,
        op: Op,
        batch: Option<&Batch>,
        worker: &dyn Worker,
    ) -> Result<u32, BackendError> {
        if let Some(err) = &self.broken {
            return Err(err.clone());
        }
        let seq = self.next_seq;
        let sent = match (op, batch) {
            (Op::Batch(kind), Some(batch)) => {
                let mut request = Request::batch(kind, seq, batch, false);
                let len = request.payload_len();
                match self.inputs.slot(seq, len) {
                    Some(slot) => {
                        encode_batch(batch, slot);
                        request.write(&mut self.socket, None)
                    }
                    None => {
                        let mut payload = vec![0u8; len];
                        encode_batch(batch, &mut payload);
                        request.inline = true;
                        request.write(&mut self.socket, Some(&payload))
                    }
                }
            }
            _ => Request::control(op, seq).write(&mut self.socket, None),
        };
        sent.map_err(|e| self.fail(e, worker))?;
        if op != Op::Warm {
            self.next_seq = seq.wrapping_add(1);
            self.outstanding.push_back(seq);
        }
        Ok(seq)
    }

    fn receive(&mut self, seq: u32, worker: &dyn Worker) -> Result<Matrix, BackendError> {
        if let Some(err) = &self.broken {
            return Err(err.clone());
        }
        if self.outstanding.front() != Some(&seq) {
            // Replies come in order; reading out of order would hand rows to the wrong batch.
            return Err(self.fail(
                io::Error::other(format!("batch {seq} was read back out of order")),
                worker,
            ));
        }
        let reply = Reply::read(&mut self.socket).map_err(|e| self.fail(e, worker))?;
        if reply.seq != seq {
            return Err(self.fail(
                io::Error::other(format!("expected the reply to {seq}, got {}", reply.seq)),
                worker,
            ));
        }
        self.outstanding.pop_front();
        let (len, inline) = (reply.matrix_len(), reply.inline);
        let (rows, cols) = reply.outcome?;
        if inline {
            let mut bytes = vec![0u8; len];
            self.socket
                .read_exact(&mut bytes)
                .map_err(|e| self.fail(e, worker))?;
            return Ok(decode_matrix(rows, cols, &bytes));
        }
        match self.outputs.slot(seq, len) {
            Some(bytes) => Ok(decode_matrix(rows, cols, bytes)),
            None => Err(self.fail(
                io::Error::other(format!("a reply of {len} bytes does not fit its slot")),
                worker,
            )),
        }
    }

    /// The lane is unusable: the worker died or broke the protocol. Its device is lost.
    fn fail(&mut self, err: io::Error, worker: &dyn Worker) -> BackendError {
        let why = match err.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset => worker.why_stopped(),
            _ => format!("{err}"),
        };
        let err = BackendError::Device(format!(
            "the worker process of {} stopped: {why}",
            worker.device()
        ));
        self.broken = Some(err.clone());
        err
    }
}

impl Backend for WorkerLane {
    fn health(&mut self) -> Result<(), BackendError> {
        self.call(Op::Health, None).map(|_| ())
    }

    fn forward(&mut self, kind: BatchKind, batch: &Batch) -> Result<Matrix, BackendError> {
        self.call(Op::Batch(kind), Some(batch))
    }

    fn pipelines(&self) -> bool {
        self.pipelines
    }

    fn launch(&mut self, kind: BatchKind, batch: &Batch) -> Result<Launched, BackendError> {
        if !self.pipelines {
            return self.forward(kind, batch).map(Launched::done);
        }
        let seq = self
            .lock()
            .send(Op::Batch(kind), Some(batch), self.worker.as_ref())?;
        let channel = self.channel.clone();
        let worker = self.worker.clone();
        Ok(Launched::new(move || {
            lock(&channel).receive(seq, worker.as_ref())
        }))
    }

    fn warm(&mut self) {
        // Errors are the next query's to report.
        let _ = self.lock().send(Op::Warm, None, self.worker.as_ref());
    }
}
