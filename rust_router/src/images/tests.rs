use super::*;
use base64::Engine;

const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn data_urls_and_plain_base64_give_the_bytes() {
    let limits = ImageLimits::default();
    let plain = b64(PNG_MAGIC);
    assert_eq!(decode_source(&plain, &limits).unwrap(), PNG_MAGIC);
    let url = format!("data:image/png;base64,{plain}");
    assert_eq!(decode_source(&url, &limits).unwrap(), PNG_MAGIC);
    let upper = format!("DATA:image/png;BASE64,{plain}");
    assert_eq!(decode_source(&upper, &limits).unwrap(), PNG_MAGIC);
}

#[test]
fn unpadded_url_safe_and_wrapped_base64_are_read() {
    let limits = ImageLimits::default();
    let bytes = [0xfbu8, 0xff, 0xfe, 0x01];
    let url_safe = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    assert_eq!(decode_source(&url_safe, &limits).unwrap(), bytes);
    let wrapped = format!("{}\n{}", &b64(&bytes)[..4], &b64(&bytes)[4..]);
    assert_eq!(decode_source(&wrapped, &limits).unwrap(), bytes);
}

#[test]
fn urls_are_left_to_the_fetcher() {
    let limits = ImageLimits::default();
    for url in ["http://example.com/a.png", "HTTPS://example.com/a.png"] {
        assert_eq!(decode_source(url, &limits), Err(ImageError::Url));
    }
}

#[test]
fn a_data_url_must_be_base64() {
    let limits = ImageLimits::default();
    for source in ["data:image/png,rawbytes", "data:image/png;base64"] {
        assert_eq!(
            decode_source(source, &limits),
            Err(ImageError::NotBase64DataUrl)
        );
    }
}

#[test]
fn bad_base64_and_empty_images_are_refused() {
    let limits = ImageLimits::default();
    assert!(matches!(
        decode_source("not base64 at all!", &limits),
        Err(ImageError::Base64(_))
    ));
    assert_eq!(
        decode_source("data:image/png;base64,", &limits),
        Err(ImageError::Empty)
    );
}

#[test]
fn more_bytes_than_the_limit_are_refused() {
    let limits = ImageLimits {
        max_bytes: 5,
        ..ImageLimits::default()
    };
    assert_eq!(decode_source(&b64(b"12345"), &limits).unwrap(), b"12345");
    assert_eq!(
        decode_source(&b64(b"123456"), &limits),
        Err(ImageError::TooManyBytes { given: 6, max: 5 })
    );
    // Far over the limit: refused from the text's length, before decoding.
    assert!(matches!(
        decode_source(&b64(&[0u8; 300]), &limits),
        Err(ImageError::TooManyBytes { max: 5, .. })
    ));
}
