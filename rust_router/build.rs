//! Compiles `proto/tei.proto` (the `tei.v1` gRPC API) into Rust messages and server traits,
//! and keeps its encoded descriptor for gRPC server reflection. protox parses the file in
//! Rust, so building needs no `protoc`.

use prost::Message as _;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/tei.proto");
    let descriptors = protox::compile(["tei.proto"], ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("tei_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
