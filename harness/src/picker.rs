//! A stand-in endpoint picker for tests: a gRPC `ext_proc` server that does what each
//! request's test header [`PLAN_HEADER`] says, the way a GIE EPP, llm-d or Dynamo would.
//!
//! The plan is a JSON object: `{"set": {"header": "value", ...}}` sets those request headers
//! (OVERWRITE_IF_EXISTS_OR_ADD), `{"status": 503, "body": "..."}` answers the request itself
//! (the EPP's own 503 or 429). Without the header the stand-in changes nothing. It answers
//! Envoy's `FULL_DUPLEX_STREAMED` mode (the bootstrap's): headers at once, every body chunk
//! passed back as it came.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Result;
use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpBody,
    HttpHeaders, ImmediateResponse, ProcessingRequest, ProcessingResponse, StreamedBodyResponse,
    TrailersResponse, body_mutation, processing_request, processing_response,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::value::Kind;
use futures_util::Stream;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status, Streaming};

use crate::grpc;

/// The test header holding the stand-in's plan for a request; removed before it goes on.
pub const PLAN_HEADER: &str = "x-stand-in-picker";
/// The metadata namespace the gateway reports the endpoints that served in.
pub const SERVED_NAMESPACE: &str = "envoy.lb";

/// One HTTP request as the stand-in saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeenRequest {
    /// The request headers as the picker got them (its plan included).
    pub headers: Vec<(String, String)>,
    /// The response headers as the picker got them; empty if it never saw the response.
    pub response_headers: Vec<(String, String)>,
    /// The `envoy.lb` metadata fields that came with the response headers.
    pub served: Vec<(String, String)>,
}

impl SeenRequest {
    /// The first value of request header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name)
    }

    /// The value of `envoy.lb` metadata field `key`.
    pub fn served(&self, key: &str) -> Option<&str> {
        find(&self.served, key)
    }
}

fn find<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.as_str())
}

/// The requests seen, each under the number of its gRPC stream.
type Log = Arc<Mutex<Vec<(u64, SeenRequest)>>>;

/// A running stand-in picker on `127.0.0.1`; it stops when dropped.
pub struct StandInPicker {
    address: SocketAddr,
    log: Log,
    server: JoinHandle<()>,
}

impl StandInPicker {
    pub async fn start() -> Result<Self> {
        let log = Log::default();
        let service = ExternalProcessorServer::new(Picker {
            log: log.clone(),
            streams: Arc::default(),
        });
        let router = tonic::transport::Server::builder().add_service(service);
        let (address, server) = grpc::serve(router, "stand-in picker").await?;
        Ok(StandInPicker {
            address,
            log,
            server,
        })
    }

    /// Where the gRPC `ext_proc` service listens (`picker.address`).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Every request seen, in order of arrival.
    pub fn seen(&self) -> Vec<SeenRequest> {
        lock(&self.log)
            .iter()
            .map(|(_, seen)| seen.clone())
            .collect()
    }

    pub fn clear(&self) {
        lock(&self.log).clear();
    }
}

impl Drop for StandInPicker {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn lock(log: &Log) -> std::sync::MutexGuard<'_, Vec<(u64, SeenRequest)>> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Picker {
    log: Log,
    streams: Arc<AtomicU64>,
}

type Responses = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Picker {
    type ProcessStream = Responses;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let stream = Exchange {
            id: self.streams.fetch_add(1, Ordering::Relaxed),
            log: self.log.clone(),
        };
        let (sender, receiver) = mpsc::channel(16);
        tokio::spawn(stream.run(request.into_inner(), sender));
        let responses = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|response| (response, receiver))
        });
        Ok(Response::new(Box::pin(responses)))
    }
}

/// One gRPC stream: one HTTP request and its response.
struct Exchange {
    id: u64,
    log: Log,
}

type Sender = mpsc::Sender<Result<ProcessingResponse, Status>>;

impl Exchange {
    async fn run(self, mut inbound: Streaming<ProcessingRequest>, sender: Sender) {
        loop {
            let message = match inbound.message().await {
                Ok(Some(message)) => message,
                Ok(None) => return,
                Err(status) => {
                    log::debug!("stand-in picker stream {}: {status}", self.id);
                    return;
                }
            };
            let Some(response) = self.answer(message) else {
                continue;
            };
            if sender.send(Ok(response)).await.is_err() {
                return;
            }
        }
    }

