//! The gRPC API: TEI's `tei.v1` services (`proto/tei.proto`), the standard health service
//! (`grpc.health.v1`) and server reflection, answered on HTTP/2 connections
//! (`connections::http2`) beside the HTTP routes. Each `tei.v1` call converts its message
//! into the matching HTTP route's body and runs that route's own logic
//! (`http::embed::embed_answer`, ...), so validation, limits, the queue, lanes, metrics and
//! error messages are the HTTP routes'; only the status codes are gRPC's ([`status`]).

mod call;
mod classify;
mod convert;
mod deadline;
mod embed;
mod health;
mod meta;
mod pb;
mod routes;
mod status;
mod streams;

pub use routes::http2_service;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_tracing;
#[cfg(test)]
mod tests_wire;
