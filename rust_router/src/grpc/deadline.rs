//! A call's deadline, as gRPC clients send it: the `grpc-timeout` header (the gRPC over
//! HTTP/2 protocol: at most 8 digits, then a unit: `H`, `M`, `S`, `m`, `u` or `n`).

use std::time::Duration;

/// The metadata key that carries a call's deadline.
pub(crate) const GRPC_TIMEOUT: &str = "grpc-timeout";

/// The time a `grpc-timeout` value gives, or why it is not one.
pub(crate) fn parse_grpc_timeout(value: &str) -> Result<Duration, String> {
    let malformed = || {
        format!(
            "`{GRPC_TIMEOUT}` must be 1 to 8 digits and a unit (H, M, S, m, u or n), got \
             `{value}`"
        )
    };
    let unit_at = value.len().checked_sub(1).ok_or_else(malformed)?;
    let (digits, unit) = value.split_at(unit_at);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    let amount: u64 = digits.parse().map_err(|_| malformed())?;
    match unit {
        "H" => Ok(Duration::from_secs(amount * 3600)),
        "M" => Ok(Duration::from_secs(amount * 60)),
        "S" => Ok(Duration::from_secs(amount)),
        "m" => Ok(Duration::from_millis(amount)),
        "u" => Ok(Duration::from_micros(amount)),
        "n" => Ok(Duration::from_nanos(amount)),
        _ => Err(malformed()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_is_read() {
        assert_eq!(parse_grpc_timeout("2H"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("3M"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("5S"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("250m"), Ok(Duration::from_millis(250)));
        assert_eq!(
            parse_grpc_timeout("99999999u"),
            Ok(Duration::from_micros(99_999_999))
        );
        assert_eq!(parse_grpc_timeout("7n"), Ok(Duration::from_nanos(7)));
    }

    #[test]
    fn malformed_values_are_refused() {
        for value in [
            "",
            "m",
            "10",
            "10x",
            "123456789m",
            "-1S",
            "1.5S",
            " 1S",
            "1s",
        ] {
            let err = parse_grpc_timeout(value).unwrap_err();
            assert!(err.contains("grpc-timeout"), "{value}: {err}");
        }
    }
}
