//! The boundary between the router and the model runtime.
//!
//! A [`Backend`] runs one packed batch at a time on a dedicated OS thread
//! ([`BackendHandle::spawn`]): tokio workers never touch the GIL, and the runtime sees one
//! caller per lane. Bulk batches (and health checks) run on the thread that loaded the model.
//! A runtime that has an interactive lane gets a second thread for small requests, so a query
//! never waits for a corpus batch's forward pass to end before its own can start.

#[cfg(test)]
pub(crate) mod fake;
#[cfg(feature = "pyo3")]
pub mod python;
pub mod wait;

use crate::tokenization::PairTemplate;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use wait::{next_message, WaitPolicy};

/// One forward pass worth of sequences, packed end to end with no padding.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    pub input_ids: Vec<u32>,
    pub token_type_ids: Vec<u32>,
    pub position_ids: Vec<u32>,
    /// `n_seqs + 1` offsets into the flat arrays, starting at 0.
    pub cu_seqlens: Vec<u32>,
}

impl Batch {
    pub fn num_seqs(&self) -> usize {
        self.cu_seqlens.len().saturating_sub(1)
    }

    pub fn num_tokens(&self) -> usize {
        self.input_ids.len()
    }

    /// A batch of only the sequences at `seqs` (ascending indices), packed again.
    pub fn select(&self, seqs: &[usize]) -> Batch {
        let mut out = Batch {
            cu_seqlens: vec![0],
            ..Default::default()
        };
        for &i in seqs {
            let (a, b) = (self.cu_seqlens[i] as usize, self.cu_seqlens[i + 1] as usize);
            out.input_ids.extend_from_slice(&self.input_ids[a..b]);
            out.token_type_ids
                .extend_from_slice(&self.token_type_ids[a..b]);
            out.position_ids.extend_from_slice(&self.position_ids[a..b]);
            out.cu_seqlens.push(out.input_ids.len() as u32);
        }
        out
    }
}

/// What a batch asks of the model. Batches are homogeneous: the runtime exposes one method per
/// kind, so the queue never mixes kinds in one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchKind {
    /// Pooled sentence embeddings, `[n_seqs, hidden]`.
    Pooled,
    /// Per-token hidden states, `[n_tokens, hidden]`.
    AllTokens,
    /// Classification logits, `[n_seqs, num_labels]`.
    Predict,
}

/// A dense row-major float matrix returned by the runtime.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum BackendError {
    #[error("could not start the model backend: {0}")]
    Start(String),
    #[error("inference failed: {0}")]
    Inference(String),
    #[error("model backend is unhealthy: {0}")]
    Unhealthy(String),
    #[error("model backend has stopped")]
    Stopped,
    /// Checked per sequence: the other sequences of the batch are still served.
    #[error("inference failed: the model returned NaN or infinite values for this input (e.g. a float16 overflow)")]
    NonFinite,
}

/// Which queue and backend thread a request's sequences go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Small requests (queries): their own queue and, when the runtime has one, their own
    /// backend thread and high-priority stream.
    Interactive,
    /// Everything else (corpus backfills): fills the capacity the interactive lane leaves.
    Bulk,
}

impl Lane {
    /// Both lanes, most urgent first: the order a single-thread backend serves them in.
    pub const PRIORITY: [Lane; 2] = [Lane::Interactive, Lane::Bulk];

    /// The `lane` label of the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Interactive => "interactive",
            Lane::Bulk => "bulk",
        }
    }

    /// Position in per-lane arrays, in [`Lane::PRIORITY`] order.
    pub fn index(self) -> usize {
        match self {
            Lane::Interactive => 0,
            Lane::Bulk => 1,
        }
    }
}

