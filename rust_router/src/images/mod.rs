//! Image inputs: what a request's `{"image": ...}` holds (a data URL or plain base64), the
//! limits it must keep (`--max-image-bytes`, `--max-image-pixels`), and how it becomes the
//! bytes of an encoded image. Those bytes become the model's pixels
//! ([`crate::backend::ImagePreprocessor`]), which must match the checkpoint's own processor:
//! in Rust ([`pixels`]) where the router matches its steps exactly, else in the runtime.

mod limits;
pub mod pixels;
mod source;

pub use limits::{ImageLimits, DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGE_PIXELS};
pub use source::{decode_source, ImageError};

#[cfg(test)]
mod tests;
