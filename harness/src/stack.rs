//! A whole deployment on this machine: sim workers, their registry, Envoy with the filter.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use serde_json::{Value, json};

use crate::certs::Issued;
use crate::envoy::native::{module_env, with_native_module};
use crate::envoy::{
    BootstrapOptions, DEFAULT_ROUTE_TIMEOUT, EdgeOptions, Envoy, EnvoyOptions, envoy_binary,
    render_bootstrap, repo_root,
};
use crate::picker::StandInPicker;
use crate::registry_server::RegistryServer;
use crate::sim::{SimConfig, SimRole, SimWorker};
use crate::tls_front::TlsFront;

/// Binding a restarted worker's old port is retried this often (the port is normally free
/// at once: the listener of a killed worker is closed and tokio binds with `SO_REUSEADDR`).
const RESTART_ATTEMPTS: u32 = 20;
const RESTART_PAUSE: Duration = Duration::from_millis(100);

/// What to run. Workers listen on `127.0.0.1` at `worker_ports` (0: any free port).
#[derive(Debug, Clone)]
pub struct StackSpec {
    pub workers: Vec<SimConfig>,
    pub worker_ports: Vec<u16>,
    /// Ids of started workers the registry marks as draining.
    pub draining: Vec<u64>,
    /// Registry entries whose address refuses connections: `(id, role, dp_size)`.
    pub dead: Vec<(u64, SimRole, u32)>,
    /// Filter settings merged into the plugin configuration (`prefill_timeout_ms`, ...).
    pub settings: Value,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub wasm: PathBuf,
    pub route_timeout: Duration,
    /// Request timeouts and CORS of the listener.
    pub edge: EdgeOptions,
    /// Serve the registry over HTTP and let the filter refresh it on this period.
    pub live_registry: Option<Duration>,
    /// Picker mode, with a [`StandInPicker`] as the endpoint picker.
    pub picker: Option<PickerSpec>,
    /// Every worker behind a [`TlsFront`]: the registry names the fronts.
    pub worker_fronts: Option<WorkerFronts>,
    /// The filter as this native Envoy dynamic module (`libpinroute.so`) in place of `wasm`.
    pub native_module: Option<PathBuf>,
    /// More of Envoy's environment (`PINROUTE_OWN_TIME`).
    pub envoy_env: Vec<(String, String)>,
}

/// The certificate the workers' TLS fronts present, and the CA whose certificates they
/// require of their clients (none: no client certificate asked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerFronts {
    pub server: Issued,
    pub client_ca: Option<PathBuf>,
}

/// The plugin configuration's `picker`, but for the address (the stand-in's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PickerSpec {
    /// `gie`, `llm-d` or `dynamo`.
    pub protocol: String,
    /// `registry` and CIDR ranges.
    pub allow: Vec<String>,
}

impl PickerSpec {
    /// `protocol`, allowing the registry's workers only.
    pub fn new(protocol: &str) -> Self {
        PickerSpec {
            protocol: protocol.to_owned(),
            allow: vec!["registry".to_owned()],
        }
    }
}

impl StackSpec {
    pub fn new(workers: Vec<SimConfig>, wasm: PathBuf) -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            worker_ports: vec![0; workers.len()],
            workers,
            draining: Vec::new(),
            dead: Vec::new(),
            settings: json!({}),
            listen: any,
            admin: any,
            wasm,
            route_timeout: DEFAULT_ROUTE_TIMEOUT,
            edge: EdgeOptions::default(),
            live_registry: None,
            picker: None,
            worker_fronts: None,
            native_module: None,
            envoy_env: Vec::new(),
        }
    }
}

/// A running deployment; everything stops when it is dropped.
pub struct Stack {
    pub envoy: Envoy,
    pub workers: Vec<SimWorker>,
    pub plugin_config: Value,
    pub registry: Option<RegistryServer>,
    pub picker: Option<StandInPicker>,
    /// The workers' TLS fronts, with [`StackSpec::worker_fronts`], by worker id.
    pub fronts: Vec<(u64, TlsFront)>,
    bootstrap: String,
    /// How Envoy is started (the native module's search path, with [`StackSpec::native_module`]).
    options: EnvoyOptions,
}

