//! Image inputs: what a request's `{"image": ...}` holds (a data URL, plain base64, or a URL
//! of an allowed host), the limits it must keep (`--max-image-bytes`, `--max-image-pixels`),
//! and how it becomes the bytes of an encoded image. Those bytes become the model's pixels
//! ([`crate::backend::ImagePreprocessor`]), which must match the checkpoint's own processor:
//! in Rust ([`pixels`]) where the router matches its steps exactly, else in the runtime.

mod fetch;
mod limits;
pub mod pixels;
mod source;

pub use fetch::{
    parse_host_pattern, AllowedHosts, FetcherSetupError, ImageFetcher,
    DEFAULT_IMAGE_FETCH_TIMEOUT_SECS,
};
pub use limits::{ImageLimits, DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGE_PIXELS};
pub use source::{decode_source, image_url, ImageError};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_fetch;
