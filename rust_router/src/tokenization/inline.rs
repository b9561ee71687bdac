//! Encoding on the calling thread, for small requests (`super::INLINE_MAX_BYTES`) and the
//! warming step: no pool thread, no hand-off.

use super::{
    EncodeConfig, EncodeOptions, Encoder, EncodingInput, TokenizationError, ValidEncoding,
};
use std::sync::{Arc, Mutex};
use tokenizers::Tokenizer;

/// Idle [`Encoder`]s for inline encoding: taken for one encode, then put back. There are never
/// more of them than callers that encoded inline at the same time (at most the tokio workers).
pub(super) struct InlinePool {
    pub(super) tokenizer: Tokenizer,
    pub(super) config: Arc<EncodeConfig>,
    pub(super) idle: Mutex<Vec<Encoder>>,
}

impl InlinePool {
    fn take(&self) -> Encoder {
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        idle.unwrap_or_else(|| Encoder::new(self.tokenizer.clone(), self.config.clone()))
    }

    fn put(&self, worker: Encoder) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(worker);
        }
    }

    /// Encodes on the calling thread with an idle worker, which goes back to the pool last:
    /// the next inline encode takes it.
    pub(super) fn encode(
        &self,
        input: EncodingInput,
        opts: &EncodeOptions,
    ) -> Result<ValidEncoding, TokenizationError> {
        let mut worker = self.take();
        let result = worker.encode(input, opts);
        self.put(worker);
        result
    }
}
