//! `trt_tei_runtime._router.FlatTokenizer`: tokenization for the Python runtime's own batches
//! (`Model.embed`, corpus jobs), with the router's tokenizer and none of its HTTP layer.
//!
//! The Python `tokenizers` package hands back one `Encoding` per text, and reading `.ids`
//! makes a Python int per token while holding the interpreter lock, which the threads that
//! launch kernels need. This returns each batch's ids as two flat buffers instead (all
//! tokens end to end, and each text's length), built with the lock released.

use crate::tokenization::load_tokenizer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::Path;
use tokenizers::{Tokenizer, TruncationParams};

#[pyclass(frozen, module = "trt_tei_runtime._router")]
pub struct FlatTokenizer {
    full: Tokenizer,
    truncating: Tokenizer,
}

/// Token ids end to end and the length of each text, both little-endian u32.
type FlatBuffers = (Vec<u8>, Vec<u8>);

fn encode_flat(
    tokenizer: &Tokenizer,
    texts: Vec<String>,
    prompt: &str,
    add_special_tokens: bool,
) -> Result<FlatBuffers, String> {
    let inputs: Vec<String> = if prompt.is_empty() {
        texts
    } else {
        texts.into_iter().map(|t| format!("{prompt}{t}")).collect()
    };
    let encodings = tokenizer
        .encode_batch(inputs, add_special_tokens)
        .map_err(|e| e.to_string())?;
    let total: usize = encodings.iter().map(|e| e.get_ids().len()).sum();
    let mut ids = Vec::with_capacity(4 * total);
    let mut lengths = Vec::with_capacity(4 * encodings.len());
    for encoding in &encodings {
        for id in encoding.get_ids() {
            ids.extend_from_slice(&id.to_le_bytes());
        }
        let n = u32::try_from(encoding.get_ids().len()).map_err(|e| e.to_string())?;
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
        Ok(Self { full, truncating })
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
        let tokenizer = if truncate {
            &self.truncating
        } else {
            &self.full
        };
        let prompt = prompt.to_string();
        let (ids, lengths) = py
            .detach(move || encode_flat(tokenizer, texts, &prompt, add_special_tokens))
            .map_err(PyValueError::new_err)?;
        Ok((PyBytes::new(py, &ids), PyBytes::new(py, &lengths)))
    }
}
