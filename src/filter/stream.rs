//! One HTTP request through the filter (`docs/semantics.md` §1–§4): every host callback is an
//! [`Event`], and [`step`] — the only place a [`Phase`] is made or changed — takes the current
//! phase and the event to the next phase. The hop modules report what happened
//! ([`PrefillVerdict`], [`Outcome`]); the phases themselves ([`super::phase`]) only hold data.

use super::decode_retry;
use super::env::{Env, host_failure};
use super::host::{Flow, Headers, Host};
use super::intake::{self, forwarded_headers, header_text};
use super::metrics::Counter;
use super::phase::{Answer, Completion, Phase, Routed};
use super::prefill::{self, PrefillVerdict};
use super::response::{self, HeldBody, Outcome, RoutedBody};
use crate::policy::api::Api;
use crate::policy::error::RouteError;
use crate::policy::hop::HopFailure;
use crate::policy::json::JsonObject;
use crate::policy::paths::{Destination, StoredResponse};
use crate::policy::pins::{HeaderHints, Pins};
use crate::policy::registry::{Deployment, WorkerId};
use crate::policy::resolve::{PrefillPlan, TokenHop};
use crate::policy::responses::{self, ResponsesRequest};
use crate::policy::rewrite::{self, DecodeBody};
use crate::policy::trace::TRACEPARENT;
use crate::policy::{headers, models, passthrough, picker, pins, steering};

pub struct Stream<H: Host> {
    env: Env<H>,
    phase: Phase,
}

/// What the host tells the filter about the stream.
#[derive(Debug, Clone, Copy)]
enum Event {
    RequestHeaders {
        end_of_stream: bool,
    },
    RequestBody {
        size: usize,
        end: bool,
    },
    RequestTrailers,
    /// The answer of a call the request made (its prefill hop, a decode hop sent again).
    CallAnswer {
        token: u32,
        body_size: usize,
    },
    ResponseHeaders {
        end_of_stream: bool,
    },
    ResponseBody {
        size: usize,
        end: bool,
    },
}

type Step = Result<(Phase, Flow), RouteError>;

/// The host's callbacks: each is one step of the machine.
impl<H: Host> Stream<H> {
    pub fn new(env: Env<H>) -> Self {
        Self {
            env,
            phase: Phase::Headers,
        }
    }

    pub fn on_request_headers(&mut self, end_of_stream: bool) -> Flow {
        self.advance(Event::RequestHeaders { end_of_stream })
    }

    pub fn on_request_body(&mut self, size: usize, end: bool) -> Flow {
        self.advance(Event::RequestBody { size, end })
    }

    /// A body that ends in trailers (HTTP/2) never ends in the body callbacks: a body the
    /// filter must read is refused rather than forwarded unread.
    pub fn on_request_trailers(&mut self) -> Flow {
        self.advance(Event::RequestTrailers)
    }

    pub fn on_call_answer(&mut self, token: u32, body_size: usize) {
        self.advance(Event::CallAnswer { token, body_size });
    }

    pub fn on_response_headers(&mut self, end_of_stream: bool) -> Flow {
        self.advance(Event::ResponseHeaders { end_of_stream })
    }

    pub fn on_response_body(&mut self, size: usize, end: bool) -> Flow {
        self.advance(Event::ResponseBody { size, end })
    }

    /// The stream is over, however it ended (answered, failed, the client gone): its hops no
    /// longer count as outstanding, its in-flight slot is free, and nothing more is done for
    /// it (a late prefill answer included).
    pub fn on_stream_end(&mut self) {
        self.env.release_slot();
        let worker = match std::mem::replace(&mut self.phase, Phase::Answered) {
            Phase::Prefill(prefilling) => prefilling.attempt.target.worker.id,
            Phase::Routed(routed) => response::serving_worker(&routed),
            _ => return,
        };
        self.env.count_outstanding(worker, -1);
        self.env.flush_load();
    }

