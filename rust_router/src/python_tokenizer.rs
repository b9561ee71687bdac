//! `trt_tei_runtime._router.FlatTokenizer`: tokenization for the Python runtime's own batches
//! (`Model.embed`, `Model.predict`, corpus jobs) by the router's own encode rules (prompts,
//! pair templates, adapters, truncation, the model's limit), with none of its HTTP layer.
//!
//! The Python `tokenizers` package hands back one `Encoding` per text, and reading `.ids`
//! makes a Python int per token while holding the interpreter lock, which the threads that
//! launch kernels need. This returns each batch's ids as flat buffers instead (all tokens end
//! to end, their type ids, and each input's length), built with the lock released.

use crate::tokenization::{
    load_tokenizer, ChunkError, Chunking, EncodeOptions, EncodingInput, InlinePool, PairTemplate,
    TokenizationError, TokenizerConfig, TruncationDirection, ValidEncoding,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::HashMap;
use std::path::Path;
use tokenizers::Tokenizer;

#[pyclass(frozen, module = "trt_tei_runtime._router")]
pub struct FlatTokenizer {
    /// The vocabulary, for lookups (`token_to_id`, `id_to_token`, `encode_plain`).
    tokenizer: Tokenizer,
    /// The router's encode rules, run on the calling thread (and `tokenizers`' thread pool).
    encoders: InlinePool,
}

/// Token ids end to end, their type ids (empty when all are 0), and the length of each input,
/// all little-endian u32.
type FlatBuffers = (Vec<u8>, Vec<u8>, Vec<u8>);

/// `FlatBuffers` as Python bytes.
type FlatBytes<'py> = (
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
);

/// An input that failed: its index, and why.
type Failure = (usize, TokenizationError);

/// What an input that produces no tokens gets from the router: here an empty sequence, which
/// the caller reports (corpus jobs count it as a bad row).
fn no_tokens() -> TokenizationError {
    TokenizationError::Tokenizer("the input produced no tokens".into())
}

impl FlatTokenizer {
    fn encode_all(
        &self,
        inputs: Vec<EncodingInput>,
        opts: &EncodeOptions,
    ) -> Result<FlatBuffers, Failure> {
        let encoded =
            self.encoders
                .encode_batch(inputs, opts)
                .into_iter()
                .map(|result| match result {
                    Err(e) if e == no_tokens() => Ok(None),
                    other => other.map(Some),
                });
        let mut total = 0;
        let mut own = Vec::with_capacity(encoded.len());
        for (index, result) in encoded.enumerate() {
            let encoding = result.map_err(|e| (index, e))?;
            total += encoding.as_ref().map_or(0, |e| e.input_ids.len());
            own.push(encoding);
        }
        Ok(flat(&own, total))
    }

    /// Every text's windows (`long_input: chunk`) end to end as `encode_all` lays out
    /// sequences, then each text's window count and each window's weight (u32 LE).
    fn encode_windows_all(
        &self,
        texts: Vec<String>,
        opts: &EncodeOptions,
    ) -> Result<(FlatBuffers, Vec<u8>, Vec<u8>), Failure> {
        let mut sequences = Vec::new();
        let mut total = 0;
        let mut counts = Vec::with_capacity(4 * texts.len());
        let mut weights = Vec::new();
        for (index, text) in texts.into_iter().enumerate() {
            let windows = self
                .encoders
                .encode_windows(EncodingInput::Single(text), opts)
                .map_err(|e| (index, e))?;
            counts.extend_from_slice(&(windows.len() as u32).to_le_bytes());
            for window in windows {
                weights.extend_from_slice(&(window.weight as u32).to_le_bytes());
                total += window.encoding.input_ids.len();
                sequences.push(Some(window.encoding));
            }
        }
        Ok((flat(&sequences, total), counts, weights))
    }

    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<EncodingInput>,
        opts: EncodeOptions,
    ) -> PyResult<FlatBytes<'py>> {
        let (ids, type_ids, lengths) = py
            .detach(|| self.encode_all(inputs, &opts))
            .map_err(to_py_error)?;
        Ok((
            PyBytes::new(py, &ids),
            PyBytes::new(py, &type_ids),
            PyBytes::new(py, &lengths),
        ))
    }
}

