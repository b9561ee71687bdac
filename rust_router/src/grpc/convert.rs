//! The fields every `tei.v1` message shares, as the HTTP bodies have them, and the
//! `Metadata` every answer carries.

use super::pb;
use crate::http::error::{ApiError, ErrorType};
use crate::http::response_meta::ResponseMeta;
use crate::infer::Priority;
use crate::tokenization::TruncationDirection;

/// `truncate`: proto3 cannot tell `false` from a field left out, so `false` leaves it to the
/// server's default (`--auto-truncate`, off unless set, so TEI's `false`).
pub(crate) fn truncate(value: bool) -> Option<bool> {
    value.then_some(true)
}

pub(crate) fn truncation_direction(value: i32) -> Result<TruncationDirection, ApiError> {
    match pb::TruncationDirection::try_from(value) {
        Ok(pb::TruncationDirection::Right) => Ok(TruncationDirection::Right),
        Ok(pb::TruncationDirection::Left) => Ok(TruncationDirection::Left),
        Err(_) => Err(ApiError::validation(format!(
            "Input validation error: `truncation_direction` must be \
             TRUNCATION_DIRECTION_RIGHT (0) or TRUNCATION_DIRECTION_LEFT (1), got {value}"
        ))),
    }
}

/// `priority`: unspecified is none (the lane by the request's size).
pub(crate) fn priority(value: i32) -> Result<Option<Priority>, ApiError> {
    match pb::Priority::try_from(value) {
        Ok(pb::Priority::Unspecified) => Ok(None),
        Ok(pb::Priority::High) => Ok(Some(Priority::High)),
        Ok(pb::Priority::Low) => Ok(Some(Priority::Low)),
        Err(_) => Err(ApiError::validation(format!(
            "Input validation error: `priority` must be PRIORITY_UNSPECIFIED (0), \
             PRIORITY_HIGH (1) or PRIORITY_LOW (2), got {value}"
        ))),
    }
}

/// What a request cost, as TEI's `Metadata` reports it (counts saturate at `u32::MAX`).
pub(crate) fn metadata(meta: &ResponseMeta) -> pb::Metadata {
    let nanos = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    pb::Metadata {
        compute_chars: count(meta.compute_chars),
        compute_tokens: count(meta.compute_tokens),
        total_time_ns: nanos(meta.start.elapsed()),
        tokenization_time_ns: nanos(meta.tokenization),
        queue_time_ns: nanos(meta.queue),
        inference_time_ns: nanos(meta.inference),
    }
}

/// The one answer of a route given one input.
pub(crate) fn only<T>(answers: Vec<T>) -> Result<T, ApiError> {
    let n = answers.len();
    let mut answers = answers.into_iter();
    match (answers.next(), answers.next()) {
        (Some(answer), None) => Ok(answer),
        _ => Err(ApiError::new(
            ErrorType::Backend,
            format!("the model answered {n} results for one input"),
        )),
    }
}

/// A count the HTTP routes keep as `usize`, as the proto's `uint32`.
pub(crate) fn uint32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_are_read_or_refused() {
        assert_eq!(truncation_direction(1).unwrap(), TruncationDirection::Left);
        assert_eq!(truncation_direction(0).unwrap(), TruncationDirection::Right);
        let e = truncation_direction(7).unwrap_err();
        assert_eq!(e.kind, ErrorType::Validation);
        assert!(e.message.contains("got 7"), "{}", e.message);
        assert_eq!(priority(0).unwrap(), None);
        assert_eq!(priority(1).unwrap(), Some(Priority::High));
        assert_eq!(priority(2).unwrap(), Some(Priority::Low));
        assert!(priority(-1).is_err());
    }

    #[test]
    fn false_truncate_is_the_servers_default() {
        assert_eq!(truncate(false), None);
        assert_eq!(truncate(true), Some(true));
    }

    #[test]
    fn one_input_has_one_answer() {
        assert_eq!(only(vec![3]).unwrap(), 3);
        assert_eq!(only(Vec::<u8>::new()).unwrap_err().kind, ErrorType::Backend);
        assert!(only(vec![1, 2]).is_err());
    }
}
