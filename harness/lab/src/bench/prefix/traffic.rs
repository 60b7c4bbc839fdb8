//! The prefix benchmark's traffic: many users sharing a few long system prompts, and
//! multi-turn conversations resending their history; streamed chat completions sent to a
//! gateway unpinned, with a session id, with the oracle's pins, or to two replicas at once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use http::Request;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::fleet::{Fleet, model_name};
use crate::bench::workload::{post_to, stream_problem};
use crate::load::{ChunkedBody, Exchange, Sample, VirtualUser, Workload};
use pinroute::policy::headers::PREFILL_WORKER_HEADER;
use pinroute_harness::sim::PromptBlocks;

const PATH: &str = "/v1/chat/completions";
/// Each model's requests are counted under its own label: user `u` asks model `u % models`.
pub const LABELS: [&str; 4] = ["model-0", "model-1", "model-2", "model-3"];
/// The most models the traffic spreads users over.
pub const MAX_MODELS: u64 = LABELS.len() as u64;

/// The two traffic shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Traffic {
    /// Every request: one of a few long system prompts, then a short question of its own.
    SystemPrompts,
    /// Each user holds a conversation (one of a few shorter system prompts, then turns that
    /// add a question and the answer), resending it whole every turn, then starts another.
    Conversations,
}

impl Traffic {
    pub const ALL: [Traffic; 2] = [Traffic::SystemPrompts, Traffic::Conversations];

    pub fn as_str(self) -> &'static str {
        match self {
            Traffic::SystemPrompts => "system-prompts",
            Traffic::Conversations => "conversations",
        }
    }

    /// Shared system prompts, their length in words, words per question, turns per
    /// conversation.
    fn shape(self) -> Shape {
        match self {
            Traffic::SystemPrompts => Shape {
                system_prompts: 16,
                system_words: 2000,
                question_words: 40,
                turns: 1,
            },
            Traffic::Conversations => Shape {
                system_prompts: 4,
                system_words: 250,
                question_words: 80,
                turns: 10,
            },
        }
    }

    pub fn describe(self) -> String {
        let shape = self.shape();
        match self {
            Traffic::SystemPrompts => format!(
                "{} system prompts of {} words (about {} KB each); each request adds a question of {} words",
                shape.system_prompts,
                shape.system_words,
                shape.system_words * 6 / 1024,
                shape.question_words
            ),
            Traffic::Conversations => format!(
                "conversations of {} turns over {} shared system prompts of {} words; each turn adds an answer and a question of {} words",
                shape.turns, shape.system_prompts, shape.system_words, shape.question_words
            ),
        }
    }
}

impl std::fmt::Display for Traffic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Traffic {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> anyhow::Result<Self> {
        Traffic::ALL
            .into_iter()
            .find(|t| t.as_str() == text.trim())
            .ok_or_else(|| {
                anyhow::anyhow!("unknown traffic {text:?}: system-prompts or conversations")
            })
    }
}

#[derive(Debug, Clone, Copy)]
struct Shape {
    system_prompts: u64,
    system_words: usize,
    question_words: usize,
    turns: usize,
}

/// Where the requests go.
#[derive(Clone)]
pub enum Target {
    /// To a gateway that chooses both workers; with the user's session id or not.
    Unpinned { gateway: SocketAddr, session: bool },
    /// To a pinroute gateway, pinned to the oracle's workers.
    Oracle {
        gateway: SocketAddr,
        fleet: Arc<Fleet>,
    },
    /// Two pinroute replicas sharing the requests as `sharing` says, counting how often they
    /// chose the same prefill worker for the requests both were sent.
    Pair {
        first: SocketAddr,
        second: SocketAddr,
        sharing: Sharing,
    },
}

/// How two replicas share a run's requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// Every request to both, one after the other: each replica counts every request.
    #[default]
    Mirrored,
    /// Each request to one replica, in turn (a conversation's turns alternate), and every
    /// [`PROBE_EVERY`]th also to the other: each replica counts little more than half.
    Split,
}

/// Under [`Sharing::Split`], one request in this many is also sent to the other replica.
pub const PROBE_EVERY: u64 = 4;

impl Sharing {
    pub fn describe(self) -> String {
        match self {
            Sharing::Mirrored => "every request sent to both".to_string(),
            Sharing::Split => format!(
                "each request sent to one of them in turn (a conversation's turns alternate), one in {PROBE_EVERY} also to the other"
            ),
        }
    }

