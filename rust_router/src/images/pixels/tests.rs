use super::resample::{resize, AxisWeights, Filter, Rgb};
use super::steps::{center_crop, shortest_edge_size};
use super::*;
use crate::backend::{Resample, ResizeTo};
use std::io::Cursor;

const ONE: f64 = (1u32 << 22) as f64;

fn fixed(w: f64) -> i32 {
    (w * ONE + 0.5) as i32
}

fn png(image: image::DynamicImage) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    image.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

fn clip_steps() -> ImageSteps {
    ImageSteps {
        resize: Some(ResizeTo::ShortestEdge { shortest_edge: 4 }),
        resample: Resample::Bicubic,
        crop: Some([4, 4]),
        rescale_factor: Some(1.0 / 255.0),
        mean: Some([0.5; 3]),
        std: Some([0.25; 3]),
        convert_rgb: true,
        patch_size: None,
        max_num_patches: None,
    }
}

#[test]
fn halving_with_bilinear_weighs_three_inputs_per_output() {
    // Scale 2 widens the triangle to 2 input pixels each side: output 0 centres on 1.0
    // and reads inputs 0..3 at distances 0.5, 0.5 and 1.5 (weights 0.75, 0.75, 0.25).
    let weights = AxisWeights::new(4, 2, Filter::of(Resample::Bilinear).unwrap());
    assert_eq!(weights.first, [0, 1]);
    assert_eq!(weights.len, [3, 3]);
    assert_eq!(weights.stride, 5);
    let expected = [fixed(3.0 / 7.0), fixed(3.0 / 7.0), fixed(1.0 / 7.0)];
    assert_eq!(&weights.weights[..3], expected);
    assert_eq!(
        &weights.weights[5..8],
        [expected[2], expected[0], expected[1]]
    );
}

#[test]
fn bicubic_weights_have_negative_lobes_rounded_away_from_zero() {
    let weights = AxisWeights::new(8, 5, Filter::of(Resample::Bicubic).unwrap());
    let negative: Vec<i32> = weights.weights.iter().copied().filter(|&k| k < 0).collect();
    assert!(!negative.is_empty());
    for i in 0..5 {
        let row = &weights.weights[i * weights.stride..i * weights.stride + weights.len[i]];
        // Each output's weights sum to one, give or take the rounding of each.
        let sum: i32 = row.iter().sum();
        assert!((sum - ONE as i32).abs() <= row.len() as i32, "{sum}");
    }
}

#[test]
fn nearest_is_no_convolution() {
    assert!(Filter::of(Resample::Nearest).is_none());
    let steps = ImageSteps {
        resample: Resample::Nearest,
        ..clip_steps()
    };
    assert!(Plan::new(&steps).unwrap_err().contains("Nearest"));
}

#[test]
fn one_pixel_images_upscale_to_their_colour() {
    let pixel = Rgb {
        width: 1,
        height: 1,
        data: vec![10, 200, 255],
    };
    for resample in [
        Resample::Box,
        Resample::Bilinear,
        Resample::Bicubic,
        Resample::Lanczos,
    ] {
        let out = resize(&pixel, 3, 2, Filter::of(resample).unwrap());
        assert_eq!((out.width, out.height), (3, 2));
        assert!(
            out.data.chunks(3).all(|p| p == [10, 200, 255]),
            "{resample:?}"
        );
    }
}

#[test]
fn an_unchanged_size_is_a_copy() {
    let image = Rgb {
        width: 2,
        height: 1,
        data: vec![1, 2, 3, 4, 5, 6],
    };
    assert_eq!(
        resize(&image, 2, 1, Filter::of(Resample::Lanczos).unwrap()),
        image
    );
}

#[test]
fn shortest_edge_sizes_truncate_the_long_side() {
    assert_eq!(shortest_edge_size(640, 480, 224), (298, 224));
    assert_eq!(shortest_edge_size(480, 640, 224), (224, 298));
    assert_eq!(shortest_edge_size(5, 5, 3), (3, 3));
}

#[test]
fn a_crop_larger_than_the_image_pads_with_zeros_around_it() {
    let image = Rgb {
        width: 2,
        height: 1,
        data: vec![1, 1, 1, 2, 2, 2],
    };
    let out = center_crop(&image, 3, 4);
    // Rows: one pad row above (ceil of (3 - 1) / 2); columns: one pad column left.
    let mut expected = vec![0u8; 3 * 4 * 3];
    expected[(4 + 1) * 3..(4 + 1) * 3 + 6].copy_from_slice(&image.data);
    assert_eq!(out.data, expected);
    let wide = Rgb {
        width: 5,
        height: 1,
        data: (0..15).collect(),
    };
    // Wider than the crop, shorter than it: cropped across, padded above (the ceiling of
    // half of one row).
    let out = center_crop(&wide, 2, 3);
    assert!(out.data[..9].iter().all(|&v| v == 0));
    assert_eq!(&out.data[9..], &(3..12).collect::<Vec<u8>>()[..]);
}

#[test]
fn pixels_are_channels_first_rescaled_and_normalized() {
    let grey =
        image::DynamicImage::ImageLuma8(image::GrayImage::from_pixel(4, 4, image::Luma([51])));
    let (out, shape) = preprocess(&clip_steps(), &png(grey), 1000).unwrap();
    assert_eq!(shape, [3, 4, 4]);
    assert_eq!(out.len(), 3 * 4 * 4);
    let value = ((51.0f64 / 255.0) as f32 - 0.5) / 0.25;
    assert!(out.iter().all(|&v| v == value), "{:?}", &out[..4]);
}

