//! What stands between the load generator and the workers in each scenario.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{Context, Result, bail};
use pinroute::policy::config::Settings;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::python::PythonProxy;
use super::sims::{Listed, Workers};
use super::vllm_router::{Policy, VllmRouter};
use crate::load::ClientTls;
use crate::tls::RunTls;
use pinroute_harness::envoy::{
    BootstrapOptions, CONNECT_TIMEOUT, DEFAULT_ROUTE_TIMEOUT, EdgeOptions, Envoy, EnvoyOptions,
    MAX_UPSTREAM_REQUESTS, buffer_limit_bytes, envoy_duration, lb_endpoints, native,
    render_bootstrap,
};
use pinroute_harness::tls_front::TlsFront;

const PLAIN_TEMPLATE: &str = include_str!("../../../../envoy/plain.yaml");

/// One way of sending the two hops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// The load generator sends the prefill and then the decode hop itself: no proxy.
    Floor,
    /// Prefill sent directly, decode through Envoy without the filter (what Envoy costs).
    Envoy,
    /// Both hops sent by the client, both through Envoy without the filter: what Envoy
    /// costs for the two hops pinroute sends, so that pinroute minus this is the filter.
    #[serde(rename = "envoy-2hop")]
    EnvoyTwoHops,
    /// `EnvoyTwoHops` with each hop naming its worker as pinroute's do, in rotation over the
    /// registry: Envoy's own work for the hosts the filter names, without the filter.
    #[serde(rename = "envoy-2hop-named")]
    EnvoyTwoHopsNamed,
    /// One request to Envoy with the pinroute filter: the full two-hop flow with pins.
    Pinroute,
    /// `Pinroute` with the clients over TLS (HTTP/1.1 by ALPN); the workers in clear.
    #[serde(rename = "pinroute-tls")]
    PinrouteTls,
    /// `Pinroute` with mutual TLS on both sides: the clients present a certificate, and both
    /// hops reach the workers (behind TLS fronts) over mutual TLS.
    #[serde(rename = "pinroute-mtls")]
    PinrouteMtls,
    /// `Pinroute` with the filter as the native Envoy dynamic module instead of wasm.
    #[serde(rename = "pinroute-native")]
    PinrouteNative,
    /// `PinrouteNative` counting its own time apart from Envoy's (`PINROUTE_OWN_TIME`): the
    /// registry axis's measure of the module's own code.
    #[serde(rename = "pinroute-native-timed")]
    PinrouteNativeTimed,
    /// One request to the Python (FastAPI + httpx) proxy, which sends both hops.
    Python,
    /// One request to vllm-router (`--vllm-pd-disaggregation`, its default `cache_aware`
    /// policy), which sends both hops.
    #[serde(rename = "vllm-router")]
    VllmRouter,
    /// vllm-router with `round_robin`, its cheapest policy.
    #[serde(rename = "vllm-router-rr")]
    VllmRouterRoundRobin,
}

