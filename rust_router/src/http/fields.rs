//! Readers for request fields whose JSON forms serde's defaults refuse though the OpenAPI
//! document (JSON Schema) or the API the route copies accepts them.
//!
//! - JSON Schema's `integer` is any number without a fractional part: `128` and `128.0` alike
//!   (JavaScript clients and some serializers write whole numbers as floats). serde's integer
//!   types take only the first. Here both are read, and a value that is no integer, or does
//!   not fit the field, is refused with a message naming the field.
//! - OpenAI's API takes `null` for an optional field as the field left out (its SDKs send
//!   `"encoding_format": null` when the caller passes `None`); serde refuses `null` for a
//!   field that is not an `Option`.

use crate::infer::Priority;
use serde::{de, Deserialize, Deserializer};
use serde_json::Value;
use std::fmt::Display;

/// An integer type a request field is read into, with its bounds for the refusal message.
pub(crate) trait Whole: TryFrom<i128> + Display {
    const MIN: Self;
    const MAX: Self;
}

impl Whole for usize {
    const MIN: Self = usize::MIN;
    const MAX: Self = usize::MAX;
}

impl Whole for i64 {
    const MIN: Self = i64::MIN;
    const MAX: Self = i64::MAX;
}

/// The integer `value` holds, written with or without a zero fraction (`7`, `7.0`, `7e2`).
/// A float too large for `i128` saturates, which no field's range holds either.
fn integer(value: &Value) -> Option<i128> {
    let n = value.as_number()?;
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
        .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i128))
}

/// `value` as the integer type `T`, or why not, naming `field`.
pub(crate) fn whole<T: Whole>(value: &Value, field: &str) -> Result<T, String> {
    let n = integer(value).ok_or_else(|| format!("`{field}` must be an integer, got {value}"))?;
    T::try_from(n).map_err(|_| {
        format!(
            "`{field}` must be an integer from {} to {}, got {value}",
            T::MIN,
            T::MAX
        )
    })
}

/// An optional integer field; `null` is the field left out.
fn optional<'de, D: Deserializer<'de>, T: Whole>(d: D, field: &str) -> Result<Option<T>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(value) => whole(&value, field).map(Some).map_err(de::Error::custom),
    }
}

/// `dimensions` of `/embed` and `/v1/embeddings`.
pub(crate) fn dimensions<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    optional(d, "dimensions")
}

/// `chunk_overlap` of the embedding routes: signed, so that a negative one is refused with
/// the routes' own message.
pub(crate) fn chunk_overlap<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    optional(d, "chunk_overlap")
}

/// `top_n` of the rerank routes: signed, so that a negative one is refused with the routes'
/// own message (it must be at least 1, see `classify::top_n`).
pub(crate) fn top_n<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    optional(d, "top_n")
}

/// `priority` of the inference routes: `"high"`, `"low"`, or `null` / left out (by size).
/// Read here rather than by serde's enum so the refusal names the field and every value it
/// takes.
pub(crate) fn priority<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Priority>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_str()
            .and_then(Priority::parse)
            .map(Some)
            .ok_or_else(|| {
                de::Error::custom(format!(
                    "`priority` must be \"high\", \"low\" or null (decided by size), got {value}"
                ))
            }),
    }
}

/// A field whose `null` is its default, as OpenAI's API reads it.
pub(crate) fn null_is_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integers_may_be_written_as_floats() {
        assert_eq!(whole::<usize>(&json!(128), "f"), Ok(128));
        assert_eq!(whole::<usize>(&json!(128.0), "f"), Ok(128));
        assert_eq!(whole::<usize>(&json!(1390e0), "f"), Ok(1390));
        assert_eq!(whole::<i64>(&json!(-3.0), "f"), Ok(-3));
        assert_eq!(whole::<usize>(&json!(u64::MAX), "f"), Ok(u64::MAX as usize));
    }

    #[test]
    fn fractions_other_types_and_out_of_range_values_name_the_field() {
        let e = whole::<usize>(&json!(1.5), "top_n").unwrap_err();
        assert_eq!(e, "`top_n` must be an integer, got 1.5");
        let e = whole::<usize>(&json!("3"), "top_n").unwrap_err();
        assert_eq!(e, "`top_n` must be an integer, got \"3\"");
        let e = whole::<usize>(&json!(-1), "dimensions").unwrap_err();
        assert!(
            e.starts_with("`dimensions` must be an integer from 0 to "),
            "{e}"
        );
        // Past u64: serde_json reads it as a float, still a whole number, out of range.
        let big: Value = serde_json::from_str("18446744073709551616").unwrap();
        let e = whole::<usize>(&big, "dimensions").unwrap_err();
        assert!(e.contains("from 0 to 18446744073709551615"), "{e}");
        let e = whole::<usize>(&json!(1e300), "dimensions").unwrap_err();
        assert!(e.contains("from 0 to"), "{e}");
        let e = whole::<i64>(&json!(1e19), "top_n").unwrap_err();
        assert!(e.contains("to 9223372036854775807"), "{e}");
    }

    #[derive(Debug, Deserialize)]
    struct Body {
        #[serde(default, deserialize_with = "dimensions")]
        dimensions: Option<usize>,
        #[serde(default, deserialize_with = "null_is_default")]
        name: String,
    }

    #[test]
    fn fields_read_null_as_left_out() {
        let b: Body = serde_json::from_str(r#"{"dimensions": null, "name": null}"#).unwrap();
        assert_eq!((b.dimensions, b.name.as_str()), (None, ""));
        let b: Body = serde_json::from_str(r#"{"dimensions": 4.0, "name": "x"}"#).unwrap();
        assert_eq!((b.dimensions, b.name.as_str()), (Some(4), "x"));
        let b: Body = serde_json::from_str("{}").unwrap();
        assert_eq!(b.dimensions, None);
        let e = serde_json::from_str::<Body>(r#"{"dimensions": 4.5}"#).unwrap_err();
        assert!(
            e.to_string()
                .contains("`dimensions` must be an integer, got 4.5"),
            "{e}"
        );
    }
}
