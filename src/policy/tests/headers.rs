use super::*;
use crate::policy::testing::test;

#[test]
fn headers_that_could_choose_an_upstream_are_stripped() {
    for name in [
        "x-envoy-original-dst-host",
        "x-gateway-destination-endpoint",
        "x-gateway-destination-endpoint-fallback",
        "x-prefiller-host-port",
        "x-pinroute-upstream",
        "x-pinroute-anything",
        "my-upstream",
        "x-data-parallel-rank",
        "x-dynamo-worker-instance-id",
    ] {
        assert!(must_strip(name, "my-upstream"), "{name}");
    }
    for name in [
        "authorization",
        "x-request-id",
        "content-type",
        "traceparent",
    ] {
        assert!(!must_strip(name, "my-upstream"), "{name}");
    }
}
