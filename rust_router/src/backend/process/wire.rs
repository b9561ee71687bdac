//! The messages of the device-worker protocol: fixed-size little-endian headers on the lane's
//! socket, payloads in the lane's shared memory ([`super::region`]) or, when one does not fit
//! its slot, right after its header on the socket.
//!
//! Router → worker: a [`Request`] (a batch, a health check, or a warm-up, which has no reply).
//! Worker → router: a [`Reply`] per batch or health check, in the order they were sent; the
//! first message of the bulk socket is the worker's [`Ready`] (or why it could not start).

use crate::backend::{BackendError, Batch, BatchKind, Matrix};
use std::io::{self, Read, Write};

const REQUEST_WORDS: usize = 8;
const REPLY_WORDS: usize = 6;
const MAX_WORDS: usize = if REQUEST_WORDS > REPLY_WORDS {
    REQUEST_WORDS
} else {
    REPLY_WORDS
};

/// What a request asks of the worker's lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Run a batch (`launch` on a lane whose backend pipelines, else `forward`).
    Batch(BatchKind),
    Health,
    /// `Backend::warm`; no reply.
    Warm,
}

/// One request's header; a batch's arrays follow in its input slot or, `inline`, on the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    /// Counts the lane's batches and health checks from 0: its slot is `seq % 2`.
    pub seq: u32,
    pub num_tokens: u32,
    /// Entries of `cu_seqlens` (sequences + 1).
    pub num_offsets: u32,
    /// Floats of [`Batch::queries`] (a MaxSim batch's; its spans, two per sequence, come
    /// with them).
    pub num_query_values: u32,
    /// Floats of an image batch's pixels ([`Batch::pixels`]; 0 for texts).
    pub num_pixels: u32,
    pub inline: bool,
}

impl Request {
    pub fn batch(kind: BatchKind, seq: u32, batch: &Batch, inline: bool) -> Self {
        Self {
            op: Op::Batch(kind),
            seq,
            num_tokens: batch.num_tokens() as u32,
            num_offsets: batch.cu_seqlens.len() as u32,
            num_query_values: batch.queries.len() as u32,
            num_pixels: batch.pixels.len() as u32,
            inline,
        }
    }

    pub fn control(op: Op, seq: u32) -> Self {
        Self {
            op,
            seq,
            num_tokens: 0,
            num_offsets: 0,
            num_query_values: 0,
            num_pixels: 0,
            inline: false,
        }
    }

    /// Entries of [`Batch::query_spans`]: two per sequence of a MaxSim batch.
    fn num_spans(&self) -> usize {
        match self.op {
            Op::Batch(BatchKind::MaxSim) => 2 * (self.num_offsets as usize).saturating_sub(1),
            _ => 0,
        }
    }

    /// Bytes of the batch's arrays.
    pub fn payload_len(&self) -> usize {
        4 * (3 * self.num_tokens as usize
            + self.num_offsets as usize
            + self.num_spans()
            + self.num_query_values as usize
            + self.num_pixels as usize)
    }

    pub fn write(&self, out: &mut impl Write, inline_payload: Option<&[u8]>) -> io::Result<()> {
        let (op, kind) = match self.op {
            Op::Batch(kind) => (1, kind_code(kind)),
            Op::Health => (2, 0),
            Op::Warm => (3, 0),
        };
        let words = [
            op,
            kind,
            self.seq,
            self.num_tokens,
            self.num_offsets,
            self.inline as u32,
            self.num_query_values,
            self.num_pixels,
        ];
        write_words(out, &words, inline_payload)
    }

    /// The next request, `None` at the end of the stream (the router closed the lane).
    pub fn read(input: &mut impl Read) -> io::Result<Option<Self>> {
        let Some(w) = read_words::<REQUEST_WORDS>(input)? else {
            return Ok(None);
        };
        let op = match w[0] {
            1 => Op::Batch(kind_from_code(w[1])?),
            2 => Op::Health,
            3 => Op::Warm,
            other => return Err(invalid(format!("unknown request op {other}"))),
        };
        Ok(Some(Self {
            op,
            seq: w[2],
            num_tokens: w[3],
            num_offsets: w[4],
            inline: w[5] != 0,
            num_query_values: w[6],
            num_pixels: w[7],
        }))
    }
}

