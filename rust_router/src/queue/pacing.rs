//! Bulk batches bounded by forward-pass time as well as tokens (`--max-bulk-batch-ms`).

use std::time::Duration;

/// Bulk batches bounded by time as well as tokens, for backends without an interactive lane
/// (the CPU): there a query waits for the bulk batch that runs, and a 16k-token batch takes
/// seconds on a CPU. The token budget of bulk batches follows the device's measured speed so
/// that one takes about `target`; tokens per second stay about the same, since a CPU is as
/// efficient on a few hundred tokens as on thousands.
#[derive(Debug, Clone)]
pub struct BulkPacing {
    target: Duration,
    /// Smoothed tokens per second of the bulk batches run so far.
    tokens_per_s: Option<f64>,
}

/// Bulk batches before the device's speed is known hold at most this many tokens, so the
/// first one cannot hold a query for seconds either.
pub const PACED_FIRST_BATCH_TOKENS: usize = 1024;

/// Paced bulk batches never get a smaller budget than this. A batch's duration has a fixed
/// part (the Python call; on a CPU shared with other busy processes, the thread pool's
/// barriers, measured at ~1 s per batch), so tokens/s measured on tiny batches understates
/// the device and would shrink the next batches further, down to one short document.
pub const PACED_MIN_BATCH_TOKENS: usize = 256;

impl BulkPacing {
    pub fn new(target: Duration) -> Self {
        Self {
            target,
            tokens_per_s: None,
        }
    }

    /// Folds in one bulk batch's size and duration. Weighted towards the latest: the speed
    /// moves with the batch size (small batches run slower on a GPU) and with other load.
    pub fn record(&mut self, tokens: usize, took: Duration) {
        let seconds = took.as_secs_f64();
        if tokens == 0 || seconds <= 0.0 {
            return;
        }
        let rate = tokens as f64 / seconds;
        self.tokens_per_s = Some(match self.tokens_per_s {
            Some(old) => 0.5 * old + 0.5 * rate,
            None => rate,
        });
    }

    /// Tokens of a bulk batch that runs about `target`, within
    /// `[PACED_MIN_BATCH_TOKENS, max_batch_tokens]`.
    pub fn budget(&self, max_batch_tokens: usize) -> usize {
        match self.tokens_per_s {
            Some(rate) => ((rate * self.target.as_secs_f64()) as usize)
                .max(PACED_MIN_BATCH_TOKENS)
                .min(max_batch_tokens),
            None => PACED_FIRST_BATCH_TOKENS.min(max_batch_tokens),
        }
    }
}
