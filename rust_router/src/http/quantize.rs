//! Embedding output formats beyond float: base64 and the quantized `int8`, `uint8`, `binary`
//! and `ubinary`, computed as sentence-transformers' `quantize_embeddings` computes them (the
//! same float32 arithmetic, so the codes are equal, not merely close).
//!
//! `int8`/`uint8` need a calibration range per dimension. sentence-transformers takes it from
//! the batch being quantized when none is given, but a server cannot: a one-text request
//! would have an empty range (every code the same), and a query and its documents, sent in
//! different requests, would land in different buckets and not be comparable. So the ranges
//! are fixed: the client's `quantization_ranges` (from its own calibration set), else, for
//! normalized vectors, [-1, 1] in every dimension, the one range a unit vector's components
//! are sure to lie in.

use super::error::ApiError;
use base64::Engine;
use serde::{de, Deserialize, Deserializer, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// The range every component of a unit vector lies in: the default for normalized outputs.
const UNIT_RANGE: (f32, f32) = (-1.0, 1.0);

/// `quantization_ranges`: one `[min, max]` for every dimension, or `[[min, ...], [max, ...]]`
/// with one value per output dimension (sentence-transformers' `ranges`, shape `(2, dim)`).
#[derive(Debug, Clone, PartialEq)]
pub enum Ranges {
    Shared(f32, f32),
    PerDimension(Vec<f32>, Vec<f32>),
}

const RANGES_SHAPES: &str =
    "`[min, max]` or `[[min, ...], [max, ...]]` (one value per output dimension)";

fn number(v: &Value) -> Option<f32> {
    v.as_f64().map(|f| f as f32).filter(|f| f.is_finite())
}

fn numbers(v: &Value) -> Option<Vec<f32>> {
    v.as_array()?.iter().map(number).collect()
}

impl TryFrom<Value> for Ranges {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        let bad = || format!("`quantization_ranges` must be {RANGES_SHAPES} of finite numbers");
        let Value::Array(a) = value else {
            return Err(bad());
        };
        if a.len() != 2 {
            return Err(bad());
        }
        if let (Some(lo), Some(hi)) = (number(&a[0]), number(&a[1])) {
            return Ok(Self::Shared(lo, hi));
        }
        match (numbers(&a[0]), numbers(&a[1])) {
            (Some(lo), Some(hi)) => Ok(Self::PerDimension(lo, hi)),
            _ => Err(bad()),
        }
    }
}

impl<'de> Deserialize<'de> for Ranges {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ranges::try_from(Value::deserialize(d)?).map_err(de::Error::custom)
    }
}

// Mirrors [`Ranges`] in the OpenAPI document.
/// Calibration ranges for `int8`/`uint8`: `[min, max]` shared by every dimension, or
/// `[[min, ...], [max, ...]]` with one value per output dimension (after `dimensions`), as
/// sentence-transformers' `quantize_embeddings(..., ranges=...)` takes them. Each min must
/// not exceed its max. Defaults to `[-1, 1]` for normalized embeddings.
#[allow(dead_code)]
#[derive(ToSchema)]
#[serde(untagged)]
pub enum RangesDoc {
    Shared(#[schema(inline)] SharedRangeDoc),
    PerDimension(#[schema(inline)] PerDimensionRangesDoc),
}

/// `[min, max]`, the same for every dimension.
#[allow(dead_code)]
#[derive(ToSchema)]
#[schema(min_items = 2, max_items = 2)]
pub struct SharedRangeDoc(Vec<f32>);

/// `[[min, ...], [max, ...]]`, one value per output dimension.
#[allow(dead_code)]
#[derive(ToSchema)]
#[schema(min_items = 2, max_items = 2)]
pub struct PerDimensionRangesDoc(Vec<Vec<f32>>);

/// How embeddings are returned. The quantized formats follow sentence-transformers'
/// `quantize_embeddings`, applied after `dimensions` and normalization.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EncodingFormat {
    /// float32 numbers.
    #[default]
    Float,
    /// Little-endian float32 bytes, base64-encoded.
    Base64,
    /// One integer from -128 to 127 per dimension: the `uint8` bucket minus 128.
    Int8,
    /// One integer from 0 to 255 per dimension: `floor((x - min) / ((max - min) / 255))`,
    /// clipped, with `min`/`max` from `quantization_ranges` (default `[-1, 1]`).
    Uint8,
    /// One bit per dimension (set where the value is > 0), packed 8 to a byte, first dimension
    /// in the high bit, as integers from -128 to 127 (the byte minus 128).
    Binary,
    /// As `binary`, the bytes as integers from 0 to 255.
    Ubinary,
}

impl EncodingFormat {
    pub fn name(self) -> &'static str {
        match self {
            Self::Float => "float",
            Self::Base64 => "base64",
            Self::Int8 => "int8",
            Self::Uint8 => "uint8",
            Self::Binary => "binary",
            Self::Ubinary => "ubinary",
        }
    }
}

