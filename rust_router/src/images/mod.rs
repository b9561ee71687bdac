//! Image inputs: what a request's `{"image": ...}` holds (a data URL or plain base64), the
//! limits it must keep (`--max-image-bytes`, `--max-image-pixels`), and how it becomes the
//! bytes of an encoded image. Decoding those bytes into pixels is the model runtime's
//! ([`crate::backend::ImagePreprocessor`]): it must match the checkpoint's own processor.

mod limits;
mod source;

pub use limits::{ImageLimits, DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGE_PIXELS};
pub use source::{decode_source, ImageError};

#[cfg(test)]
mod tests;
