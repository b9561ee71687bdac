//! Encoding on the calling thread, for small requests (`super::INLINE_MAX_BYTES`), the
//! warming step, and the Python runtime's own batches (`crate::python_tokenizer`): no pool
//! thread, no hand-off.

use super::{
    EncodeConfig, EncodeOptions, Encoder, EncodingInput, TokenizationError, TokenizerConfig,
    ValidEncoding, Window,
};
use std::sync::{Arc, Mutex};
use tokenizers::utils::parallelism::MaybeParallelIterator;
use tokenizers::Tokenizer;

/// Inputs one [`Encoder`] takes in turn in [`InlinePool::encode_batch`]: enough that taking
/// and returning it costs little per input, few enough that a batch still spreads over cores.
const BATCH_CHUNK: usize = 16;

/// Idle [`Encoder`]s for inline encoding: taken for one encode (or one chunk of a batch), then
/// put back. There are never more of them than callers that encoded inline at the same time.
pub struct InlinePool {
    tokenizer: Tokenizer,
    config: Arc<EncodeConfig>,
    idle: Mutex<Vec<Encoder>>,
}

impl InlinePool {
    /// The encode rules for `model` with one ready encoder, so the first small request does
    /// not pay for a tokenizer clone.
    pub fn new(tokenizer: Tokenizer, model: TokenizerConfig) -> Self {
        Self::with_config(
            tokenizer.clone(),
            Arc::new(EncodeConfig::new(&tokenizer, model)),
        )
    }

    pub(super) fn with_config(tokenizer: Tokenizer, config: Arc<EncodeConfig>) -> Self {
        let first = Encoder::new(tokenizer.clone(), config.clone());
        Self {
            tokenizer,
            config,
            idle: Mutex::new(vec![first]),
        }
    }

    /// The rules these encoders apply (prompts, adapters), for the Python runtime's checks.
    #[cfg(feature = "pyo3")]
    pub(crate) fn config(&self) -> &EncodeConfig {
        &self.config
    }

    /// Encoders waiting to be taken.
    #[cfg(test)]
    pub(super) fn idle_workers(&self) -> usize {
        self.idle.lock().map_or(0, |idle| idle.len())
    }

    /// A new encoder with these rules, for one more caller (or a pool thread).
    pub(super) fn new_encoder(&self) -> Encoder {
        Encoder::new(self.tokenizer.clone(), self.config.clone())
    }

    fn take(&self) -> Encoder {
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        idle.unwrap_or_else(|| self.new_encoder())
    }

    fn put(&self, worker: Encoder) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(worker);
        }
    }

    /// Encodes on the calling thread with an idle worker, which goes back to the pool last:
    /// the next inline encode takes it.
    pub fn encode(
        &self,
        input: EncodingInput,
        opts: &EncodeOptions,
    ) -> Result<ValidEncoding, TokenizationError> {
        let mut worker = self.take();
        let result = worker.encode(input, opts);
        self.put(worker);
        result
    }

    /// [`Encoder::encode_windows`] on the calling thread, as [`InlinePool::encode`].
    pub fn encode_windows(
        &self,
        input: EncodingInput,
        opts: &EncodeOptions,
    ) -> Result<Vec<Window>, TokenizationError> {
        let mut worker = self.take();
        let result = worker.encode_windows(input, opts);
        self.put(worker);
        result
    }

    /// Encodes every input, in order, on the calling thread and (unless
    /// TOKENIZERS_PARALLELISM says not) the `tokenizers` crate's thread pool, one worker per
    /// chunk of inputs.
    pub fn encode_batch(
        &self,
        inputs: Vec<EncodingInput>,
        opts: &EncodeOptions,
    ) -> Vec<Result<ValidEncoding, TokenizationError>> {
        let mut chunks: Vec<Vec<EncodingInput>> = Vec::new();
        let mut inputs = inputs.into_iter().peekable();
        while inputs.peek().is_some() {
            chunks.push(inputs.by_ref().take(BATCH_CHUNK).collect());
        }
        chunks
            .into_maybe_par_iter()
            .map(|chunk| {
                let mut worker = self.take();
                let out: Vec<_> = chunk.into_iter().map(|i| worker.encode(i, opts)).collect();
                self.put(worker);
                out
            })
            .collect::<Vec<_>>()
            .into_iter()
            .flatten()
            .collect()
    }
}
