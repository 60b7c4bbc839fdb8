//! Envoy's rules for a filter's host calls (`host::rules`), which the in-memory host here and
//! the wasmtime host of `tests/host/` both enforce.

use super::*;
use crate::filter::host::Host;
use crate::filter::host::rules::{Access, Direction, Refusal, check};

#[test]
fn headers_are_writable_only_while_held_and_before_they_went_on() {
    let held = Direction {
        headers_received: true,
        headers_held: true,
        ..Direction::default()
    };
    assert_eq!(check(Access::WriteHeaders, &held, false), Ok(()));
    let went_on = Direction {
        went_on: true,
        ..held
    };
    assert_eq!(
        check(Access::WriteHeaders, &went_on, false),
        Err(Refusal::WentOn)
    );
    assert_eq!(
        check(Access::ReadHeaders, &went_on, false),
        Ok(()),
        "still readable"
    );
    let released = Direction {
        headers_held: false,
        ..went_on
    };
    assert_eq!(
        check(Access::ReadHeaders, &released, false),
        Err(Refusal::MapUnavailable)
    );
    assert_eq!(
        check(Access::ReadHeaders, &released, true),
        Ok(()),
        "the log sees them"
    );
    assert_eq!(
        check(Access::WriteHeaders, &held, true),
        Err(Refusal::MapUnavailable)
    );
}

#[test]
fn a_body_is_reachable_only_in_its_callback_or_while_paused() {
    let mut direction = Direction::default();
    assert_eq!(
        check(Access::ReadBody, &direction, false),
        Err(Refusal::NoBody)
    );
    direction.body_reachable = true;
    assert_eq!(check(Access::WriteBody, &direction, false), Ok(()));
}

#[test]
fn the_in_memory_host_refuses_what_envoy_refuses() {
    let mut request = Request::new(REGISTRY, COMPLETION_HEADERS);
    assert_eq!(request.headers(false), Flow::Pause);
    // Its body went on: the headers did too, and Envoy still points at them.
    request.host.answered(true, Part::Body, Flow::Continue);
    let refused = request.host.set_request_header("x-late", Some("1"));
    assert_eq!(
        refused,
        Err(crate::filter::host::HostError::Refused("bad argument"))
    );
    let refusals = std::mem::take(&mut request.host.state().refusals);
    assert_eq!(
        refusals,
        ["set_request_header: the headers already went on"]
    );
}
