//! The benchmark's request: a streamed `/v1/completions` with a prompt of a given size,
//! sent the way each scenario needs, and checked (HTTP 200, the SSE stream complete, and
//! for pinroute the prefill hop taken).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http::Request;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::gateways::Scenario;
use super::sims::{PREFILL_ID, Workers};
use pinroute::policy::headers::PREFILL_WORKER_HEADER;
use pinroute::policy::rewrite::PREFILL_KV_TRANSFER_PARAMS;

use super::prompt::prompt_text;
use crate::load::{ChunkedBody, ClientTls, Exchange, Sample, VirtualUser, Workload};

const PATH: &str = "/v1/completions";
const LABEL: &str = "completion";
const STREAM_END: &[u8] = b"data: [DONE]\n\n";

/// The request bodies of one prompt size, built once and shared by every request.
#[derive(Debug, Clone)]
pub struct Bodies {
    /// What a client sends: `{"model", "prompt", "max_tokens", "stream": true}`.
    pub client: Bytes,
    /// The client body without its closing `}`: the decode hop appends the
    /// `kv_transfer_params` member to it.
    pub client_open: Bytes,
    /// The prefill hop a proxy would send for `client`.
    pub prefill: Bytes,
}

impl Bodies {
    /// Bodies whose client request is about `size` bytes, asking for `max_tokens` tokens.
    pub fn new(size: usize, max_tokens: u32) -> Bodies {
        let prompt = prompt_text(size.saturating_sub(64));
        let client = format!(
            r#"{{"model":"sim-model","prompt":"{prompt}","max_tokens":{max_tokens},"stream":true}}"#
        );
        let prefill = format!(
            r#"{{"model":"sim-model","prompt":"{prompt}","max_tokens":1,"stream":false,"kv_transfer_params":{PREFILL_KV_TRANSFER_PARAMS}}}"#
        );
        let client = Bytes::from(client);
        let client_open = client.slice(..client.len().saturating_sub(1));
        Bodies {
            client,
            client_open,
            prefill: Bytes::from(prefill),
        }
    }
}

/// Where a scenario sends its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The client sends the prefill hop to `prefill`, then the decode hop to `decode`
    /// (the decode worker itself, or Envoy in front of it: `via_envoy`).
    TwoHops {
        prefill: SocketAddr,
        decode: SocketAddr,
        via_envoy: bool,
    },
    /// One request to a proxy that sends both hops.
    Proxy {
        proxy: SocketAddr,
        steering: Steering,
    },
}

/// How a proxy is asked to place the hops, and what its answer must show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steering {
    /// Both hops pinned to the sims' workers ([`PINS`]): the answer names prefill worker 101.
    Pinned,
    /// Unpinned, through pinroute: the answer names the prefill worker it chose.
    Chosen,
    /// A proxy that chooses both workers and names neither.
    Peer,
}

impl Route {
    /// The route of `scenario`, given the workers and the proxy's address (`None` only
    /// for the floor).
    pub fn of(
        scenario: Scenario,
        prefill: SocketAddr,
        decode: SocketAddr,
        gateway: Option<SocketAddr>,
    ) -> anyhow::Result<Route> {
        Ok(match (scenario, gateway) {
            (Scenario::Floor, _) => Route::TwoHops {
                prefill,
                decode,
                via_envoy: false,
            },
            (Scenario::Envoy, Some(envoy)) => Route::TwoHops {
                prefill,
                decode: envoy,
                via_envoy: true,
            },
            (Scenario::EnvoyTwoHops | Scenario::EnvoyTwoHopsNamed, Some(envoy)) => Route::TwoHops {
                prefill: envoy,
                decode: envoy,
                via_envoy: true,
            },
            (
                Scenario::Pinroute
                | Scenario::PinrouteNative
                | Scenario::PinrouteNativeTimed
                | Scenario::PinrouteTls
                | Scenario::PinrouteMtls,
                Some(proxy),
            ) => Route::Proxy {
                proxy,
                steering: Steering::Pinned,
            },
            (
                Scenario::Python | Scenario::VllmRouter | Scenario::VllmRouterRoundRobin,
                Some(proxy),
            ) => Route::Proxy {
                proxy,
                steering: Steering::Peer,
            },
            (scenario, None) => anyhow::bail!("the {scenario} scenario needs its proxy running"),
        })
    }

    /// The same route with pinroute choosing the workers instead of the pins.
    pub fn unpinned(self) -> Route {
        match self {
            Route::Proxy {
                proxy,
                steering: Steering::Pinned,
            } => Route::Proxy {
                proxy,
                steering: Steering::Chosen,
            },
            other => other,
        }
    }
}

/// The addresses of a client-sent two-hop request.
#[derive(Debug, Clone, Copy)]
struct Hops {
    prefill: SocketAddr,
    decode: SocketAddr,
    via_envoy: bool,
}

/// The benchmark workload: every request is the same completion.
pub struct Completion {
    pub route: Route,
    pub bodies: Bodies,
    /// TLS to the proxy; `None`: clear text.
    pub tls: Option<ClientTls>,
    /// Client-sent hops through Envoy name their workers, as pinroute does; `None`: Envoy
    /// balances over them itself.
    pub named: Option<NamedHosts>,
}