/// The engine behind the router. Called only from its lane's backend thread.
pub trait Backend {
    fn health(&mut self) -> Result<(), BackendError>;
    fn forward(&mut self, kind: BatchKind, batch: &Batch) -> Result<Matrix, BackendError>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelType {
    Embedding,
    Classifier,
    Reranker,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScoreActivation {
    Sigmoid,
    Softmax,
}

/// What the runtime tells the router about the loaded model: `Backend.info()` in Python, as
/// JSON. This struct is the contract; the Python runtime's `info()` returns exactly these
/// keys (a Python test compares them with [`ModelInfo::FIELDS`]). Only the first three are
/// required: the rest default as documented, so a minimal backend needs little.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelInfo {
    /// `embedding`, `classifier` or `reranker` (a classifier with one label).
    pub model_type: ModelType,
    /// The `tokenizer.json` the router tokenizes with.
    pub tokenizer_path: String,
    /// Longest input in tokens (after special tokens), the model's own limit.
    pub max_input_length: usize,
    /// The checkpoint's architecture name, for logs.
    #[serde(default)]
    pub architecture: String,
    /// Width of a pooled embedding; also the width of `embed_all` rows.
    #[serde(default)]
    pub hidden_size: usize,
    /// First position id (2 for RoBERTa-style models).
    #[serde(default)]
    pub position_offset: u32,
    /// The pooling of an embedding model, for `/info`.
    #[serde(default)]
    pub pooling: Option<String>,
    /// Columns of `predict`'s output.
    #[serde(default)]
    pub num_labels: usize,
    /// Label names by column index (`"0"`, `"1"`, ...); default `LABEL_i`.
    #[serde(default)]
    pub id2label: Option<BTreeMap<String, String>>,
    /// `sigmoid` or `softmax`; default sigmoid for one label, softmax for several.
    #[serde(default)]
    pub score_activation: Option<ScoreActivation>,
    /// Named prompts (config_sentence_transformers.json).
    #[serde(default)]
    pub prompts: Option<HashMap<String, String>>,
    #[serde(default)]
    pub default_prompt_name: Option<String>,
    /// Set for decoder rerankers that score a templated prompt instead of a plain pair.
    #[serde(default)]
    pub pair_template: Option<PairTemplate>,
    /// The weights' dtype and the device, for `/info` and the `x-compute-type` header.
    #[serde(default)]
    pub dtype: Option<String>,
    #[serde(default)]
    pub device: Option<String>,
    /// The runtime's `embed` / `embed_all` / `predict` accept `interactive=True` and may be
    /// called from a second thread while a bulk call runs (on a high-priority CUDA stream).
    #[serde(default)]
    pub interactive_lane: bool,
}

impl ModelInfo {
    /// Every key of the contract, in the struct's order.
    pub const FIELDS: [&'static str; 16] = [
        "model_type",
        "tokenizer_path",
        "max_input_length",
        "architecture",
        "hidden_size",
        "position_offset",
        "pooling",
        "num_labels",
        "id2label",
        "score_activation",
        "prompts",
        "default_prompt_name",
        "pair_template",
        "dtype",
        "device",
        "interactive_lane",
    ];

    /// Rejects an info that the router could not serve correctly, before any request arrives.
    pub fn validate(&self) -> Result<(), BackendError> {
        let fail = |m: String| {
            Err(BackendError::Start(format!(
                "Backend.info() is invalid: {m}"
            )))
        };
        if self.max_input_length == 0 {
            return fail("max_input_length must be positive".into());
        }
        match self.model_type {
            ModelType::Embedding if self.hidden_size == 0 => {
                fail("hidden_size must be positive for an embedding model".into())
            }
            ModelType::Classifier | ModelType::Reranker if self.num_labels == 0 => {
                fail("num_labels must be positive for a classifier".into())
            }
            ModelType::Reranker if self.num_labels != 1 => fail(format!(
                "a reranker has exactly one label, got num_labels={}",
                self.num_labels
            )),
            _ => Ok(()),
        }
    }

    /// Label of output column `i`, falling back to transformers' default names.
    pub fn label(&self, i: usize) -> String {
        self.id2label
            .as_ref()
            .and_then(|m| m.get(&i.to_string()).cloned())
            .unwrap_or_else(|| format!("LABEL_{i}"))
    }

