//! What the runtime tells the router about the loaded model ([`ModelInfo`]).

use super::contract::{BackendError, BatchKind};
use super::image_steps::ImageSteps;
use crate::tokenization::{PairTemplate, TextPadding};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

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
    /// LoRA adapter name -> index (1-based; 0 is the base weights), every adapter the model
    /// loaded: a request selects one by name (`model: NAME`) and each of its tokens carries
    /// the index in its type id, `index * adapter_type_stride + its own type`.
    #[serde(default)]
    pub lora_adapters: Option<HashMap<String, u32>>,
    /// See `lora_adapters`; default 1.
    #[serde(default)]
    pub adapter_type_stride: Option<u32>,
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
    /// Set for models that also embed images (CLIP, SigLIP): the pixels each image becomes.
    #[serde(default)]
    pub image_input: Option<ImageInput>,
    /// Set for models trained on padded texts (SigLIP): every text, after truncation, is padded
    /// to the same length with a pad token.
    #[serde(default)]
    pub text_padding: Option<TextPadding>,
    /// Set for late-interaction (ColBERT) models: the rules that make an input's tokens
    /// (`/embed_multivector`); `embed_all` then gives one normalized vector per token.
    #[serde(default)]
    pub late_interaction: Option<LateInteraction>,
}

/// A late-interaction (ColBERT, PyLate) model's rules (`Backend.info()`'s
/// `late_interaction`; trt_tei_runtime/late_interaction.py): prefix token ids (none for an
/// empty prefix), each input type's length in tokens, query expansion with the mask token,
/// the document skiplist, the vectors' width.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LateInteraction {
    pub query_prefix_id: Option<u32>,
    pub document_prefix_id: Option<u32>,
    pub query_length: usize,
    pub document_length: usize,
    pub expand_queries: bool,
    pub attend_to_expansion: bool,
    pub mask_token_id: u32,
    pub skiplist_ids: Vec<u32>,
    pub embedding_size: usize,
}

/// What one image becomes before the model sees it (`Backend.info()`'s `image_input`): a
/// float32 `[channels, height, width]` array, costing `tokens_per_image` tokens of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ImageInput {
    pub height: usize,
    pub width: usize,
    pub channels: usize,
    pub patch_size: usize,
    pub tokens_per_image: usize,
    /// The processor's steps; absent from a runtime that does not list them, whose images
    /// are then always preprocessed by the runtime.
    #[serde(default)]
    pub steps: Option<ImageSteps>,
}

impl ModelInfo {
    /// Every key of the contract, in the struct's order.
    pub const FIELDS: [&'static str; 23] = [
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
        "lora_adapters",
        "adapter_type_stride",
        "dtype",
        "device",
        "interactive_lane",
        "devices",
        "image_input",
        "text_padding",
        "late_interaction",
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
        if let Some(late) = &self.late_interaction {
            let prefixed = |p: Option<u32>| usize::from(p.is_some());
            if late.query_length < 2 + prefixed(late.query_prefix_id)
                || late.document_length < 2 + prefixed(late.document_prefix_id)
                || late.query_length.max(late.document_length) > self.max_input_length
            {
                return fail(format!(
                    "late_interaction lengths ({}, {}) must hold the special and prefix tokens \
                     and be at most max_input_length {}",
                    late.query_length, late.document_length, self.max_input_length
                ));
            }
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
            BatchKind::Pooled | BatchKind::AllTokens | BatchKind::Images => Some(self.hidden_size),
            BatchKind::Predict => Some(self.num_labels),
            BatchKind::Sparse => None,
            BatchKind::MaxSim => Some(1),
        }
    }
}
