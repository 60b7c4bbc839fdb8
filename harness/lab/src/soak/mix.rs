//! The soak's request mix: what the `seq`-th request of a virtual user is, and what it
//! should get. Every request is derived from `(user, seq)` by a small deterministic
//! generator, so a run's mix is reproducible.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use pinroute_harness::sim::PREFILL_LATENCY_HEADER;
use serde_json::{Value, json};

use super::deployment::{DECODE_WORKERS, HOSTILE_PREFILL, PREFILL_WORKERS};
use crate::load::ChunkedBody;

pub const COMPLETIONS: &str = "/v1/completions";
pub const CHAT: &str = "/v1/chat/completions";
pub const MODELS: &str = "/v1/models";
/// The filter's `max_body_bytes` in the soak's deployment: small, so that an oversized body
/// costs the load generator little.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// Sessions a session request picks its key from.
const SESSIONS: u64 = 48;
/// An id no registry entry has.
const UNKNOWN_ID: u64 = 999;

/// The kinds of request in the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Unpinned,
    UnpinnedStream,
    Chat,
    ChatStream,
    Session,
    DecodePinHeader,
    DecodePinNvext,
    PrefillPinHeader,
    PrefillPinNvext,
    BothPins,
    Models,
    UnknownWorker,
    BadHeader,
    BadJson,
    WrongType,
    RankOutOfRange,
    WrongRole,
    RankWithoutWorker,
    KvGuess,
    NestedSteering,
    WrongMethod,
    ControlPath,
    OversizedBody,
    UnderscoreHeader,
    LeavesDuringPrefill,
    LeavesDuringDecode,
    HostilePrefillPin,
}

/// Every kind with its weight in the mix (percent of requests, roughly).
pub const MIX: [(Kind, u64); 27] = [
    (Kind::Unpinned, 6),
    (Kind::UnpinnedStream, 8),
    (Kind::Chat, 5),
    (Kind::ChatStream, 7),
    (Kind::Session, 8),
    (Kind::DecodePinHeader, 9),
    (Kind::DecodePinNvext, 7),
    (Kind::PrefillPinHeader, 7),
    (Kind::PrefillPinNvext, 5),
    (Kind::BothPins, 8),
    (Kind::Models, 2),
    (Kind::UnknownWorker, 3),
    (Kind::BadHeader, 3),
    (Kind::BadJson, 3),
    (Kind::WrongType, 3),
    (Kind::RankOutOfRange, 2),
    (Kind::WrongRole, 2),
    (Kind::RankWithoutWorker, 2),
    (Kind::KvGuess, 1),
    (Kind::NestedSteering, 1),
    (Kind::WrongMethod, 1),
    (Kind::ControlPath, 1),
    (Kind::OversizedBody, 1),
    (Kind::UnderscoreHeader, 1),
    (Kind::LeavesDuringPrefill, 1),
    (Kind::LeavesDuringDecode, 1),
    (Kind::HostilePrefillPin, 1),
];

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Unpinned => "unpinned completion",
            Kind::UnpinnedStream => "unpinned completion, SSE",
            Kind::Chat => "unpinned chat",
            Kind::ChatStream => "unpinned chat, SSE",
            Kind::Session => "session (chat, SSE)",
            Kind::DecodePinHeader => "decode pin, header (+rank)",
            Kind::DecodePinNvext => "decode pin, nvext (+rank)",
            Kind::PrefillPinHeader => "prefill pin, header (+rank)",
            Kind::PrefillPinNvext => "prefill pin, nvext (+rank)",
            Kind::BothPins => "prefill + decode pins, ranks, session",
            Kind::Models => "GET /v1/models",
            Kind::UnknownWorker => "invalid: unknown worker",
            Kind::BadHeader => "invalid: bad header value",
            Kind::BadJson => "invalid: bad JSON",
            Kind::WrongType => "invalid: wrong field type",
            Kind::RankOutOfRange => "invalid: rank out of range",
            Kind::WrongRole => "invalid: wrong role",
            Kind::RankWithoutWorker => "invalid: rank without worker",
            Kind::KvGuess => "hostile: KV locator guess in stream_options",
            Kind::NestedSteering => "hostile: nested steering field",
            Kind::WrongMethod => "hostile: not POST on a completion path",
            Kind::ControlPath => "hostile: engine control path",
            Kind::OversizedBody => "hostile: oversized body, other path",
            Kind::UnderscoreHeader => "hostile: underscore header name",
            Kind::LeavesDuringPrefill => "client leaves during the prefill hop",
            Kind::LeavesDuringDecode => "client leaves during the decode stream",
            Kind::HostilePrefillPin => "hostile worker: prefill pinned to it",
        }
    }
}