    /// The replica that serves a user's `seq`-th request, and the other one if it is also
    /// sent there.
    fn route(self, first: SocketAddr, second: SocketAddr, user: usize, seq: u64) -> Route {
        match self {
            Sharing::Mirrored => (first, Some(second)),
            Sharing::Split => {
                let (serving, other) = if (user as u64 + seq).is_multiple_of(2) {
                    (first, second)
                } else {
                    (second, first)
                };
                (serving, seq.is_multiple_of(PROBE_EVERY).then_some(other))
            }
        }
    }
}

/// The gateway a request is sent to, and the replica it is compared on.
type Route = (SocketAddr, Option<SocketAddr>);

/// One user's place in the traffic.
#[derive(Debug, Default)]
struct UserState {
    conversation: u64,
    exchanges: Vec<(String, String)>,
    asked: u64,
}

/// How often two replicas agreed.
#[derive(Debug, Default)]
pub struct Agreement {
    pub pairs: AtomicU64,
    pub agreed: AtomicU64,
}

/// Pairs compared, and those where both replicas chose the same prefill worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Agreed {
    pub pairs: u64,
    pub agreed: u64,
}

impl Agreement {
    pub fn so_far(&self) -> Agreed {
        Agreed {
            pairs: self.pairs.load(Ordering::Relaxed),
            agreed: self.agreed.load(Ordering::Relaxed),
        }
    }
}

impl Agreed {
    pub fn since(self, earlier: Agreed) -> Agreed {
        Agreed {
            pairs: self.pairs.saturating_sub(earlier.pairs),
            agreed: self.agreed.saturating_sub(earlier.agreed),
        }
    }
}

pub struct PrefixTraffic {
    traffic: Traffic,
    target: Target,
    /// Makes every run's prompts its own, so that no cache or memory outlives a run.
    salt: u64,
    max_tokens: u32,
    /// The models users are spread over (at most [`MAX_MODELS`]).
    models: u64,
    answer: String,
    users: Mutex<HashMap<usize, UserState>>,
    conversations: AtomicU64,
    pub agreement: Agreement,
}

impl PrefixTraffic {
    pub fn new(traffic: Traffic, target: Target, salt: u64, max_tokens: u32, models: u64) -> Self {
        let answer: Vec<String> = (0..max_tokens).map(|i| format!("tok{i}")).collect();
        PrefixTraffic {
            traffic,
            target,
            salt,
            max_tokens,
            models: models.clamp(1, MAX_MODELS),
            answer: answer.join(" "),
            users: Mutex::new(HashMap::new()),
            conversations: AtomicU64::new(0),
            agreement: Agreement::default(),
        }
    }

    /// The user's next request: its messages and its session id.
    fn next_request(&self, user: usize) -> (Value, String) {
        let shape = self.traffic.shape();
        let mut users = self.users.lock().unwrap_or_else(PoisonError::into_inner);
        let state = users.entry(user).or_default();
        if state.asked == 0 || state.exchanges.len() >= shape.turns {
            state.conversation = self.conversations.fetch_add(1, Ordering::Relaxed);
            state.exchanges.clear();
        }
        state.asked += 1;
        let (system, session) = match self.traffic {
            Traffic::SystemPrompts => (
                mix(self.salt ^ mix(user as u64) ^ state.asked) % shape.system_prompts,
                format!("user-{}-{user}", self.salt),
            ),
            Traffic::Conversations => (
                mix(self.salt ^ state.conversation) % shape.system_prompts,
                format!("conversation-{}-{}", self.salt, state.conversation),
            ),
        };
        let system_text = words(
            &format!("System prompt {system} of run {}.", self.salt),
            mix(self.salt.wrapping_add(system)),
            shape.system_words,
        );
        let question = words(
            &format!("User {user} asks question {}:", state.asked),
            mix(self.salt ^ (user as u64) << 32 ^ state.asked),
            shape.question_words,
        );
        let mut messages = vec![json!({"role": "system", "content": system_text})];
        for (asked, answered) in &state.exchanges {
            messages.push(json!({"role": "user", "content": asked}));
            messages.push(json!({"role": "assistant", "content": answered}));
        }
        messages.push(json!({"role": "user", "content": question}));
        (Value::Array(messages), session)
    }

