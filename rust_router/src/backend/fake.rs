//! A deterministic backend for tests: no Python, no model, same contract.

use super::{
    Backend, BackendError, BackendFactory, Batch, BatchKind, Matrix, ModelInfo, ModelType,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A token id (the word "poison" in the test tokenizer) that makes the fake backend fail the
/// whole batch, like a Python exception would.
pub const POISON_ID: u32 = 20;
pub const HIDDEN: usize = 8;

/// What one forward pass looked like, for tests that check how the queue packed batches.
#[derive(Debug, Clone, PartialEq)]
pub struct SeenBatch {
    pub kind: BatchKind,
    pub num_seqs: usize,
    pub num_tokens: usize,
}

#[derive(Clone)]
pub struct FakeBackend {
    pub info: ModelInfo,
    pub delay: Duration,
    pub healthy: bool,
    pub seen: Arc<Mutex<Vec<SeenBatch>>>,
}

/// Per-token hidden state: any fixed function of (token, position, column) will do, as long as
/// tests can recompute it.
pub fn token_state(id: u32, position: u32, col: usize) -> f32 {
    ((id as f32 + 1.0) * (col as f32 + 1.0)).sin() + 0.01 * position as f32
}

/// Mean of the token states, as a mean-pooling model would return.
pub fn pooled(ids: &[u32], positions: &[u32]) -> Vec<f32> {
    (0..HIDDEN)
        .map(|c| {
            ids.iter()
                .zip(positions)
                .map(|(&i, &p)| token_state(i, p, c))
                .sum::<f32>()
                / ids.len() as f32
        })
        .collect()
}

/// Logits: column `l` is the mean token id scaled per label, so scores differ by input.
pub fn logits(ids: &[u32], num_labels: usize) -> Vec<f32> {
    let mean = ids.iter().map(|&i| i as f32).sum::<f32>() / ids.len() as f32;
    (0..num_labels)
        .map(|l| (mean / 100.0) * (l as f32 + 1.0) - l as f32 * 0.5)
        .collect()
}

impl FakeBackend {
    pub fn info() -> ModelInfo {
        ModelInfo {
            model_type: ModelType::Embedding,
            architecture: "FakeModel".into(),
            model_dir: String::new(),
            tokenizer_path: String::new(),
            hidden_size: HIDDEN,
            max_input_length: 16,
            position_offset: 0,
            pooling: Some("mean".into()),
            num_labels: 0,
            id2label: None,
            score_activation: None,
            prompts: Some([("query".to_string(), "query : ".to_string())].into()),
            default_prompt_name: None,
            pair_template: None,
            dtype: Some("float32".into()),
            device: Some("cpu".into()),
        }
    }

    pub fn classifier_info(num_labels: usize) -> ModelInfo {
        ModelInfo {
            model_type: if num_labels == 1 {
                ModelType::Reranker
            } else {
                ModelType::Classifier
            },
            hidden_size: HIDDEN,
            num_labels,
            pooling: None,
            ..Self::info()
        }
    }

    pub fn new(info: ModelInfo) -> Self {
        Self {
            info,
            delay: Duration::ZERO,
            healthy: true,
            seen: Arc::default(),
        }
    }

    pub fn factory() -> BackendFactory {
        Self::new(Self::info()).into_factory()
    }

    pub fn into_factory(self) -> BackendFactory {
        Box::new(move || {
            let info = self.info.clone();
            Ok((Box::new(self) as Box<dyn Backend>, info))
        })
    }
}

impl Backend for FakeBackend {
    fn health(&mut self) -> Result<(), BackendError> {
        if self.healthy {
            Ok(())
        } else {
            Err(BackendError::Unhealthy("RuntimeError: CUDA error".into()))
        }
    }

    fn forward(&mut self, kind: BatchKind, batch: &Batch) -> Result<Matrix, BackendError> {
        self.seen.lock().unwrap().push(SeenBatch {
            kind,
            num_seqs: batch.num_seqs(),
            num_tokens: batch.num_tokens(),
        });
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        if batch.input_ids.contains(&POISON_ID) {
            return Err(BackendError::Inference("ValueError: poison token".into()));
        }
        let seqs = batch.cu_seqlens.windows(2).map(|w| {
            let (a, b) = (w[0] as usize, w[1] as usize);
            (&batch.input_ids[a..b], &batch.position_ids[a..b])
        });
        let (cols, data): (usize, Vec<f32>) = match kind {
            BatchKind::Pooled => (HIDDEN, seqs.flat_map(|(i, p)| pooled(i, p)).collect()),
            BatchKind::AllTokens => (
                HIDDEN,
                batch
                    .input_ids
                    .iter()
                    .zip(&batch.position_ids)
                    .flat_map(|(&i, &p)| (0..HIDDEN).map(move |c| token_state(i, p, c)))
                    .collect(),
            ),
            BatchKind::Predict => {
                let n = self.info.num_labels;
                (n, seqs.flat_map(|(i, _)| logits(i, n)).collect())
            }
        };
        Ok(Matrix {
            rows: data.len() / cols,
            cols,
            data,
        })
    }
}
