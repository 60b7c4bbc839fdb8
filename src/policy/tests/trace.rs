#![allow(clippy::unwrap_used)]

use super::*;
use crate::policy::testing::test;

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const SPAN: &str = "b7ad6b7169203331";

#[test]
fn envoys_ids_name_the_parent_with_the_clients_sampled_flag() {
    let ids = SpanIds::from_trace_header(&format!("{TRACE}/{SPAN}")).unwrap();
    let client = format!("00-{TRACE}-00f067aa0ba902b7-00");
    assert_eq!(ids.traceparent(&client), format!("00-{TRACE}-{SPAN}-00"));
    assert_eq!(ids.traceparent(""), format!("00-{TRACE}-{SPAN}-01"));
    assert_eq!(
        ids.traceparent("00-garbage-00f067aa0ba902b7-00"),
        format!("00-{TRACE}-{SPAN}-01"),
        "an invalid client header says nothing"
    );
}

#[test]
fn anything_but_two_well_formed_ids_is_no_context() {
    for value in [
        "",
        "-/-",
        TRACE,
        &format!("{TRACE}/"),
        &format!("{TRACE}/{SPAN}/x"),
        &format!("{}/{SPAN}", "0".repeat(32)),
        &format!("{TRACE}/{}", "0".repeat(16)),
        &format!("{}/{SPAN}", TRACE.to_uppercase()),
        &format!("{TRACE}0/{SPAN}"),
    ] {
        assert_eq!(SpanIds::from_trace_header(value), None, "{value:?}");
    }
}

#[test]
fn a_traceparent_names_its_span_and_sampling_and_a_child_keeps_the_trace() {
    let (ids, sampled) = SpanIds::from_traceparent(&format!("00-{TRACE}-{SPAN}-01")).unwrap();
    assert_eq!(
        (ids.trace_id.as_str(), ids.span_id.as_str(), sampled),
        (TRACE, SPAN, true)
    );
    let (_, sampled) = SpanIds::from_traceparent(&format!("00-{TRACE}-{SPAN}-00")).unwrap();
    assert!(!sampled);
    assert_eq!(
        SpanIds::from_traceparent(&format!("01-{TRACE}-{SPAN}-01")),
        None
    );
    let child = ids.child();
    assert_eq!(child.trace_id, TRACE);
    assert!(
        SpanIds::new(&child.trace_id, &child.span_id).is_some(),
        "{child:?}"
    );
    assert_ne!(child.span_id, ids.child().span_id, "each child its own id");
}