    /// The user's last request was answered: a conversation goes on with it.
    fn answered(&self, user: usize, messages: &Value) {
        let mut users = self.users.lock().unwrap_or_else(PoisonError::into_inner);
        let state = users.entry(user).or_default();
        let question = messages
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_string();
        state.exchanges.push((question, self.answer.clone()));
    }

    /// The user's request failed: it starts a new conversation.
    fn failed(&self, user: usize) {
        let mut users = self.users.lock().unwrap_or_else(PoisonError::into_inner);
        users.entry(user).or_default().exchanges.clear();
    }

    /// The model `user` asks.
    fn model_of(&self, user: usize) -> u64 {
        user as u64 % self.models
    }

    fn label_of(&self, user: usize) -> &'static str {
        let index = usize::try_from(self.model_of(user)).unwrap_or(0);
        LABELS.get(index).copied().unwrap_or("model")
    }

    fn body(&self, user: usize, messages: &Value) -> ChunkedBody {
        let body = json!({"model": model_name(self.model_of(user)), "messages": messages,
                          "max_tokens": self.max_tokens, "stream": true});
        ChunkedBody::from(Bytes::from(body.to_string()))
    }

    /// Where `user`'s `seq`-th request goes and, for a replica pair, where it is compared.
    fn route(&self, user: usize, seq: u64) -> Route {
        match &self.target {
            Target::Unpinned { gateway, .. } | Target::Oracle { gateway, .. } => (*gateway, None),
            Target::Pair {
                first,
                second,
                sharing,
            } => sharing.route(*first, *second, user, seq),
        }
    }

    async fn send(
        &self,
        user: &mut VirtualUser,
        gateway: SocketAddr,
        messages: &Value,
        session: &str,
    ) -> Result<Exchange, Sample> {
        let request_id = format!("prefix-{}-{}", user.id, self.salt);
        let started = Instant::now();
        let (headers, started) = match &self.target {
            Target::Unpinned {
                session: with_session,
                ..
            } => {
                let headers = if *with_session {
                    vec![("x-dynamo-session-id".to_string(), session.to_string())]
                } else {
                    Vec::new()
                };
                (headers, started)
            }
            Target::Oracle { fleet, .. } => {
                let (prefill, decode) = fleet.oracle(&PromptBlocks::of(messages));
                let headers = vec![
                    (
                        "x-dynamo-prefill-instance-id".to_string(),
                        prefill.to_string(),
                    ),
                    (
                        "x-dynamo-worker-instance-id".to_string(),
                        decode.to_string(),
                    ),
                ];
                (headers, Instant::now())
            }
            Target::Pair { .. } => (Vec::new(), started),
        };
        let request = post(&request_id, self.body(user.id, messages), &headers);
        let label = self.label_of(user.id);
        match user.connections.exchange(gateway, request).await {
            Ok(exchange) => match stream_problem(&exchange) {
                None => Ok(exchange),
                problem => Err(Sample::from_exchange(label, started, &exchange, problem)),
            },
            Err(error) => Err(Sample::transport_failure(label, started, &error)),
        }
    }

    /// The same request through the other replica: whether it chose the same prefill worker.
    async fn compare(
        &self,
        user: &mut VirtualUser,
        other: SocketAddr,
        messages: &Value,
        first: &Exchange,
    ) {
        let request_id = format!("prefix-{}-{}-b", user.id, self.salt);
        let request = post(&request_id, self.body(user.id, messages), &[]);
        if let Ok(exchange) = user.connections.exchange(other, request).await {
            let agreed = exchange.header(PREFILL_WORKER_HEADER).is_some()
                && exchange.header(PREFILL_WORKER_HEADER) == first.header(PREFILL_WORKER_HEADER);
            self.agreement.pairs.fetch_add(1, Ordering::Relaxed);
            self.agreement
                .agreed
                .fetch_add(u64::from(agreed), Ordering::Relaxed);
        }
    }
}

impl Workload for PrefixTraffic {
    async fn call(&self, user: &mut VirtualUser, seq: u64) -> Sample {
        let (messages, session) = self.next_request(user.id);
        let (gateway, compared_on) = self.route(user.id, seq);
        let started = Instant::now();
        match self.send(user, gateway, &messages, &session).await {
            Ok(exchange) => {
                if let Some(other) = compared_on {
                    self.compare(user, other, &messages, &exchange).await;
                }
                self.answered(user.id, &messages);
                Sample::from_exchange(self.label_of(user.id), started, &exchange, None)
            }
            Err(sample) => {
                self.failed(user.id);
                sample
            }
        }
    }
}

