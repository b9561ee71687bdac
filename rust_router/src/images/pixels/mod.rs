//! Image preprocessing in Rust: encoded bytes to the float32 pixels of a checkpoint's
//! processor, equal to the runtime's (trt_tei_runtime/images.py) and run without the Python
//! interpreter. [`RustImages`] serves a model whose steps it matches ([`Plan::new`]); an
//! image its decoder cannot convert as Pillow does goes to the runtime's preprocessor.

mod decode;
mod patches;
mod resample;
mod steps;

use std::sync::Arc;

use crate::backend::{ImagePreprocessor, ImageSteps};

pub use decode::{decode_rgb, DecodeError};
pub use steps::Plan;

/// A model's image preprocessing in Rust, with the runtime's for the images it leaves.
pub struct RustImages {
    plan: Plan,
    /// None where the runtime is in device worker processes: the images it would read are
    /// refused.
    runtime: Option<Arc<dyn ImagePreprocessor>>,
}

impl RustImages {
    /// The Rust preprocessing of `steps`, or why the runtime keeps it.
    pub fn new(
        steps: &ImageSteps,
        runtime: Option<Arc<dyn ImagePreprocessor>>,
    ) -> Result<Self, String> {
        Ok(RustImages {
            plan: Plan::new(steps)?,
            runtime,
        })
    }
}

impl ImagePreprocessor for RustImages {
    fn preprocess(&self, data: &[u8], max_pixels: u64) -> Result<Vec<f32>, String> {
        match (self.preprocess_natively(data, max_pixels), &self.runtime) {
            (Some(done), _) => done,
            (None, Some(runtime)) => runtime.preprocess(data, max_pixels),
            (None, None) => unreachable!("without a runtime every image is answered natively"),
        }
    }

    fn preprocess_natively(
        &self,
        data: &[u8],
        max_pixels: u64,
    ) -> Option<Result<Vec<f32>, String>> {
        match decode_rgb(data, max_pixels) {
            Ok(image) => Some(Ok(self.plan.pixels(&image).0)),
            Err(refused @ DecodeError::TooManyPixels { .. }) => Some(Err(refused.to_string())),
            // Pillow reads more formats than this decoder, and its own words say why a file
            // is unreadable.
            Err(_) if self.runtime.is_some() => None,
            Err(refused @ DecodeError::Unsupported(_)) => Some(Err(format!(
                "{refused}, and the runtime runs in device worker processes here \
                 (`--device-workers threads` reads them)"
            ))),
            Err(refused) => Some(Err(refused.to_string())),
        }
    }
}

/// The pixels of `data` under `steps` and their shape, in Rust only (the
/// `_router.preprocess_image` test hook): an error for unsupported steps and for every image
/// the decoder leaves.
pub fn preprocess(
    steps: &ImageSteps,
    data: &[u8],
    max_pixels: u64,
) -> Result<(Vec<f32>, [usize; 3]), String> {
    let plan = Plan::new(steps)?;
    let image = decode_rgb(data, max_pixels).map_err(|e| e.to_string())?;
    Ok(plan.pixels(&image))
}

#[cfg(test)]
mod tests;