/// Sequences end to end as [`FlatBuffers`] (`None`: an input of no tokens, length 0); `total`:
/// their token count.
fn flat(own: &[Option<ValidEncoding>], total: usize) -> FlatBuffers {
    // Type ids are all zeros unless an adapter or a pair sets them: then none are sent.
    let typed = own
        .iter()
        .flatten()
        .any(|e| e.token_type_ids.iter().any(|&t| t != 0));
    let mut ids = Vec::with_capacity(4 * total);
    let mut type_ids = Vec::with_capacity(if typed { 4 * total } else { 0 });
    let mut lengths = Vec::with_capacity(4 * own.len());
    for encoding in own.iter().flatten() {
        for id in &encoding.input_ids {
            ids.extend_from_slice(&id.to_le_bytes());
        }
        if typed {
            for id in &encoding.token_type_ids {
                type_ids.extend_from_slice(&id.to_le_bytes());
            }
        }
    }
    for encoding in own {
        let n = encoding.as_ref().map_or(0, |e| e.input_ids.len()) as u32;
        lengths.extend_from_slice(&n.to_le_bytes());
    }
    (ids, type_ids, lengths)
}

/// A `ValueError` whose args are `(message, kind, index, given)`: `kind` is "too_long" (then
/// `given` is the input's token count), "unknown_prompt", "too_many_chunks" (`given`: the
/// windows it needs), "chunk_overlap" or "tokenizer".
fn to_py_error((index, error): Failure) -> PyErr {
    let (kind, given) = match &error {
        TokenizationError::TooLong { given, .. } => ("too_long", Some(*given)),
        TokenizationError::UnknownPrompt { .. } => ("unknown_prompt", None),
        TokenizationError::Chunk(ChunkError::TooManyChunks { needed, .. }) => {
            ("too_many_chunks", Some(*needed))
        }
        TokenizationError::Chunk(ChunkError::OverlapTooLarge { .. }) => ("chunk_overlap", None),
        _ => ("tokenizer", None),
    };
    PyValueError::new_err((error.to_string(), kind, index, given))
}

fn direction(left: bool) -> TruncationDirection {
    if left {
        TruncationDirection::Left
    } else {
        TruncationDirection::Right
    }
}

