//! Pillow's convolution resize of 8-bit RGB images (`Image.resize` with a BOX, BILINEAR,
//! HAMMING, BICUBIC or LANCZOS filter), pixel for pixel: the same per-axis weights, rounded
//! to the same 22-bit fixed point, the horizontal pass first into an 8-bit image, then the
//! vertical one. An axis whose size does not change is not resampled, as in Pillow.

use crate::backend::Resample;

/// Fractional bits of the fixed-point weights: 32 bits less 8 for the pixel value and 2
/// for the headroom negative lobes need.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// A filter Pillow resamples with, and how far (in input pixels, at scale 1) it reaches.
#[derive(Debug, Clone, Copy)]
pub struct Filter {
    weight: fn(f64) -> f64,
    support: f64,
}

impl Filter {
    /// The convolution filter of `resample`; `None` for NEAREST, which is no convolution.
    pub fn of(resample: Resample) -> Option<Filter> {
        let (weight, support): (fn(f64) -> f64, f64) = match resample {
            Resample::Nearest => return None,
            Resample::Box => (box_filter, 0.5),
            Resample::Bilinear => (bilinear, 1.0),
            Resample::Hamming => (hamming, 1.0),
            Resample::Bicubic => (bicubic, 2.0),
            Resample::Lanczos => (lanczos, 3.0),
        };
        Some(Filter { weight, support })
    }
}

fn box_filter(x: f64) -> f64 {
    if x > -0.5 && x <= 0.5 {
        1.0
    } else {
        0.0
    }
}

fn bilinear(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

fn hamming(x: f64) -> f64 {
    let x = x.abs();
    if x == 0.0 {
        1.0
    } else if x >= 1.0 {
        0.0
    } else {
        let x = x * std::f64::consts::PI;
        x.sin() / x * (0.54 + 0.46 * x.cos())
    }
}

fn bicubic(x: f64) -> f64 {
    // Keys' cubic with a = -0.5, evaluated in Pillow's order of operations.
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let x = x * std::f64::consts::PI;
        x.sin() / x
    }
}

fn lanczos(x: f64) -> f64 {
    if -3.0 < x && x < 3.0 {
        sinc(x) * sinc(x / 3.0)
    } else {
        0.0
    }
}

/// One axis's weights: output `i` is the sum over `len[i]` inputs from `first[i]` of
/// input times `weights[i * stride ..]`, in fixed point.
#[derive(Debug, PartialEq)]
pub struct AxisWeights {
    pub first: Vec<usize>,
    pub len: Vec<usize>,
    pub stride: usize,
    pub weights: Vec<i32>,
}

impl AxisWeights {
    /// The weights resizing `input` pixels to `output` with `filter`.
    pub fn new(input: usize, output: usize, filter: Filter) -> AxisWeights {
        let scale = input as f64 / output as f64;
        let filterscale = scale.max(1.0);
        let support = filter.support * filterscale;
        let stride = support.ceil() as usize * 2 + 1;
        let mut first = Vec::with_capacity(output);
        let mut len = Vec::with_capacity(output);
        let mut weights = vec![0i32; output * stride];
        let mut exact = vec![0f64; stride];
        let ss = 1.0 / filterscale;
        for (xx, row) in weights.chunks_exact_mut(stride).enumerate() {
            let center = (xx as f64 + 0.5) * scale;
            // `as` truncates toward zero, as C's `(int)` does.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(input as i64) as usize - xmin;
            let mut sum = 0.0;
            for (x, w) in exact[..xmax].iter_mut().enumerate() {
                *w = (filter.weight)((x as f64 + xmin as f64 - center + 0.5) * ss);
                sum += *w;
            }
            for (k, w) in row.iter_mut().zip(&exact[..xmax]) {
                let w = if sum != 0.0 { w / sum } else { *w };
                *k = fixed_point(w);
            }
            first.push(xmin);
            len.push(xmax);
        }
        AxisWeights {
            first,
            len,
            stride,
            weights,
        }
    }

