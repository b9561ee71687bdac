//! Image inputs of a request: each becomes one sequence of the model's
//! `tokens_per_image` placeholder tokens carrying its pixels.

use super::Infer;
use crate::backend::BatchKind;
use crate::images::{decode_source, image_url, ImageError, ImageFetcher, ImageLimits};
use crate::tokenization::{ValidEncoding, Window};

impl Infer {
    /// `--max-image-bytes` and `--max-image-pixels` (the defaults otherwise).
    pub fn with_image_limits(mut self, limits: ImageLimits) -> Self {
        self.image_limits = limits;
        self
    }

    /// Fetches image URLs from the hosts it allows (none otherwise).
    pub fn with_image_fetcher(mut self, fetcher: ImageFetcher) -> Self {
        self.image_fetcher = fetcher;
        self
    }

    /// An image input's one sequence: its pixels, made from the bytes `source` carries (or
    /// that its URL answers, fetched here, before any thread decodes it) by the router on the
    /// tokenization pool, or by the runtime where the router leaves the image; and
    /// `tokens_per_image` placeholder tokens.
    pub(super) async fn image_window(
        &self,
        source: String,
        kind: BatchKind,
    ) -> Result<Window, ImageError> {
        if kind != BatchKind::Pooled {
            return Err(ImageError::NotAccepted(
                "an image is embedded only as a pooled vector (`/embed`, `/v1/embeddings`)".into(),
            ));
        }
        let Some(image_input) = self.info.image_input.as_ref() else {
            return Err(ImageError::NotAccepted(format!(
                "the model ({}) embeds texts only: it takes no images",
                self.info.architecture
            )));
        };
        let Some(images) = self.backend.images().cloned() else {
            return Err(ImageError::NotAccepted(
                "this model's images are preprocessed by the runtime, which runs in device \
                 worker processes here (`--device-workers threads` serves them)"
                    .into(),
            ));
        };
        let tokens = image_input.tokens_per_image;
        let limits = self.image_limits;
        let fetched = match image_url(&source) {
            Some(url) => Some(self.image_fetcher.fetch(url, limits.max_bytes).await?),
            None => None,
        };
        let panicked = || ImageError::Unreadable("the image's preprocessing panicked".into());
        // On the tokenization pool: its threads give way to those that answer queries, and
        // there are as many as it has cores for preparing inputs.
        let native = images.clone();
        let (bytes, natively) = self
            .tokenization
            .run(move || {
                let bytes = match fetched {
                    Some(bytes) => bytes,
                    None => decode_source(&source, &limits)?,
                };
                let natively = native.preprocess_natively(&bytes, limits.max_pixels);
                Ok::<_, ImageError>((bytes, natively))
            })
            .await
            .map_err(|_| panicked())??;
        let pixels = match natively {
            Some(pixels) => pixels,
            // The runtime's preprocessing holds the interpreter's lock at times: a thread of
            // the default class, one image per core at most.
            None => {
                let _worker = self.image_workers.acquire().await;
                tokio::task::spawn_blocking(move || images.preprocess(&bytes, limits.max_pixels))
                    .await
                    .map_err(|_| panicked())?
            }
        };
        Ok(Window {
            encoding: ValidEncoding::image(tokens, pixels.map_err(ImageError::Unreadable)?),
            weight: tokens,
        })
    }
}
