//! The worker registry (`docs/semantics.md` §8): who the workers are, their roles and ranks.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::rc::Rc;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use thiserror::Error;

pub type WorkerId = u64;

/// The models a worker names, shared by every copy of the worker.
pub type ModelNames = Rc<[Rc<str>]>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Prefill,
    Decode,
    Aggregated,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Aggregated => "aggregated",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Worker {
    pub id: WorkerId,
    pub role: Role,
    #[serde(deserialize_with = "socket_address")]
    pub address: SocketAddr,
    #[serde(default = "one")]
    pub dp_size: u32,
    /// Set by the operator to take a worker out of service without forgetting it:
    /// pins to it answer 503 `worker_unavailable` instead of 400 `unknown_worker`.
    #[serde(default)]
    pub draining: bool,
    /// The models it serves, as clients name them in `model` (vLLM's `--served-model-name`
    /// and `--lora-modules` names); `None`: every model (`docs/semantics.md` §8). Shared, so
    /// that the copies of a worker each request's route holds cost no allocation.
    #[serde(default, deserialize_with = "model_names")]
    pub models: Option<ModelNames>,
    /// A worker a picker chose outside the registry (`docs/semantics.md` §9).
    #[serde(skip)]
    pub unlisted: bool,
}

impl Worker {
    /// A worker a picker chose that the registry does not list: nothing is known of it but
    /// its address, so any rank is passed on for it to check. Its id, a hash of the address,
    /// only names it in logs and answers: passive health and load are kept for listed
    /// workers only.
    pub fn unlisted(role: Role, address: SocketAddr) -> Worker {
        Worker {
            id: xxhash_rust::xxh3::xxh3_64(address.to_string().as_bytes()),
            role,
            address,
            dp_size: u32::MAX,
            draining: false,
            models: None,
            unlisted: true,
        }
    }

    /// Whether it serves `model`; a worker that names no models serves every one.
    pub fn serves(&self, model: &str) -> bool {
        self.models
            .as_ref()
            .is_none_or(|models| models.iter().any(|m| **m == *model))
    }
}

fn one() -> u32 {
    1
}

fn model_names<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<ModelNames>, D::Error> {
    let names: Option<Vec<String>> = Option::deserialize(deserializer)?;
    Ok(names.map(|names| names.iter().map(|name| Rc::from(name.as_str())).collect()))
}

fn socket_address<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.parse().map_err(|_| {
        D::Error::custom(format_args!(
            "address {text:?} is not ip:port (IPv6 as [::1]:8000)"
        ))
    })
}

/// The `workers` list; an entry refused is named by its id, or by its place in the list.
pub fn workers_from(list: serde_json::Value) -> Result<Vec<Worker>, RegistryError> {
    let entries: Vec<serde_json::Value> = serde_json::from_value(list)?;
    let worker = |(index, entry): (usize, serde_json::Value)| {
        let name = entry
            .get("id")
            .and_then(serde_json::Value::as_u64)
            .map_or_else(|| format!("workers[{index}]"), |id| format!("worker {id}"));
        serde_json::from_value(entry).map_err(|error| RegistryError::Worker { name, error })
    };
    entries.into_iter().enumerate().map(worker).collect()
}

/// Whether requests take two hops (prefill then decode) or one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deployment {
    Disaggregated,
    Aggregated,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    workers: Vec<Worker>,
    deployment: Deployment,
    /// Every model a worker names, sorted, each once: shared with the requests naming one,
    /// which then keep no copy of their own.
    models: Vec<Rc<str>>,
}

/// Why a worker list was refused (`docs/semantics.md` §8), at load or fetched at run time.
#[derive(Debug, Error)]
pub enum RegistryError {
    /// Not JSON.
    #[error("invalid JSON: {0}")]
    Json(serde_json::Error),
    /// JSON, but not of the expected shape (an unknown key, a value of the wrong type).
    #[error("{0}")]
    Shape(serde_json::Error),
    /// An entry of `workers` refused, named by its id or its place.
    #[error("{name}: {error}")]
    Worker {
        name: String,
        error: serde_json::Error,
    },
    #[error("worker id {0} appears more than once")]
    DuplicateId(WorkerId),
    #[error("address {0} is given to more than one worker")]
    DuplicateAddress(SocketAddr),
    #[error("worker {0} has dp_size 0")]
    ZeroDpSize(WorkerId),
    #[error("worker {0} has an empty models list: leave models out to serve every model")]
    NoModels(WorkerId),
    #[error("worker {0} names a model \"\" in models")]
    EmptyModelName(WorkerId),
    #[error("aggregated workers cannot be mixed with prefill or decode workers")]
    MixedDeployment,
    #[error("no decode or aggregated worker: nothing could generate tokens")]
    NoDecodeWorker,
}

