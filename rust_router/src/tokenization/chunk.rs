//! What happens to an input longer than the model's limit (`long_input`), and the windowing
//! rule of `long_input: chunk`.
//!
//! The rule (docs/server.md, "Long inputs"; the Python package runs this same code through
//! `FlatTokenizer.encode_windows`): the input is tokenized with its prompt and special tokens; its *content*
//! is what lies between the model's leading and trailing special tokens after the prompt's
//! own tokens. The content is cut into windows of `max_input_length - specials - prompt`
//! tokens, each starting `window - overlap` tokens after the previous one, the last one
//! ending at the content's end. Each window runs as a sequence of its own: the special tokens,
//! the prompt's tokens, the window. The input's vector is the mean of the windows' pooled
//! vectors weighted by each window's content token count, then normalized if asked.

use serde::{de, Deserialize, Deserializer, Serialize};
use serde_json::Value;
use std::ops::Range;

/// The values `long_input` takes, for messages.
const LONG_INPUT_VALUES: &str = "\"error\", \"truncate\" or \"chunk\"";

/// What to do with an input longer than the model's limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LongInput {
    /// Refuse it (422).
    #[default]
    Error,
    /// Cut it at the limit (`truncate: true`).
    Truncate,
    /// Embed it whole, as the weighted mean of windows of the limit's size.
    Chunk,
}

impl LongInput {
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "error" => Some(Self::Error),
            "truncate" => Some(Self::Truncate),
            "chunk" => Some(Self::Chunk),
            _ => None,
        }
    }

    /// For `--long-input`.
    pub fn parse_flag(value: &str) -> Result<Self, String> {
        Self::parse(value).ok_or_else(|| format!("expected {LONG_INPUT_VALUES}, got `{value}`"))
    }
}

impl std::fmt::Display for LongInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Error => "error",
            Self::Truncate => "truncate",
            Self::Chunk => "chunk",
        })
    }
}

impl<'de> Deserialize<'de> for LongInput {
    /// Read by hand so the refusal names the field and every value it takes.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        value.as_str().and_then(Self::parse).ok_or_else(|| {
            de::Error::custom(format!(
                "`long_input` must be {LONG_INPUT_VALUES}, got {value}"
            ))
        })
    }
}

/// How `long_input: chunk` cuts an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunking {
    /// Tokens each window shares with the previous one.
    pub overlap: usize,
    /// At most this many windows per input (`--max-chunks`).
    pub max_chunks: usize,
}

/// Why an input cannot be cut into windows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error(
        "Input validation error: `chunk_overlap` ({overlap}) must be smaller than the window \
         ({window} tokens: the model's limit less its special tokens and the prompt)"
    )]
    OverlapTooLarge { overlap: usize, window: usize },
    #[error(
        "the input needs {needed} windows of {window} tokens, more than `--max-chunks` ({max})"
    )]
    TooManyChunks {
        needed: usize,
        window: usize,
        max: usize,
    },
}

/// The windows `len` content tokens are cut into: `window` tokens each, every one starting
/// `window - overlap` after the last, the last one ending at `len` (and so maybe shorter).
pub fn windows(
    len: usize,
    window: usize,
    chunking: Chunking,
) -> Result<Vec<Range<usize>>, ChunkError> {
    if chunking.overlap >= window {
        return Err(ChunkError::OverlapTooLarge {
            overlap: chunking.overlap,
            window,
        });
    }
    let step = window - chunking.overlap;
    let needed = if len <= window {
        1
    } else {
        1 + (len - window).div_ceil(step)
    };
    if needed > chunking.max_chunks {
        return Err(ChunkError::TooManyChunks {
            needed,
            window,
            max: chunking.max_chunks,
        });
    }
    Ok((0..needed)
        .map(|i| {
            let start = i * step;
            start..(start + window).min(len)
        })
        .collect())
}

/// The mean of `vectors` weighted by `weights` (each window's content token count).
pub fn weighted_mean(vectors: &[Vec<f32>], weights: &[usize]) -> Vec<f32> {
    let total: usize = weights.iter().sum();
    let cols = vectors.first().map_or(0, Vec::len);
    let mut sum = vec![0f64; cols];
    for (vector, &weight) in vectors.iter().zip(weights) {
        for (s, &x) in sum.iter_mut().zip(vector) {
            *s += x as f64 * weight as f64;
        }
    }
    let total = total.max(1) as f64;
    sum.into_iter().map(|s| (s / total) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(len: usize, window: usize, overlap: usize) -> Vec<Range<usize>> {
        let chunking = Chunking {
            overlap,
            max_chunks: 1000,
        };
        windows(len, window, chunking).unwrap()
    }

    #[test]
    fn a_short_input_is_one_window() {
        assert_eq!(cut(5, 10, 0), vec![0..5]);
        assert_eq!(cut(10, 10, 3), vec![0..10]);
    }

    #[test]
    fn windows_without_overlap_tile_the_input() {
        assert_eq!(cut(25, 10, 0), vec![0..10, 10..20, 20..25]);
        assert_eq!(cut(20, 10, 0), vec![0..10, 10..20]);
    }

    #[test]
    fn windows_with_overlap_share_tokens_and_end_at_the_input_end() {
        assert_eq!(cut(25, 10, 4), vec![0..10, 6..16, 12..22, 18..25]);
        assert_eq!(cut(22, 10, 4), vec![0..10, 6..16, 12..22]);
        // Every token is covered, and no window is empty.
        for (len, window, overlap) in [(1000, 510, 0), (1000, 510, 509), (511, 510, 100)] {
            let ranges = cut(len, window, overlap);
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges.last().unwrap().end, len);
            for pair in ranges.windows(2) {
                assert_eq!(pair[1].start, pair[0].end - overlap.min(pair[0].len()));
                assert!(!pair[1].is_empty());
            }
        }
    }

    #[test]
    fn an_overlap_as_large_as_the_window_is_refused() {
        let chunking = Chunking {
            overlap: 10,
            max_chunks: 64,
        };
        assert_eq!(
            windows(25, 10, chunking),
            Err(ChunkError::OverlapTooLarge {
                overlap: 10,
                window: 10
            })
        );
    }

    #[test]
    fn more_windows_than_max_chunks_is_refused() {
        let chunking = Chunking {
            overlap: 0,
            max_chunks: 2,
        };
        assert_eq!(windows(20, 10, chunking).unwrap().len(), 2);
        assert_eq!(
            windows(21, 10, chunking),
            Err(ChunkError::TooManyChunks {
                needed: 3,
                window: 10,
                max: 2
            })
        );
    }

    #[test]
    fn the_mean_is_weighted_by_token_counts() {
        let mean = weighted_mean(&[vec![1.0, 0.0], vec![0.0, 4.0]], &[3, 1]);
        assert_eq!(mean, vec![0.75, 1.0]);
        assert_eq!(weighted_mean(&[vec![2.0, -2.0]], &[7]), vec![2.0, -2.0]);
    }

    #[test]
    fn long_input_values_are_read_and_others_refused_by_name() {
        let read = |s: &str| serde_json::from_str::<LongInput>(s);
        assert_eq!(read("\"chunk\"").unwrap(), LongInput::Chunk);
        assert_eq!(read("\"truncate\"").unwrap(), LongInput::Truncate);
        assert_eq!(read("\"error\"").unwrap(), LongInput::Error);
        let e = read("\"split\"").unwrap_err().to_string();
        assert!(
            e.contains("`long_input` must be \"error\", \"truncate\" or \"chunk\", got \"split\""),
            "{e}"
        );
        assert!(LongInput::parse_flag("whole").is_err());
    }
}