/// What a request should get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// A 2xx with a complete, well-formed body (see `outcome` for pins to killed workers).
    Success,
    /// Exactly this status and error `code`, whatever happens to the workers.
    Rejected { status: u16, code: &'static str },
}

/// When a client leaves (closes its connection) without waiting for its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// While the prefill worker holds the prefill hop ([`HELD_PREFILL`]).
    DuringPrefill,
    /// While the decode worker streams [`LEAVER_TOKENS`] tokens.
    DuringDecode,
}

/// How long the prefill worker holds a leaving client's prefill hop (the sim's
/// `x-sim-prefill-latency-ms`); the client leaves a third of the way through.
pub const HELD_PREFILL: Duration = Duration::from_millis(300);
/// Tokens a client leaving during the decode stream asks for; it leaves a quarter of the way
/// through.
pub const LEAVER_TOKENS: u32 = 400;

impl Leave {
    /// How long after sending the request the client leaves.
    pub fn after(self, token_latency: Duration) -> Duration {
        match self {
            Leave::DuringPrefill => HELD_PREFILL / 3,
            Leave::DuringDecode => token_latency.saturating_mul(LEAVER_TOKENS / 4),
        }
    }
}

/// The worker pins of a request, as the filter should resolve them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pins {
    pub prefill: Option<u64>,
    pub decode: Option<u64>,
    /// The decode rank, when pinned (the sim names its rank in `x-sim-dp-rank`).
    pub decode_rank: Option<u32>,
}

impl Pins {
    pub fn is_pinned(&self) -> bool {
        self.prefill.is_some() || self.decode.is_some()
    }

    pub fn workers(&self) -> impl Iterator<Item = u64> {
        self.prefill.into_iter().chain(self.decode)
    }
}

/// One request of the mix, ready to send.
#[derive(Debug, Clone)]
pub struct Planned {
    pub kind: Kind,
    /// `None`: POST with a body, GET without.
    pub method: Option<Method>,
    pub path: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: Option<Bytes>,
    pub stream: bool,
    pub expect: Expect,
    pub pins: Pins,
    /// A client that leaves before its answer is complete.
    pub leaves: Option<Leave>,
}

impl Planned {
    fn new(kind: Kind, path: &'static str, expect: Expect) -> Self {
        Planned {
            kind,
            method: None,
            path,
            headers: Vec::new(),
            body: None,
            stream: false,
            expect,
            pins: Pins::default(),
            leaves: None,
        }
    }

    fn rejected(kind: Kind, status: u16, code: &'static str) -> Self {
        Planned::new(kind, COMPLETIONS, Expect::Rejected { status, code })
    }

    fn header(mut self, name: &'static str, value: impl ToString) -> Self {
        self.headers.push((name, value.to_string()));
        self
    }

    fn json(mut self, body: &Value) -> Self {
        self.stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
        self.body = Some(Bytes::from(body.to_string()));
        self
    }

    fn raw(mut self, body: &'static str) -> Self {
        self.body = Some(Bytes::from_static(body.as_bytes()));
        self
    }

    /// The HTTP request, with `x-request-id`.
    pub fn request(&self, request_id: &str) -> Request<ChunkedBody> {
        let body = self.body.clone().map(ChunkedBody::from).unwrap_or_default();
        let mut builder = Request::builder()
            .method(self.method())
            .uri(self.path)
            .header("host", "soak")
            .header("x-request-id", request_id);
        if self.body.is_some() {
            builder = builder.header("content-length", body.len());
            if !self.headers.iter().any(|(name, _)| *name == "content-type") {
                builder = builder.header("content-type", "application/json");
            }
        }
        for (name, value) in &self.headers {
            builder = builder.header(*name, value.as_str());
        }
        builder
            .body(body)
            .unwrap_or_else(|_| Request::new(ChunkedBody::empty()))
    }