/// One vector as `encoding_format` asks (its schema is written out below).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Embedding {
    Float(Vec<f32>),
    Base64(String),
    /// `int8` and `binary`.
    Int8(Vec<i8>),
    /// `uint8` and `ubinary`.
    Uint8(Vec<u8>),
}

impl utoipa::PartialSchema for Embedding {
    /// `anyOf`, not the `oneOf` a derived untagged enum gets: a list of small integers is
    /// also a list of numbers, and `oneOf` forbids a value that fits two branches.
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AnyOfBuilder, ArrayBuilder, ObjectBuilder, Type};
        let floats = ArrayBuilder::new()
            .items(ObjectBuilder::new().schema_type(Type::Number))
            .description(Some("`float`: float32 numbers"));
        let base64 = ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("`base64`: little-endian float32 bytes"));
        let codes = ArrayBuilder::new()
            .items(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(-128))
                    .maximum(Some(255)),
            )
            .description(Some(
                "`int8`/`binary`: integers from -128 to 127; `uint8`/`ubinary`: from 0 to 255",
            ));
        AnyOfBuilder::new()
            .item(floats)
            .item(base64)
            .item(codes)
            .into()
    }
}

impl ToSchema for Embedding {}

/// Turns float embeddings into the requested format; built (and validated) before inference.
#[derive(Debug, Clone)]
pub struct Encoder {
    format: EncodingFormat,
    /// Per-dimension starts and steps of the `int8`/`uint8` buckets.
    buckets: Option<(Vec<f32>, Vec<f32>)>,
}

impl Encoder {
    /// `dim` is the output size (after `dimensions`). Refuses (422) ranges that do not fit,
    /// ranges with a format that has no use for them, and `int8`/`uint8` of unnormalized
    /// vectors without ranges (their components have no known bound).
    pub fn new(
        format: EncodingFormat,
        ranges: Option<Ranges>,
        normalized: bool,
        dim: usize,
    ) -> Result<Self, ApiError> {
        let scalar = matches!(format, EncodingFormat::Int8 | EncodingFormat::Uint8);
        if !scalar {
            if ranges.is_some() {
                return Err(ApiError::validation(format!(
                    "Input validation error: `quantization_ranges` applies to the `int8` and \
                     `uint8` encodings only, not `{}`",
                    format.name()
                )));
            }
            return Ok(Self {
                format,
                buckets: None,
            });
        }
        let (lo, hi) = match ranges {
            Some(Ranges::Shared(lo, hi)) => (vec![lo; dim], vec![hi; dim]),
            Some(Ranges::PerDimension(lo, hi)) => {
                if lo.len() != dim || hi.len() != dim {
                    return Err(ApiError::validation(format!(
                        "Input validation error: `quantization_ranges` has {} minimums and {} \
                         maximums; the output has {dim} dimensions",
                        lo.len(),
                        hi.len()
                    )));
                }
                (lo, hi)
            }
            None if normalized => (vec![UNIT_RANGE.0; dim], vec![UNIT_RANGE.1; dim]),
            None => {
                return Err(ApiError::validation(format!(
                    "Input validation error: `{}` of unnormalized embeddings needs \
                     `quantization_ranges` (their values have no known bound); send them, or \
                     `normalize: true`",
                    format.name()
                )))
            }
        };
        if let Some(i) = (0..dim).find(|&i| lo[i] > hi[i]) {
            return Err(ApiError::validation(format!(
                "Input validation error: `quantization_ranges` minimum {} is over its maximum \
                 {} (dimension {i})",
                lo[i], hi[i]
            )));
        }
        // An empty range (min = max) puts every value of its dimension in one code, as
        // sentence-transformers does: a calibration set can hold a dimension that never
        // varies. Every dimension empty is no calibration at all: every code would be 0.
        if (0..dim).all(|i| lo[i] == hi[i]) {
            return Err(ApiError::validation(
                "Input validation error: `quantization_ranges` is empty in every dimension \
                 (each minimum equals its maximum): every value would get the same code",
            ));
        }
        // sentence-transformers: steps = (max - min) / 255, and 1 where that is 0.
        let steps = lo
            .iter()
            .zip(&hi)
            .map(|(l, h)| {
                let step = (h - l) / 255.0;
                if step == 0.0 {
                    1.0
                } else {
                    step
                }
            })
            .collect();
        Ok(Self {
            format,
            buckets: Some((lo, steps)),
        })
    }

