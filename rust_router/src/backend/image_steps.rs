//! The steps of a checkpoint's image processor (`Backend.info()["image_input"]["steps"]`,
//! trt_tei_runtime/images.py `ImagePreprocessor.steps`), as plain data: the router runs them
//! itself when it can match them exactly (`crate::images::pixels`).

use serde::{Deserialize, Serialize};

/// Every step from the decoded RGB image to its float32 pixels, in the runtime's order:
/// resize, centre crop, rescale, normalize (NaFlex: resize to a patch budget, then patches).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ImageSteps {
    pub resize: Option<ResizeTo>,
    pub resample: Resample,
    /// `[height, width]` of the centre crop.
    pub crop: Option<[usize; 2]>,
    pub rescale_factor: Option<f64>,
    pub mean: Option<[f64; 3]>,
    pub std: Option<[f64; 3]>,
    pub convert_rgb: bool,
    /// SigLIP 2 NaFlex: the patch size and the patch budget each image is resized to.
    pub patch_size: Option<usize>,
    pub max_num_patches: Option<usize>,
}

/// The size an image is resized to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ResizeTo {
    /// The shorter side to this, the longer by `int(shortest_edge * long / short)`.
    ShortestEdge {
        shortest_edge: usize,
    },
    Fixed {
        height: usize,
        width: usize,
    },
}

/// Pillow's resampling filters, by their lower-case names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Resample {
    Nearest,
    Box,
    Bilinear,
    Hamming,
    Bicubic,
    Lanczos,
}
