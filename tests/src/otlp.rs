//! A tiny OTLP/gRPC metrics receiver for tests, and readers for what it
//! received.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::{
    collector::metrics::v1::{
        metrics_service_server::{MetricsService, MetricsServiceServer},
        ExportMetricsServiceRequest, ExportMetricsServiceResponse,
    },
    metrics::v1::{metric::Data, number_data_point::Value as Num},
};

#[derive(Clone, Default)]
pub struct Sink(pub Arc<Mutex<Vec<ExportMetricsServiceRequest>>>);

#[tonic::async_trait]
impl MetricsService for Sink {
    async fn export(
        &self,
        req: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(req.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// Serves OTLP/gRPC metrics on 127.0.0.1:`port` on `rt`.
pub fn start_receiver(rt: &tokio::runtime::Runtime, port: u16) -> Sink {
    let sink = Sink::default();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
        .unwrap();
    let svc = sink.clone();
    rt.spawn(async move {
        tonic::transport::Server::builder()
            .add_service(MetricsServiceServer::new(svc))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
    });
    sink
}

/// Cumulative (sum of counts, sum of sums) of a histogram in the last
/// export that has it.
pub fn histogram(
    exports: &[ExportMetricsServiceRequest],
    name: &str,
) -> Option<(u64, f64, String)> {
    for e in exports.iter().rev() {
        for rm in &e.resource_metrics {
            for sm in &rm.scope_metrics {
                for m in &sm.metrics {
                    if m.name == name {
                        if let Some(Data::Histogram(h)) = &m.data {
                            let c = h.data_points.iter().map(|p| p.count).sum();
                            let s = h.data_points.iter().map(|p| p.sum.unwrap_or(0.0)).sum();
                            return Some((c, s, m.unit.clone()));
                        }
                    }
                }
            }
        }
    }
    None
}

pub fn counter(exports: &[ExportMetricsServiceRequest], name: &str) -> Option<u64> {
    for e in exports.iter().rev() {
        for rm in &e.resource_metrics {
            for sm in &rm.scope_metrics {
                for m in &sm.metrics {
                    if m.name == name {
                        if let Some(Data::Sum(s)) = &m.data {
                            return Some(
                                s.data_points
                                    .iter()
                                    .map(|p| match p.value {
                                        Some(Num::AsInt(i)) => i as u64,
                                        Some(Num::AsDouble(d)) => d as u64,
                                        None => 0,
                                    })
                                    .sum(),
                            );
                        }
                    }
                }
            }
        }
    }
    None
}

/// Names of the metrics with an exponential histogram in the last export.
pub fn exponential_histograms(exports: &[ExportMetricsServiceRequest]) -> Vec<String> {
    let mut out = vec![];
    if let Some(e) = exports.last() {
        for rm in &e.resource_metrics {
            for sm in &rm.scope_metrics {
                for m in &sm.metrics {
                    if let Some(Data::ExponentialHistogram(_)) = &m.data {
                        out.push(m.name.clone());
                    }
                }
            }
        }
    }
    out
}