/// A batch's arrays, back to back: ids, type ids, positions, offsets, then a MaxSim batch's
/// query spans and queries' vectors, then an image batch's pixels.
pub fn encode_batch(batch: &Batch, out: &mut [u8]) {
    let mut at = 0;
    for values in [
        &batch.input_ids,
        &batch.token_type_ids,
        &batch.position_ids,
        &batch.cu_seqlens,
        &batch.query_spans,
    ] {
        put_u32s(&mut out[at..at + 4 * values.len()], values);
        at += 4 * values.len();
    }
    for values in [&batch.queries, &batch.pixels] {
        put_f32s(&mut out[at..at + 4 * values.len()], values);
        at += 4 * values.len();
    }
}

/// The batch of a request from its payload ([`encode_batch`]'s layout).
pub fn decode_batch(request: &Request, payload: &[u8]) -> Batch {
    let n = request.num_tokens as usize;
    let offsets = request.num_offsets as usize;
    let spans = request.num_spans();
    let take = |from: usize, len: usize| get_u32s(&payload[4 * from..4 * (from + len)]);
    let queries_at = 3 * n + offsets + spans;
    let pixels_at = queries_at + request.num_query_values as usize;
    let floats = |from: usize, len: usize| get_f32s(&payload[4 * from..4 * (from + len)]);
    Batch {
        input_ids: take(0, n),
        token_type_ids: take(n, n),
        position_ids: take(2 * n, n),
        cu_seqlens: take(3 * n, offsets),
        pixels: floats(pixels_at, request.num_pixels as usize),
        queries: floats(queries_at, request.num_query_values as usize),
        query_spans: take(3 * n + offsets, spans),
    }
}

/// One reply's header; an error's message, then (`inline`) the matrix follow on the socket,
/// else the matrix is in the output slot of `seq`.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub seq: u32,
    /// `Ok((rows, cols))`, or the error (its message on the socket after the header).
    pub outcome: Result<(u32, u32), BackendError>,
    pub inline: bool,
}

impl Reply {
    pub fn write(&self, out: &mut impl Write, inline_matrix: Option<&[u8]>) -> io::Result<()> {
        let (status, rows, cols, message) = match &self.outcome {
            Ok((rows, cols)) => (0, *rows, *cols, String::new()),
            Err(err) => {
                let (status, message) = error_code(err);
                (status, 0, 0, message)
            }
        };
        let words = [
            status,
            self.seq,
            rows,
            cols,
            self.inline as u32,
            message.len() as u32,
        ];
        let mut tail = message.into_bytes();
        if let Some(matrix) = inline_matrix {
            tail.extend_from_slice(matrix);
        }
        write_words(out, &words, Some(&tail))
    }

    /// The next reply; the end of the stream is an error here (the worker went away).
    pub fn read(input: &mut impl Read) -> io::Result<Self> {
        let w = read_words::<REPLY_WORDS>(input)?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::UnexpectedEof, "the worker closed the lane")
        })?;
        let mut message = vec![0u8; w[5] as usize];
        input.read_exact(&mut message)?;
        let outcome = if w[0] == 0 {
            Ok((w[2], w[3]))
        } else {
            Err(error_from_code(
                w[0],
                String::from_utf8_lossy(&message).into_owned(),
            )?)
        };
        Ok(Self {
            seq: w[1],
            outcome,
            inline: w[4] != 0,
        })
    }

    /// Bytes of the matrix it announces.
    pub fn matrix_len(&self) -> usize {
        match self.outcome {
            Ok((rows, cols)) => 4 * rows as usize * cols as usize,
            Err(_) => 0,
        }
    }
}

/// The worker's first message on the bulk socket: what it loaded, or why it could not.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Ready {
    /// `Backend.info()` of the worker's one device, as JSON.
    pub info: serde_json::Value,
    /// Whether its bulk lane launches batches ahead ([`crate::backend::Backend::pipelines`]).
    pub pipelines: bool,
    /// Whether it serves the interactive lane's socket.
    pub interactive: bool,
}

impl Ready {
    pub fn write(result: &Result<Ready, BackendError>, out: &mut impl Write) -> io::Result<()> {
        let outcome = match result {
            Ok(ready) => {
                let json = serde_json::to_vec(ready).map_err(io::Error::other)?;
                return write_words(out, &[0, 0, 0, 0, 0, json.len() as u32], Some(&json));
            }
            Err(err) => Err(err.clone()),
        };
        Reply {
            seq: 0,
            outcome,
            inline: false,
        }
        .write(out, None)
    }

