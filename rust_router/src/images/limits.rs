//! What one image input may cost the server: `--max-image-bytes`, `--max-image-pixels`.

/// Default `--max-image-bytes`: 20 MB, a large photo's JPEG several times over.
pub const DEFAULT_MAX_IMAGE_BYTES: usize = 20_000_000;
/// Default `--max-image-pixels`: 64 megapixels (Pillow's own bomb check warns past 89).
pub const DEFAULT_MAX_IMAGE_PIXELS: u64 = 64_000_000;

/// What one image may cost the server before it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Bytes of the encoded image, after base64 decoding.
    pub max_bytes: usize,
    /// Width × height of the decoded image.
    pub max_pixels: u64,
}

impl Default for ImageLimits {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_IMAGE_BYTES,
            max_pixels: DEFAULT_MAX_IMAGE_PIXELS,
        }
    }
}