impl Scenario {
    pub const ALL: [Scenario; 12] = [
        Scenario::Floor,
        Scenario::Envoy,
        Scenario::EnvoyTwoHops,
        Scenario::EnvoyTwoHopsNamed,
        Scenario::Pinroute,
        Scenario::PinrouteNative,
        Scenario::PinrouteNativeTimed,
        Scenario::PinrouteTls,
        Scenario::PinrouteMtls,
        Scenario::Python,
        Scenario::VllmRouter,
        Scenario::VllmRouterRoundRobin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scenario::Floor => "floor",
            Scenario::Envoy => "envoy",
            Scenario::EnvoyTwoHops => "envoy-2hop",
            Scenario::EnvoyTwoHopsNamed => "envoy-2hop-named",
            Scenario::Pinroute => "pinroute",
            Scenario::PinrouteNative => "pinroute-native",
            Scenario::PinrouteNativeTimed => "pinroute-native-timed",
            Scenario::PinrouteTls => "pinroute-tls",
            Scenario::PinrouteMtls => "pinroute-mtls",
            Scenario::Python => "python",
            Scenario::VllmRouter => "vllm-router",
            Scenario::VllmRouterRoundRobin => "vllm-router-rr",
        }
    }

    /// Whether the scenario's proxy is an Envoy.
    pub fn runs_envoy(self) -> bool {
        matches!(
            self,
            Scenario::Envoy | Scenario::EnvoyTwoHops | Scenario::EnvoyTwoHopsNamed
        ) || self.runs_pinroute()
    }

    /// The vllm-router policy of a vllm-router scenario.
    pub fn vllm_router_policy(self) -> Option<Policy> {
        match self {
            Scenario::VllmRouter => Some(Policy::CacheAware),
            Scenario::VllmRouterRoundRobin => Some(Policy::RoundRobin),
            _ => None,
        }
    }

    /// Whether the scenario's proxy runs the pinroute filter.
    pub fn runs_pinroute(self) -> bool {
        matches!(
            self,
            Scenario::Pinroute | Scenario::PinrouteTls | Scenario::PinrouteMtls
        ) || self.runs_native_module()
    }

    /// Whether the scenario's Envoy runs the filter as the native module.
    pub fn runs_native_module(self) -> bool {
        matches!(
            self,
            Scenario::PinrouteNative | Scenario::PinrouteNativeTimed
        )
    }

    /// Another project's proxy, compared with: its failures are its result, not the bench's.
    pub fn is_peer(self) -> bool {
        self.vllm_router_policy().is_some() || self == Scenario::Python
    }

    /// How the side-by-side tables name it: vllm-router with its policy.
    pub fn peer_name(self) -> &'static str {
        match self {
            Scenario::VllmRouter => "vllm-router cache_aware",
            Scenario::VllmRouterRoundRobin => "vllm-router round_robin",
            other => other.as_str(),
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Scenario::Floor => "no proxy: the client sends prefill, then decode",
            Scenario::Envoy => "Envoy without the filter on the decode hop (prefill direct)",
            Scenario::EnvoyTwoHops => {
                "Envoy without the filter on both hops (the client sends both)"
            }
            Scenario::EnvoyTwoHopsNamed => {
                "the same, each hop naming its worker as pinroute's do (registry in rotation)"
            }
            Scenario::Pinroute => "Envoy + pinroute: both hops, pinned",
            Scenario::PinrouteNative => "the same, the filter as a native dynamic module",
            Scenario::PinrouteNativeTimed => {
                "the same, counting the module's own time apart from Envoy's"
            }
            Scenario::PinrouteTls => "the same, clients over TLS",
            Scenario::PinrouteMtls => "the same, mutual TLS to clients and to both workers",
            Scenario::Python => "Python proxy (FastAPI + httpx, like vLLM's example)",
            Scenario::VllmRouter => "vllm-router 0.1.17, P/D mode, cache_aware (its default)",
            Scenario::VllmRouterRoundRobin => "vllm-router 0.1.17, P/D mode, round_robin",
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scenario {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> Result<Self> {
        Scenario::ALL
            .into_iter()
            .find(|s| s.as_str() == text.trim().to_ascii_lowercase())
            .with_context(|| {
                let names: Vec<_> = Scenario::ALL.iter().map(|s| s.as_str()).collect();
                format!(
                    "unknown scenario {text:?}: expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// A running proxy process.
pub enum Gateway {
    Envoy(Envoy),
    TlsEnvoy(Box<TlsGateway>),
    Python(PythonProxy),
    VllmRouter(VllmRouter),
}

impl Gateway {
    /// The admin interface of an Envoy gateway.
    pub fn envoy_admin(&self) -> Option<SocketAddr> {
        match self {
            Gateway::Envoy(envoy) => Some(envoy.admin()),
            Gateway::TlsEnvoy(gateway) => Some(gateway.envoy.admin()),
            Gateway::Python(_) | Gateway::VllmRouter(_) => None,
        }
    }

    pub fn pid(&self) -> u32 {
        match self {
            Gateway::Envoy(envoy) => envoy.pid(),
            Gateway::TlsEnvoy(gateway) => gateway.envoy.pid(),
            Gateway::Python(proxy) => proxy.pid(),
            Gateway::VllmRouter(router) => router.pid(),
        }
    }

    pub fn address(&self) -> SocketAddr {
        match self {
            Gateway::Envoy(envoy) => envoy.listen(),
            Gateway::TlsEnvoy(gateway) => gateway.envoy.listen(),
            Gateway::Python(proxy) => proxy.address(),
            Gateway::VllmRouter(router) => router.address(),
        }
    }

    /// How the load generator reaches it over TLS; `None`: in clear.
    pub fn client_tls(&self) -> Option<ClientTls> {
        match self {
            Gateway::TlsEnvoy(gateway) => Some(gateway.client.clone()),
            _ => None,
        }
    }
}

/// What starting a gateway needs.
#[derive(Clone, Copy)]
pub struct GatewayInputs<'a> {
    /// The registry (pinroute) and the clusters (Envoy alone); the proxies that take one
    /// worker of each role are given the first.
    pub workers: &'a Workers,
    pub envoy_binary: &'a Path,
    pub wasm: &'a Path,
    /// `libpinroute.so`, for `pinroute-native`.
    pub native_module: Option<&'a Path>,
    pub python: Option<&'a Path>,
    pub vllm_router: Option<&'a Path>,
    pub repo_root: &'a Path,
    pub work_dir: &'a Path,
    /// Worker threads of each proxy (Envoy's `--concurrency`, vllm-router's tokio workers).
    pub threads: u32,
}

impl GatewayInputs<'_> {
    /// How an Envoy of the bench runs: `threads` worker threads, with `env`.
    pub fn envoy_options(&self, env: Vec<(String, String)>) -> EnvoyOptions {
        EnvoyOptions {
            concurrency: self.threads,
            env,
            ..EnvoyOptions::default()
        }
    }
}

/// Envoy with the native module in front of `inputs.workers`, run with `options` (and the
/// module's search path).
pub async fn start_native(
    inputs: &GatewayInputs<'_>,
    dir: &Path,
    mut options: EnvoyOptions,
) -> Result<Envoy> {
    let Some(module) = inputs.native_module else {
        bail!("the native module was not built")
    };
    let wasm_yaml = pinroute_bootstrap(inputs.workers, inputs.wasm, unlogged_edge())?;
    let yaml = native::with_native_module(&wasm_yaml)?;
    options.env.push(native::module_env(module)?);
    Envoy::start_with(inputs.envoy_binary, &yaml, dir, &options).await
}

/// Starts the proxy of `scenario` (`None` for the floor).
pub async fn start_gateway(
    scenario: Scenario,
    inputs: &GatewayInputs<'_>,
) -> Result<Option<Gateway>> {
    let dir = inputs.work_dir.join(scenario.as_str());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(match scenario {
        Scenario::Floor => None,
        Scenario::Envoy | Scenario::EnvoyTwoHops | Scenario::EnvoyTwoHopsNamed => {
            let yaml = plain_bootstrap(inputs.workers)?;
            let options = inputs.envoy_options(Vec::new());
            Some(Gateway::Envoy(
                Envoy::start_with(inputs.envoy_binary, &yaml, &dir, &options).await?,
            ))
        }
        Scenario::Pinroute => {
            let yaml = pinroute_bootstrap(inputs.workers, inputs.wasm, unlogged_edge())?;
            let options = inputs.envoy_options(Vec::new());
            Some(Gateway::Envoy(
                Envoy::start_with(inputs.envoy_binary, &yaml, &dir, &options).await?,
            ))
        }
        Scenario::PinrouteNative | Scenario::PinrouteNativeTimed => {
            let mut options = inputs.envoy_options(Vec::new());
            if scenario == Scenario::PinrouteNativeTimed {
                options
                    .env
                    .push((native::OWN_TIME_ENV.to_owned(), "1".to_owned()));
            }
            Some(Gateway::Envoy(start_native(inputs, &dir, options).await?))
        }
        Scenario::PinrouteTls | Scenario::PinrouteMtls => {
            let mutual = scenario == Scenario::PinrouteMtls;
            let gateway = TlsGateway::start(inputs, &dir, mutual).await?;
            Some(Gateway::TlsEnvoy(Box::new(gateway)))
        }
        Scenario::Python => {
            let Some(python) = inputs.python else {
                bail!("the Python scenario needs the bench venv")
            };
            let sims = inputs.workers.first();
            let proxy = PythonProxy::start(python, inputs.repo_root, &sims, &dir).await?;
            Some(Gateway::Python(proxy))
        }
        Scenario::VllmRouter | Scenario::VllmRouterRoundRobin => {
            let Some(binary) = inputs.vllm_router else {
                bail!("the vllm-router scenarios need its venv")
            };
            let addresses =
                |listed: &[Listed]| listed.iter().map(|l| l.address).collect::<Vec<_>>();
            let (prefill, decode) = (
                addresses(&inputs.workers.prefill),
                addresses(&inputs.workers.decode),
            );
            let policy = scenario
                .vllm_router_policy()
                .context("a vllm-router scenario without a policy")?;
            let threads = Some(inputs.threads);
            let router =
                VllmRouter::start(binary, &prefill, &decode, policy, &dir, threads).await?;
            Some(Gateway::VllmRouter(router))
        }
    })
}

fn loopback_any() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// The worker registry of the pinroute scenarios.
pub fn registry(workers: &Workers) -> serde_json::Value {
    let entries = |listed: &[Listed], role: &str| -> Vec<serde_json::Value> {
        listed
            .iter()
            .map(|l| json!({"id": l.id, "role": role, "address": l.address.to_string(), "dp_size": 1}))
            .collect()
    };
    let mut all = entries(&workers.prefill, "prefill");
    all.extend(entries(&workers.decode, "decode"));
    json!({ "workers": all })
}

/// The edge of every pinroute scenario: the defaults without the access log, since no
/// gateway of the bench writes a line per request (`envoy/plain.yaml` has none, vllm-router
/// runs at `--log-level error`), so that none pays for logging the others skip.
fn unlogged_edge() -> EdgeOptions {
    EdgeOptions {
        access_log: false,
        ..EdgeOptions::default()
    }
}

fn pinroute_bootstrap(workers: &Workers, wasm: &Path, edge: EdgeOptions) -> Result<String> {
    render_bootstrap(&BootstrapOptions {
        listen: loopback_any(),
        admin: loopback_any(),
        wasm: PathBuf::from(wasm),
        plugin_config: registry(workers).to_string(),
        route_timeout: DEFAULT_ROUTE_TIMEOUT,
        edge,
    })
}

/// Envoy + pinroute terminating TLS, and with `mutual`, asking the clients for a certificate
/// and reaching both workers over mutual TLS through TLS fronts (in this process: their CPU
/// counts as the load generator's, not the gateway's).
pub struct TlsGateway {
    envoy: Envoy,
    client: ClientTls,
    _fronts: Vec<TlsFront>,
}

impl TlsGateway {
    async fn start(inputs: &GatewayInputs<'_>, dir: &Path, mutual: bool) -> Result<TlsGateway> {
        let tls = RunTls::create(&dir.join("tls"), mutual)?;
        let mut edge = EdgeOptions {
            tls: Some(tls.listener),
            ..unlogged_edge()
        };
        let mut workers = inputs.workers.clone();
        let mut fronts = Vec::new();
        if let Some((server, worker_tls)) = tls.workers {
            for worker in workers.prefill.iter_mut().chain(&mut workers.decode) {
                let front = TlsFront::start(&server, Some(&tls.ca), worker.address).await?;
                worker.address = front.addr();
                fronts.push(front);
            }
            edge.worker_tls = Some(worker_tls);
        }
        let yaml = pinroute_bootstrap(&workers, inputs.wasm, edge)?;
        let options = inputs.envoy_options(Vec::new());
        let envoy = Envoy::start_with(inputs.envoy_binary, &yaml, dir, &options).await?;
        Ok(TlsGateway {
            envoy,
            client: tls.client,
            _fronts: fronts,
        })
    }
}

/// `envoy/plain.yaml` for the workers (a cluster of each role, round robin), with the limits
/// of the pinroute bootstrap.
pub fn plain_bootstrap(workers: &Workers) -> Result<String> {
    let endpoints = |listed: &[Listed]| lb_endpoints(listed.iter().map(|l| l.address));
    let buffer_limit = buffer_limit_bytes(&Settings::default())?;
    let values = [
        ("{{ADMIN_IP}}", "\"127.0.0.1\"".to_string()),
        ("{{ADMIN_PORT}}", "0".to_string()),
        ("{{LISTEN_IP}}", "\"127.0.0.1\"".to_string()),
        ("{{LISTEN_PORT}}", "0".to_string()),
        ("{{PREFILL_ENDPOINTS}}", endpoints(&workers.prefill)),
        ("{{DECODE_ENDPOINTS}}", endpoints(&workers.decode)),
        ("{{BUFFER_LIMIT_BYTES}}", buffer_limit.to_string()),
        ("{{ROUTE_TIMEOUT}}", envoy_duration(DEFAULT_ROUTE_TIMEOUT)),
        ("{{CONNECT_TIMEOUT}}", envoy_duration(CONNECT_TIMEOUT)),
        (
            "{{MAX_UPSTREAM_REQUESTS}}",
            MAX_UPSTREAM_REQUESTS.to_string(),
        ),
    ];
    let rendered = values
        .iter()
        .fold(PLAIN_TEMPLATE.to_string(), |text, (marker, value)| {
            text.replace(marker, value)
        });
    if let Some(line) = rendered.lines().find(|line| line.contains("{{")) {
        bail!(
            "envoy/plain.yaml has an unknown placeholder: {}",
            line.trim()
        );
    }
    Ok(rendered)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::bench::sims::SimAddresses;

    #[test]
    fn plain_bootstrap_renders_every_marker() {
        let sims = SimAddresses {
            prefill: "127.0.0.1:8101".parse().unwrap(),
            decode: "127.0.0.1:8201".parse().unwrap(),
        };
        let yaml = plain_bootstrap(&Workers::one_each(sims)).unwrap();
        assert!(yaml.contains(r#""port_value":8101"#), "{yaml}");
        assert!(yaml.contains(r#""port_value":8201"#), "{yaml}");
        assert!(!yaml.contains("wasm"), "{yaml}");
    }

    #[test]
    fn aliased_workers_are_each_a_cluster_host_and_a_registry_entry() {
        let sims = SimAddresses {
            prefill: "127.0.0.1:8101".parse().unwrap(),
            decode: "127.0.0.1:8201".parse().unwrap(),
        };
        let workers = Workers::aliased(sims, 300).unwrap();
        let yaml = plain_bootstrap(&workers).unwrap();
        assert_eq!(yaml.matches(r#""port_value":8101"#).count(), 300);
        assert!(yaml.contains(r#""address":"127.11.1.50""#), "{yaml}");
        let registry = registry(&workers);
        let entries = registry["workers"].as_array().unwrap();
        assert_eq!(entries.len(), 600);
        let addresses: std::collections::HashSet<&str> = entries
            .iter()
            .map(|w| w["address"].as_str().unwrap())
            .collect();
        assert_eq!(addresses.len(), 600, "every worker at its own address");
        assert!(Workers::aliased(sims, 0).is_err());
    }

    #[test]
    fn scenarios_parse() {
        assert_eq!("Pinroute".parse::<Scenario>().unwrap(), Scenario::Pinroute);
        assert_eq!(
            "envoy-2hop".parse::<Scenario>().unwrap(),
            Scenario::EnvoyTwoHops
        );
        assert_eq!(
            "vllm-router".parse::<Scenario>().unwrap(),
            Scenario::VllmRouter
        );
        assert!("nginx".parse::<Scenario>().is_err());
    }
}
