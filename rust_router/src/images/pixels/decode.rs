//! Encoded bytes (PNG, JPEG, WebP, GIF) to an upright 8-bit RGB image, as the runtime's
//! `load_image` + `Image.convert("RGB")` make it: the first frame of an animation, turned by
//! its EXIF orientation, alpha dropped (not composited), greyscale expanded. Images whose
//! pixels Pillow would convert differently (16-bit samples, transparent GIF pixels) are
//! refused as [`DecodeError::Unsupported`], for the runtime to preprocess.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader};

use super::resample::Rgb;

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("the bytes are not a PNG, JPEG, WebP or GIF image")]
    NotAnImage,
    #[error(
        "the image has {width}x{height} = {pixels} pixels, more than the limit of {max_pixels}",
        pixels = u64::from(*width) * u64::from(*height)
    )]
    TooManyPixels {
        width: u32,
        height: u32,
        max_pixels: u64,
    },
    #[error("cannot decode the image: {0}")]
    Corrupt(String),
    #[error("{0} are converted to RGB by the runtime, not here")]
    Unsupported(&'static str),
}

/// The upright RGB pixels of `data`, refused before decoding when the header says the
/// image has more than `max_pixels` pixels.
pub fn decode_rgb(data: &[u8], max_pixels: u64) -> Result<Rgb, DecodeError> {
    let reader = ImageReader::new(Cursor::new(data))
        .with_guessed_format()
        .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
    let format = reader.format().ok_or(DecodeError::NotAnImage)?;
    if !matches!(
        format,
        ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif
    ) {
        return Err(DecodeError::NotAnImage);
    }
    if format == ImageFormat::Jpeg && !ends_with_end_of_image(data) {
        // zune-jpeg fills in a cut-off scan where Pillow refuses the file.
        return Err(DecodeError::Unsupported("truncated JPEG files"));
    }
    let mut decoder = reader
        .into_decoder()
        .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
    let (width, height) = decoder.dimensions();
    if u64::from(width) * u64::from(height) > max_pixels {
        return Err(DecodeError::TooManyPixels {
            width,
            height,
            max_pixels,
        });
    }
    let orientation = decoder
        .orientation()
        .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
    let mut image =
        DynamicImage::from_decoder(decoder).map_err(|e| DecodeError::Corrupt(e.to_string()))?;
    image.apply_orientation(orientation);
    rgb_of(image, format == ImageFormat::Gif)
}

/// A JPEG file's last marker (EOI), allowing trailing padding bytes.
fn ends_with_end_of_image(data: &[u8]) -> bool {
    let tail = &data[data.len().saturating_sub(4096)..];
    tail.windows(2).any(|w| w == [0xff, 0xd9])
}

fn rgb_of(image: DynamicImage, gif: bool) -> Result<Rgb, DecodeError> {
    let (width, height) = (image.width() as usize, image.height() as usize);
    let data = match image {
        DynamicImage::ImageRgb8(rgb) => rgb.into_raw(),
        DynamicImage::ImageRgba8(rgba) => {
            // A GIF's transparent pixels come out with alpha 0 and no colour, where
            // Pillow keeps the palette entry's colour.
            if gif && rgba.pixels().any(|p| p.0[3] != 255) {
                return Err(DecodeError::Unsupported("GIFs with transparent pixels"));
            }
            rgba.into_raw()
                .chunks_exact(4)
                .flat_map(|p| [p[0], p[1], p[2]])
                .collect()
        }
        DynamicImage::ImageLuma8(grey) => grey.into_raw().iter().flat_map(|&l| [l, l, l]).collect(),
        DynamicImage::ImageLumaA8(grey) => grey
            .into_raw()
            .chunks_exact(2)
            .flat_map(|p| [p[0], p[0], p[0]])
            .collect(),
        _ => {
            return Err(DecodeError::Unsupported(
                "images of 16-bit or float samples",
            ))
        }
    };
    Ok(Rgb {
        width,
        height,
        data,
    })
}
