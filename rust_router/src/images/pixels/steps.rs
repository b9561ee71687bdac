//! The steps after decoding, on an upright RGB image, as the runtime's
//! `ImagePreprocessor.pixels` runs them: resize, centre crop (zero-padded), rescale in f64
//! then f32, normalize in f32, channels first (NaFlex: a block of patches instead).

use crate::backend::{ImageSteps, ResizeTo};

use super::patches::{patch_block, size_for_patch_budget};
use super::resample::{resize, Filter, Rgb};

/// A processor's steps the router runs exactly as the runtime does.
#[derive(Debug, Clone)]
pub struct Plan {
    resize: Option<ResizeTo>,
    filter: Filter,
    crop: Option<(usize, usize)>,
    rescale_factor: Option<f64>,
    mean_std: Option<([f32; 3], [f32; 3])>,
    patches: Option<(usize, usize)>,
}

impl Plan {
    /// The plan of `steps`, or why the runtime must run them itself.
    pub fn new(steps: &ImageSteps) -> Result<Plan, String> {
        if !steps.convert_rgb {
            return Err("images are not converted to RGB (do_convert_rgb false)".into());
        }
        let filter = Filter::of(steps.resample)
            .ok_or_else(|| format!("the {:?} filter is not a convolution", steps.resample))?;
        let patches = match (steps.patch_size, steps.max_num_patches) {
            (Some(patch), Some(budget)) if patch > 0 && budget > 0 => Some((patch, budget)),
            (None, None) => None,
            _ => return Err("patch_size and max_num_patches come together".into()),
        };
        if patches.is_some() && (steps.resize.is_some() || steps.crop.is_some()) {
            return Err("a NaFlex processor has no other resize or crop".into());
        }
        let mean_std = match (steps.mean, steps.std) {
            (Some(mean), Some(std)) => Some((mean.map(|m| m as f32), std.map(|s| s as f32))),
            _ => None,
        };
        Ok(Plan {
            resize: steps.resize,
            filter,
            crop: steps.crop.map(|[h, w]| (h, w)),
            rescale_factor: steps.rescale_factor,
            mean_std,
            patches,
        })
    }

    /// The float32 pixels of `image`: `[3, H, W]`, or NaFlex's block of patches
    /// `[1, max_num_patches + 1, 3 * patch * patch]`; and that shape.
    pub fn pixels(&self, image: &Rgb) -> (Vec<f32>, [usize; 3]) {
        let mut image = match (self.patches, self.resize) {
            (Some((patch, budget)), _) => {
                let (h, w) = size_for_patch_budget(image.height, image.width, patch, budget);
                resize(image, w, h, self.filter)
            }
            (None, Some(ResizeTo::Fixed { height, width })) => {
                resize(image, width, height, self.filter)
            }
            (None, Some(ResizeTo::ShortestEdge { shortest_edge })) => {
                let (w, h) = shortest_edge_size(image.width, image.height, shortest_edge);
                resize(image, w, h, self.filter)
            }
            (None, None) => image.clone(),
        };
        if let Some((height, width)) = self.crop {
            image = center_crop(&image, height, width);
        }
        let values = self.values(&image.data);
        match self.patches {
            Some((patch, budget)) => (
                patch_block(&values, image.height, image.width, patch, budget),
                [1, budget + 1, 3 * patch * patch],
            ),
            None => (
                channels_first(&values, image.height * image.width),
                [3, image.height, image.width],
            ),
        }
    }

    /// Rescaled and normalized values, still interleaved `[H, W, 3]`.
    fn values(&self, bytes: &[u8]) -> Vec<f32> {
        let mut values: Vec<f32> = match self.rescale_factor {
            Some(factor) => bytes
                .iter()
                .map(|&v| (f64::from(v) * factor) as f32)
                .collect(),
            None => bytes.iter().map(|&v| f32::from(v)).collect(),
        };
        if let Some((mean, std)) = self.mean_std {
            for pixel in values.chunks_exact_mut(3) {
                for c in 0..3 {
                    pixel[c] = (pixel[c] - mean[c]) / std[c];
                }
            }
        }
        values
    }
}

/// (width, height) with the shorter side `shortest_edge` and the longer
/// `int(shortest_edge * long / short)` (transformers' `get_resize_output_image_size`).
pub fn shortest_edge_size(width: usize, height: usize, shortest_edge: usize) -> (usize, usize) {
    let (short, long) = if width <= height {
        (width, height)
    } else {
        (height, width)
    };
    let new_long = (shortest_edge as f64 * long as f64 / short as f64) as usize;
    if width <= height {
        (shortest_edge, new_long)
    } else {
        (new_long, shortest_edge)
    }
}

/// The centre `height x width` of `image`, zero-padded where the image is smaller, with
/// transformers' `center_crop` offsets.
pub fn center_crop(image: &Rgb, height: usize, width: usize) -> Rgb {
    let (h, w) = (image.height as i64, image.width as i64);
    let (ch, cw) = (height as i64, width as i64);
    // Where the crop's top-left corner lies in the image, negative where it pads: padding
    // by the ceiling of half the shortfall and then cropping lands on the floor of half the
    // difference, in both cases.
    let (top, left) = ((h - ch).div_euclid(2), (w - cw).div_euclid(2));
    let mut data = vec![0u8; height * width * 3];
    for (y, out_row) in data.chunks_exact_mut(width * 3).enumerate() {
        let src_y = top + y as i64;
        if !(0..h).contains(&src_y) {
            continue;
        }
        for (x, out) in out_row.chunks_exact_mut(3).enumerate() {
            let src_x = left + x as i64;
            if (0..w).contains(&src_x) {
                let at = (src_y as usize * image.width + src_x as usize) * 3;
                out.copy_from_slice(&image.data[at..at + 3]);
            }
        }
    }
    Rgb {
        width,
        height,
        data,
    }
}

/// Interleaved `[pixels, 3]` values as `[3, pixels]`.
fn channels_first(values: &[f32], pixels: usize) -> Vec<f32> {
    let mut out = vec![0f32; values.len()];
    let (r, rest) = out.split_at_mut(pixels);
    let (g, b) = rest.split_at_mut(pixels);
    for (i, p) in values.chunks_exact(3).enumerate() {
        r[i] = p[0];
        g[i] = p[1];
        b[i] = p[2];
    }
    out
}
