//! No input traps the VM: hostile headers, bodies and upstream answers, many times over.

use pinroute_tests::Host;

use crate::{REGISTRY, completion_headers, host};

/// A small deterministic generator (xorshift64*), so a failure replays exactly.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap()
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const HEADER_NAMES: &[&str] = &[
    "x-dynamo-worker-instance-id",
    "x-worker-instance-id",
    "x-dynamo-prefill-instance-id",
    "x-dynamo-dp-rank",
    "x-data-parallel-rank",
    "x-dynamo-prefill-dp-rank",
    "x-dynamo-session-id",
    "x-envoy-original-dst-host",
    "x-pinroute-upstream",
    "content-length",
];

const HEADER_VALUES: &[&[u8]] = &[
    b"201",
    b"202",
    b"101",
    b"102",
    b"0",
    b"1",
    b"2",
    b"4294967295",
    b"18446744073709551615",
    b"18446744073709551616",
    b"-1",
    b"",
    b"\xff\xfe",
    b"abc",
    b"1e3",
    b"999999999999999999999999",
];

const BODIES: &[&str] = &[
    r#"{"prompt": "x"}"#,
    r#"{"prompt": "x", "nvext": {"decode_worker_id": 202, "dp_rank": 1, "prefill_worker_id": 102, "prefill_dp_rank": 1}}"#,
    r#"{"prompt": "x", "nvext": {"backend_instance_id": 1e400}}"#,
    r#"{"prompt": "x", "nvext": {"dp_rank": 123456789012345678901234567890}}"#,
    r#"{"prompt": "x", "nvext": []}"#,
    r#"{"prompt": "x", "kv_transfer_params": {"remote_host": "6.6.6.6"}, "stream": true}"#,
    r#"{"prompt": "\ud800", "max_tokens": -1}"#,
    r#"{"a": 1, "a": 2}"#,
    r#"{"#,
    "[]",
    "",
    "\u{0}\u{1}",
];

fn random_body(dice: &mut Dice) -> Vec<u8> {
    match dice.below(4) {
        0 => format!(
            "{{\"prompt\": {}1{}}}",
            "[".repeat(dice.below(5000)),
            "]".repeat(dice.below(5000))
        )
        .into_bytes(),
        1 => (0..dice.below(300))
            .map(|_| u8::try_from(dice.below(256)).unwrap())
            .collect(),
        _ => dice.pick(BODIES).as_bytes().to_vec(),
    }
}

fn one_request(host: &mut Host, dice: &mut Dice) {
    let ctx = host.new_http_stream().unwrap();
    let mut headers: Vec<(String, Vec<u8>)> = completion_headers(&[])
        .into_iter()
        .map(|(n, v)| (n, v.into_bytes()))
        .collect();
    for _ in 0..dice.below(5) {
        headers.push((
            dice.pick(HEADER_NAMES).to_string(),
            dice.pick(HEADER_VALUES).to_vec(),
        ));
    }
    host.request_headers(ctx, &headers, false).unwrap();
    if host.stream(ctx).unwrap().local_reply.is_none() {
        host.request_body(ctx, &random_body(dice), true).unwrap();
    }
    while let Some(call) = host.take_http_calls().into_iter().next() {
        match dice.below(4) {
            0 => host.http_call_failure(call.token).unwrap(),
            1 => host
                .http_call_response(call.token, &[(":status", "200")], &random_body(dice))
                .unwrap(),
            2 => host
                .http_call_response(call.token, &[(":status", "500")], b"oops")
                .unwrap(),
            _ => host
                .http_call_response(
                    call.token,
                    &[(":status", "200")],
                    br#"{"kv_transfer_params": {"x": 1}}"#,
                )
                .unwrap(),
        }
    }
    let stream = host.stream(ctx).unwrap();
    assert!(
        stream.local_reply.is_some() || stream.request_forwarded,
        "request left hanging: {headers:?}"
    );
    if stream.request_forwarded {
        let status: &[u8] = if dice.below(2) == 0 { b"200" } else { b"503" };
        host.response_headers(ctx, &[(":status", status)], false)
            .unwrap();
        host.response_body(ctx, b"body", true).unwrap();
    }
    host.done(ctx).unwrap();
}

#[test]
fn thousands_of_hostile_requests_never_trap_the_vm() {
    let mut host = host(REGISTRY);
    let mut dice = Dice(0x5EED_1234_ABCD_0001);
    for _ in 0..3000 {
        one_request(&mut host, &mut dice);
        host.advance_time(std::time::Duration::from_millis(50));
    }
    assert!(host.failure().is_none(), "{:?}", host.failure());
    assert_eq!(host.counter("pinroute.requests"), Some(3000));
}
