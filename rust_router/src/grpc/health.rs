//! `grpc.health.v1.Health`, as Kubernetes gRPC probes and `grpc-health-probe` ask it: a
//! service is `SERVING` while `/health` would answer 200 and a served model serves the
//! service's calls (`tei.v1.Rerank` needs a reranker), `NOT_SERVING` otherwise and from the
//! moment the server drains. The empty name is the server as a whole. No API key: probes
//! carry none, as `/health` needs none.

use super::pb;
use crate::backend::ModelType;
use crate::http::meta::serving;
use crate::http::AppState;
use crate::shutdown::Phase;
use futures_util::stream::{self, Stream, StreamExt as _};
use std::pin::Pin;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::Health;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

pub(crate) struct HealthService {
    state: AppState,
}

impl HealthService {
    pub fn new(state: AppState) -> Self {
        Self { state }
    }

    /// `service`'s status now, or `NOT_FOUND` for a service the server does not have.
    async fn status(&self, service: &str) -> Result<ServingStatus, Status> {
        let served = |types: &[ModelType]| {
            self.state
                .models
                .entries()
                .iter()
                .any(|e| types.contains(&e.infer.info().model_type))
        };
        let has_calls = match service {
            "" => true,
            name if name == info_name() || name == tokenize_name() => true,
            name if name == embed_name() => served(&[ModelType::Embedding, ModelType::Sparse]),
            name if name == predict_name() => served(&[ModelType::Classifier, ModelType::Reranker]),
            name if name == rerank_name() => served(&[ModelType::Reranker]),
            _ => {
                return Err(Status::not_found(format!(
                    "unknown service `{service}`: the server has `` (all), {}",
                    [
                        info_name(),
                        embed_name(),
                        predict_name(),
                        rerank_name(),
                        tokenize_name()
                    ]
                    .join(", ")
                )))
            }
        };
        if !has_calls {
            return Ok(ServingStatus::NotServing);
        }
        Ok(match serving(&self.state).await {
            Ok(_) => ServingStatus::Serving,
            Err(_) => ServingStatus::NotServing,
        })
    }
}

fn info_name() -> &'static str {
    <pb::info_server::InfoServer<()> as NamedService>::NAME
}

fn embed_name() -> &'static str {
    <pb::embed_server::EmbedServer<()> as NamedService>::NAME
}

fn predict_name() -> &'static str {
    <pb::predict_server::PredictServer<()> as NamedService>::NAME
}

fn rerank_name() -> &'static str {
    <pb::rerank_server::RerankServer<()> as NamedService>::NAME
}

fn tokenize_name() -> &'static str {
    <pb::tokenize_server::TokenizeServer<()> as NamedService>::NAME
}

fn answer(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status.into(),
    }
}

type Updates = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let status = self.status(&request.get_ref().service).await?;
        Ok(Response::new(answer(status)))
    }

    type WatchStream = Updates;

    /// The status at the call, then `NOT_SERVING` once the server drains; the stream stays
    /// open until the client ends it (a later device failure shows in `Check` and `/health`).
    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let now = self.status(&request.get_ref().service).await?;
        let first = stream::once(async move { Ok(answer(now)) });
        let shutdown = self.state.shutdown.clone();
        let updates: Updates = if now == ServingStatus::NotServing && shutdown.is_draining() {
            Box::pin(first.chain(stream::pending()))
        } else {
            let draining = stream::once(async move {
                shutdown.reached(Phase::Draining).await;
                Ok(answer(ServingStatus::NotServing))
            });
            Box::pin(first.chain(draining).chain(stream::pending()))
        };
        Ok(Response::new(updates))
    }
}
