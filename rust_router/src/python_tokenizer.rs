//! `trt_tei_runtime._router.FlatTokenizer`: tokenization for the Python runtime's own batches
//! (`Model.embed`, corpus jobs), with the router's tokenizer and none of its HTTP layer.
//!
//! The Python `tokenizers` package hands back one `Encoding` per text, and reading `.ids`
//! makes a Python int per token while holding the interpreter lock, which the threads that
//! launch kernels need. This returns each batch's ids as two flat buffers instead (all
//! tokens end to end, and each text's length), built with the lock released.

use crate::tokenization::{load_tokenizer, FastWordPiece};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::Path;
use tokenizers::utils::parallelism::MaybeParallelIterator;
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams};

#[pyclass(frozen, module = "trt_tei_runtime._router")]
pub struct FlatTokenizer {
    full: Tokenizer,
    truncating: Tokenizer,
    /// BERT's tokenizer without its per-character bookkeeping, where the tokenizer is BERT's
    /// (see `tokenization::fast_wordpiece`).
    fast: Option<FastWordPiece>,
}

/// Token ids end to end and the length of each text, both little-endian u32.
type FlatBuffers = (Vec<u8>, Vec<u8>);

/// How `encode_flat` encodes each text: `tokenizer` (truncating or not), and the fast path
/// with the tokenizer's own truncation where there is one.
struct Encoder<'a> {
    tokenizer: &'a Tokenizer,
    fast: Option<&'a FastWordPiece>,
}

impl Encoder<'_> {
    fn ids(&self, text: String, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        let fast = self.fast.filter(|_| add_special_tokens);
        let truncation = self.tokenizer.get_truncation();
        let max_length = truncation.map(|t| t.max_length);
        let direction = truncation.map_or(TruncationDirection::Right, |t| t.direction);
        if let Some(ids) = fast.and_then(|f| f.encode(&text, max_length, direction)) {
            return Ok(ids);
        }
        self.tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }
}

fn encode_flat(
    encoder: &Encoder,
    texts: Vec<String>,
    prompt: &str,
    add_special_tokens: bool,
) -> Result<FlatBuffers, String> {
    let inputs: Vec<String> = if prompt.is_empty() {
        texts
    } else {
        texts.into_iter().map(|t| format!("{prompt}{t}")).collect()
    };
    // In parallel as `tokenizers`' own batches are (unless TOKENIZERS_PARALLELISM says not).
    let encoded = inputs
        .into_maybe_par_iter()
        .map(|text| encoder.ids(text, add_special_tokens))
        .collect::<Result<Vec<Vec<u32>>, String>>()?;
    let total: usize = encoded.iter().map(Vec::len).sum();
    let mut ids = Vec::with_capacity(4 * total);
    let mut lengths = Vec::with_capacity(4 * encoded.len());
    for own in &encoded {
        for id in own {
            ids.extend_from_slice(&id.to_le_bytes());
        }
        let n = u32::try_from(own.len()).map_err(|e| e.to_string())?;
        lengths.extend_from_slice(&n.to_le_bytes());
    }
    Ok((ids, lengths))
}

#[pymethods]
impl FlatTokenizer {
    /// Loads `tokenizer.json` without its own truncation and padding; `max_length` is the
    /// limit `encode(..., truncate=True)` cuts at, special tokens kept.
    #[new]
    fn new(path: &str, max_length: usize) -> PyResult<Self> {
        let load =
            || load_tokenizer(Path::new(path)).map_err(|e| PyValueError::new_err(e.to_string()));
        let full = load()?;
        let mut truncating = load()?;
        truncating
            .with_truncation(Some(TruncationParams {
                max_length,
                ..TruncationParams::default()
            }))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let fast = FastWordPiece::from_tokenizer(&full);
        Ok(Self {
            full,
            truncating,
            fast,
        })
    }

    /// `(ids, lengths)` of `prompt + text` for each text, special tokens added, as bytes of
    /// little-endian u32. Without `truncate` nothing is cut: the caller checks the lengths.
    #[pyo3(signature = (texts, prompt = "", truncate = true, add_special_tokens = true))]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        prompt: &str,
        truncate: bool,
        add_special_tokens: bool,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        let encoder = Encoder {
            tokenizer: if truncate {
                &self.truncating
            } else {
                &self.full
            },
            fast: self.fast.as_ref(),
        };
        let prompt = prompt.to_string();
        let (ids, lengths) = py
            .detach(move || encode_flat(&encoder, texts, &prompt, add_special_tokens))
            .map_err(PyValueError::new_err)?;
        Ok((PyBytes::new(py, &ids), PyBytes::new(py, &lengths)))
    }
}
