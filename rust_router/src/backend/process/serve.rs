//! The worker's side of a lane: requests from the router's socket run on the worker's own
//! [`Backend`] for its one device, and each batch or health check is answered in order.
//!
//! A lane whose backend pipelines (a GPU's bulk lane) answers from a second thread: this one
//! launches batch k + 1 while that one waits for batch k's rows, as the router's bulk thread
//! does in one process, so the device never waits for the host between two batches.

use super::region::{Inputs, Outputs, Region};
use super::wire::{decode_batch, encode_matrix, Op, Reply, Request};
use crate::backend::contract::guarded;
use crate::backend::{Backend, BackendError, Launched, Matrix};
use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;

/// A batch or health check on its way to its reply.
enum Pending {
    Launched(u32, Launched),
    Done(u32, Result<Matrix, BackendError>),
}

/// Serves the lane until the router closes it (or the socket fails). `name` names the
/// replying thread.
pub fn serve_lane(
    mut backend: Box<dyn Backend + Send>,
    socket: UnixStream,
    region: Region,
    name: &str,
) -> io::Result<()> {
    let (mut inputs, outputs) = region.split();
    let mut reader = socket.try_clone()?;
    let mut replier = Replier { socket, outputs };
    if !backend.pipelines() {
        while let Some(pending) = next(&mut reader, &mut inputs, backend.as_mut())? {
            replier.answer(pending)?;
        }
        return Ok(());
    }
    let (tx, rx) = mpsc::channel::<Pending>();
    let answering =
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || -> io::Result<()> {
                for pending in rx {
                    replier.answer(pending)?;
                }
                Ok(())
            })?;
    let mut served = Ok(());
    loop {
        match next(&mut reader, &mut inputs, backend.as_mut()) {
            Ok(Some(pending)) => {
                if tx.send(pending).is_err() {
                    break; // the replying thread failed: its error is returned below
                }
            }
            Ok(None) => break,
            Err(e) => {
                served = Err(e);
                break;
            }
        }
    }
    drop(tx);
    let answered = answering
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the replying thread panicked")));
    served.and(answered)
}

/// Reads the next request and starts it; `None` once the router closed the lane. Warm-ups
/// run here and are not answered.
fn next(
    reader: &mut UnixStream,
    inputs: &mut Inputs,
    backend: &mut (dyn Backend + Send),
) -> io::Result<Option<Pending>> {
    loop {
        let Some(request) = Request::read(reader)? else {
            return Ok(None);
        };
        let seq = request.seq;
        let kind = match request.op {
            Op::Warm => {
                backend.warm();
                continue;
            }
            Op::Health => {
                let result = guarded(|| backend.health()).map(|()| Matrix {
                    rows: 0,
                    cols: 0,
                    data: Vec::new(),
                });
                return Ok(Some(Pending::Done(seq, result)));
            }
            Op::Batch(kind) => kind,
        };
        let len = request.payload_len();
        let batch = if request.inline {
            let mut payload = vec![0u8; len];
            reader.read_exact(&mut payload)?;
            decode_batch(&request, &payload)
        } else {
            let slot = inputs.slot(seq, len).ok_or_else(|| {
                io::Error::other(format!("a batch of {len} bytes does not fit its slot"))
            })?;
            decode_batch(&request, slot)
        };
        let pending = if backend.pipelines() {
            match guarded(|| backend.launch(kind, &batch)) {
                Ok(launched) => Pending::Launched(seq, launched),
                Err(err) => Pending::Done(seq, Err(err)),
            }
        } else {
            Pending::Done(seq, guarded(|| backend.forward(kind, &batch)))
        };
        return Ok(Some(pending));
    }
}

struct Replier {
    socket: UnixStream,
    outputs: Outputs,
}

impl Replier {
    fn answer(&mut self, pending: Pending) -> io::Result<()> {
        let (seq, result) = match pending {
            Pending::Launched(seq, launched) => (seq, guarded(|| launched.finish())),
            Pending::Done(seq, result) => (seq, result),
        };
        let matrix = match result {
            Ok(matrix) => matrix,
            Err(err) => {
                let reply = Reply {
                    seq,
                    outcome: Err(err),
                    inline: false,
                };
                return reply.write(&mut self.socket, None);
            }
        };
        let mut reply = Reply {
            seq,
            outcome: Ok((matrix.rows as u32, matrix.cols as u32)),
            inline: false,
        };
        let len = reply.matrix_len();
        if matrix.data.len() * 4 != len {
            let err = BackendError::Inference(format!(
                "the backend returned {} values for a [{}, {}] matrix",
                matrix.data.len(),
                matrix.rows,
                matrix.cols
            ));
            reply.outcome = Err(err);
            return reply.write(&mut self.socket, None);
        }
        match self.outputs.slot(seq, len) {
            Some(slot) => {
                encode_matrix(&matrix, slot);
                reply.write(&mut self.socket, None)
            }
            None => {
                let mut bytes = vec![0u8; len];
                encode_matrix(&matrix, &mut bytes);
                reply.inline = true;
                reply.write(&mut self.socket, Some(&bytes))
            }
        }
    }
}