#[test]
fn naflex_blocks_hold_patches_then_padding_then_the_grid() {
    let steps = ImageSteps {
        resize: None,
        crop: None,
        patch_size: Some(2),
        max_num_patches: Some(5),
        ..clip_steps()
    };
    let rgb = image::RgbImage::from_fn(4, 2, |x, _| image::Rgb([x as u8 * 60, 0, 0]));
    let (out, shape) = preprocess(&steps, &png(image::DynamicImage::ImageRgb8(rgb)), 1000).unwrap();
    assert_eq!(shape, [1, 6, 12]);
    // A 4x2 image within 5 patches of 2x2: any larger scale needs a 2x3 grid, so it stays
    // a 1x2 grid: 2 patches, 3 padding rows, the grid row.
    assert_eq!(out.len(), 6 * 12);
    let last = &out[5 * 12..];
    assert_eq!((last[0], last[1]), (1.0, 2.0));
    assert!(last[2..].iter().all(|&v| v == 0.0));
    assert!(out[2 * 12..5 * 12].iter().all(|&v| v == 0.0));
}

#[test]
fn bad_bytes_and_large_images_are_refused_with_the_reason() {
    let err = decode_rgb(b"not an image at all", 1000).unwrap_err();
    assert!(matches!(err, DecodeError::NotAnImage), "{err}");
    let big = png(image::DynamicImage::new_rgb8(40, 30));
    let err = decode_rgb(&big, 1000).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the image has 40x30 = 1200 pixels, more than the limit of 1000"
    );
    let cut = &big[..big.len() / 2];
    assert!(matches!(
        decode_rgb(cut, 10_000).unwrap_err(),
        DecodeError::Corrupt(_)
    ));
}

#[test]
fn truncated_jpegs_are_left_to_the_runtime() {
    let mut out = Cursor::new(Vec::new());
    image::DynamicImage::new_rgb8(64, 64)
        .write_to(&mut out, image::ImageFormat::Jpeg)
        .unwrap();
    let jpeg = out.into_inner();
    assert!(decode_rgb(&jpeg, 10_000).is_ok());
    let err = decode_rgb(&jpeg[..jpeg.len() - 40], 10_000).unwrap_err();
    assert!(matches!(err, DecodeError::Unsupported(_)), "{err}");
}

/// Counts the images handed to it, as the runtime's preprocessor.
struct Runtime(std::sync::atomic::AtomicUsize);

impl ImagePreprocessor for Runtime {
    fn preprocess(&self, _: &[u8], _: u64) -> Result<Vec<f32>, String> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err("from the runtime".into())
    }
}

#[test]
fn images_the_decoder_leaves_go_to_the_runtime() {
    let runtime = Arc::new(Runtime(Default::default()));
    let images = RustImages::new(&clip_steps(), Some(runtime.clone())).unwrap();
    let small = png(image::DynamicImage::new_rgb8(5, 5));
    assert_eq!(images.preprocess(&small, 1000).unwrap().len(), 48);
    assert_eq!(
        images.preprocess(b"BM not ours", 1000).unwrap_err(),
        "from the runtime"
    );
    // The pixel limit is checked here, with the runtime's words.
    let err = images.preprocess(&small, 10).unwrap_err();
    assert!(err.starts_with("the image has 5x5 = 25 pixels"), "{err}");
    assert_eq!(runtime.0.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[test]
fn without_a_runtime_the_images_it_would_read_are_refused_with_the_reason() {
    let images = RustImages::new(&clip_steps(), None).unwrap();
    let small = png(image::DynamicImage::new_rgb8(5, 5));
    assert_eq!(images.preprocess(&small, 1000).unwrap().len(), 48);
    let err = images.preprocess(b"BM not ours", 1000).unwrap_err();
    assert_eq!(err, "the bytes are not a PNG, JPEG, WebP or GIF image");
    let sixteen_bit = png(image::DynamicImage::new_rgb16(5, 5));
    let err = images.preprocess(&sixteen_bit, 1000).unwrap_err();
    assert!(err.contains("`--device-workers threads`"), "{err}");
}

#[test]
fn steps_parse_from_the_runtimes_json_exactly() {
    let json = r#"{"resize": {"shortest_edge": 224}, "resample": "bicubic", "crop": [224, 224],
        "rescale_factor": 0.00392156862745098, "mean": [0.48145466, 0.4578275, 0.40821073],
        "std": [0.26862954, 0.26130258, 0.27577711], "convert_rgb": true,
        "patch_size": null, "max_num_patches": null}"#;
    let steps: ImageSteps = serde_json::from_str(json).unwrap();
    assert_eq!(
        steps.resize,
        Some(ResizeTo::ShortestEdge { shortest_edge: 224 })
    );
    assert_eq!(steps.rescale_factor, Some(1.0 / 255.0));
    let fixed: ImageSteps = serde_json::from_str(
        &json.replace(r#"{"shortest_edge": 224}"#, r#"{"height": 3, "width": 5}"#),
    )
    .unwrap();
    assert_eq!(
        fixed.resize,
        Some(ResizeTo::Fixed {
            height: 3,
            width: 5
        })
    );
}