    /// TEI's rule when the runtime does not say: one label is a probability, several a
    /// distribution.
    pub fn activation(&self) -> ScoreActivation {
        self.score_activation.unwrap_or(if self.num_labels == 1 {
            ScoreActivation::Sigmoid
        } else {
            ScoreActivation::Softmax
        })
    }

    /// Width of one output row for a batch kind.
    pub fn output_cols(&self, kind: BatchKind) -> usize {
        match kind {
            BatchKind::Pooled | BatchKind::AllTokens => self.hidden_size,
            BatchKind::Predict => self.num_labels,
        }
    }
}

/// Result of one forward pass, with when it ran so requests can report queue vs inference time.
#[derive(Debug)]
pub struct Output {
    pub matrix: Matrix,
    pub started: Instant,
    pub duration: Duration,
}

/// A forward pass's result, with the batch handed back so that a failed batch can be re-run
/// in parts.
#[derive(Debug)]
pub struct Ran {
    pub batch: Batch,
    pub result: Result<Output, BackendError>,
}

pub type ForwardReply = oneshot::Sender<Ran>;

enum Command {
    Forward {
        kind: BatchKind,
        batch: Batch,
        reply: ForwardReply,
        /// Released as soon as the backend thread picks the batch up.
        slot: OwnedSemaphorePermit,
    },
    Health(oneshot::Sender<Result<(), BackendError>>),
}

/// The right to hand a lane's backend thread its next batch. Each thread has one such slot,
/// freed when the thread starts a batch, so exactly one batch waits while another runs (the
/// prefetch), and it is packed as late as possible. Health checks do not need a slot, so they
/// never wait behind an idle batching task.
pub struct Slot {
    permit: OwnedSemaphorePermit,
    tx: mpsc::UnboundedSender<Command>,
}

impl Slot {
    pub fn send(self, kind: BatchKind, batch: Batch, reply: ForwardReply) {
        // If the thread is gone the command (and `reply`) is dropped: the waiter sees
        // `Stopped`.
        let _ = self.tx.send(Command::Forward {
            kind,
            batch,
            reply,
            slot: self.permit,
        });
    }
}

/// The way to one backend thread: its command channel and its one-batch slot.
#[derive(Clone)]
struct LaneChannel {
    tx: mpsc::UnboundedSender<Command>,
    slots: Arc<Semaphore>,
}

impl LaneChannel {
    fn new(tx: mpsc::UnboundedSender<Command>) -> Self {
        Self {
            tx,
            slots: Arc::new(Semaphore::new(1)),
        }
    }

    async fn reserve(&self) -> Result<Slot, BackendError> {
        if self.tx.is_closed() {
            return Err(BackendError::Stopped);
        }
        let permit = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| BackendError::Stopped)?;
        Ok(Slot {
            permit,
            tx: self.tx.clone(),
        })
    }
}

/// Cheap, cloneable handle the async side uses to reach the backend threads.
#[derive(Clone)]
pub struct BackendHandle {
    bulk: LaneChannel,
    /// `None` when the runtime has no interactive lane: one thread serves both lanes.
    interactive: Option<LaneChannel>,
}

/// What a [`BackendFactory`] loads.
pub struct LoadedBackend {
    pub info: ModelInfo,
    /// Runs bulk batches and health checks, on the thread that built it.
    pub bulk: Box<dyn Backend>,
    /// Runs interactive batches on a second thread, at the same time as `bulk`; `None` when
    /// the runtime has no interactive lane (or it is turned off).
    pub interactive: Option<Box<dyn Backend + Send>>,
}

/// Builds the backend on the backend thread (a Python object must be created where it is used).
pub type BackendFactory = Box<dyn FnOnce() -> Result<LoadedBackend, BackendError> + Send>;

/// The backend threads; join them after the handle and all its clones are dropped.
pub struct BackendThreads(Vec<JoinHandle<()>>);

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

