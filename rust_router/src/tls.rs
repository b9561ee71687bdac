//! The process's rustls crypto provider: ring. reqwest's rustls, which image URLs need, is the
//! OTLP HTTP exporter's too (Cargo unifies features), and rustls picks no provider on its own
//! once none is compiled in by default: each client that may build TLS installs this first.

use std::sync::Once;

pub fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // Err only if one is installed already, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