impl Stack {
    pub async fn start(spec: &StackSpec, work_dir: &Path) -> Result<Stack> {
        let picker = match &spec.picker {
            Some(_) => Some(StandInPicker::start().await?),
            None => None,
        };
        let mut workers = Vec::new();
        for (config, port) in spec
            .workers
            .iter()
            .zip(spec.worker_ports.iter().chain(std::iter::repeat(&0)))
        {
            let listen = SocketAddr::from(([127, 0, 0, 1], *port));
            let worker = SimWorker::start(config.clone(), listen)
                .await
                .with_context(|| format!("starting sim worker {} on {listen}", config.id))?;
            workers.push(worker);
        }
        let mut plugin_config = plugin_config(spec, &workers)?;
        let fronts = match &spec.worker_fronts {
            Some(fronts) => front_workers(&mut plugin_config, fronts, &workers).await?,
            None => Vec::new(),
        };
        if let (Some(picker_spec), Some(picker)) = (&spec.picker, &picker) {
            set_picker(&mut plugin_config, picker_spec, picker.address());
        }
        let registry = match spec.live_registry {
            Some(refresh) => Some(serve_registry(&mut plugin_config, refresh).await?),
            None => None,
        };
        let mut bootstrap = render_bootstrap(&BootstrapOptions {
            listen: spec.listen,
            admin: spec.admin,
            wasm: spec.wasm.clone(),
            plugin_config: plugin_config.to_string(),
            route_timeout: spec.route_timeout,
            edge: spec.edge.clone(),
        })?;
        let mut options = EnvoyOptions::default();
        if let Some(module) = &spec.native_module {
            bootstrap = with_native_module(&bootstrap)?;
            options.env.push(module_env(module)?);
        }
        options.env.extend(spec.envoy_env.iter().cloned());
        let binary = envoy_binary(&repo_root())?;
        let envoy = Envoy::start_with(&binary, &bootstrap, work_dir, &options).await?;
        Ok(Stack {
            envoy,
            workers,
            plugin_config,
            registry,
            picker,
            fronts,
            bootstrap,
            options,
        })
    }

    /// Another Envoy with the same configuration (listening on ports of its own when the
    /// spec's ports are 0): a second replica of the gateway.
    pub async fn start_replica(&self, work_dir: &Path) -> Result<Envoy> {
        let binary = envoy_binary(&repo_root())?;
        Envoy::start_with(&binary, &self.bootstrap, work_dir, &self.options).await
    }

