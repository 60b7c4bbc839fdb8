//! One HTTP request through the filter (`docs/semantics.md` §1–§4): a state machine whose
//! phases own what they need. Every callback takes the current phase and returns the next.
//!
//! ```text
//! Headers ─┬─ completion path ──► CompletionBody ──► Prefill ──► Routed (─► its retries)
//!          │                             └────────────────────────┘ (no prefill hop)
//!          ├─ other path, JSON body ──► PassthroughBody ──► Routed
//!          └─ other path ──► Routed
//! any phase ──► Answered (the filter answered itself)
//! ```

use super::env::Env;
use super::host::{Flow, Host, HostError};
use super::intake::{forwarded_headers, header_text};
use super::metrics::Counter;
use super::prefill::Prefilling;
use super::response::{HeldBody, Routed, RoutedBody};
use crate::policy::error::RouteError;
use crate::policy::json::JsonObject;
use crate::policy::paths::Destination;
use crate::policy::pins::{self, HeaderHints};
use crate::policy::registry::Deployment;
use crate::policy::resolve::{PrefillPlan, TokenHop};
use crate::policy::rewrite::DecodeBody;
use crate::policy::{headers, passthrough, prefix, steering};

pub struct Stream<H: Host> {
    env: Env<H>,
    phase: Phase,
}

pub(super) enum Phase {
    Headers,
    /// A completion request whose body is arriving.
    CompletionBody(Completion),
    /// Another path's JSON body, read whole before it goes on (`policy::passthrough`).
    PassthroughBody(TokenHop),
    /// The prefill call is in flight; the request waits for it.
    Prefill(Box<Prefilling>),
    /// On its way to the token-generating worker; the response side acts on its answer.
    Routed(Box<Routed>),
    /// The filter answered the request itself.
    Answered,
}

/// What the headers of a completion request decided, for its body and its prefill hop.
pub(super) struct Completion {
    pub hints: HeaderHints,
    /// The path both hops carry: the plain spelling of the completion path.
    pub path: &'static str,
    /// Client headers, minus stripped ones, for the prefill hop.
    pub forwarded: Vec<(String, String)>,
}

type Step = Result<(Phase, Flow), RouteError>;

impl<H: Host> Stream<H> {
    pub fn new(env: Env<H>) -> Self {
        Self {
            env,
            phase: Phase::Headers,
        }
    }

    /// Runs one callback: `step` gets the current phase and returns the next; an error is
    /// answered in place of the request.
    fn advance(&mut self, step: impl FnOnce(&mut Env<H>, Phase) -> Step) -> Flow {
        let phase = std::mem::replace(&mut self.phase, Phase::Answered);
        let (next, action) = step(&mut self.env, phase).unwrap_or_else(|e| self.env.answer(&e));
        self.phase = next;
        self.env.flush_load();
        action
    }
}

impl<H: Host> Env<H> {
    fn on_headers(&mut self, end_of_stream: bool) -> Step {
        self.count(Counter::Requests);
        let headers = self.host.request_headers().map_err(host_failure)?;
        let destination = self.admit(&headers)?;
        let hints = pins::parse_headers(headers.iter().map(|(n, v)| (n.as_str(), v.as_slice())))?;
        let upstream_header = self.config.settings.upstream_header.as_str();
        for (name, _) in headers
            .iter()
            .filter(|(n, _)| headers::must_strip(n, upstream_header))
        {
            self.set_request_header(name, None)?;
        }
        self.request_id = self.request_id(&headers)?;
        let Destination::Completion(path) = destination else {
            let decode = self.with_resolver(&hints, None, |r| r.token_hop(&hints.pins))?;
            self.count_panics(false, decode.panic);
            let reads_body = passthrough::read_as_json(header_text(&headers, "content-type"));
            if end_of_stream || !reads_body {
                let body = if end_of_stream {
                    RoutedBody::Empty
                } else {
                    RoutedBody::Unread
                };
                return Ok((self.route(decode, body, None)?, Flow::Continue));
            }
            return Ok((Phase::PassthroughBody(decode), Flow::Pause));
        };
        if end_of_stream {
            return Err(RouteError::InvalidBody("the body is empty".into()));
        }
        if header_text(&headers, ":path") != path {
            self.set_request_header(":path", Some(path))?;
        }
        let forwarded = forwarded_headers(&headers, upstream_header);
        self.take_slot()?;
        self.set_request_header("content-length", None)?;
        let completion = Completion {
            hints,
            path,
            forwarded,
        };
        Ok((Phase::CompletionBody(completion), Flow::Pause))
    }