    /// The request as one line for problem reports.
    pub fn describe(&self) -> String {
        let headers: Vec<String> = self
            .headers
            .iter()
            .map(|(n, v)| format!("{n}: {v}"))
            .collect();
        let body = self.body.as_ref().map(|b| {
            String::from_utf8_lossy(b)
                .chars()
                .take(240)
                .collect::<String>()
        });
        format!(
            "[{}] {} {} headers {:?} body {}",
            self.kind.label(),
            self.method(),
            self.path,
            headers,
            body.unwrap_or_default()
        )
    }

    fn method(&self) -> Method {
        match (&self.method, &self.body) {
            (Some(method), _) => method.clone(),
            (None, Some(_)) => Method::POST,
            (None, None) => Method::GET,
        }
    }
}

/// SplitMix64: small, fast and good enough to shape a request mix.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn for_request(user: usize, seq: u64) -> Rng {
        let mut rng = Rng((user as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seq.rotate_left(29));
        rng.next_u64();
        rng
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64().checked_rem(n).unwrap_or(0)
    }

    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }

    /// One of `items` (the first one's default when empty).
    pub fn pick<T: Copy + Default>(&mut self, items: &[T]) -> T {
        let index = usize::try_from(self.below(items.len() as u64)).unwrap_or(0);
        items.get(index).copied().unwrap_or_default()
    }
}

/// The kind of a request: drawn by [`MIX`] weight.
pub fn draw_kind(rng: &mut Rng) -> Kind {
    let total: u64 = MIX.iter().map(|(_, weight)| weight).sum();
    let mut ticket = rng.below(total);
    for (kind, weight) in MIX {
        if ticket < weight {
            return kind;
        }
        ticket -= weight;
    }
    Kind::Unpinned
}

/// The `seq`-th request of virtual user `user`.
pub fn plan(user: usize, seq: u64, max_tokens: u32) -> Planned {
    let mut rng = Rng::for_request(user, seq);
    let kind = draw_kind(&mut rng);
    let prompt = format!(
        "soak request {user}-{seq}: the prefill worker computes a cache that decode streams"
    );
    let mut maker = Maker {
        rng,
        prompt,
        max_tokens,
    };
    maker.plan(kind)
}

/// `body` with one more top-level member.
fn with_member(mut body: Value, key: &str, value: Value) -> Value {
    if let Some(object) = body.as_object_mut() {
        object.insert(key.into(), value);
    }
    body
}

/// Builds the requests of each kind from one generator.
struct Maker {
    rng: Rng,
    prompt: String,
    max_tokens: u32,
}

impl Maker {
    fn plan(&mut self, kind: Kind) -> Planned {
        match kind {
            Kind::Unpinned => self.success(kind, COMPLETIONS, false, None),
            Kind::UnpinnedStream => self.success(kind, COMPLETIONS, true, None),
            Kind::Chat => self.success(kind, CHAT, false, None),
            Kind::ChatStream => self.success(kind, CHAT, true, None),
            Kind::Session => self.session(),
            Kind::DecodePinHeader => self.decode_pin_header(),
            Kind::DecodePinNvext => self.decode_pin_nvext(),
            Kind::PrefillPinHeader => self.prefill_pin_header(),
            Kind::PrefillPinNvext => self.prefill_pin_nvext(),
            Kind::BothPins => self.both_pins(),
            Kind::Models => Planned::new(kind, MODELS, Expect::Success),
            Kind::UnknownWorker => self.unknown_worker(),
            Kind::BadHeader => self.bad_header(),
            Kind::BadJson => self.bad_json(),
            Kind::WrongType => self.wrong_type(),
            Kind::RankOutOfRange => self.rank_out_of_range(),
            Kind::WrongRole => self.wrong_role(),
            Kind::RankWithoutWorker => self.rank_without_worker(),
            Kind::KvGuess => self.kv_guess(),
            Kind::NestedSteering => self.nested_steering(),
            Kind::WrongMethod => self.wrong_method(),
            Kind::ControlPath => self.control_path(),
            Kind::OversizedBody => self.oversized_body(),
            Kind::UnderscoreHeader => self.underscore_header(),
            Kind::LeavesDuringPrefill => self.leaves_during_prefill(),
            Kind::LeavesDuringDecode => self.leaves_during_decode(),
            Kind::HostilePrefillPin => self.hostile_prefill_pin(),
        }
    }

