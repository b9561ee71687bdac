//! An `{"image": ...}` value as the bytes of an encoded image: a `data:` URL
//! (`data:image/png;base64,...`) or plain base64. An `http(s)://` URL is the fetcher's
//! ([`super::fetch`]), and refused here.

use super::limits::ImageLimits;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;

/// Why an image input was refused; the HTTP layer names the input it came from.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImageError {
    #[error("image URLs are not fetched by this server (no host is listed by --allowed-image-hosts): send the image's bytes as a data URL (`data:image/png;base64,...`) or plain base64")]
    Url,
    #[error("the image URL's host `{0}` is not listed by --allowed-image-hosts")]
    HostNotAllowed(String),
    #[error("the image URL is refused: {0}")]
    BadUrl(String),
    #[error("the image could not be fetched: {0}")]
    Fetch(String),
    #[error("a data URL of an image must be base64 (`data:<type>;base64,<data>`)")]
    NotBase64DataUrl,
    #[error("the image is not valid base64: {0}")]
    Base64(String),
    #[error("the image has {given} bytes, more than --max-image-bytes ({max})")]
    TooManyBytes { given: usize, max: usize },
    #[error("the image is empty")]
    Empty,
    /// The runtime could not turn the bytes into pixels (not an image, truncated, more
    /// pixels than --max-image-pixels): its message.
    #[error("{0}")]
    Unreadable(String),
    /// The model embeds texts only, or the route takes texts only.
    #[error("{0}")]
    NotAccepted(String),
}

/// Standard or URL-safe alphabet, padded or not: clients differ, and none is ambiguous.
fn engines() -> [GeneralPurpose; 2] {
    let config =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    [
        GeneralPurpose::new(&base64::alphabet::STANDARD, config),
        GeneralPurpose::new(&base64::alphabet::URL_SAFE, config),
    ]
}

/// `source` if it is a URL (`scheme://...`: `http`, `https`, or any other, which the fetcher
/// refuses by name) rather than the image's bytes: base64 has no `:`, and a data URL no `//`.
pub fn image_url(source: &str) -> Option<&str> {
    let source = source.trim();
    let (scheme, _) = source.split_once("://")?;
    let is_scheme = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    is_scheme.then_some(source)
}

/// The encoded image that `source` carries, at most `limits.max_bytes` long.
pub fn decode_source(source: &str, limits: &ImageLimits) -> Result<Vec<u8>, ImageError> {
    if image_url(source).is_some() {
        return Err(ImageError::Url);
    }
    let source = source.trim();
    let lower = source.get(..5).unwrap_or(source).to_ascii_lowercase();
    let data = if lower.starts_with("data:") {
        let (header, data) = source.split_once(',').ok_or(ImageError::NotBase64DataUrl)?;
        if !header.to_ascii_lowercase().ends_with(";base64") {
            return Err(ImageError::NotBase64DataUrl);
        }
        data
    } else {
        source
    };
    // Base64 is 4 characters per 3 bytes: refuse before decoding what cannot fit.
    let at_least = data.len() / 4 * 3;
    if at_least > limits.max_bytes + 2 {
        return Err(ImageError::TooManyBytes {
            given: at_least,
            max: limits.max_bytes,
        });
    }
    let data: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let [standard, url_safe] = engines();
    let bytes = standard
        .decode(&data)
        .or_else(|_| url_safe.decode(&data))
        .map_err(|e| ImageError::Base64(e.to_string()))?;
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    if bytes.len() > limits.max_bytes {
        return Err(ImageError::TooManyBytes {
            given: bytes.len(),
            max: limits.max_bytes,
        });
    }
    Ok(bytes)
}