    fn answer(&self, message: ProcessingRequest) -> Option<ProcessingResponse> {
        use processing_request::Request as Message;
        use processing_response::Response as Answer;
        let answer = match message.request? {
            Message::RequestHeaders(headers) => self.request_headers(&headers),
            Message::ResponseHeaders(headers) => {
                self.record_response(&headers, message.metadata_context.as_ref());
                Answer::ResponseHeaders(HeadersResponse::default())
            }
            Message::RequestBody(body) => Answer::RequestBody(passed_back(body)),
            Message::ResponseBody(body) => Answer::ResponseBody(passed_back(body)),
            Message::RequestTrailers(_) => Answer::RequestTrailers(TrailersResponse::default()),
            Message::ResponseTrailers(_) => Answer::ResponseTrailers(TrailersResponse::default()),
        };
        Some(ProcessingResponse {
            response: Some(answer),
            ..ProcessingResponse::default()
        })
    }

    fn request_headers(&self, headers: &HttpHeaders) -> processing_response::Response {
        let headers = header_pairs(headers);
        let plan = find(&headers, PLAN_HEADER).map(serde_json::from_str::<Plan>);
        lock(&self.log).push((
            self.id,
            SeenRequest {
                headers,
                ..SeenRequest::default()
            },
        ));
        match plan {
            None => headers_changed(None),
            Some(Ok(Plan {
                status: Some(status),
                body,
                ..
            })) => immediate(status, body.into_bytes()),
            Some(Ok(plan)) => headers_changed(Some(plan.mutation())),
            Some(Err(error)) => immediate(500, format!("{PLAN_HEADER}: {error}").into_bytes()),
        }
    }

    fn record_response(
        &self,
        headers: &HttpHeaders,
        metadata: Option<&envoy_types::pb::envoy::config::core::v3::Metadata>,
    ) {
        let served = metadata
            .and_then(|m| m.filter_metadata.get(SERVED_NAMESPACE))
            .map(|fields| {
                fields
                    .fields
                    .iter()
                    .map(|(key, value)| (key.clone(), metadata_text(value.kind.as_ref())))
                    .collect()
            })
            .unwrap_or_default();
        let mut log = lock(&self.log);
        if let Some((_, seen)) = log.iter_mut().find(|(id, _)| *id == self.id) {
            seen.response_headers = header_pairs(headers);
            seen.served = served;
        }
    }
}

/// What a request's [`PLAN_HEADER`] asks of the stand-in.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Plan {
    #[serde(default)]
    set: BTreeMap<String, String>,
    status: Option<u32>,
    #[serde(default)]
    body: String,
}

impl Plan {
    fn mutation(self) -> HeaderMutation {
        let set = |(key, value): (String, String)| HeaderValueOption {
            header: Some(HeaderValue {
                key,
                raw_value: value.into_bytes(),
                ..HeaderValue::default()
            }),
            append_action: HeaderAppendAction::OverwriteIfExistsOrAdd.into(),
            ..HeaderValueOption::default()
        };
        HeaderMutation {
            set_headers: self.set.into_iter().map(set).collect(),
            remove_headers: vec![PLAN_HEADER.to_owned()],
        }
    }
}

fn header_pairs(headers: &HttpHeaders) -> Vec<(String, String)> {
    let Some(map) = &headers.headers else {
        return Vec::new();
    };
    map.headers
        .iter()
        .map(|header| {
            let value = if header.raw_value.is_empty() {
                header.value.clone()
            } else {
                String::from_utf8_lossy(&header.raw_value).into_owned()
            };
            (header.key.clone(), value)
        })
        .collect()
}

fn metadata_text(kind: Option<&Kind>) -> String {
    match kind {
        Some(Kind::StringValue(text)) => text.clone(),
        other => format!("{other:?}"),
    }
}

fn headers_changed(mutation: Option<HeaderMutation>) -> processing_response::Response {
    processing_response::Response::RequestHeaders(HeadersResponse {
        response: Some(CommonResponse {
            header_mutation: mutation,
            ..CommonResponse::default()
        }),
    })
}

fn immediate(status: u32, body: Vec<u8>) -> processing_response::Response {
    let code = i32::try_from(status).unwrap_or(500);
    processing_response::Response::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus { code }),
        body,
        ..ImmediateResponse::default()
    })
}

/// A body chunk handed back unchanged: in `FULL_DUPLEX_STREAMED` mode Envoy sends on only
/// what the processor streams back.
fn passed_back(body: HttpBody) -> BodyResponse {
    let streamed = StreamedBodyResponse {
        body: body.body,
        end_of_stream: body.end_of_stream,
        ..StreamedBodyResponse::default()
    };
    BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(streamed)),
            }),
            ..CommonResponse::default()
        }),
    }
}

#[cfg(test)]
mod tests;
