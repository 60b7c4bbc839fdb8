//! Judging one answer against the class its request should get.
//!
//! The expected class of a request:
//! - an invalid request: exactly its 4xx status and error `code`, whatever the workers do;
//! - a valid request: a 2xx with a complete body (an SSE stream up to `data: [DONE]`, the
//!   pinned workers and decode rank named in the response headers);
//! - a valid request pinned to a worker that was down, or out of service after its restart
//!   (passive health), while the request ran: that 2xx, or one of the typed errors of
//!   `docs/semantics.md` §3: 502 or 504 `pinned_worker_failed`, 503 `worker_unavailable` with
//!   `Retry-After`.
//!
//! A client that leaves before its answer is complete (during the prefill hop, or during the
//! decode stream) is counted as **left**; what must show is that Envoy and the filter leave
//! nothing behind (no request left open, no VM failure: the report checks both). An answer
//! that completes before the client leaves is judged as any other.
//!
//! Two outcomes a kill can cause that no gateway can turn into a success are counted apart,
//! each under a precise condition (anything else is a mismatch):
//! - **cut by kill**: the request's decode worker (named in `x-pinroute-decode-worker`) was
//!   killed while the request was open, after the request had reached it: either the 200
//!   and part of the stream were already sent (the body is cut, as it must be: the status
//!   is gone), or no answer had come yet, and the answer is the typed 502 `upstream_failed`
//!   (an unpinned decode hop is retried only when the connection was refused: a request a
//!   worker may have started is not replayed).
//! - **KV lost**: the decode worker answered 400 "kv_transfer_params do not match any
//!   prefill" because the prefill worker named in `x-pinroute-prefill-worker` was killed
//!   after its prefill hop and before decode fetched the KV (the KV died with it). The
//!   gateway answers a decode 4xx to a hop that carried KV as 400 `decode_refused`, its
//!   body withheld (`docs/semantics.md` §4), so that answer counts too, under the same
//!   condition.

use std::time::{Duration, Instant};

use http::{HeaderMap, StatusCode};
use serde::Serialize;
use serde_json::Value;

use super::chaos::Outages;
use super::deployment::{LONGEST_OUTAGE, is_decode_worker};
use super::mix::{Expect, MODELS, Planned};
use crate::load::{Exchange, TransportError};
use pinroute::policy::headers::{DECODE_WORKER_HEADER, ERROR_CODE_HEADER, PREFILL_WORKER_HEADER};

const SIM_WORKER_HEADER: &str = "x-sim-worker-id";
const SIM_RANK_HEADER: &str = "x-sim-dp-rank";
const STREAM_END: &[u8] = b"data: [DONE]\n\n";
/// Where the soak's workers listen.
const WORKER_HOST: &str = "127.0.0.1";
/// How the sim decode worker starts its message when it cannot load the KV.
const KV_MISMATCH: &str = "kv_transfer_params do not match any prefill";

/// How a request ended, judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Judgement {
    AsExpected,
    CutByKill,
    KvLost,
    Mismatch,
    NoAnswer,
    Left,
}

impl Judgement {
    pub fn label(self) -> &'static str {
        match self {
            Judgement::AsExpected => "ok",
            Judgement::CutByKill => "cut by kill",
            Judgement::KvLost => "KV lost with its prefill worker",
            Judgement::Mismatch => "MISMATCH",
            Judgement::NoAnswer => "NO ANSWER",
            Judgement::Left => "left, as planned",
        }
    }

    /// Whether it fails the soak.
    pub fn fails(self) -> bool {
        matches!(self, Judgement::Mismatch | Judgement::NoAnswer)
    }
}

/// What came back for one request.
#[derive(Debug)]
pub enum Answer<'a> {
    Complete(&'a Exchange),
    /// A response head, then the body failed.
    Cut {
        status: StatusCode,
        headers: &'a HeaderMap,
        error: &'a TransportError,
    },
    /// No response head at all.
    Failed(&'a TransportError),
    TimedOut(Duration),
    /// The client left, as planned, before the answer was complete.
    Left,
}

/// When a request was open.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub started: Instant,
    pub ended: Instant,
}

/// The judgement of one request, with the labels of its expected and actual class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub expected: String,
    pub actual: String,
    pub judgement: Judgement,
    /// What was wrong, for a mismatch or a missing answer.
    pub problem: Option<String>,
    /// A 502 counted as cut by kill, to be confirmed by Envoy's access log: the kill must have
    /// reset a request the worker had (`UC`), not refused one that Envoy then did not retry.
    pub confirm_reset: bool,
}