    /// Runs one step; an error is answered in place of the request. The hops the step started
    /// and ended are counted in one write.
    fn advance(&mut self, event: Event) -> Flow {
        let phase = std::mem::replace(&mut self.phase, Phase::Answered);
        let (next, flow) = step(&mut self.env, phase, event).unwrap_or_else(|error| {
            self.env.answer(&error);
            (Phase::Answered, Flow::Pause)
        });
        self.phase = next;
        self.env.flush_load();
        flow
    }
}

/// The machine: `phase` and `event` to the next phase and what the host does with the stream.
fn step<H: Host>(env: &mut Env<H>, phase: Phase, event: Event) -> Step {
    match (phase, event) {
        (_, Event::RequestHeaders { end_of_stream }) => on_headers(env, end_of_stream),
        (Phase::CompletionBody(completion), Event::RequestBody { size, end }) => {
            on_completion_body(env, completion, size, end)
        }
        (Phase::PassthroughBody(decode), Event::RequestBody { size, end }) => {
            on_passthrough_body(env, decode, size, end)
        }
        (Phase::CompletionBody(_) | Phase::PassthroughBody(_), Event::RequestTrailers) => Err(
            RouteError::InvalidBody("a body followed by trailers is not accepted".into()),
        ),
        (
            phase @ (Phase::Prefill(_) | Phase::Answered),
            Event::RequestBody { .. } | Event::RequestTrailers,
        ) => Ok((phase, Flow::Pause)),
        (Phase::Prefill(prefilling), Event::CallAnswer { token, body_size })
            if prefilling.token == token =>
        {
            let verdict = prefill::judge(env, *prefilling, body_size)?;
            after_prefill(env, verdict)
        }
        (Phase::Routed(routed), Event::CallAnswer { token, body_size })
            if awaits(&routed, token) =>
        {
            Ok((on_retry_answer(env, routed, body_size), Flow::Continue))
        }
        (Phase::Routed(routed), Event::ResponseHeaders { end_of_stream }) => {
            let (routed, flow) = on_response_headers(env, routed, end_of_stream);
            Ok((Phase::Routed(routed), flow))
        }
        (Phase::Routed(routed), Event::ResponseBody { size, end }) => {
            let flow = on_response_body(env, &routed, size, end);
            Ok((Phase::Routed(routed), flow))
        }
        (phase, _) => Ok((phase, Flow::Continue)),
    }
}

fn on_headers<H: Host>(env: &mut Env<H>, end_of_stream: bool) -> Step {
    env.count(Counter::Requests);
    let headers = env.host.request_headers().map_err(host_failure)?;
    let destination = intake::admit(env, &headers)?;
    let named = || headers.iter();
    let mut hints = pins::parse_headers(named())?;
    if let Some(picker) = &env.config.settings.picker {
        hints.picked = picker::parse_headers(picker.protocol, named())?;
    }
    hints.caller = intake::caller(env, &headers);
    intake::check_caller(env, &hints, &hints.pins)?;
    let upstream_header = env.config.settings.upstream_header.as_str();
    for (name, _) in headers
        .iter()
        .filter(|(n, _)| headers::must_strip(n, upstream_header))
    {
        env.set_request_header(name, None)?;
    }
    // The filter's own calls name Envoy's span: the prefill hop through `forwarded`, a retry
    // of the decode hop through the request's headers (the routed hop gets the router's).
    let traceparent = intake::request_traceparent(&headers);
    if let Some(traceparent) = &traceparent {
        env.set_request_header(TRACEPARENT, Some(traceparent))?;
    }
    env.request_id = intake::request_id(env, &headers)?;
    let api = match destination {
        Destination::Generation(api) => api,
        Destination::StoredResponse(stored) => {
            hints.pins = to_stored_response(env, &stored, hints.pins, &headers)?;
            return route_one_hop(env, hints, &headers, end_of_stream);
        }
        Destination::ModelList if header_text(&headers, ":method") == "GET" => {
            if let Some(list) = models::list(&env.config.registry) {
                return answer_model_list(env, &list);
            }
            return route_one_hop(env, hints, &headers, end_of_stream);
        }
        Destination::ModelList | Destination::Other | Destination::NotRouted(_) => {
            return route_one_hop(env, hints, &headers, end_of_stream);
        }
    };
    if end_of_stream {
        return Err(RouteError::InvalidBody("the body is empty".into()));
    }
    if header_text(&headers, ":path") != api.path() {
        env.set_request_header(":path", Some(api.path()))?;
    }
    let forwarded = forwarded_headers(&headers, upstream_header, traceparent.as_deref());
    env.take_slot()?;
    env.set_request_header("content-length", None)?;
    let completion = Box::new(Completion {
        hints,
        api,
        forwarded,
    });
    Ok((Phase::CompletionBody(completion), Flow::Pause))
}