/// The workers a client-sent hop names to Envoy, in rotation over the registry as pinroute
/// chooses unpinned workers by load: the prefill hop one worker (`x-bench-host`, as pinroute's
/// `x-envoy-original-dst-host`), the decode hop the worker and the next ones as its retry
/// candidates (`x-bench-pool`, as pinroute's `x-pinroute-pool`).
pub struct NamedHosts {
    prefill: Vec<String>,
    decode: Vec<String>,
    next: AtomicU64,
}

/// Workers `x-bench-pool` names: pinroute's decode hop lists its first choice and up to two
/// alternates.
const POOL_LISTED: usize = 3;

impl NamedHosts {
    pub fn new(workers: &Workers) -> NamedHosts {
        let addresses =
            |listed: &[super::sims::Listed]| listed.iter().map(|l| l.address.to_string()).collect();
        NamedHosts {
            prefill: addresses(&workers.prefill),
            decode: addresses(&workers.decode),
            next: AtomicU64::new(0),
        }
    }

    /// The next request's prefill worker and decode pool.
    fn next(&self) -> (String, String) {
        let turn = self.next.fetch_add(1, Ordering::Relaxed);
        let at = |list: &[String], offset: u64| {
            let len = list.len().max(1) as u64;
            let index = usize::try_from((turn + offset) % len).unwrap_or(0);
            list.get(index).cloned().unwrap_or_default()
        };
        let listed = POOL_LISTED.min(self.decode.len()) as u64;
        let pool: Vec<String> = (0..listed).map(|offset| at(&self.decode, offset)).collect();
        (at(&self.prefill, 0), pool.join(","))
    }
}

impl Workload for Completion {
    async fn call(&self, user: &mut VirtualUser, seq: u64) -> Sample {
        let request_id = format!("bench-{}-{seq}", user.id);
        let started = Instant::now();
        match self.route {
            Route::TwoHops {
                prefill,
                decode,
                via_envoy,
            } => {
                let hops = Hops {
                    prefill,
                    decode,
                    via_envoy,
                };
                self.two_hops(user, &request_id, hops, started).await
            }
            Route::Proxy { proxy, steering } => {
                self.through_proxy(user, &request_id, proxy, steering, started)
                    .await
            }
        }
    }

    fn label(&self, _seq: u64) -> &'static str {
        LABEL
    }

    fn client_tls(&self) -> Option<ClientTls> {
        self.tls.clone()
    }
}

impl Completion {
    async fn two_hops(
        &self,
        user: &mut VirtualUser,
        request_id: &str,
        hops: Hops,
        started: Instant,
    ) -> Sample {
        let (host, pool) = self.named.as_ref().map(NamedHosts::next).unzip();
        let named_prefill = host.as_deref().map(|host| ("x-bench-host", host));
        let prefill_headers: Vec<(&str, &str)> =
            std::iter::once(PREFILL_HOP).chain(named_prefill).collect();
        let request = post(
            request_id,
            ChunkedBody::from(self.bodies.prefill.clone()),
            &prefill_headers,
        );
        let prefill_answer = match user.connections.exchange(hops.prefill, request).await {
            Ok(exchange) => exchange,
            Err(error) => return Sample::transport_failure(LABEL, started, &error),
        };
        let params = match kv_transfer_params(&prefill_answer) {
            Ok(params) => params,
            Err(problem) => {
                return Sample::from_exchange(LABEL, started, &prefill_answer, Some(problem));
            }
        };
        let body = ChunkedBody::new([self.bodies.client_open.clone(), Bytes::from(params)]);
        let named_decode: Vec<(&str, &str)> = pool
            .as_deref()
            .map(|pool| ("x-bench-pool", pool))
            .into_iter()
            .collect();
        match user
            .connections
            .exchange(hops.decode, post(request_id, body, &named_decode))
            .await
        {
            Ok(exchange) => {
                let problem = stream_problem(&exchange)
                    .or_else(|| hops.via_envoy.then(|| envoy_problem(&exchange)).flatten());
                Sample::from_exchange(LABEL, started, &exchange, problem)
            }
            Err(error) => Sample::transport_failure(LABEL, started, &error),
        }
    }

    async fn through_proxy(
        &self,
        user: &mut VirtualUser,
        request_id: &str,
        proxy: SocketAddr,
        steering: Steering,
        started: Instant,
    ) -> Sample {
        let pins: &[(&str, &str)] = match steering {
            Steering::Pinned => &PINS,
            Steering::Chosen | Steering::Peer => &[],
        };
        let request = post(
            request_id,
            ChunkedBody::from(self.bodies.client.clone()),
            pins,
        );
        match user.connections.exchange(proxy, request).await {
            Ok(exchange) => {
                let problem =
                    stream_problem(&exchange).or_else(|| prefill_problem(&exchange, steering));
                Sample::from_exchange(LABEL, started, &exchange, problem)
            }
            Err(error) => Sample::transport_failure(LABEL, started, &error),
        }
    }
}

