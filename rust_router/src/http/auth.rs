//! The API key (`--api-key`): a request's `Authorization: Bearer <key>`, checked by the HTTP
//! routes' gate and by every gRPC call (its `authorization` metadata).

use super::error::{ApiError, ErrorType};

/// `Ok` when no key is set or `authorization` (the header's value) carries it, else a 401
/// `unauthorized` saying what was wrong.
pub(crate) fn authorize(key: Option<&str>, authorization: Option<&str>) -> Result<(), ApiError> {
    let Some(key) = key else {
        return Ok(());
    };
    let given = authorization.and_then(bearer_token);
    // Compare without an early exit so response time does not leak the key's prefix.
    let ok = given.is_some_and(|g| {
        g.len() == key.len()
            && g.bytes()
                .zip(key.bytes())
                .fold(0u8, |a, (x, y)| a | (x ^ y))
                == 0
    });
    if ok {
        return Ok(());
    }
    let message = match given {
        None => "Unauthorized: missing `Authorization: Bearer <api key>` header",
        Some(_) => "Unauthorized: invalid API key",
    };
    Err(ApiError::new(ErrorType::Unauthorized, message))
}

/// The token of an `Authorization: Bearer <token>` value. The scheme is case-insensitive
/// (RFC 9110, 11.1: `bearer` and `BEARER` too), and one or more spaces separate it from the
/// token.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_checked() {
        assert!(authorize(None, None).is_ok());
        assert!(authorize(Some("k1"), Some("Bearer k1")).is_ok());
        assert!(authorize(Some("k1"), Some("bearer   k1")).is_ok());
        let missing = authorize(Some("k1"), None).unwrap_err();
        assert_eq!(missing.kind, ErrorType::Unauthorized);
        assert!(missing.message.contains("missing"), "{}", missing.message);
        let wrong = authorize(Some("k1"), Some("Bearer k2")).unwrap_err();
        assert!(wrong.message.contains("invalid"), "{}", wrong.message);
        assert!(authorize(Some("k1"), Some("Basic k1")).is_err());
        assert!(authorize(Some("k1"), Some("Bearer k1x")).is_err());
    }
}