    /// Starts one more sim worker (not yet in any registry) and returns its registry entry.
    pub async fn add_worker(&mut self, config: SimConfig) -> Result<Value> {
        let worker = SimWorker::start(config, SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let entry = registry_entry(&worker, false);
        self.workers.push(worker);
        Ok(entry)
    }

    /// The registry entries of the running sim workers with these ids.
    pub fn entries(&self, ids: &[u64]) -> Vec<Value> {
        self.workers
            .iter()
            .filter(|w| ids.contains(&w.config().id))
            .map(|w| registry_entry(w, false))
            .collect()
    }

    pub fn worker(&self, id: u64) -> Result<&SimWorker> {
        self.workers
            .iter()
            .find(|w| w.config().id == id)
            .ok_or_else(|| anyhow!("no sim worker {id}"))
    }

    /// Kills sim worker `id` abruptly ([`SimWorker::kill`]). Its registry entry stays, so its
    /// address refuses connections until [`Stack::restart_worker`]; returns what that needs.
    pub async fn kill_worker(&mut self, id: u64) -> Result<(SimConfig, SocketAddr)> {
        let index = self
            .workers
            .iter()
            .position(|w| w.config().id == id)
            .ok_or_else(|| anyhow!("no running sim worker {id}"))?;
        let worker = self.workers.remove(index);
        let killed = (worker.config().clone(), worker.addr());
        worker.kill().await;
        Ok(killed)
    }

    /// Starts a fresh sim worker (no KV entries, no fault) on `addr`, the address its
    /// registry entry names, e.g. one that [`Stack::kill_worker`] killed.
    pub async fn restart_worker(&mut self, config: SimConfig, addr: SocketAddr) -> Result<()> {
        let mut attempts = 0;
        let worker = loop {
            attempts += 1;
            match SimWorker::start(config.clone(), addr).await {
                Ok(worker) => break worker,
                Err(error) if attempts < RESTART_ATTEMPTS => {
                    log::debug!("restarting sim worker {} on {addr}: {error:#}", config.id);
                    tokio::time::sleep(RESTART_PAUSE).await;
                }
                Err(error) => {
                    return Err(
                        error.context(format!("restarting sim worker {} on {addr}", config.id))
                    );
                }
            }
        };
        self.workers.push(worker);
        Ok(())
    }

    pub fn url(&self, path: &str) -> String {
        self.envoy.url(path)
    }

    pub fn clear_requests(&self) {
        self.workers.iter().for_each(SimWorker::clear_requests);
    }
}

/// The registry of the started workers (plus dead entries) and the filter's settings.
fn plugin_config(spec: &StackSpec, workers: &[SimWorker]) -> Result<Value> {
    let mut entries: Vec<Value> = workers
        .iter()
        .map(|w| registry_entry(w, spec.draining.contains(&w.config().id)))
        .collect();
    for (id, role, dp_size) in &spec.dead {
        let address = refusing_address()?;
        entries.push(json!({"id": id, "role": role.as_str(), "address": address.to_string(), "dp_size": dp_size}));
    }
    let mut config = json!({ "workers": entries });
    if let (Some(config), Some(settings)) = (config.as_object_mut(), spec.settings.as_object()) {
        config.extend(settings.clone());
    }
    Ok(config)
}

fn registry_entry(worker: &SimWorker, draining: bool) -> Value {
    let c = worker.config();
    let mut entry = json!({
        "id": c.id, "role": c.role.as_str(), "address": worker.addr().to_string(),
        "dp_size": c.dp_size, "draining": draining,
    });
    if let (Some(models), Some(entry)) = (&c.served_models, entry.as_object_mut()) {
        entry.insert("models".into(), json!(models));
    }
    entry
}

/// Starts a TLS front for each worker and makes the registry name the fronts.
async fn front_workers(
    plugin_config: &mut Value,
    spec: &WorkerFronts,
    workers: &[SimWorker],
) -> Result<Vec<(u64, TlsFront)>> {
    let mut fronts = Vec::new();
    for worker in workers {
        let front = TlsFront::start(&spec.server, spec.client_ca.as_deref(), worker.addr()).await?;
        let (plain, tls) = (worker.addr().to_string(), front.addr().to_string());
        if let Some(entries) = plugin_config["workers"].as_array_mut() {
            for entry in entries
                .iter_mut()
                .filter(|e| e["address"] == plain.as_str())
            {
                entry["address"] = json!(tls);
            }
        }
        fronts.push((worker.config().id, front));
    }
    Ok(fronts)
}

/// Points the filter at the stand-in picker.
fn set_picker(plugin_config: &mut Value, spec: &PickerSpec, address: SocketAddr) {
    let picker = json!({
        "protocol": spec.protocol, "allow": spec.allow, "address": address.to_string(),
    });
    if let Some(config) = plugin_config.as_object_mut() {
        config.insert("picker".into(), picker);
    }
}

/// Serves the configured workers as the live registry and points the filter at it.
async fn serve_registry(plugin_config: &mut Value, refresh: Duration) -> Result<RegistryServer> {
    let workers = json!({ "workers": plugin_config.get("workers").cloned().unwrap_or_default() });
    let server = RegistryServer::start(&workers).await?;
    let refresh_ms = u64::try_from(refresh.as_millis()).unwrap_or(u64::MAX);
    let source = json!({
        "cluster": "pinroute_registry", "address": server.addr().to_string(), "refresh_ms": refresh_ms,
    });
    if let Some(config) = plugin_config.as_object_mut() {
        config.insert("registry".into(), source);
    }
    Ok(server)
}

/// A loopback address nothing listens on: a port bound and released at once, outside the
/// ephemeral range so that no outgoing connection is given it meanwhile.
pub fn refusing_address() -> Result<SocketAddr> {
    crate::vllm::free_loopback_address()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::envoy::test_support::stub_wasm;
    use crate::picker::PLAN_HEADER;

    #[tokio::test]
    async fn a_picker_stack_runs_its_stand_in_in_front_of_the_filter() {
        let wasm = stub_wasm();
        let workers = vec![SimConfig::new(201, SimRole::Decode)];
        let mut spec = StackSpec::new(workers, wasm.path().to_owned());
        spec.picker = Some(PickerSpec {
            allow: vec!["registry".into(), "10.0.0.0/8".into()],
            ..PickerSpec::new("llm-d")
        });
        let dir = tempfile::tempdir().unwrap();
        let stack = Stack::start(&spec, dir.path()).await.unwrap();
        let picker = stack.picker.as_ref().unwrap();
        assert_eq!(
            stack.plugin_config["picker"],
            json!({"protocol": "llm-d", "allow": ["registry", "10.0.0.0/8"],
                   "address": picker.address().to_string()})
        );
        let plan = json!({"status": 429});
        let response = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(stack.url("/v1/models"))
            .header(PLAN_HEADER, plan.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 429);
        assert_eq!(picker.seen().len(), 1);
    }
}
