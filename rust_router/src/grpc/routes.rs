//! What answers an HTTP/2 request: a gRPC call (`content-type: application/grpc...`) goes to
//! its service, anything else to the HTTP routes, so HTTP/2 clients with prior knowledge
//! reach both on one port.

use super::call::TeiApi;
use super::health::HealthService;
use super::pb;
use crate::connections::Http2Service;
use crate::http::error::handler_failed;
use crate::http::AppState;
use crate::panics::panic_message;
use axum::extract::Request;
use axum::http::header;
use axum::response::Response;
use axum::Router;
use futures_util::FutureExt as _;
use std::panic::AssertUnwindSafe;
use tonic::service::Routes;
use tower::util::BoxCloneSyncService;
use tower::ServiceExt as _;

/// The gRPC services over `state` (messages up to `--payload-limit` bytes), with `app` for
/// the requests that are not gRPC.
pub fn http2_service(state: AppState, app: Router) -> Http2Service {
    let grpc = grpc_routes(state);
    BoxCloneSyncService::new(tower::service_fn(move |req: Request| {
        let grpc = grpc.clone();
        let app = app.clone();
        async move {
            let is_grpc = is_grpc(&req);
            let answer = async move {
                if is_grpc {
                    grpc.oneshot(req)
                        .await
                        .map(|r| r.map(axum::body::Body::new))
                } else {
                    app.oneshot(req).await
                }
            };
            Ok(AssertUnwindSafe(answer)
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| Ok(panicked(is_grpc, panic.as_ref())))
                .unwrap_or_else(|never| match never {}))
        }
    }))
}

fn is_grpc(req: &Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// The answer to a request whose handler panicked (logged): `INTERNAL` to a gRPC call, as
/// the HTTP routes answer one.
fn panicked(is_grpc: bool, panic: &(dyn std::any::Any + Send)) -> Response {
    let why = panic_message(panic).unwrap_or("(no message)");
    tracing::error!("a request's handler panicked: {why}");
    if !is_grpc {
        return handler_failed(false);
    }
    let status =
        tonic::Status::internal("The request's handler failed unexpectedly; the server logged why");
    status.into_http::<axum::body::Body>()
}

fn grpc_routes(state: AppState) -> Routes {
    let limit = state.config.payload_limit;
    let api = TeiApi::new(state.clone());
    let mut routes = Routes::new(pb::info_server::InfoServer::new(api.clone()))
        .add_service(
            pb::embed_server::EmbedServer::new(api.clone()).max_decoding_message_size(limit),
        )
        .add_service(
            pb::predict_server::PredictServer::new(api.clone()).max_decoding_message_size(limit),
        )
        .add_service(
            pb::rerank_server::RerankServer::new(api.clone()).max_decoding_message_size(limit),
        )
        .add_service(pb::tokenize_server::TokenizeServer::new(api).max_decoding_message_size(limit))
        .add_service(tonic_health::pb::health_server::HealthServer::new(
            HealthService::new(state),
        ));
    // Both versions: grpcurl and most tools ask v1, older ones v1alpha.
    match reflection().build_v1() {
        Ok(v1) => routes = routes.add_service(v1),
        Err(e) => tracing::error!("gRPC reflection (v1) is off: {e}"),
    }
    match reflection().build_v1alpha() {
        Ok(v1alpha) => routes = routes.add_service(v1alpha),
        Err(e) => tracing::error!("gRPC reflection (v1alpha) is off: {e}"),
    }
    routes.prepare()
}

/// Reflection over `proto/tei.proto` and the health service's file.
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}
