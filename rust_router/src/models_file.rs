//! `--models FILE`: models to serve after the `--model-id`s, each with the options that differ
//! from the command line's for it alone. The file is a YAML list, one entry per model:
//!
//! ```yaml
//! - model_id: BAAI/bge-base-en-v1.5      # required: a hub id or a folder
//!   name: bge                            # default: the id's last path component
//!   pooling: cls
//!   default_prompt_name: query
//!   max_batch_tokens: 8192
//!   long_input: chunk                    # documents over the limit embedded whole
//!   weight: 2                            # its share of a device's backfill time
//! - model_id: BAAI/bge-reranker-base
//!   lora_adapters: {legal: /adapters/legal}
//! ```
//!
//! A key the file does not know, a value of the wrong type or out of range is refused with
//! the file, the entry (`[1]` is the second) and the key, and the line where YAML knows it.

use crate::models::{LoraSpec, ModelSpec};
use crate::tokenization::LongInput;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::Path;

/// The options an entry may set for its model, each overriding the flag of the same name for
/// that model only (`Args::for_model`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelOptions {
    pub revision: Option<String>,
    pub dtype: Option<String>,
    pub pooling: Option<String>,
    pub task: Option<String>,
    pub max_active_dims: Option<u32>,
    /// At most one of the two, as on the command line; either replaces both flags.
    pub default_prompt_name: Option<String>,
    pub default_prompt: Option<String>,
    pub max_batch_tokens: Option<usize>,
    pub max_batch_requests: Option<usize>,
    pub max_client_batch_size: Option<usize>,
    pub auto_truncate: Option<bool>,
    pub long_input: Option<LongInput>,
    pub max_chunks: Option<u32>,
}

/// One model of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct FileModel {
    pub spec: ModelSpec,
    pub options: ModelOptions,
    /// Its own LoRA adapters (`lora_adapters`, name -> folder).
    pub adapters: Vec<LoraSpec>,
    /// Its share of a device that several models' backfills use, against the others' (each
    /// `--model-id` model weighs 1).
    pub weight: f64,
}

/// The models of one `--models` file, in its order.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelsFile {
    pub models: Vec<FileModel>,
}

impl ModelsFile {
    /// Reads and checks `path`: clap's value parser of `--models`, whose errors clap prefixes
    /// with the flag and the path.
    pub fn read(path: &str) -> Result<Self, String> {
        let text =
            std::fs::read_to_string(Path::new(path)).map_err(|e| format!("cannot read it: {e}"))?;
        Self::parse(&text)
    }

    /// The models of a file's text; errors name the entry and key, not the file.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Err(EMPTY.into());
        }
        let entries: Vec<Entry> = serde_norway::from_str(text).map_err(|e| {
            let message = e.to_string();
            let hint = if message.contains("expected a sequence") {
                " (the file is a YAML list: one `- model_id: ...` entry per model)"
            } else {
                ""
            };
            // `.[1].weight` is the root's second entry: `[1].weight`, as our own checks say.
            format!("{}{hint}", message.strip_prefix('.').unwrap_or(&message))
        })?;
        if entries.is_empty() {
            return Err(EMPTY.into());
        }
        let models = entries
            .into_iter()
            .enumerate()
            .map(|(index, entry)| entry.into_model(index))
            .collect::<Result<_, _>>()?;
        Ok(Self { models })
    }
}

const EMPTY: &str = "it lists no model: give a YAML list with one `- model_id: ...` per model";

/// One entry as written; [`Entry::into_model`] checks what types alone cannot.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: Option<String>,
    model_id: String,
    revision: Option<String>,
    dtype: Option<String>,
    pooling: Option<String>,
    task: Option<String>,
    max_active_dims: Option<NonZeroU32>,
    default_prompt_name: Option<String>,
    default_prompt: Option<String>,
    max_batch_tokens: Option<NonZeroUsize>,
    max_batch_requests: Option<NonZeroUsize>,
    max_client_batch_size: Option<NonZeroUsize>,
    auto_truncate: Option<bool>,
    long_input: Option<LongInput>,
    max_chunks: Option<NonZeroU32>,
    #[serde(default)]
    lora_adapters: BTreeMap<String, String>,
    #[serde(default)]
    weight: Weight,
}

/// A positive, finite number; 1 when absent.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(try_from = "f64")]
struct Weight(f64);

impl Default for Weight {
    fn default() -> Self {
        Weight(1.0)
    }
}

impl TryFrom<f64> for Weight {
    type Error = String;

    fn try_from(value: f64) -> Result<Self, String> {
        if value > 0.0 && value.is_finite() {
            Ok(Weight(value))
        } else {
            // serde reports it at its entry, not its key: the message names the key.
            Err(format!("`weight` must be a positive number, got {value}"))
        }
    }
}

impl Entry {
    fn into_model(self, index: usize) -> Result<FileModel, String> {
        let at = |key: &str, e: String| format!("[{index}].{key}: {e}");
        let spec = ModelSpec::named(self.name.as_deref(), &self.model_id).map_err(|e| {
            let key = if self.name.is_some() {
                "name"
            } else {
                "model_id"
            };
            at(key, e)
        })?;
        if self.default_prompt.is_some() && self.default_prompt_name.is_some() {
            return Err(at(
                "default_prompt",
                "give `default_prompt` or `default_prompt_name`, not both".into(),
            ));
        }
        let adapters = self
            .lora_adapters
            .iter()
            .map(|(name, path)| LoraSpec::new(name, path).map_err(|e| at("lora_adapters", e)))
            .collect::<Result<_, _>>()?;
        Ok(FileModel {
            spec,
            adapters,
            weight: self.weight.0,
            options: ModelOptions {
                revision: self.revision,
                dtype: self.dtype,
                pooling: self.pooling,
                task: self.task,
                max_active_dims: self.max_active_dims.map(NonZeroU32::get),
                default_prompt_name: self.default_prompt_name,
                default_prompt: self.default_prompt,
                max_batch_tokens: self.max_batch_tokens.map(NonZeroUsize::get),
                max_batch_requests: self.max_batch_requests.map(NonZeroUsize::get),
                max_client_batch_size: self.max_client_batch_size.map(NonZeroUsize::get),
                auto_truncate: self.auto_truncate,
                long_input: self.long_input,
                max_chunks: self.max_chunks.map(NonZeroU32::get),
            },
        })
    }
}

#[cfg(test)]
#[path = "models_file_tests.rs"]
mod tests;
