#![allow(clippy::unwrap_used)]

use super::*;
use crate::policy::testing::test;

#[test]
fn varints_and_ids_encode_as_protobuf_does() {
    assert_eq!(varint(0), [0]);
    assert_eq!(varint(127), [127]);
    assert_eq!(varint(300), [0xac, 0x02]);
    assert_eq!(hex_bytes("00ff10"), [0, 255, 16]);
    assert_eq!(fixed64_field(7, 1), [0x39, 1, 0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn spans_are_one_resource_one_scope() {
    let span = FinishedSpan {
        ids: SpanIds::new("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7").unwrap(),
        parent: SpanIds::new("4bf92f3577b34da6a3ce929d0e0e4736", "b7ad6b7169203331").unwrap(),
        name: "pinroute prefill".into(),
        start_nanos: 1,
        end_nanos: 2,
        attributes: vec![("pinroute.outcome".into(), "ok".into())],
        error: None,
    };
    let encoded = export_request(std::slice::from_ref(&span));
    assert_eq!(encoded[0], 0x0a, "resource_spans, length-delimited");
    let text = String::from_utf8_lossy(&encoded);
    for part in ["service.name", "pinroute prefill", "pinroute.outcome"] {
        assert!(text.contains(part), "{part}");
    }
}
