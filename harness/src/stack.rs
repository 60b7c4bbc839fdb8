//! A whole deployment on this machine: sim workers, their registry, Envoy with the filter.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use serde_json::{Value, json};

use crate::envoy::{BootstrapOptions, DEFAULT_ROUTE_TIMEOUT, Envoy, envoy_binary, render_bootstrap, repo_root};
use crate::sim::{SimConfig, SimRole, SimWorker};

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
        }
    }
}

/// A running deployment; everything stops when it is dropped.
pub struct Stack {
    pub envoy: Envoy,
    pub workers: Vec<SimWorker>,
    pub plugin_config: Value,
}

impl Stack {
    pub async fn start(spec: &StackSpec, work_dir: &Path) -> Result<Stack> {
        let mut workers = Vec::new();
        for (config, port) in spec.workers.iter().zip(spec.worker_ports.iter().chain(std::iter::repeat(&0))) {
            let listen = SocketAddr::from(([127, 0, 0, 1], *port));
            let worker = SimWorker::start(config.clone(), listen)
                .await
                .with_context(|| format!("starting sim worker {} on {listen}", config.id))?;
            workers.push(worker);
        }
        let plugin_config = plugin_config(spec, &workers)?;
        let bootstrap = render_bootstrap(&BootstrapOptions {
            listen: spec.listen,
            admin: spec.admin,
            wasm: spec.wasm.clone(),
            plugin_config: plugin_config.to_string(),
            route_timeout: spec.route_timeout,
        })?;
        let binary = envoy_binary(&repo_root())?;
        let envoy = Envoy::start(&binary, &bootstrap, work_dir).await?;
        Ok(Stack { envoy, workers, plugin_config })
    }

    pub fn worker(&self, id: u64) -> Result<&SimWorker> {
        self.workers.iter().find(|w| w.config().id == id).ok_or_else(|| anyhow!("no sim worker {id}"))
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
        .map(|w| {
            let c = w.config();
            json!({
                "id": c.id, "role": c.role.as_str(), "address": w.addr().to_string(),
                "dp_size": c.dp_size, "draining": spec.draining.contains(&c.id),
            })
        })
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

/// A loopback address nothing listens on: a port bound and released at once.
pub fn refusing_address() -> Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).context("binding a free port")?;
    listener.local_addr().context("reading a bound port")
}