    pub fn encode(&self, v: Vec<f32>) -> Embedding {
        match self.format {
            EncodingFormat::Float => Embedding::Float(v),
            EncodingFormat::Base64 => Embedding::Base64(to_base64(&v)),
            EncodingFormat::Uint8 => Embedding::Uint8(self.buckets(&v).collect()),
            // The uint8 bucket shifted by -128, as sentence-transformers does.
            EncodingFormat::Int8 => {
                Embedding::Int8(self.buckets(&v).map(|b| (b as i16 - 128) as i8).collect())
            }
            EncodingFormat::Ubinary => Embedding::Uint8(pack_bits(&v)),
            EncodingFormat::Binary => Embedding::Int8(
                pack_bits(&v)
                    .into_iter()
                    .map(|b| (b ^ 0x80) as i8)
                    .collect(),
            ),
        }
    }

    /// `clip(floor((x - start) / step), 0, 255)` per dimension.
    fn buckets<'a>(&'a self, v: &'a [f32]) -> impl Iterator<Item = u8> + 'a {
        let (starts, steps) = self
            .buckets
            .as_ref()
            .expect("int8/uint8 encoders are built with buckets");
        v.iter()
            .zip(starts.iter().zip(steps))
            .map(|(x, (start, step))| ((x - start) / step).floor().clamp(0.0, 255.0) as u8)
    }
}

/// One bit per dimension, set where the value is > 0, eight to a byte with the first
/// dimension in the high bit and the last byte padded with zeros (numpy's `packbits`).
pub fn pack_bits(v: &[f32]) -> Vec<u8> {
    v.chunks(8)
        .map(|chunk| {
            chunk
                .iter()
                .enumerate()
                .filter(|(_, x)| **x > 0.0)
                .fold(0u8, |byte, (i, _)| byte | (0x80 >> i))
        })
        .collect()
}