    fn on_completion_body(&mut self, completion: Completion, size: usize, end: bool) -> Step {
        let Some(body) = self.whole_body(size, end)? else {
            return Ok((Phase::CompletionBody(completion), Flow::Pause));
        };
        let request =
            JsonObject::parse(&body).map_err(|e| RouteError::InvalidBody(e.to_string()))?;
        steering::check_completion(&request)?;
        let pins = completion
            .hints
            .pins
            .clone()
            .or(pins::parse_nvext(&request)?);
        self.count_pins(&pins, &completion.hints);
        let raw_prompt = prefix::prompt_member(&request).map_or(&[][..], |p| p.get().as_bytes());
        let prompt = self.read_prompt(raw_prompt, &pins);
        let route = self.with_resolver(&completion.hints, prompt.as_ref(), |r| r.resolve(&pins))?;
        self.count_route(&route);
        self.remember_turn(prompt.as_ref(), &route);
        let decode_body = DecodeBody::new(&request, &body);
        let candidates = match route.prefill {
            PrefillPlan::Skip | PrefillPlan::Local(_) => {
                if route.prefill == PrefillPlan::Skip
                    && self.config.registry.deployment() == Deployment::Disaggregated
                {
                    self.count(Counter::AggregatedFallback);
                }
                let held = HeldBody::edited(size, decode_body.finish(None));
                return Ok((
                    self.route(route.decode, RoutedBody::Held(held), None)?,
                    Flow::Continue,
                ));
            }
            PrefillPlan::Pinned(target) => vec![target],
            PrefillPlan::Candidates(targets) => targets,
        };
        let prefilling = Prefilling::new(
            &completion,
            &request,
            candidates,
            decode_body,
            route.decode,
            size,
        )?;
        Ok((self.dispatch_prefill(prefilling)?, Flow::Pause))
    }

    /// Another path's JSON body, once whole: on to the worker unless it names
    /// `kv_transfer_params`.
    fn on_passthrough_body(&mut self, decode: TokenHop, size: usize, end: bool) -> Step {
        let Some(body) = self.whole_body(size, end)? else {
            return Ok((Phase::PassthroughBody(decode), Flow::Pause));
        };
        passthrough::check_body(&body)?;
        let body = RoutedBody::Read(body.len());
        Ok((self.route(decode, body, None)?, Flow::Continue))
    }

    fn on_call_answer(&mut self, phase: Phase, token: u32, body_size: usize) -> Step {
        match phase {
            Phase::Prefill(prefill) if prefill.token == token => {
                let next = self.on_prefill_answer(prefill, body_size)?;
                if matches!(next, Phase::Routed(_))
                    && let Err(status) = self.host.resume_request()
                {
                    log::error!(
                        "pinroute: could not resume request {}: {status:?}",
                        self.request_id
                    );
                }
                Ok((next, Flow::Continue))
            }
            Phase::Routed(mut routed) if routed.awaits(token) => {
                routed.on_retry_answer(self, body_size);
                Ok((Phase::Routed(routed), Flow::Continue))
            }
            other => Ok((other, Flow::Continue)),
        }
    }
}

/// The host's callbacks: each runs one step of the machine.
impl<H: Host> Stream<H> {
    pub fn on_request_headers(&mut self, end_of_stream: bool) -> Flow {
        self.advance(|env, _| env.on_headers(end_of_stream))
    }

    pub fn on_request_body(&mut self, size: usize, end: bool) -> Flow {
        self.advance(|env, phase| match phase {
            Phase::CompletionBody(completion) => env.on_completion_body(completion, size, end),
            Phase::PassthroughBody(decode) => env.on_passthrough_body(decode, size, end),
            Phase::Prefill(_) | Phase::Answered => Ok((phase, Flow::Pause)),
            Phase::Headers | Phase::Routed(_) => Ok((phase, Flow::Continue)),
        })
    }

    /// A body that ends in trailers (HTTP/2) never ends in the body callbacks: a body the
    /// filter must read is refused rather than forwarded unread.
    pub fn on_request_trailers(&mut self) -> Flow {
        self.advance(|_, phase| match phase {
            Phase::CompletionBody(_) | Phase::PassthroughBody(_) => Err(RouteError::InvalidBody(
                "a body followed by trailers is not accepted".into(),
            )),
            Phase::Prefill(_) | Phase::Answered => Ok((phase, Flow::Pause)),
            Phase::Headers | Phase::Routed(_) => Ok((phase, Flow::Continue)),
        })
    }

    /// The answer of a call the request made: its prefill hop, or a decode hop the filter
    /// sent again.
    pub fn on_call_answer(&mut self, token: u32, body_size: usize) {
        self.advance(|env, phase| env.on_call_answer(phase, token, body_size));
    }

    pub fn on_response_headers(&mut self, end_of_stream: bool) -> Flow {
        let flow = match &mut self.phase {
            Phase::Routed(routed) => routed.on_response_headers(&self.env, end_of_stream),
            _ => Flow::Continue,
        };
        // A retried hop moved the request to another worker.
        self.env.flush_load();
        flow
    }

    pub fn on_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Flow {
        match &mut self.phase {
            Phase::Routed(routed) => routed.on_response_body(&self.env, body_size, end_of_stream),
            _ => Flow::Continue,
        }
    }

    /// The stream is over, however it ended (answered, failed, the client gone): its hops no
    /// longer count as outstanding, its in-flight slot is free, and nothing more is done for
    /// it (a late prefill answer included).
    pub fn on_stream_end(&mut self) {
        self.env.release_slot();
        let worker = match std::mem::replace(&mut self.phase, Phase::Answered) {
            Phase::Prefill(prefill) => prefill.current.worker.id,
            Phase::Routed(routed) => routed.worker(),
            _ => return,
        };
        self.env.count_outstanding(worker, -1);
        self.env.flush_load();
    }
}

pub(super) fn host_failure(error: HostError) -> RouteError {
    log::error!("pinroute: host call failed: {error}");
    RouteError::Internal("a host call failed")
}