impl Verdict {
    /// This verdict, confirmed or not by the response flags Envoy logged for the request.
    pub fn confirmed_by(self, request_id: &str, flags: Option<&str>) -> Verdict {
        match flags {
            Some(flags) if flags.contains("UC") && !flags.contains("UO") => Verdict {
                confirm_reset: false,
                ..self
            },
            _ => {
                let flags = flags.unwrap_or("(no access log line)");
                let problem = format!(
                    "{request_id}: {} on a decode worker killed meanwhile, but Envoy's response flags are {flags}: \
                     the connection was not reset by the kill (UC) but refused (UF) and not retried (UO: retry overflow)",
                    self.actual
                );
                Verdict {
                    actual: format!("{} (Envoy flags {flags})", self.actual),
                    judgement: Judgement::Mismatch,
                    problem: Some(problem),
                    confirm_reset: false,
                    ..self
                }
            }
        }
    }
}

/// The class a request should get, given the outages while it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expected {
    Success,
    SuccessOrTyped,
    Rejected { status: u16, code: &'static str },
}

impl Expected {
    fn label(self) -> String {
        match self {
            Expected::Success => "2xx".into(),
            Expected::SuccessOrTyped => "2xx or typed 502/503/504 (pinned worker down)".into(),
            Expected::Rejected { status, code } => format!("{status} {code}"),
        }
    }
}

/// Judges `answer` to `planned`, which ran during `timing`; `aftermath` is how long after
/// its restart a worker may still be out of service.
pub fn judge(
    planned: &Planned,
    answer: &Answer<'_>,
    timing: Timing,
    outages: &Outages,
    aftermath: Duration,
) -> Verdict {
    let expected = expected_class(planned, timing, outages, aftermath);
    let judge = Judge {
        planned,
        timing,
        outages,
        expected,
    };
    let (actual, judgement, problem) = match answer {
        Answer::Complete(exchange) => judge.complete(exchange),
        Answer::Cut {
            status,
            headers,
            error,
        } => judge.cut(*status, headers, error),
        Answer::Failed(error) => (
            "no answer: transport error".into(),
            Judgement::NoAnswer,
            Some(error.to_string()),
        ),
        Answer::TimedOut(after) => (
            "no answer: timeout".into(),
            Judgement::NoAnswer,
            Some(format!("no answer within {after:?}")),
        ),
        Answer::Left => ("the client left".into(), Judgement::Left, None),
    };
    let problem = problem.map(|p| format!("{p}; request {}", planned.describe()));
    let confirm_reset = judgement == Judgement::CutByKill
        && matches!(answer, Answer::Complete(exchange) if exchange.status == StatusCode::BAD_GATEWAY);
    Verdict {
        expected: expected.label(),
        actual,
        judgement,
        problem,
        confirm_reset,
    }
}

fn expected_class(
    planned: &Planned,
    timing: Timing,
    outages: &Outages,
    aftermath: Duration,
) -> Expected {
    match planned.expect {
        Expect::Rejected { status, code } => Expected::Rejected { status, code },
        Expect::Success => {
            let disturbed = planned.pins.workers().any(|worker| {
                outages.disturbed_during(worker, timing.started, timing.ended, aftermath)
            });
            if disturbed {
                Expected::SuccessOrTyped
            } else {
                Expected::Success
            }
        }
    }
}

struct Judge<'a> {
    planned: &'a Planned,
    timing: Timing,
    outages: &'a Outages,
    expected: Expected,
}

type Judged = (String, Judgement, Option<String>);