/// Little-endian float32 bytes, base64: what the `openai` SDK decodes with numpy.
pub fn to_base64(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoder(format: EncodingFormat, ranges: Option<Ranges>, dim: usize) -> Encoder {
        Encoder::new(format, ranges, true, dim).unwrap()
    }

    #[test]
    fn base64_is_little_endian_f32() {
        assert_eq!(to_base64(&[1.0]), "AACAPw==");
    }

    #[test]
    fn bits_are_packed_high_first_and_padded() {
        // > 0 sets the bit: 0.0 and negatives do not.
        let v = [1.0, -1.0, 0.0, 0.5, 0.0, 0.0, 0.0, 2.0, 3.0, -0.1];
        assert_eq!(pack_bits(&v), vec![0b1001_0001, 0b1000_0000]);
        let e = encoder(EncodingFormat::Ubinary, None, v.len()).encode(v.to_vec());
        assert!(
            matches!(e, Embedding::Uint8(ref b) if b == &[145, 128]),
            "{e:?}"
        );
        // binary is ubinary - 128, as int8: 145 -> 17, 128 -> 0.
        let e = encoder(EncodingFormat::Binary, None, v.len()).encode(v.to_vec());
        assert!(
            matches!(e, Embedding::Int8(ref b) if b == &[17, 0]),
            "{e:?}"
        );
        let e = encoder(EncodingFormat::Binary, None, 8).encode(vec![-1.0; 8]);
        assert!(matches!(e, Embedding::Int8(ref b) if b == &[-128]), "{e:?}");
    }

    #[test]
    fn scalar_buckets_follow_sentence_transformers() {
        // Range [-1, 1]: step 2/255; -1 -> 0, 0 -> floor(127.5) = 127, out of range values
        // clip. 1 lands in 254, not 255: the float32 step is a hair over 2/255 (numpy's
        // float32 answer too: `quantize_embeddings` gives [0, 254, 127, 255, 0]).
        let v = vec![-1.0, 1.0, 0.0, 5.0, -5.0];
        let e = encoder(EncodingFormat::Uint8, None, 5).encode(v.clone());
        assert!(
            matches!(e, Embedding::Uint8(ref b) if b == &[0, 254, 127, 255, 0]),
            "{e:?}"
        );
        let e = encoder(EncodingFormat::Int8, None, 5).encode(v);
        assert!(
            matches!(e, Embedding::Int8(ref b) if b == &[-128, 126, -1, 127, -128]),
            "{e:?}"
        );
        // Per-dimension ranges; an empty range has step 1 (values at its start -> 0).
        let ranges = Ranges::PerDimension(vec![0.0, 2.0], vec![255.0, 2.0]);
        let e = encoder(EncodingFormat::Uint8, Some(ranges), 2).encode(vec![10.5, 3.5]);
        assert!(
            matches!(e, Embedding::Uint8(ref b) if b == &[10, 1]),
            "{e:?}"
        );
    }

    #[test]
    fn bad_ranges_are_refused() {
        let err = |format, ranges, normalized, dim| {
            Encoder::new(format, ranges, normalized, dim)
                .unwrap_err()
                .message
        };
        let m = err(
            EncodingFormat::Int8,
            Some(Ranges::PerDimension(vec![0.0], vec![1.0])),
            true,
            2,
        );
        assert!(m.contains("2 dimensions"), "{m}");
        let m = err(
            EncodingFormat::Int8,
            Some(Ranges::Shared(1.0, 0.0)),
            true,
            2,
        );
        assert!(m.contains("over its maximum"), "{m}");
        let m = err(
            EncodingFormat::Binary,
            Some(Ranges::Shared(0.0, 1.0)),
            true,
            2,
        );
        assert!(m.contains("`int8` and `uint8`"), "{m}");
        // An empty range in every dimension would give one code for every value.
        let m = err(
            EncodingFormat::Uint8,
            Some(Ranges::Shared(0.0, 0.0)),
            true,
            2,
        );
        assert!(m.contains("empty in every dimension"), "{m}");
        let m = err(
            EncodingFormat::Int8,
            Some(Ranges::PerDimension(vec![1.0, 2.0], vec![1.0, 2.0])),
            true,
            2,
        );
        assert!(m.contains("empty in every dimension"), "{m}");
        let m = err(EncodingFormat::Uint8, None, false, 2);
        assert!(m.contains("unnormalized"), "{m}");
        // Binary needs no bound.
        assert!(Encoder::new(EncodingFormat::Binary, None, false, 2).is_ok());
    }

    #[test]
    fn ranges_parse_both_shapes() {
        let r: Ranges = serde_json::from_str("[-0.5, 0.5]").unwrap();
        assert_eq!(r, Ranges::Shared(-0.5, 0.5));
        let r: Ranges = serde_json::from_str("[[0, 1], [2, 3]]").unwrap();
        assert_eq!(r, Ranges::PerDimension(vec![0.0, 1.0], vec![2.0, 3.0]));
        for bad in [
            "[1]",
            "[[0], 1]",
            "\"x\"",
            "[1, 2, 3]",
            "[[0, \"a\"], [1, 2]]",
        ] {
            let e = serde_json::from_str::<Ranges>(bad).unwrap_err().to_string();
            assert!(e.contains("quantization_ranges"), "{bad}: {e}");
        }
    }
}