#[pymethods]
impl FlatTokenizer {
    /// Loads `tokenizer.json` without its own truncation and padding, for a model whose
    /// limit is `max_length` tokens (special tokens included), with the router's view of
    /// the model: its named prompts and default prompt name, its pair template (decoder
    /// rerankers) and its adapters (prompt name -> adapter index, the type id of each token).
    #[new]
    #[pyo3(signature = (
        path, max_length, prompts = None, default_prompt_name = None, pair_template = None,
        adapters = None,
    ))]
    fn new(
        path: &str,
        max_length: usize,
        prompts: Option<HashMap<String, String>>,
        default_prompt_name: Option<String>,
        pair_template: Option<(String, String, String, Vec<u32>)>,
        adapters: Option<HashMap<String, u32>>,
    ) -> PyResult<Self> {
        let tokenizer =
            load_tokenizer(Path::new(path)).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let prompts = prompts.unwrap_or_default();
        let adapters = adapters.unwrap_or_default();
        // As the router's server resolves the model's default prompt name.
        let default_prompt = match &default_prompt_name {
            None => None,
            Some(name) => Some(prompts.get(name).cloned().ok_or_else(|| {
                let mut names: Vec<&String> = prompts.keys().collect();
                names.sort();
                PyValueError::new_err(format!(
                    "default prompt name `{name}` is not a prompt of this model; available: \
                     {names:?}"
                ))
            })?),
        };
        let default_adapter = default_prompt_name
            .and_then(|name| adapters.get(&name).copied())
            .unwrap_or(0);
        let pair_template = pair_template.map(
            |(before_query, between, after_document, suffix_ids)| PairTemplate {
                before_query,
                between,
                after_document,
                suffix_ids,
            },
        );
        let config = TokenizerConfig {
            max_input_length: max_length,
            position_offset: 0,
            prompts,
            default_prompt,
            pair_template,
            adapters,
            default_adapter,
            // The runtime adds a LoRA adapter's index to the type ids itself.
            adapter_type_stride: 1,
            // The runtime pads texts itself (`TextTokenizer`'s `padding`).
            text_padding: None,
        };
        let encoders = InlinePool::new(tokenizer.clone(), config);
        Ok(Self {
            tokenizer,
            encoders,
        })
    }

    /// `(ids, type_ids, lengths)` of each text as the router encodes a text to embed: the
    /// prompt `prompt_name` names (default: the model's default prompt) before it, special
    /// tokens added, cut at the model's limit (`truncate`, from the `left` or the right) or
    /// else refused when longer; the type ids carry the prompt's adapter, if the model has
    /// adapters. A text of no tokens has length 0.
    #[pyo3(signature = (texts, prompt_name = None, truncate = true, left = false))]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        prompt_name: Option<String>,
        truncate: bool,
        left: bool,
    ) -> PyResult<FlatBytes<'py>> {
        let opts = EncodeOptions {
            truncate,
            direction: direction(left),
            prompt_name,
            apply_prompts: true,
            inline: true,
            adapter: None,
            chunking: None,
        };
        if texts.is_empty() {
            // The prompt name is checked all the same.
            if let Err(e) = self.encoders.config().prompt(&opts) {
                return Err(to_py_error((0, e)));
            }
        }
        let inputs = texts.into_iter().map(EncodingInput::Single).collect();
        self.run(py, inputs, opts)
    }

    /// `long_input: chunk` as the router applies it (`tokenization::chunk`): `(ids, type_ids,
    /// lengths)` of every window of every text, end to end, then each text's window count and
    /// each window's weight (its own tokens of the text), all little-endian u32.
    #[pyo3(signature = (texts, prompt_name = None, overlap = 0, max_chunks = 64))]
    fn encode_windows<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        prompt_name: Option<String>,
        overlap: usize,
        max_chunks: usize,
    ) -> PyResult<(FlatBytes<'py>, Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        let opts = EncodeOptions {
            chunking: Some(Chunking {
                overlap,
                max_chunks,
            }),
            prompt_name,
            apply_prompts: true,
            inline: true,
            ..EncodeOptions::default()
        };
        if let Err(e) = self.encoders.config().prompt(&opts) {
            return Err(to_py_error((0, e)));
        }
        let ((ids, type_ids, lengths), counts, weights) = py
            .detach(|| self.encode_windows_all(texts, &opts))
            .map_err(to_py_error)?;
        let flat = (
            PyBytes::new(py, &ids),
            PyBytes::new(py, &type_ids),
            PyBytes::new(py, &lengths),
        );
        Ok((flat, PyBytes::new(py, &counts), PyBytes::new(py, &weights)))
    }

    /// `(ids, type_ids, lengths)` of each input as the router encodes one to score: a text as
    /// given, a `(query, document)` pair with the model's pair template if it has one, else
    /// as the tokenizer encodes pairs; cut or refused as `encode` does.
    #[pyo3(signature = (inputs, truncate = true, left = false))]
    fn encode_pairs<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<(String, Option<String>)>,
        truncate: bool,
        left: bool,
    ) -> PyResult<FlatBytes<'py>> {
        let opts = EncodeOptions {
            truncate,
            direction: direction(left),
            prompt_name: None,
            apply_prompts: false,
            inline: true,
            adapter: None,
            chunking: None,
        };
        let inputs = inputs
            .into_iter()
            .map(|(a, b)| match b {
                Some(b) => EncodingInput::Pair(a, b),
                None => EncodingInput::Single(a),
            })
            .collect();
        self.run(py, inputs, opts)
    }

    /// The adapter index (the type id of every token) the router gives a text embedded with
    /// `prompt_name` (default: the model's default prompt); 0 without adapters, and for a
    /// name that is not a prompt of the model.
    #[pyo3(signature = (prompt_name = None))]
    fn adapter(&self, prompt_name: Option<String>) -> u32 {
        let opts = EncodeOptions {
            truncate: true,
            prompt_name,
            apply_prompts: true,
            inline: true,
            ..EncodeOptions::default()
        };
        self.encoders.config().adapter(&opts).unwrap_or(0)
    }

    /// The id of one vocabulary token (added tokens included), or None.
    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The vocabulary token of one id, or None.
    fn id_to_token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    /// Token ids of `text` without special tokens added and without truncation.
    fn encode_plain(&self, py: Python<'_>, text: String) -> PyResult<Vec<u32>> {
        py.detach(|| self.tokenizer.encode_fast(text, false))
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}