/// A read or cancel of a stored response: the pins of its one hop, to the worker its id names,
/// and the path in its plain spelling, the client's query kept.
fn to_stored_response<H: Host>(
    env: &Env<H>,
    stored: &StoredResponse,
    pins: Pins,
    headers: &Headers,
) -> Result<Pins, RouteError> {
    // As on the other one-hop paths, prefill pins do not apply.
    let pins = Pins {
        prefill_worker_id: None,
        prefill_dp_rank: None,
        ..pins
    };
    let holder = ResponsesRequest::about(&stored.id, &env.config.registry)?;
    let pins = holder.pin(pins, "the response id of the path")?;
    let raw = header_text(headers, ":path");
    let path = match raw.split_once('?') {
        Some((_, query)) => format!("{}?{query}", stored.path),
        None => stored.path.clone(),
    };
    if raw != path {
        env.set_request_header(":path", Some(&path))?;
    }
    Ok(pins)
}

/// A request of another path (or about a stored response): one hop, its JSON body read first.
fn route_one_hop<H: Host>(
    env: &mut Env<H>,
    hints: HeaderHints,
    headers: &Headers,
    end_of_stream: bool,
) -> Step {
    let reads_body = passthrough::read_as_json(header_text(headers, "content-type"));
    if !end_of_stream && reads_body {
        return Ok((Phase::PassthroughBody(Box::new(hints)), Flow::Pause));
    }
    let body = if end_of_stream {
        RoutedBody::Empty
    } else {
        RoutedBody::Unread
    };
    let routed = response::route(env, one_hop(env, &hints)?, body, None)?;
    Ok((Phase::Routed(routed), Flow::Continue))
}

/// The one hop of a path that takes no prefill hop, for the request's model if it names one.
fn one_hop<H: Host>(env: &Env<H>, hints: &HeaderHints) -> Result<TokenHop, RouteError> {
    let decode = env.with_resolver(hints, None, |r| r.token_hop(&hints.pins))?;
    env.count_panics(false, decode.panic);
    Ok(decode)
}

/// `GET /v1/models`, answered from the registry's models (`docs/semantics.md` §3).
fn answer_model_list<H: Host>(env: &Env<H>, list: &str) -> Step {
    let headers = [("content-type", "application/json")];
    env.host
        .send_response(200, &headers, list.as_bytes())
        .map_err(host_failure)?;
    Ok((Phase::Answered, Flow::Pause))
}

