//! The messages and server traits generated from `proto/tei.proto` by `build.rs`, and the
//! file's encoded descriptor (for server reflection).

#![allow(clippy::all, clippy::pedantic)]

tonic::include_proto!("tei.v1");

/// `proto/tei.proto` compiled, as gRPC server reflection serves it.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tei_descriptor.bin"));
