//! The boundary between the router and the model runtime.
//!
//! A [`Backend`] runs one packed batch at a time on a dedicated OS thread
//! ([`BackendHandle::spawn`]): tokio workers never touch the GIL, and the runtime sees one
//! caller per lane. Each device the runtime serves (`info()["devices"]`, one when it lists
//! none) is an executor of its own ([`executor`]): a thread for bulk batches and health checks
//! (device 0's is the thread that loaded the model), and, when the runtime has an interactive
//! lane, a second thread for small requests, so a query never waits for a corpus batch's
//! forward pass to end before its own can start. A device whose runtime raises `DeviceError`
//! is taken out of service ([`device`]); the others keep serving.

pub mod device;
mod executor;
#[cfg(test)]
pub(crate) mod fake;
#[cfg(feature = "pyo3")]
pub mod python;
pub mod wait;

pub use device::{DeviceFailure, DeviceStatus, Health};
pub use executor::{
    BackendFactory, BackendHandle, BackendThreads, DeviceBackends, ForwardReply, LoadedBackend,
    Output, Ran, Slot,
};

use crate::tokenization::PairTemplate;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

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
    /// A batch of no sequences, ready for [`Batch::push_sequence`].
    pub fn empty() -> Self {
        Self {
            cu_seqlens: vec![0],
            ..Default::default()
        }
    }

    /// Appends one sequence: its token ids, type ids and positions, of equal length.
    pub fn push_sequence(
        &mut self,
        input_ids: &[u32],
        token_type_ids: &[u32],
        position_ids: &[u32],
    ) {
        self.input_ids.extend_from_slice(input_ids);
        self.token_type_ids.extend_from_slice(token_type_ids);
        self.position_ids.extend_from_slice(position_ids);
        self.cu_seqlens.push(self.input_ids.len() as u32);
    }

    pub fn num_seqs(&self) -> usize {
        self.cu_seqlens.len().saturating_sub(1)
    }

    pub fn num_tokens(&self) -> usize {
        self.input_ids.len()
    }

    /// A batch of only the sequences at `seqs` (ascending indices), packed again.
    pub fn select(&self, seqs: &[usize]) -> Batch {
        let mut out = Batch::empty();
        for &i in seqs {
            let (a, b) = (self.cu_seqlens[i] as usize, self.cu_seqlens[i + 1] as usize);
            out.push_sequence(
                &self.input_ids[a..b],
                &self.token_type_ids[a..b],
                &self.position_ids[a..b],
            );
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
    /// SPLADE sparse vectors, `[n_seqs, 2k]`: per row k (vocabulary index, value) pairs, the
    /// index an integral float, in index order; a pair of value 0 is padding. k varies from
    /// batch to batch.
    Sparse,
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
    /// The device itself failed (the runtime raised `DeviceError`): the batch is lost and the
    /// device takes no more work. Never re-run apart: no input is to blame.
    #[error("the device running this request failed: {0}")]
    Device(String),
    /// A device that had failed gave back a batch it was handed before; it runs elsewhere.
    #[error("the device failed before this batch ran")]
    Refused,
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

    /// Whether [`Backend::launch`] returns before its batch has run (a GPU runtime): the
    /// bulk thread then starts the next batch before it reads this one back.
    fn pipelines(&self) -> bool {
        false
    }

    /// Starts a batch and returns once the device holds its work; [`Launched::finish`]
    /// reads its result. By default the whole pass runs here.
    fn launch(&mut self, kind: BatchKind, batch: &Batch) -> Result<Launched, BackendError> {
        self.forward(kind, batch).map(Launched::done)
    }

    /// Runs the host side of the lane's last query again without the device, so that the
    /// next query finds its code and data in the CPU's caches; the interactive thread calls
    /// it while it spins between queries (`--query-warm-us`). Errors are the next query's to
    /// report. By default nothing.
    fn warm(&mut self) {}
}

/// A batch started by [`Backend::launch`], its result not read yet.
pub struct Launched(Box<dyn FnOnce() -> Result<Matrix, BackendError> + Send>);

impl Launched {
    pub fn new(finish: impl FnOnce() -> Result<Matrix, BackendError> + Send + 'static) -> Self {
        Self(Box::new(finish))
    }

    /// A batch that has run already: `finish` returns `matrix`.
    pub fn done(matrix: Matrix) -> Self {
        Self::new(move || Ok(matrix))
    }

    /// Waits for the batch and returns its result.
    pub fn finish(self) -> Result<Matrix, BackendError> {
        (self.0)()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelType {
    Embedding,
    Classifier,
    Reranker,
    /// A SPLADE model: sparse vectors over the vocabulary (`/embed_sparse`).
    Sparse,
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
    /// `embedding`, `classifier`, `reranker` (a classifier with one label) or `sparse` (SPLADE).
    pub model_type: ModelType,
    /// The `tokenizer.json` the router tokenizes with.
    pub tokenizer_path: String,
    /// Longest input in tokens (after special tokens), the model's own limit.
    pub max_input_length: usize,
    /// The checkpoint's architecture name, for logs.
    #[serde(default)]
    pub architecture: String,
    /// Width of a pooled embedding; also the width of `embed_all` rows. For a sparse model,
    /// the vocabulary size (the dimension of its sparse vectors).
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
    /// Prompt name -> adapter index for models that choose an adapter per request
    /// (jina-embeddings-v3's LoRA tasks): the token type id of every token of such a request.
    #[serde(default)]
    pub adapters: Option<HashMap<String, u32>>,
    /// The weights' dtype and the device, for `/info` and the `x-compute-type` header.
    #[serde(default)]
    pub dtype: Option<String>,
    #[serde(default)]
    pub device: Option<String>,
    /// The runtime's `embed` / `embed_all` / `predict` accept `interactive=True` and may be
    /// called from a second thread while a bulk call runs (on a high-priority CUDA stream).
    #[serde(default)]
    pub interactive_lane: bool,
    /// The devices the runtime runs on, one executor each (`["cuda:0", "cuda:1"]`; names may
    /// repeat, `["cpu", "cpu"]`). With more than one, every call names its device
    /// (`device=i`). Missing, empty or one entry: one device, called without `device=`.
    #[serde(default)]
    pub devices: Option<Vec<String>>,
}

impl ModelInfo {
    /// Every key of the contract, in the struct's order.
    pub const FIELDS: [&'static str; 18] = [
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
        "adapters",
        "dtype",
        "device",
        "interactive_lane",
        "devices",
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
            ModelType::Embedding | ModelType::Sparse if self.hidden_size == 0 => {
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

    /// One name per device the router runs an executor for: `devices`, else the single
    /// `device` (or `default` when the runtime names none).
    pub fn device_names(&self) -> Vec<String> {
        match &self.devices {
            Some(devices) if !devices.is_empty() => devices.clone(),
            _ => vec![self.device.clone().unwrap_or_else(|| "default".into())],
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

    /// Width of one output row for a batch kind; `None` when it varies by batch (sparse).
    pub fn output_cols(&self, kind: BatchKind) -> Option<usize> {
        match kind {
            BatchKind::Pooled | BatchKind::AllTokens => Some(self.hidden_size),
            BatchKind::Predict => Some(self.num_labels),
            BatchKind::Sparse => None,
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_devices;
#[cfg(test)]
mod tests_pipelined;
