//! The boundary between the router and the model runtime.
//!
//! A [`Backend`] runs one packed batch at a time. It lives on ONE dedicated OS thread
//! ([`BackendHandle::spawn`]): the Python runtime is not thread-safe in any useful way, and
//! keeping every interpreter call on one thread means tokio workers never touch the GIL.

#[cfg(test)]
pub(crate) mod fake;
#[cfg(feature = "pyo3")]
pub mod python;

use crate::tokenization::PairTemplate;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

/// One forward pass worth of sequences, packed end to end with no padding.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    pub input_ids: Vec<u32>,
    pub token_type_ids: Vec<u32>,
    pub position_ids: Vec<u32>,
    /// `n_seqs + 1` offsets into the flat arrays, starting at 0.
    pub cu_seqlens: Vec<u32>,
    /// Length of the longest sequence (attention kernels size their tiles with it).
    pub max_length: u32,
}

impl Batch {
    pub fn num_seqs(&self) -> usize {
        self.cu_seqlens.len().saturating_sub(1)
    }

    pub fn num_tokens(&self) -> usize {
        self.input_ids.len()
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
}

/// The engine behind the router. Called only from the backend thread.
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

/// What the runtime tells the router about the loaded model (`Backend.info()` in Python).
#[derive(Debug, Clone, Deserialize)]
pub struct ModelInfo {
    pub model_type: ModelType,
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub model_dir: String,
    pub tokenizer_path: String,
    #[serde(default)]
    pub hidden_size: usize,
    pub max_input_length: usize,
    #[serde(default)]
    pub position_offset: u32,
    #[serde(default)]
    pub pooling: Option<String>,
    #[serde(default)]
    pub num_labels: usize,
    #[serde(default)]
    pub id2label: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub score_activation: Option<ScoreActivation>,
    #[serde(default)]
    pub prompts: Option<HashMap<String, String>>,
    #[serde(default)]
    pub default_prompt_name: Option<String>,
    /// Set for decoder rerankers that score a templated prompt instead of a plain pair.
    #[serde(default)]
    pub pair_template: Option<PairTemplate>,
    #[serde(default)]
    pub dtype: Option<String>,
    #[serde(default)]
    pub device: Option<String>,
}

impl ModelInfo {
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

pub type ForwardReply = oneshot::Sender<Result<Output, BackendError>>;

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

/// The right to hand the backend its next batch. There is one such slot, freed when the
/// backend starts a batch, so exactly one batch waits while another runs (the prefetch), and
/// it is packed as late as possible. Health checks do not need a slot, so they never wait
/// behind an idle batching task.
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

/// Cheap, cloneable handle the async side uses to reach the backend thread.
#[derive(Clone)]
pub struct BackendHandle {
    tx: mpsc::UnboundedSender<Command>,
    slots: Arc<Semaphore>,
}

/// Builds the backend on the backend thread (a Python object must be created where it is used).
pub type BackendFactory =
    Box<dyn FnOnce() -> Result<(Box<dyn Backend>, ModelInfo), BackendError> + Send>;

impl BackendHandle {
    /// Starts the backend thread, waits for the model to load, and returns the handle, the
    /// model's info and the thread (join it after the handle and all clones are dropped).
    pub fn spawn(
        factory: BackendFactory,
    ) -> Result<(BackendHandle, ModelInfo, JoinHandle<()>), BackendError> {
        let (tx, mut rx) = mpsc::unbounded_channel::<Command>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("model-backend".into())
            .spawn(move || {
                let mut backend = match factory() {
                    Ok((backend, info)) => {
                        let _ = ready_tx.send(Ok(info));
                        backend
                    }
                    Err(err) => {
                        let _ = ready_tx.send(Err(err));
                        return;
                    }
                };
                // Waiting here holds no interpreter lock: the Python backend attaches only
                // inside `forward` / `health`.
                while let Some(cmd) = rx.blocking_recv() {
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
                            let _ = reply.send(result.map(|matrix| Output {
                                matrix,
                                started,
                                duration,
                            }));
                        }
                        Command::Health(reply) => {
                            let _ = reply.send(guarded(|| backend.health()));
                        }
                    }
                }
                tracing::debug!("backend thread stopping");
            })
            .map_err(|e| BackendError::Start(format!("cannot spawn the backend thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(info)) => {
                info.validate()?;
                let slots = Arc::new(Semaphore::new(1));
                Ok((BackendHandle { tx, slots }, info, thread))
            }
            Ok(Err(err)) => {
                let _ = thread.join();
                Err(err)
            }
            Err(_) => {
                let _ = thread.join();
                Err(BackendError::Start(
                    "the backend thread panicked while loading".into(),
                ))
            }
        }
    }

    /// Waits until the backend can take the next batch.
    pub async fn reserve(&self) -> Result<Slot, BackendError> {
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

    pub async fn health(&self) -> Result<(), BackendError> {
        let (reply, rx) = oneshot::channel();
        self.tx
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
mod tests {
    use super::fake::{FakeBackend, POISON_ID};
    use super::*;

    fn batch(ids: &[&[u32]]) -> Batch {
        let mut b = Batch {
            cu_seqlens: vec![0],
            ..Default::default()
        };
        for seq in ids {
            b.input_ids.extend_from_slice(seq);
            b.token_type_ids.extend(std::iter::repeat_n(0, seq.len()));
            b.position_ids.extend(0..seq.len() as u32);
            b.cu_seqlens.push(b.input_ids.len() as u32);
            b.max_length = b.max_length.max(seq.len() as u32);
        }
        b
    }

    #[tokio::test]
    async fn thread_runs_batches_and_survives_failures() {
        let (handle, info, thread) = BackendHandle::spawn(FakeBackend::factory()).unwrap();
        assert_eq!(info.model_type, ModelType::Embedding);

        let run = |b: Batch| {
            let handle = handle.clone();
            async move {
                let (tx, rx) = oneshot::channel();
                handle
                    .reserve()
                    .await
                    .unwrap()
                    .send(BatchKind::Pooled, b, tx);
                rx.await.unwrap()
            }
        };
        let out = run(batch(&[&[1, 2], &[3]])).await.unwrap();
        assert_eq!((out.matrix.rows, out.matrix.cols), (2, info.hidden_size));
        let err = run(batch(&[&[1, POISON_ID]])).await.unwrap_err();
        assert!(matches!(err, BackendError::Inference(_)), "{err:?}");
        // The failure did not kill the thread.
        assert!(run(batch(&[&[4]])).await.is_ok());
        assert!(handle.health().await.is_ok());

        drop(handle);
        thread.join().unwrap();
    }

    #[test]
    fn load_failure_is_reported() {
        let factory: BackendFactory = Box::new(|| Err(BackendError::Start("no weights".into())));
        let err = BackendHandle::spawn(factory).err().unwrap();
        assert_eq!(err, BackendError::Start("no weights".into()));
    }

    #[test]
    fn info_validation() {
        let mut info = FakeBackend::info();
        assert!(info.validate().is_ok());
        info.model_type = ModelType::Reranker;
        info.num_labels = 3;
        assert!(info.validate().is_err());
        info.num_labels = 1;
        assert!(info.validate().is_ok());
        assert_eq!(info.activation(), ScoreActivation::Sigmoid);
        assert_eq!(info.label(0), "LABEL_0");
    }
}