/// Marks the prefill hop, which plain Envoy (`envoy/plain.yaml`) routes to the prefill worker.
const PREFILL_HOP: (&str, &str) = ("x-bench-hop", "prefill");

/// The sim workers' ids ([`PREFILL_ID`], `DECODE_ID`) as header values.
const PREFILL_PIN: &str = "101";
const DECODE_PIN: &str = "201";

/// The pins of the pinroute scenario: the prefill worker, and the decode worker through
/// the generic Dynamo header.
const PINS: [(&str, &str); 2] = [
    ("x-dynamo-prefill-instance-id", PREFILL_PIN),
    ("x-dynamo-worker-instance-id", DECODE_PIN),
];

fn post(request_id: &str, body: ChunkedBody, extra: &[(&str, &str)]) -> Request<ChunkedBody> {
    post_to(PATH, request_id, body, extra)
}

/// A JSON `POST` to `path` with these extra headers.
pub(crate) fn post_to(
    path: &str,
    request_id: &str,
    body: ChunkedBody,
    extra: &[(&str, &str)],
) -> Request<ChunkedBody> {
    let mut builder = Request::post(path)
        .header("host", "bench")
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .header("x-request-id", request_id);
    for (name, value) in extra {
        builder = builder.header(*name, *value);
    }
    builder
        .body(body)
        .unwrap_or_else(|_| Request::new(ChunkedBody::empty()))
}

#[derive(Deserialize)]
struct PrefillAnswer<'a> {
    #[serde(borrow)]
    kv_transfer_params: Option<&'a RawValue>,
}

/// `,"kv_transfer_params":{...}}`: what closes the decode body, from the prefill's answer.
fn kv_transfer_params(prefill: &Exchange) -> Result<String, String> {
    if !prefill.status.is_success() {
        return Err(format!(
            "prefill answered {}: {}",
            prefill.status,
            String::from_utf8_lossy(&prefill.body)
        ));
    }
    let answer: PrefillAnswer<'_> = serde_json::from_slice(&prefill.body)
        .map_err(|e| format!("prefill answer is not JSON: {e}"))?;
    match answer.kv_transfer_params {
        Some(params) => Ok(format!(r#","kv_transfer_params":{}}}"#, params.get())),
        None => Err("the prefill answer has no kv_transfer_params".into()),
    }
}

pub(crate) fn stream_problem(exchange: &Exchange) -> Option<String> {
    if !exchange.status.is_success() {
        let body = String::from_utf8_lossy(&exchange.body);
        return Some(format!(
            "HTTP {}: {}",
            exchange.status,
            body.chars().take(300).collect::<String>()
        ));
    }
    (!exchange.tail.ends_with(STREAM_END))
        .then(|| "the SSE stream did not end with data: [DONE]".to_string())
}

/// Envoy's router adds this header to every response it forwards.
const ENVOY_HEADER: &str = "x-envoy-upstream-service-time";

fn envoy_problem(exchange: &Exchange) -> Option<String> {
    match exchange.header(ENVOY_HEADER) {
        Some(_) => None,
        None => Some(format!(
            "no {ENVOY_HEADER}: the decode hop did not go through Envoy"
        )),
    }
}

fn prefill_problem(exchange: &Exchange, steering: Steering) -> Option<String> {
    let worker = exchange.header(PREFILL_WORKER_HEADER);
    match (steering, worker) {
        (Steering::Pinned, Some(PREFILL_PIN))
        | (Steering::Chosen, Some(_))
        | (Steering::Peer, _) => None,
        (Steering::Pinned, other) => Some(format!(
            "{PREFILL_WORKER_HEADER} is {other:?}: the prefill hop was not taken on worker {PREFILL_ID}"
        )),
        (Steering::Chosen, None) => Some(format!(
            "no {PREFILL_WORKER_HEADER}: the prefill hop was not taken"
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::bench::sims::DECODE_ID;

    #[test]
    fn pins_name_the_sim_workers() {
        assert_eq!(PREFILL_PIN, PREFILL_ID.to_string());
        assert_eq!(DECODE_PIN, DECODE_ID.to_string());
    }

    #[test]
    fn bodies_have_the_asked_size_and_are_json() {
        for size in [1024, 32 * 1024, 256 * 1024] {
            let bodies = Bodies::new(size, 8);
            let len = bodies.client.len();
            assert!(len <= size && len + 32 >= size, "{size}: {len}");
            let client: serde_json::Value = serde_json::from_slice(&bodies.client).unwrap();
            assert_eq!(client["stream"], true);
            let prefill: serde_json::Value = serde_json::from_slice(&bodies.prefill).unwrap();
            assert_eq!(prefill["max_tokens"], 1);
            assert_eq!(prefill["kv_transfer_params"]["do_remote_decode"], true);
            let decode = [
                &bodies.client_open[..],
                br#","kv_transfer_params":{"a":1}}"#,
            ]
            .concat();
            let decode: serde_json::Value = serde_json::from_slice(&decode).unwrap();
            assert_eq!(decode["kv_transfer_params"]["a"], 1);
        }
    }
}