impl From<serde_json::Error> for RegistryError {
    fn from(error: serde_json::Error) -> Self {
        if error.is_data() {
            RegistryError::Shape(error)
        } else {
            RegistryError::Json(error)
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegistryDoc {
    workers: serde_json::Value,
}

impl Registry {
    /// Parses and validates a registry document: `{"workers": [...]}`.
    pub fn from_json(json: &[u8]) -> Result<Self, RegistryError> {
        let doc: RegistryDoc = serde_json::from_slice(json)?;
        Self::new(workers_from(doc.workers)?)
    }

    pub fn new(workers: Vec<Worker>) -> Result<Self, RegistryError> {
        let mut ids = HashSet::new();
        let mut addresses = HashSet::new();
        for worker in &workers {
            if !ids.insert(worker.id) {
                return Err(RegistryError::DuplicateId(worker.id));
            }
            if !addresses.insert(worker.address) {
                return Err(RegistryError::DuplicateAddress(worker.address));
            }
            if worker.dp_size == 0 {
                return Err(RegistryError::ZeroDpSize(worker.id));
            }
            match worker.models.as_deref() {
                Some([]) => return Err(RegistryError::NoModels(worker.id)),
                Some(models) if models.iter().any(|m| m.is_empty()) => {
                    return Err(RegistryError::EmptyModelName(worker.id));
                }
                _ => {}
            }
        }
        let has = |role| workers.iter().any(|w| w.role == role);
        let deployment = match (
            has(Role::Aggregated),
            has(Role::Prefill) || has(Role::Decode),
        ) {
            (true, true) => return Err(RegistryError::MixedDeployment),
            (true, false) => Deployment::Aggregated,
            (false, _) if !has(Role::Decode) => return Err(RegistryError::NoDecodeWorker),
            (false, _) => Deployment::Disaggregated,
        };
        let mut models: Vec<Rc<str>> = workers
            .iter()
            .flat_map(|w| w.models.iter().flat_map(|m| m.iter()))
            .cloned()
            .collect();
        models.sort_unstable();
        models.dedup();
        Ok(Self {
            workers,
            deployment,
            models,
        })
    }

    /// No worker at all: where a live registry has not answered yet. Every request then
    /// gets 503 `no_worker_available`.
    pub fn empty() -> Self {
        Self {
            workers: Vec::new(),
            deployment: Deployment::Disaggregated,
            models: Vec::new(),
        }
    }

    pub fn deployment(&self) -> Deployment {
        self.deployment
    }

    pub fn workers(&self) -> &[Worker] {
        &self.workers
    }

    pub fn get(&self, id: WorkerId) -> Option<&Worker> {
        self.workers.iter().find(|w| w.id == id)
    }

    pub fn pool(&self, role: Role) -> impl Iterator<Item = &Worker> {
        self.workers.iter().filter(move |w| w.role == role)
    }

    /// Whether any worker names the models it serves: requests must then name theirs
    /// (`docs/semantics.md` §3).
    pub fn names_models(&self) -> bool {
        !self.models.is_empty()
    }

    /// The registry's own copy of `model`, if a worker names it in its `models`.
    pub fn listed_model(&self, model: &str) -> Option<&Rc<str>> {
        let at = self.models.binary_search_by(|m| (**m).cmp(model)).ok()?;
        self.models.get(at)
    }

    /// Every model a worker names, sorted, each once.
    pub fn models(&self) -> &[Rc<str>] {
        &self.models
    }

    /// The role of the worker that generates tokens: decode, or aggregated in a one-hop deployment.
    pub fn token_role(&self) -> Role {
        match self.deployment {
            Deployment::Disaggregated => Role::Decode,
            Deployment::Aggregated => Role::Aggregated,
        }
    }
}

#[cfg(test)]
#[path = "tests/registry.rs"]
mod tests;
