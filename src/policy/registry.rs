//! The worker registry (`docs/semantics.md` §8): who the workers are, their roles and ranks.

use std::collections::{HashMap, HashSet};
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

/// `address` as its `Display` writes it (`ip:port`), without the formatting machinery: a
/// request names a few workers' addresses in headers.
pub fn address_text(address: SocketAddr) -> String {
    let mut text = String::with_capacity(21);
    push_address(&mut text, address);
    text
}

/// Appends `address` as [`address_text`] spells it.
pub fn push_address(text: &mut String, address: SocketAddr) {
    let SocketAddr::V4(v4) = address else {
        text.push_str(&address.to_string());
        return;
    };
    for (at, octet) in v4.ip().octets().into_iter().enumerate() {
        if at > 0 {
            text.push('.');
        }
        push_decimal(text, u16::from(octet));
    }
    text.push(':');
    push_decimal(text, v4.port());
}

fn push_decimal(text: &mut String, n: u16) {
    if n >= 10 {
        push_decimal(text, n / 10);
    }
    let digit = b'0'.saturating_add(u8::try_from(n % 10).unwrap_or_default());
    text.push(char::from(digit));
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
    /// Where each worker is in `workers`, by id and by address: a lookup per hop costs the
    /// same whatever the registry's size.
    by_id: HashMap<WorkerId, usize>,
    by_address: HashMap<SocketAddr, usize>,
    pools: Pools,
}

/// Positions in `workers` (`u32`: a registry holds far fewer) of the workers an unpinned hop
/// chooses among, per role, computed once per registry. Each list is sorted by id and leaves
/// draining workers out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Pools {
    /// A request naming no model: every serving worker of the role.
    any: [Vec<u32>; 3],
    /// Per model of `Registry::models` (same order): the role's workers serving it.
    listed: Vec<[Vec<u32>; 3]>,
    /// The workers naming no models: they alone serve a model no worker names.
    unnamed: [Vec<u32>; 3],
    /// Whether a token-generating worker, draining or not, serves every model / each
    /// listed model (`models::requested` answers 404 for one no such worker serves).
    token_serves_any: bool,
    token_serves: Vec<bool>,
}

impl Pools {
    fn new(workers: &[Worker], models: &[Rc<str>], token_role: Role) -> Pools {
        let mut order: Vec<usize> = (0..workers.len()).collect();
        order.sort_by_key(|at| workers.get(*at).map(|w| w.id));
        let members = |role: Role, serves: &dyn Fn(&Worker) -> bool| -> Vec<u32> {
            order
                .iter()
                .filter(|at| {
                    workers
                        .get(**at)
                        .is_some_and(|w| w.role == role && !w.draining && serves(w))
                })
                .filter_map(|at| u32::try_from(*at).ok())
                .collect()
        };
        let per_role = |serves: &dyn Fn(&Worker) -> bool| ROLES.map(|role| members(role, serves));
        let token = workers.iter().filter(|w| w.role == token_role);
        Pools {
            any: per_role(&|_| true),
            listed: models
                .iter()
                .map(|model| per_role(&|w: &Worker| w.serves(model)))
                .collect(),
            unnamed: per_role(&|w: &Worker| w.models.is_none()),
            token_serves_any: token.clone().any(|w| w.models.is_none()),
            token_serves: models
                .iter()
                .map(|model| token.clone().any(|w| w.serves(model)))
                .collect(),
        }
    }
}

const ROLES: [Role; 3] = [Role::Prefill, Role::Decode, Role::Aggregated];

fn role_index(role: Role) -> usize {
    match role {
        Role::Prefill => 0,
        Role::Decode => 1,
        Role::Aggregated => 2,
    }
}

/// The workers an unpinned hop chooses among: a role's serving workers (not draining) that
/// serve the request's model, sorted by id.
#[derive(Debug, Clone, Copy)]
pub struct Pool<'r> {
    workers: &'r [Worker],
    members: &'r [u32],
}

impl<'r> Pool<'r> {
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The `at`-th worker by id.
    pub fn get(&self, at: usize) -> Option<&'r Worker> {
        let index = *self.members.get(at)?;
        self.workers.get(usize::try_from(index).ok()?)
    }

    pub fn iter(&self) -> impl Iterator<Item = &'r Worker> + use<'r> {
        let workers = self.workers;
        self.members
            .iter()
            .filter_map(move |at| workers.get(usize::try_from(*at).ok()?))
    }

    /// Where `worker` is in the pool by id, if it is a member.
    pub fn position(&self, worker: WorkerId) -> Option<usize> {
        let id_at = |at: &u32| {
            usize::try_from(*at)
                .ok()
                .and_then(|at| self.workers.get(at))
                .map(|w| w.id)
        };
        self.members
            .binary_search_by(|at| id_at(at).cmp(&Some(worker)))
            .ok()
    }
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
        let token_role = match deployment {
            Deployment::Disaggregated => Role::Decode,
            Deployment::Aggregated => Role::Aggregated,
        };
        let pools = Pools::new(&workers, &models, token_role);
        let by_id = workers
            .iter()
            .enumerate()
            .map(|(at, w)| (w.id, at))
            .collect();
        let by_address = workers
            .iter()
            .enumerate()
            .map(|(at, w)| (w.address, at))
            .collect();
        Ok(Self {
            workers,
            deployment,
            models,
            by_id,
            by_address,
            pools,
        })
    }

    /// No worker at all: where a live registry has not answered yet. Every request then
    /// gets 503 `no_worker_available`.
    pub fn empty() -> Self {
        Self {
            workers: Vec::new(),
            deployment: Deployment::Disaggregated,
            models: Vec::new(),
            by_id: HashMap::new(),
            by_address: HashMap::new(),
            pools: Pools::default(),
        }
    }

    pub fn deployment(&self) -> Deployment {
        self.deployment
    }

    pub fn workers(&self) -> &[Worker] {
        &self.workers
    }

    pub fn get(&self, id: WorkerId) -> Option<&Worker> {
        self.workers.get(*self.by_id.get(&id)?)
    }

    pub fn at_address(&self, address: SocketAddr) -> Option<&Worker> {
        self.workers.get(*self.by_address.get(&address)?)
    }

    /// The workers an unpinned hop of `role` chooses among for a request naming `model`
    /// (`None`: any model): not draining, serving it, sorted by id.
    pub fn serving(&self, role: Role, model: Option<&str>) -> Pool<'_> {
        let pools = &self.pools;
        let lists = match model {
            None => &pools.any,
            Some(model) => match self.model_index(model) {
                Some(at) => pools.listed.get(at).unwrap_or(&pools.unnamed),
                None => &pools.unnamed,
            },
        };
        let members = lists.get(role_index(role)).map_or(&[][..], Vec::as_slice);
        Pool {
            workers: &self.workers,
            members,
        }
    }

    /// Whether a token-generating worker, draining or not, serves `model`.
    pub fn generates(&self, model: &str) -> bool {
        let pools = &self.pools;
        pools.token_serves_any
            || self
                .model_index(model)
                .and_then(|at| pools.token_serves.get(at))
                .is_some_and(|serves| *serves)
    }

    fn model_index(&self, model: &str) -> Option<usize> {
        self.models.binary_search_by(|m| (**m).cmp(model)).ok()
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
        self.models.get(self.model_index(model)?)
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