    /// A completion pinned to the hostile prefill worker: its answer (oversized, truncated,
    /// compressed) fails this request alone, typed.
    fn hostile_prefill_pin(&mut self) -> Planned {
        let stream = self.rng.coin();
        let body = self.body(COMPLETIONS, stream, None);
        Planned::rejected(Kind::HostilePrefillPin, 502, "pinned_worker_failed")
            .header("x-dynamo-prefill-instance-id", HOSTILE_PREFILL)
            .json(&body)
    }

    /// An unpinned completion whose prefill hop the worker holds for [`HELD_PREFILL`].
    fn leaves_during_prefill(&mut self) -> Planned {
        let mut planned = self
            .success(Kind::LeavesDuringPrefill, COMPLETIONS, false, None)
            .header(PREFILL_LATENCY_HEADER, HELD_PREFILL.as_millis());
        planned.leaves = Some(Leave::DuringPrefill);
        planned
    }

    /// An unpinned SSE completion of [`LEAVER_TOKENS`] tokens.
    fn leaves_during_decode(&mut self) -> Planned {
        let body = with_member(
            self.body(COMPLETIONS, true, None),
            "max_tokens",
            json!(LEAVER_TOKENS),
        );
        let mut planned =
            Planned::new(Kind::LeavesDuringDecode, COMPLETIONS, Expect::Success).json(&body);
        planned.leaves = Some(Leave::DuringDecode);
        planned
    }