    fn of(&self, i: usize) -> (usize, &[i32]) {
        let start = i * self.stride;
        (self.first[i], &self.weights[start..start + self.len[i]])
    }
}

fn fixed_point(w: f64) -> i32 {
    let scaled = w * f64::from(1u32 << PRECISION_BITS);
    if w < 0.0 {
        (scaled - 0.5) as i32
    } else {
        (scaled + 0.5) as i32
    }
}

/// A fixed-point sum back to a pixel value, rounded half up and clamped to 0..=255.
#[inline]
fn to_u8(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// An 8-bit RGB image, rows of interleaved `[r, g, b]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rgb {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

/// `image` resized to `width x height` as Pillow's `Image.resize` does with `filter`.
pub fn resize(image: &Rgb, width: usize, height: usize, filter: Filter) -> Rgb {
    let horizontal = width != image.width;
    let vertical = height != image.height;
    if !horizontal && !vertical {
        return image.clone();
    }
    let rows = vertical.then(|| AxisWeights::new(image.height, height, filter));
    if !horizontal {
        return resize_rows(image, rows.as_ref().expect("vertical"), 0);
    }
    let columns = AxisWeights::new(image.width, width, filter);
    // Only the rows the vertical pass reads go through the horizontal one.
    let (top, bottom) = match &rows {
        Some(rows) => (rows.first[0], rows.first[height - 1] + rows.len[height - 1]),
        None => (0, image.height),
    };
    let narrowed = resize_columns(image, &columns, top, bottom);
    match &rows {
        Some(rows) => resize_rows(&narrowed, rows, top),
        None => narrowed,
    }
}

/// The horizontal pass over rows `top..bottom` of `image`.
fn resize_columns(image: &Rgb, columns: &AxisWeights, top: usize, bottom: usize) -> Rgb {
    let width = columns.first.len();
    let mut data = vec![0u8; (bottom - top) * width * 3];
    let in_row = image.width * 3;
    for (out_row, y) in data.chunks_exact_mut(width * 3).zip(top..bottom) {
        let row = &image.data[y * in_row..(y + 1) * in_row];
        for (xx, out) in out_row.chunks_exact_mut(3).enumerate() {
            let (first, weights) = columns.of(xx);
            let pixels = &row[first * 3..(first + weights.len()) * 3];
            let (mut r, mut g, mut b) = (HALF, HALF, HALF);
            for (p, &k) in pixels.chunks_exact(3).zip(weights) {
                r += i32::from(p[0]) * k;
                g += i32::from(p[1]) * k;
                b += i32::from(p[2]) * k;
            }
            out[0] = to_u8(r);
            out[1] = to_u8(g);
            out[2] = to_u8(b);
        }
    }
    Rgb {
        width,
        height: bottom - top,
        data,
    }
}

/// The vertical pass; `image` holds the input's rows from `top` on.
fn resize_rows(image: &Rgb, rows: &AxisWeights, top: usize) -> Rgb {
    let height = rows.first.len();
    let row_len = image.width * 3;
    let mut data = vec![0u8; height * row_len];
    let mut sums = vec![0i32; row_len];
    for (yy, out_row) in data.chunks_exact_mut(row_len).enumerate() {
        let (first, weights) = rows.of(yy);
        sums.fill(HALF);
        // Row by row, so the inner loop runs over contiguous bytes and vectorizes.
        for (offset, &k) in weights.iter().enumerate() {
            let y = first + offset - top;
            let row = &image.data[y * row_len..(y + 1) * row_len];
            for (sum, &p) in sums.iter_mut().zip(row) {
                *sum += i32::from(p) * k;
            }
        }
        for (out, &sum) in out_row.iter_mut().zip(&sums) {
            *out = to_u8(sum);
        }
    }
    Rgb {
        width: image.width,
        height,
        data,
    }
}