/// One backend thread's life: run what its lane sends until every handle is gone.
fn serve_lane(
    mut backend: Box<dyn Backend>,
    mut rx: mpsc::UnboundedReceiver<Command>,
    wait: WaitPolicy,
) {
    // Waiting here holds no interpreter lock: the Python backend attaches only inside
    // `forward` / `health`.
    while let Some(cmd) = next_message(&mut rx, wait) {
        match cmd {
            Command::Forward {
                kind,
                batch,
                reply,
                slot,
            } => {
                drop(slot);
                let started = Instant::now();
                let result = guarded(|| backend.forward(kind, &batch));
                let duration = started.elapsed();
                let result = result.map(|matrix| Output {
                    matrix,
                    started,
                    duration,
                });
                let _ = reply.send(Ran { batch, result });
            }
            Command::Health(reply) => {
                let _ = reply.send(guarded(|| backend.health()));
            }
        }
    }
    tracing::debug!("backend thread stopping");
}

type Ready = Result<(ModelInfo, Option<Box<dyn Backend + Send>>), BackendError>;

impl BackendHandle {
    /// Starts the backend thread, waits for the model to load, starts the interactive lane's
    /// thread if the factory built one, and returns the handle, the model's info and the
    /// threads. The threads sleep as soon as they have nothing to do.
    pub fn spawn(
        factory: BackendFactory,
    ) -> Result<(BackendHandle, ModelInfo, BackendThreads), BackendError> {
        Self::spawn_with(factory, WaitPolicy::default())
    }

    /// [`BackendHandle::spawn`], with the threads waiting for work as `wait` says.
    pub fn spawn_with(
        factory: BackendFactory,
        wait: WaitPolicy,
    ) -> Result<(BackendHandle, ModelInfo, BackendThreads), BackendError> {
        let (tx, rx) = mpsc::unbounded_channel::<Command>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Ready>();
        let bulk_thread = spawn_named("model-backend", move || match factory() {
            Ok(LoadedBackend {
                info,
                bulk,
                interactive,
            }) => {
                let _ = ready_tx.send(Ok((info, interactive)));
                serve_lane(bulk, rx, wait);
            }
            Err(err) => {
                let _ = ready_tx.send(Err(err));
            }
        })?;
        let (info, interactive) = match ready_rx.recv() {
            Ok(Ok(loaded)) => loaded,
            Ok(Err(err)) => {
                let _ = bulk_thread.join();
                return Err(err);
            }
            Err(_) => {
                let _ = bulk_thread.join();
                return Err(BackendError::Start(
                    "the backend thread panicked while loading".into(),
                ));
            }
        };
        info.validate()?;
        let mut threads = vec![bulk_thread];
        let interactive = match interactive {
            None => None,
            Some(backend) => {
                let (tx, rx) = mpsc::unbounded_channel::<Command>();
                threads.push(spawn_named("model-interactive", move || {
                    serve_lane(backend, rx, wait)
                })?);
                Some(LaneChannel::new(tx))
            }
        };
        let handle = BackendHandle {
            bulk: LaneChannel::new(tx),
            interactive,
        };
        Ok((handle, info, BackendThreads(threads)))
    }

    /// Whether interactive batches have their own thread (else they share the bulk one).
    pub fn has_interactive_lane(&self) -> bool {
        self.interactive.is_some()
    }

    /// Waits until `lane`'s thread (the only thread, without an interactive lane) can take
    /// the next batch.
    pub async fn reserve(&self, lane: Lane) -> Result<Slot, BackendError> {
        match (lane, &self.interactive) {
            (Lane::Interactive, Some(interactive)) => interactive.reserve().await,
            _ => self.bulk.reserve().await,
        }
    }

    pub async fn health(&self) -> Result<(), BackendError> {
        let (reply, rx) = oneshot::channel();
        self.bulk
            .tx
            .send(Command::Health(reply))
            .map_err(|_| BackendError::Stopped)?;
        rx.await.map_err(|_| BackendError::Stopped)?
    }
}

/// A panic inside one forward pass must fail that batch, not take the server down.
fn guarded<T>(f: impl FnOnce() -> Result<T, BackendError>) -> Result<T, BackendError> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let msg = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        tracing::error!("backend panicked: {msg}");
        Err(BackendError::Inference(format!("backend panicked: {msg}")))
    })
}

#[cfg(test)]
mod tests;