    /// A valid completion or chat body.
    fn body(&mut self, path: &str, stream: bool, nvext: Option<Value>) -> Value {
        let tokens = self.max_tokens
            + u32::try_from(self.rng.below(u64::from(self.max_tokens))).unwrap_or(0);
        let mut body = match path {
            CHAT => {
                json!({"model": "sim-model", "messages": [{"role": "user", "content": self.prompt}]})
            }
            _ => json!({"model": "sim-model", "prompt": self.prompt}),
        };
        if let Some(object) = body.as_object_mut() {
            let limit = if path == CHAT && self.rng.coin() {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            object.insert(limit.into(), json!(tokens));
            object.insert("stream".into(), json!(stream));
            if stream && self.rng.coin() {
                object.insert("stream_options".into(), json!({"include_usage": true}));
            }
            if let Some(nvext) = nvext {
                object.insert("nvext".into(), nvext);
            }
        }
        body
    }

    fn success(
        &mut self,
        kind: Kind,
        path: &'static str,
        stream: bool,
        nvext: Option<Value>,
    ) -> Planned {
        let body = self.body(path, stream, nvext);
        Planned::new(kind, path, Expect::Success).json(&body)
    }

    fn session(&mut self) -> Planned {
        let session = format!("soak-session-{}", self.rng.below(SESSIONS));
        self.success(Kind::Session, CHAT, true, None)
            .header("x-dynamo-session-id", session)
    }

    /// A decode worker and, for some requests, one of its ranks.
    fn decode_target(&mut self) -> (u64, Option<u32>) {
        let (id, dp_size) = self.rng.pick(&DECODE_WORKERS);
        (id, self.maybe_rank(dp_size))
    }

    fn prefill_target(&mut self) -> (u64, Option<u32>) {
        let (id, dp_size) = self.rng.pick(&PREFILL_WORKERS);
        (id, self.maybe_rank(dp_size))
    }

    /// No rank (a third of the time), else a rank in range.
    fn maybe_rank(&mut self, dp_size: u32) -> Option<u32> {
        match self.rng.below(3) {
            0 => None,
            _ => u32::try_from(self.rng.below(u64::from(dp_size))).ok(),
        }
    }

    fn decode_pin_header(&mut self) -> Planned {
        let (id, rank) = self.decode_target();
        let stream = self.rng.coin();
        let name = self
            .rng
            .pick(&["x-dynamo-worker-instance-id", "x-worker-instance-id"]);
        let mut planned = self
            .success(Kind::DecodePinHeader, COMPLETIONS, stream, None)
            .header(name, id);
        if let Some(rank) = rank {
            let rank_name =
                self.rng
                    .pick(&["x-dynamo-dp-rank", "x-dp-rank", "x-data-parallel-rank"]);
            planned = planned.header(rank_name, rank);
        }
        planned.pins = Pins {
            decode: Some(id),
            decode_rank: rank,
            ..Pins::default()
        };
        planned
    }

    fn decode_pin_nvext(&mut self) -> Planned {
        let (id, rank) = self.decode_target();
        let field = self.rng.pick(&["decode_worker_id", "backend_instance_id"]);
        let mut nvext = json!({ field: id, "annotations": ["soak"] });
        if let (Some(rank), Some(object)) = (rank, nvext.as_object_mut()) {
            object.insert("dp_rank".into(), json!(rank));
        }
        let stream = self.rng.coin();
        let mut planned = self.success(Kind::DecodePinNvext, CHAT, stream, Some(nvext));
        planned.pins = Pins {
            decode: Some(id),
            decode_rank: rank,
            ..Pins::default()
        };
        planned
    }

    fn prefill_pin_header(&mut self) -> Planned {
        let (id, rank) = self.prefill_target();
        let name = self
            .rng
            .pick(&["x-dynamo-prefill-instance-id", "x-prefill-instance-id"]);
        let mut planned = self
            .success(Kind::PrefillPinHeader, COMPLETIONS, true, None)
            .header(name, id);
        if let Some(rank) = rank {
            let rank_name = self
                .rng
                .pick(&["x-dynamo-prefill-dp-rank", "x-prefill-dp-rank"]);
            planned = planned.header(rank_name, rank);
        }
        planned.pins = Pins {
            prefill: Some(id),
            ..Pins::default()
        };
        planned
    }

    fn prefill_pin_nvext(&mut self) -> Planned {
        let (id, rank) = self.prefill_target();
        let mut nvext = json!({ "prefill_worker_id": id });
        if let (Some(rank), Some(object)) = (rank, nvext.as_object_mut()) {
            object.insert("prefill_dp_rank".into(), json!(rank));
        }
        let stream = self.rng.coin();
        let mut planned = self.success(Kind::PrefillPinNvext, CHAT, stream, Some(nvext));
        planned.pins = Pins {
            prefill: Some(id),
            ..Pins::default()
        };
        planned
    }

    /// Prefill pinned by header, decode by `nvext`, ranks on both, and a session the pins beat.
    fn both_pins(&mut self) -> Planned {
        let (prefill, prefill_rank) = self.prefill_target();
        let (decode, decode_rank) = self.decode_target();
        let mut nvext = json!({ "decode_worker_id": decode });
        if let (Some(rank), Some(object)) = (decode_rank, nvext.as_object_mut()) {
            object.insert("dp_rank".into(), json!(rank));
        }
        let session = format!("soak-session-{}", self.rng.below(SESSIONS));
        let mut planned = self
            .success(Kind::BothPins, COMPLETIONS, true, Some(nvext))
            .header("x-dynamo-prefill-instance-id", prefill)
            .header("x-dynamo-session-id", session);
        if let Some(rank) = prefill_rank {
            planned = planned.header("x-dynamo-prefill-dp-rank", rank);
        }
        planned.pins = Pins {
            prefill: Some(prefill),
            decode: Some(decode),
            decode_rank,
        };
        planned
    }

    fn unknown_worker(&mut self) -> Planned {
        let planned = Planned::rejected(Kind::UnknownWorker, 400, "unknown_worker");
        if self.rng.coin() {
            let body = self.body(COMPLETIONS, false, None);
            planned
                .json(&body)
                .header("x-dynamo-worker-instance-id", UNKNOWN_ID)
        } else {
            let body = self.body(
                COMPLETIONS,
                true,
                Some(json!({"prefill_worker_id": UNKNOWN_ID})),
            );
            planned.json(&body)
        }
    }

    fn bad_header(&mut self) -> Planned {
        let (name, value) = self.rng.pick(&[
            ("x-dynamo-worker-instance-id", "20l"),
            ("x-dynamo-worker-instance-id", "-201"),
            ("x-dynamo-prefill-instance-id", "18446744073709551616"),
            ("x-dynamo-dp-rank", "4294967296"),
            ("x-prefill-dp-rank", "0x1"),
            ("x-dynamo-worker-instance-id", "+201"),
        ]);
        let body = self.body(COMPLETIONS, false, None);
        Planned::rejected(Kind::BadHeader, 400, "invalid_header")
            .json(&body)
            .header(name, value)
    }

    fn bad_json(&mut self) -> Planned {
        let body = self.rng.pick(&[
            r#"{"model": "sim-model", "prompt": "cut short"#,
            r#"[{"model": "sim-model"}]"#,
            r#"{"model": "sim-model", "prompt": "x"} trailing"#,
            r#"{"prompt": "a", "prompt": "b", "max_tokens": 4}"#,
            "not json at all",
        ]);
        let planned = Planned::rejected(Kind::BadJson, 400, "invalid_body").raw(body);
        if self.rng.coin() {
            planned
        } else {
            Planned {
                path: CHAT,
                ..planned
            }
        }
    }

    fn wrong_type(&mut self) -> Planned {
        let nvext = match self.rng.below(5) {
            0 => json!({"decode_worker_id": "201"}),
            1 => json!({"prefill_worker_id": 101.0}),
            2 => json!({"backend_instance_id": 202, "dp_rank": true}),
            3 => json!({"prefill_worker_id": 102, "prefill_dp_rank": [1]}),
            _ => json!("not an object"),
        };
        let stream = self.rng.coin();
        let body = self.body(COMPLETIONS, stream, Some(nvext));
        Planned::rejected(Kind::WrongType, 400, "invalid_field").json(&body)
    }

    /// Ranks out of range on every worker, the killed ones included: checked before health.
    fn rank_out_of_range(&mut self) -> Planned {
        let body = self.body(COMPLETIONS, false, None);
        let planned =
            Planned::rejected(Kind::RankOutOfRange, 400, "dp_rank_out_of_range").json(&body);
        if self.rng.coin() {
            let (id, dp_size) = self.rng.pick(&DECODE_WORKERS);
            planned
                .header("x-dynamo-worker-instance-id", id)
                .header("x-dynamo-dp-rank", dp_size)
        } else {
            let (id, dp_size) = self.rng.pick(&PREFILL_WORKERS);
            planned
                .header("x-dynamo-prefill-instance-id", id)
                .header("x-dynamo-prefill-dp-rank", dp_size + 3)
        }
    }

    /// A decode id pinned as prefill, or a prefill id pinned as decode.
    fn wrong_role(&mut self) -> Planned {
        let body = self.body(CHAT, false, None);
        let planned = Planned::rejected(Kind::WrongRole, 400, "wrong_worker_role").json(&body);
        if self.rng.coin() {
            let (id, _) = self.rng.pick(&DECODE_WORKERS);
            planned.header("x-dynamo-prefill-instance-id", id)
        } else {
            let (id, _) = self.rng.pick(&PREFILL_WORKERS);
            planned.header("x-dynamo-worker-instance-id", id)
        }
    }

    fn rank_without_worker(&mut self) -> Planned {
        let body = self.body(COMPLETIONS, false, None);
        let planned =
            Planned::rejected(Kind::RankWithoutWorker, 400, "rank_without_worker").json(&body);
        let name = self
            .rng
            .pick(&["x-dynamo-dp-rank", "x-dynamo-prefill-dp-rank"]);
        planned.header(name, 0)
    }

    /// A decode hop the worker refuses (its `stream_options` are not what the prefill hop
    /// saw), guessing at the prefill's address: whatever the worker echoes, the answer is
    /// the typed `decode_refused`, and no address reaches the client
    /// (`docs/semantics.md` §4).
    fn kv_guess(&mut self) -> Planned {
        let (path, stream) = if self.rng.coin() {
            (COMPLETIONS, true)
        } else {
            (CHAT, self.rng.coin())
        };
        let guess = format!("127.0.0.1:{}", 8000 + self.rng.below(1000));
        let options = json!({ "include_usage": guess });
        let body = with_member(self.body(path, stream, None), "stream_options", options);
        Planned {
            path,
            ..Planned::rejected(Kind::KvGuess, 400, "decode_refused").json(&body)
        }
    }

    /// `kv_transfer_params` or `ec_transfer_params` below the top level, or a top-level
    /// `ec_transfer_params`: a client never steers KV transfer (`docs/semantics.md` §2).
    fn nested_steering(&mut self) -> Planned {
        let forged =
            json!({"remote_host": "10.9.9.9", "remote_port": 5600, "do_remote_prefill": true});
        let (member, value) = match self.rng.below(4) {
            0 => ("vllm_xargs", json!({ "kv_transfer_params": forged })),
            1 => ("nvext", json!({ "kv_transfer_params": forged })),
            2 => ("ec_transfer_params", json!({ "engine_id": "soak" })),
            _ => ("vllm_xargs", json!({ "ec_transfer_params": {} })),
        };
        let path = if self.rng.coin() { COMPLETIONS } else { CHAT };
        let stream = self.rng.coin();
        let body = with_member(self.body(path, stream, None), member, value);
        Planned {
            path,
            ..Planned::rejected(Kind::NestedSteering, 400, "invalid_field").json(&body)
        }
    }

    /// A completion path takes POST only: no other method makes a prefill hop.
    fn wrong_method(&mut self) -> Planned {
        let name = self.rng.pick(&["GET", "PUT", "DELETE", "PATCH", "OPTIONS"]);
        let method = Method::from_bytes(name.as_bytes()).unwrap_or(Method::GET);
        let path = if self.rng.coin() { COMPLETIONS } else { CHAT };
        let mut planned = Planned::rejected(Kind::WrongMethod, 405, "method_not_allowed");
        if matches!(method, Method::PUT | Method::PATCH) {
            let body = self.body(path, false, None);
            planned = planned.json(&body);
        }
        Planned {
            method: Some(method),
            path,
            ..planned
        }
    }

    /// vLLM's control endpoints are not public (`docs/semantics.md` §1).
    fn control_path(&mut self) -> Planned {
        let path = self.rng.pick(&[
            "/reset_prefix_cache",
            "/sleep",
            "/wake_up",
            "/collective_rpc",
            "/metrics",
            "/v1/load_lora_adapter",
        ]);
        let planned = Planned::new(
            Kind::ControlPath,
            path,
            Expect::Rejected {
                status: 404,
                code: "unknown_path",
            },
        );
        if self.rng.coin() {
            planned.raw("{}")
        } else {
            planned
        }
    }

    /// A body announced over `max_body_bytes` on a path that is not a completion path.
    fn oversized_body(&mut self) -> Planned {
        let path = self.rng.pick(&["/v1/embeddings", "/tokenize"]);
        let content_type = self
            .rng
            .pick(&["application/json", "application/octet-stream"]);
        let items = MAX_BODY_BYTES / 2 + 1;
        let body = format!("[{}0]", "0,".repeat(items));
        let planned = Planned::new(
            Kind::OversizedBody,
            path,
            Expect::Rejected {
                status: 413,
                code: "body_too_large",
            },
        )
        .header("content-type", content_type);
        Planned {
            body: Some(Bytes::from(body)),
            ..planned
        }
    }

    /// A steering or pin header spelt with underscores, which the engines' servers would
    /// read as the dashed name: Envoy refuses it before any filter (`docs/semantics.md` §6).
    fn underscore_header(&mut self) -> Planned {
        let (name, value) = self.rng.pick(&[
            ("x_pinroute_upstream", "127.0.0.1:1"),
            ("x_data_parallel_rank", "1"),
            ("x_dynamo_worker_instance_id", "201"),
        ]);
        let stream = self.rng.coin();
        let body = self.body(COMPLETIONS, stream, None);
        Planned::rejected(Kind::UnderscoreHeader, 400, "underscore_in_header")
            .json(&body)
            .header(name, value)
    }
}