fn on_completion_body<H: Host>(
    env: &mut Env<H>,
    completion: Box<Completion>,
    size: usize,
    end: bool,
) -> Step {
    let Some(body) = intake::whole_body(env, size, end)? else {
        return Ok((Phase::CompletionBody(completion), Flow::Pause));
    };
    let request = JsonObject::parse(&body).map_err(|e| RouteError::InvalidBody(e.to_string()))?;
    let api = completion.api;
    steering::check_completion(&request)?;
    rewrite::check_limits(api, &request)?;
    env.model = models::requested(&request, &env.config.registry)?;
    if let Ok(Some(model)) = models::named(&request) {
        env.log_model(&model);
    }
    env.count_model_request();
    let responses = (api == Api::Responses)
        .then(|| ResponsesRequest::read(&request, &env.config.registry))
        .transpose()?;
    let pins = completion
        .hints
        .pins
        .clone()
        .or(pins::parse_nvext(&request)?);
    intake::check_caller(env, &completion.hints, &pins)?;
    env.count_pins(&pins, &completion.hints);
    let pins = match &responses {
        Some(state) => state.pin(pins, responses::PREVIOUS_RESPONSE_ID)?,
        None => pins,
    };
    let raw_prompt = api.prompt(&request);
    let prompt = env.read_prompt(&raw_prompt, &pins);
    let mut route = env.with_resolver(&completion.hints, prompt.as_ref(), |r| r.resolve(&pins))?;
    if let Some(state) = &responses {
        route = state.route(route);
    }
    env.count_route(&route);
    env.remember_turn(prompt.as_ref(), &route);
    let stamp = responses
        .filter(|state| state.stored)
        .map(|_| responses::response_id(route.decode.target.worker.id, env.unique()))
        .map(|id| format!("\"{id}\""));
    let gateway: Vec<(&str, &str)> = stamp
        .iter()
        .map(|id| (responses::REQUEST_ID, id.as_str()))
        .collect();
    let decode_body = DecodeBody::new(&request, &body, &gateway);
    let candidates = match route.prefill {
        PrefillPlan::Skip | PrefillPlan::Local(_) => {
            if route.prefill == PrefillPlan::Skip
                && env.config.registry.deployment() == Deployment::Disaggregated
            {
                env.count(Counter::AggregatedFallback);
            }
            let held = HeldBody::edited(size, decode_body.finish(None));
            let routed = response::route(env, route.decode, RoutedBody::Held(held), None)?;
            return Ok((Phase::Routed(routed), Flow::Continue));
        }
        PrefillPlan::Pinned(target) => vec![target],
        PrefillPlan::Candidates(targets) => targets,
    };
    let attempt = prefill::first_attempt(
        *completion,
        &request,
        candidates,
        decode_body,
        route.decode,
        size,
    )?;
    Ok((
        Phase::Prefill(prefill::dispatch(env, attempt)?),
        Flow::Pause,
    ))
}

/// Another path's JSON body, once whole: on to a worker serving the model it names, unless it
/// names `kv_transfer_params`.
fn on_passthrough_body<H: Host>(
    env: &mut Env<H>,
    hints: Box<HeaderHints>,
    size: usize,
    end: bool,
) -> Step {
    let Some(body) = intake::whole_body(env, size, end)? else {
        return Ok((Phase::PassthroughBody(hints), Flow::Pause));
    };
    passthrough::check_body(&body)?;
    env.model = models::in_other_body(&body, &env.config.registry)?;
    env.count_model_request();
    let decode = one_hop(env, &hints)?;
    let routed = response::route(env, decode, RoutedBody::Read(body.len()), None)?;
    Ok((Phase::Routed(routed), Flow::Continue))
}

/// The prefill hop answered: on to decode (the request resumes), to the next prefill worker,
/// or the client already has the worker's answer.
fn after_prefill<H: Host>(env: &mut Env<H>, verdict: PrefillVerdict) -> Step {
    match verdict {
        PrefillVerdict::Decode {
            decode,
            held,
            served,
        } => {
            let routed = response::route(env, decode, RoutedBody::Held(held), served)?;
            if let Err(error) = env.host.resume_request() {
                log::error!(
                    "pinroute: could not resume request {}: {error}",
                    env.request_id
                );
            }
            Ok((Phase::Routed(routed), Flow::Continue))
        }
        PrefillVerdict::Retry(attempt) => Ok((
            Phase::Prefill(prefill::dispatch(env, attempt)?),
            Flow::Continue,
        )),
        PrefillVerdict::Answered => Ok((Phase::Answered, Flow::Continue)),
    }
}

/// Whether the filter's retry with this token is what the request waits for.
fn awaits(routed: &Routed, token: u32) -> bool {
    routed.retry.as_ref().and_then(|r| r.token) == Some(token)
}