fn post(request_id: &str, body: ChunkedBody, extra: &[(String, String)]) -> Request<ChunkedBody> {
    let extra: Vec<(&str, &str)> = extra
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    post_to(PATH, request_id, body, &extra)
}

/// splitmix64's finaliser: a well-mixed 64-bit value.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

const VOCABULARY: [&str; 32] = [
    "prefill", "decode", "cache", "token", "worker", "gateway", "prompt", "answer", "system",
    "user", "route", "block", "stream", "model", "engine", "request", "latency", "memory", "batch",
    "shared", "history", "turn", "context", "rules", "policy", "replica", "load", "queue", "hash",
    "prefix", "window", "budget",
];

/// `count` words after `head`, drawn from a small vocabulary by a generator seeded with `seed`.
fn words(head: &str, seed: u64, count: usize) -> String {
    let mut text = String::with_capacity(head.len() + count * 8);
    text.push_str(head);
    let mut state = seed;
    for _ in 0..count {
        state = mix(state);
        text.push(' ');
        let index = usize::try_from(state % VOCABULARY.len() as u64).unwrap_or(0);
        text.push_str(VOCABULARY.get(index).unwrap_or(&"word"));
    }
    text
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn traffic(kind: Traffic) -> PrefixTraffic {
        let target = Target::Unpinned {
            gateway: "127.0.0.1:1".parse().unwrap(),
            session: false,
        };
        PrefixTraffic::new(kind, target, 7, 4, 1)
    }

    #[test]
    fn a_conversation_resends_its_history_and_ends_after_its_turns() {
        let traffic = traffic(Traffic::Conversations);
        let (first, session) = traffic.next_request(3);
        traffic.answered(3, &first);
        let (second, same) = traffic.next_request(3);
        assert_eq!(session, same);
        let (first, second) = (first.as_array().unwrap(), second.as_array().unwrap());
        assert_eq!(second.len(), first.len() + 2);
        assert_eq!(second[..first.len()], first[..]);
        assert_eq!(second[first.len()]["content"], "tok0 tok1 tok2 tok3");
        for _ in 0..20 {
            let (messages, _) = traffic.next_request(3);
            traffic.answered(3, &messages);
        }
        let (messages, other) = traffic.next_request(3);
        assert!(messages.as_array().unwrap().len() <= 2 * 10 + 2);
        assert_ne!(other, session, "a new conversation");
    }

    #[test]
    fn users_share_a_few_system_prompts_and_ask_their_own_questions() {
        let traffic = traffic(Traffic::SystemPrompts);
        let mut systems = std::collections::HashSet::new();
        let mut questions = std::collections::HashSet::new();
        for user in 0..40 {
            let (messages, _) = traffic.next_request(user);
            traffic.answered(user, &messages);
            let (messages, _) = traffic.next_request(user);
            assert_eq!(messages.as_array().unwrap().len(), 2, "no history");
            systems.insert(messages[0]["content"].as_str().unwrap().to_string());
            questions.insert(messages[1]["content"].as_str().unwrap().to_string());
        }
        assert!(
            systems.len() <= 16 && systems.len() > 4,
            "{}",
            systems.len()
        );
        assert_eq!(questions.len(), 40);
        let long = systems.iter().next().unwrap();
        assert!(long.len() > 10_000, "{}", long.len());
    }

    #[test]
    fn split_replicas_serve_turns_in_turn_and_compare_one_in_four() {
        let (a, b): (SocketAddr, SocketAddr) = (
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        );
        for seq in 0..8 {
            assert_eq!(Sharing::Mirrored.route(a, b, 5, seq), (a, Some(b)));
        }
        let routes: Vec<Route> = (0..8)
            .map(|seq| Sharing::Split.route(a, b, 5, seq))
            .collect();
        let served: Vec<SocketAddr> = routes.iter().map(|(serving, _)| *serving).collect();
        assert_eq!(served, [b, a, b, a, b, a, b, a]);
        let compared: Vec<Option<SocketAddr>> = routes.iter().map(|(_, other)| *other).collect();
        assert_eq!(
            compared,
            [Some(a), None, None, None, Some(a), None, None, None]
        );
        assert_eq!(Sharing::Split.route(a, b, 6, 0), (a, Some(b)));
    }
}