impl Judge<'_> {
    fn complete(&self, exchange: &Exchange) -> Judged {
        let actual = actual_label(exchange);
        let problem = match self.expected {
            Expected::Rejected { status, code } => typed_error_problem(exchange, status, &[code]),
            Expected::Success => success_problem(self.planned, exchange),
            Expected::SuccessOrTyped if exchange.status.is_success() => {
                success_problem(self.planned, exchange)
            }
            Expected::SuccessOrTyped => pinned_failure_problem(exchange),
        };
        let Some(problem) = problem else {
            return (actual, Judgement::AsExpected, None);
        };
        if self.refusal_with_nothing_to_withhold(exchange) {
            return (actual, Judgement::AsExpected, None);
        }
        if self.cut_by_kill(exchange) {
            return (actual, Judgement::CutByKill, None);
        }
        if self.kv_lost(exchange) {
            return (actual, Judgement::KvLost, None);
        }
        let body = String::from_utf8_lossy(&exchange.body)
            .chars()
            .take(300)
            .collect::<String>();
        (
            actual,
            Judgement::Mismatch,
            Some(format!("{problem}; got {} {body}", exchange.status)),
        )
    }

    fn cut(&self, status: StatusCode, headers: &HeaderMap, error: &TransportError) -> Judged {
        let actual = format!("{} then body cut", status.as_u16());
        let decode_killed = self.worker_killed(header_id(headers, DECODE_WORKER_HEADER));
        if status.is_success() && self.planned.stream && decode_killed {
            return (actual, Judgement::CutByKill, None);
        }
        (
            actual,
            Judgement::Mismatch,
            Some(format!("{status} then the body failed: {error}")),
        )
    }

    /// A stream cut short, or the typed 502 of an unpinned decode hop, on a decode worker
    /// killed while the request was open.
    fn cut_by_kill(&self, exchange: &Exchange) -> bool {
        let decode_killed = self.worker_killed(header_id(&exchange.headers, DECODE_WORKER_HEADER));
        let stream_cut = exchange.status.is_success()
            && self.planned.stream
            && !exchange.tail.ends_with(STREAM_END);
        let unpinned_decode_failed = exchange.status == StatusCode::BAD_GATEWAY
            && self.planned.pins.decode.is_none()
            && error_code(exchange).as_deref() == Some("upstream_failed");
        decode_killed && (stream_cut || unpinned_decode_failed)
    }

    /// A request whose decode 4xx would be withheld (`decode_refused`), served with no prefill
    /// hop (every prefill worker it tried failed — the hostile one, then one being killed —
    /// and the decode worker prefilled itself): its hop carried no KV, so the worker's own
    /// 4xx is the answer (`docs/semantics.md` §4).
    fn refusal_with_nothing_to_withhold(&self, exchange: &Exchange) -> bool {
        let withheld = matches!(
            self.expected,
            Expected::Rejected {
                code: "decode_refused",
                ..
            }
        );
        withheld
            && exchange.status.is_client_error()
            && error_code(exchange).is_none()
            && header_id(&exchange.headers, PREFILL_WORKER_HEADER).is_none()
    }

    /// The decode worker's 400 for KV its prefill worker lost by being killed: the sim's own
    /// message, or the filter's `decode_refused` that withholds it (`docs/semantics.md` §4).
    fn kv_lost(&self, exchange: &Exchange) -> bool {
        let prefill_killed =
            self.worker_killed(header_id(&exchange.headers, PREFILL_WORKER_HEADER));
        let kv_missing = exchange.status == StatusCode::BAD_REQUEST
            && (error_message(exchange).is_some_and(|m| m.starts_with(KV_MISMATCH))
                || error_code(exchange).as_deref() == Some("decode_refused"));
        prefill_killed && kv_missing
    }

    fn worker_killed(&self, worker: Option<u64>) -> bool {
        worker.is_some_and(|w| {
            self.outages
                .killed_during(w, self.timing.started, self.timing.ended)
        })
    }
}

/// `2xx`, `<status> <pinroute code>`, or what else the answer was.
fn actual_label(exchange: &Exchange) -> String {
    let status = exchange.status.as_u16();
    if exchange.status.is_success() {
        return "2xx".into();
    }
    if let Some(code) = exchange.header(ERROR_CODE_HEADER) {
        return format!("{status} {code}");
    }
    match (error_message(exchange), exchange.header(SIM_WORKER_HEADER)) {
        (Some(message), Some(_)) if message.starts_with(KV_MISMATCH) => {
            format!("{status} from decode worker: KV not found")
        }
        (_, Some(worker)) => format!("{status} from worker {worker}"),
        _ => format!("{status} untyped"),
    }
}

/// Why a 2xx answer is not the complete, correctly routed one `planned` asked for.
fn success_problem(planned: &Planned, exchange: &Exchange) -> Option<String> {
    if !exchange.status.is_success() {
        return Some(format!("expected 2xx, got {}", exchange.status));
    }
    body_problem(planned, exchange)
        .or_else(|| routing_problem(planned, &exchange.headers))
        .or_else(|| kv_source_problem(planned, exchange))
}

/// Whether the decode worker used the KV of the prefill worker the gateway names
/// (`sim.kv_from` against `x-pinroute-prefill-worker`; both absent when no prefill hop served).
fn kv_source_problem(planned: &Planned, exchange: &Exchange) -> Option<String> {
    if planned.path == MODELS {
        return None;
    }
    let Some(sim) = sim_object(planned, &exchange.body) else {
        return Some("the answer has no sim object".into());
    };
    let kv_from = sim.get("kv_from").and_then(Value::as_u64);
    let prefill = header_id(&exchange.headers, PREFILL_WORKER_HEADER);
    (kv_from != prefill).then(|| {
        format!("decode used the KV of {kv_from:?} but {PREFILL_WORKER_HEADER} is {prefill:?}")
    })
}

/// The sim's `sim` object: in the JSON body, or in one of the SSE events.
fn sim_object(planned: &Planned, body: &[u8]) -> Option<Value> {
    if !planned.stream {
        return serde_json::from_slice::<Value>(body)
            .ok()?
            .get("sim")
            .cloned();
    }
    let text = std::str::from_utf8(body).ok()?;
    text.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .find_map(|event| event.get("sim").cloned())
}