/// The worker's answer headers: passed on, replaced by a typed error (now, when no body
/// follows), or held while the filter sends the request to the next candidate.
fn on_response_headers<H: Host>(
    env: &Env<H>,
    mut routed: Box<Routed>,
    end_of_stream: bool,
) -> (Box<Routed>, Flow) {
    if !matches!(routed.answer, Answer::Awaited) {
        return (routed, Flow::Continue);
    }
    let error = match response::answer_headers(env, &routed) {
        Err(failure) => {
            log::error!(
                "pinroute: could not edit the response of {}: {failure}",
                env.request_id
            );
            None
        }
        Ok((worker, Outcome::Passed)) => {
            env.log_served_decode(&routed.decode, worker);
            None
        }
        Ok((worker, Outcome::Refused)) => match send_on(env, &mut routed, worker) {
            Ok(()) => return (routed, Flow::Pause),
            Err(error) => Some(error),
        },
        Ok((_, Outcome::Failed(error))) => Some(error),
    };
    // Answered: the kept request is no longer needed.
    routed.retry = None;
    routed.answer = match error {
        Some(error) => match response::replace_headers(env, &error) {
            Ok(()) if end_of_stream => {
                // No body will come to be replaced: the error is answered whole instead.
                env.send_error(&error);
                routed.answer = Answer::AsItIs;
                return (routed, Flow::Pause);
            }
            Ok(()) => Answer::Replaced(error),
            Err(failure) => {
                log::error!(
                    "pinroute: could not edit the response of {}: {failure}",
                    env.request_id
                );
                Answer::AsItIs
            }
        },
        None => Answer::AsItIs,
    };
    (routed, Flow::Continue)
}

fn on_response_body<H: Host>(env: &Env<H>, routed: &Routed, size: usize, end: bool) -> Flow {
    match &routed.answer {
        Answer::Replaced(error) if end => {
            response::replace_body(env, error, size);
            Flow::Continue
        }
        Answer::Replaced(_) | Answer::Retrying => Flow::Pause,
        Answer::Awaited | Answer::AsItIs => Flow::Continue,
    }
}

/// `worker` refused the connection: the filter sends the request to the next candidate,
/// which the hop then counts against, or, with none it can send to, the typed error.
fn send_on<H: Host>(env: &Env<H>, routed: &mut Routed, worker: WorkerId) -> Result<(), RouteError> {
    let Some(token) = decode_retry::send_next(env, routed) else {
        return Err(response::failed(env, routed, worker, HopFailure::Connect));
    };
    if let Some(retry) = &mut routed.retry {
        retry.token = Some(token);
    }
    let next = routed.decode.alternates.remove(0);
    env.count_outstanding(routed.decode.target.worker.id, -1);
    env.count_outstanding(next.id, 1);
    routed.decode.target.worker = next;
    routed.answer = Answer::Retrying;
    Ok(())
}

/// A retried hop's answer: on to the next candidate after another refused connection, else
/// the client's answer in place of Envoy's — the worker's, whole, or a typed error.
fn on_retry_answer<H: Host>(env: &Env<H>, mut routed: Box<Routed>, body_size: usize) -> Phase {
    if let Some(retry) = &mut routed.retry {
        retry.token = None;
    }
    let (call, status, failure) = decode_retry::read_answer(env, body_size);
    let worker = response::serving_worker(&routed);
    let error = match response::outcome(env, &routed, worker, status, failure) {
        Outcome::Refused => match send_on(env, &mut routed, worker) {
            Ok(()) => return Phase::Routed(routed),
            Err(error) => error,
        },
        Outcome::Passed => {
            env.log_served_decode(&routed.decode, worker);
            decode_retry::relay(
                env,
                &call,
                status,
                &response::served(&env.config.settings, &routed, worker),
            );
            routed.retry = None;
            routed.answer = Answer::AsItIs;
            return Phase::Routed(routed);
        }
        Outcome::Failed(error) => error,
    };
    log::warn!("pinroute: request {}: {error}", env.request_id);
    env.count_error(&error);
    env.send_error(&error);
    routed.retry = None;
    routed.answer = Answer::AsItIs;
    Phase::Routed(routed)
}
