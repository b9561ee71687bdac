//! Wire types of `/info` and `/health`: the model, the router's settings, the devices.

use crate::backend::{DeviceStatus, ImageInput, LateInteraction};
use crate::tokenization::LongInput;
use serde::Serialize;
use std::collections::BTreeMap;
use utoipa::ToSchema;

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EmbeddingModel {
    #[schema(example = "mean")]
    pub pooling: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ClassifierModel {
    pub id2label: BTreeMap<String, String>,
    pub label2id: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ModelTypeInfo {
    Classifier(ClassifierModel),
    Embedding(EmbeddingModel),
    Reranker(ClassifierModel),
}

/// `/info`: TEI's fields, plus the prompts the model defines.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Info {
    pub model_id: String,
    pub model_sha: Option<String>,
    pub model_dtype: String,
    pub model_type: ModelTypeInfo,
    pub served_model_name: String,
    pub max_concurrent_requests: usize,
    pub max_input_length: usize,
    pub max_batch_tokens: usize,
    pub max_batch_requests: Option<usize>,
    pub max_client_batch_size: usize,
    pub auto_truncate: bool,
    /// What an over-long input gets when its request says neither `long_input` nor
    /// `truncate` (`--long-input`).
    pub long_input: LongInput,
    /// Most windows one input is cut into under `long_input: chunk` (`--max-chunks`).
    pub max_chunks: u32,
    pub tokenization_workers: usize,
    pub hidden_size: usize,
    pub prompts: BTreeMap<String, String>,
    pub version: &'static str,
    pub sha: Option<&'static str>,
    pub docker_label: Option<&'static str>,
    /// Every device the server runs on, filled in when `/info` is asked.
    pub devices: Vec<DeviceInfo>,
    /// Set when the model also embeds images (CLIP, SigLIP): the size each image is resized
    /// to and the tokens of a batch it costs. Absent for text-only models.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_input: Option<ImageInput>,
    /// Set for late-interaction (ColBERT) models, which give several vectors per input
    /// (`/embed_multivector`, and `/rerank` by MaxSim): their query and document rules.
    /// Absent for single-vector models.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multivector: Option<LateInteraction>,
}

/// One device in `/info`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeviceInfo {
    /// Its position in the runtime's `info()["devices"]`: the `device=` it is called with and,
    /// with several devices, the `device` label of the `te_batch_*` metrics.
    pub index: usize,
    /// The runtime's name for it; names may repeat (`cpu`, `cpu`).
    #[schema(example = "cuda:0")]
    pub name: String,
    /// `false` once the device failed (the runtime raised `DeviceError`): it takes no more
    /// batches.
    pub healthy: bool,
    /// Forward passes that returned a result.
    pub batches: u64,
    /// Forward passes that raised.
    pub failed_batches: u64,
    /// Why the device failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl From<DeviceStatus> for DeviceInfo {
    fn from(d: DeviceStatus) -> Self {
        Self {
            index: d.index,
            name: d.name,
            healthy: d.healthy,
            batches: d.batches,
            failed_batches: d.failed_batches,
            error: d.error,
        }
    }
}

/// `/health`'s 200 body while some device fails and another serves (with every device
/// healthy the body is empty). Only names: the errors are in the log and in `/info`.
#[derive(Debug, Serialize, ToSchema)]
pub struct HealthDegraded {
    #[schema(example = "degraded")]
    pub status: &'static str,
    pub unhealthy_devices: Vec<DeviceRef>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DeviceRef {
    pub index: usize,
    #[schema(example = "cuda:1")]
    pub name: String,
    /// The model whose device it is (only when several models are served).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}