fn body_problem(planned: &Planned, exchange: &Exchange) -> Option<String> {
    if planned.stream {
        return (!exchange.tail.ends_with(STREAM_END))
            .then(|| "the SSE stream did not end with data: [DONE]".into());
    }
    let Ok(body) = serde_json::from_slice::<Value>(&exchange.body) else {
        return Some("the body is not JSON".into());
    };
    let list = if planned.path == MODELS {
        "data"
    } else {
        "choices"
    };
    let filled = body
        .get(list)
        .and_then(Value::as_array)
        .is_some_and(|items| !items.is_empty());
    (!filled).then(|| format!("the body has no {list}"))
}

/// Whether the headers name the pinned workers and rank (and a decode worker at all).
fn routing_problem(planned: &Planned, headers: &HeaderMap) -> Option<String> {
    if planned.path == MODELS {
        return None;
    }
    let decode = header_id(headers, DECODE_WORKER_HEADER);
    let served_by = header_id(headers, SIM_WORKER_HEADER);
    let pins = planned.pins;
    if !decode.is_some_and(is_decode_worker) || decode != served_by {
        return Some(format!(
            "{DECODE_WORKER_HEADER} {decode:?} but served by worker {served_by:?}"
        ));
    }
    if pins.decode.is_some() && decode != pins.decode {
        return Some(format!(
            "decode pinned to {:?} but routed to {decode:?}",
            pins.decode
        ));
    }
    let rank = header_id(headers, SIM_RANK_HEADER);
    if pins.decode_rank.is_some() && rank != pins.decode_rank.map(u64::from) {
        return Some(format!(
            "decode rank pinned to {:?} but served by rank {rank:?}",
            pins.decode_rank
        ));
    }
    let prefill = header_id(headers, PREFILL_WORKER_HEADER);
    if pins.prefill.is_some() && prefill != pins.prefill {
        return Some(format!(
            "prefill pinned to {:?} but {PREFILL_WORKER_HEADER} is {prefill:?}",
            pins.prefill
        ));
    }
    None
}

/// Why the answer is not one of the typed errors of a pinned worker that was down.
fn pinned_failure_problem(exchange: &Exchange) -> Option<String> {
    match exchange.status.as_u16() {
        502 | 504 => typed_error_problem(
            exchange,
            exchange.status.as_u16(),
            &["pinned_worker_failed"],
        ),
        503 => retry_after_problem(exchange)
            .or_else(|| typed_error_problem(exchange, 503, &["worker_unavailable"])),
        other => Some(format!("expected 2xx or a typed 502/503/504, got {other}")),
    }
}

/// A worker out of service after a failure returns within its outage, at most
/// `LONGEST_OUTAGE`: `Retry-After` is the seconds left, rounded up.
fn retry_after_problem(exchange: &Exchange) -> Option<String> {
    let most = LONGEST_OUTAGE.as_millis().div_ceil(1000);
    let seconds = exchange
        .header("retry-after")
        .and_then(|value| value.parse::<u128>().ok());
    match seconds {
        Some(seconds) if (1..=most).contains(&seconds) => None,
        _ => Some(format!(
            "503 with Retry-After {:?}, not 1 to {most} seconds",
            exchange.header("retry-after")
        )),
    }
}

/// Why the answer is not an OpenAI-shaped error with this status and one of `codes`.
fn typed_error_problem(exchange: &Exchange, status: u16, codes: &[&str]) -> Option<String> {
    if exchange.status.as_u16() != status {
        return Some(format!(
            "expected {status} {codes:?}, got {}",
            exchange.status
        ));
    }
    let code = error_code(exchange);
    if !code.as_deref().is_some_and(|code| codes.contains(&code)) {
        return Some(format!("expected error code {codes:?}, got {code:?}"));
    }
    let header = exchange.header(ERROR_CODE_HEADER);
    if header != code.as_deref() {
        return Some(format!(
            "{ERROR_CODE_HEADER} {header:?} differs from the body's code {code:?}"
        ));
    }
    leaked_address(exchange)
}

/// No error may show a worker's address (the soak's workers listen on `127.0.0.1`), nor
/// confirm a client's guess of one (`docs/semantics.md` §6).
fn leaked_address(exchange: &Exchange) -> Option<String> {
    let body = String::from_utf8_lossy(&exchange.body);
    body.contains(WORKER_HOST)
        .then(|| format!("an error names a worker address ({WORKER_HOST})"))
}

fn error_field(exchange: &Exchange, field: &str) -> Option<String> {
    let body: Value = serde_json::from_slice(&exchange.body).ok()?;
    body.get("error")?.get(field)?.as_str().map(str::to_owned)
}

fn error_code(exchange: &Exchange) -> Option<String> {
    error_field(exchange, "code")
}

fn error_message(exchange: &Exchange) -> Option<String> {
    error_field(exchange, "message")
}

fn header_id(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}