    pub fn read(input: &mut impl Read) -> io::Result<Result<Ready, BackendError>> {
        let w = read_words::<REPLY_WORDS>(input)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the worker exited before it was ready",
            )
        })?;
        let mut body = vec![0u8; w[5] as usize];
        input.read_exact(&mut body)?;
        if w[0] != 0 {
            return Ok(Err(error_from_code(
                w[0],
                String::from_utf8_lossy(&body).into_owned(),
            )?));
        }
        serde_json::from_slice(&body)
            .map(Ok)
            .map_err(|e| invalid(format!("the worker's ready message is invalid: {e}")))
    }
}

/// A matrix's floats as bytes (little-endian).
pub fn encode_matrix(matrix: &Matrix, out: &mut [u8]) {
    for (chunk, v) in out.chunks_exact_mut(4).zip(&matrix.data) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
}

pub fn decode_matrix(rows: u32, cols: u32, bytes: &[u8]) -> Matrix {
    let data = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Matrix {
        rows: rows as usize,
        cols: cols as usize,
        data,
    }
}

fn kind_code(kind: BatchKind) -> u32 {
    match kind {
        BatchKind::Pooled => 0,
        BatchKind::AllTokens => 1,
        BatchKind::Predict => 2,
        BatchKind::Sparse => 3,
        BatchKind::Images => 4,
        BatchKind::MaxSim => 5,
    }
}

fn kind_from_code(code: u32) -> io::Result<BatchKind> {
    Ok(match code {
        0 => BatchKind::Pooled,
        1 => BatchKind::AllTokens,
        2 => BatchKind::Predict,
        3 => BatchKind::Sparse,
        4 => BatchKind::Images,
        5 => BatchKind::MaxSim,
        other => return Err(invalid(format!("unknown batch kind {other}"))),
    })
}

/// Every [`BackendError`] crosses as a code and its message, so the router's handling (a
/// failed device, a batch to split apart, a non-finite row) is the same as in one process.
fn error_code(err: &BackendError) -> (u32, String) {
    match err {
        BackendError::Start(m) => (1, m.clone()),
        BackendError::Inference(m) => (2, m.clone()),
        BackendError::Unhealthy(m) => (3, m.clone()),
        BackendError::Stopped => (4, String::new()),
        BackendError::Device(m) => (5, m.clone()),
        BackendError::Refused => (6, String::new()),
        BackendError::NonFinite => (7, String::new()),
    }
}

fn error_from_code(code: u32, message: String) -> io::Result<BackendError> {
    Ok(match code {
        1 => BackendError::Start(message),
        2 => BackendError::Inference(message),
        3 => BackendError::Unhealthy(message),
        4 => BackendError::Stopped,
        5 => BackendError::Device(message),
        6 => BackendError::Refused,
        7 => BackendError::NonFinite,
        other => return Err(invalid(format!("unknown error code {other}"))),
    })
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// The header words and what follows them, in one write (one wake-up of the reader).
fn write_words(out: &mut impl Write, words: &[u32], tail: Option<&[u8]>) -> io::Result<()> {
    let tail = tail.unwrap_or(&[]);
    let mut buf = Vec::with_capacity(4 * words.len() + tail.len());
    for w in words {
        buf.extend_from_slice(&w.to_le_bytes());
    }
    buf.extend_from_slice(tail);
    out.write_all(&buf)?;
    out.flush()
}

/// `N` words, or `None` when the stream ends before the first byte.
fn read_words<const N: usize>(input: &mut impl Read) -> io::Result<Option<[u32; N]>> {
    let mut buf = [0u8; 4 * MAX_WORDS];
    let buf = &mut buf[..4 * N];
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let mut words = [0u32; N];
    for (w, c) in words.iter_mut().zip(buf.chunks_exact(4)) {
        *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    Ok(Some(words))
}

fn put_u32s(out: &mut [u8], values: &[u32]) {
    for (chunk, v) in out.chunks_exact_mut(4).zip(values) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
}

fn put_f32s(out: &mut [u8], values: &[f32]) {
    for (chunk, v) in out.chunks_exact_mut(4).zip(values) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
}

fn get_f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn get_u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
