//! What the filter tells the access log (`docs/metrics.md`, "The access log"): each hop's
//! choice, the workers that served, their ranks, the model and the prefill time, each written
//! once.

use super::*;

impl Request {
    fn log_field(&self, field: &str) -> Option<String> {
        let key = format!("wasm.pinroute.{field}");
        self.host.state().log_fields.get(&key).cloned()
    }
}

/// A completion through both hops: the prefill answers, then the decode worker.
fn through_both_hops(extra: &[(&str, &str)]) -> (Request, Call) {
    through_both_hops_with(extra, PROMPT)
}

fn through_both_hops_with(extra: &[(&str, &str)], body: &str) -> (Request, Call) {
    let mut request = Request::completion(REGISTRY, extra, body);
    let call = request.prefill_call();
    request.answer(
        &call,
        Some(200),
        &format!(r#"{{"kv_transfer_params": {KV}}}"#),
    );
    request.respond(200, None);
    request.end();
    (request, call)
}

#[test]
fn pinned_hops_log_the_pins_the_workers_and_the_rank() {
    let (request, prefill) = through_both_hops(&[
        ("x-dynamo-prefill-instance-id", "102"),
        ("x-dynamo-worker-instance-id", "202"),
        ("x-dynamo-dp-rank", "1"),
    ]);
    assert_eq!(request.log_field("prefill_choice").as_deref(), Some("pin"));
    assert_eq!(request.log_field("decode_choice").as_deref(), Some("pin"));
    assert_eq!(request.log_field("prefill_worker").as_deref(), Some("102"));
    assert_eq!(request.log_field("decode_worker").as_deref(), Some("202"));
    assert_eq!(request.log_field("decode_rank").as_deref(), Some("1"));
    assert_eq!(
        request.log_field("prefill_rank").as_deref(),
        prefill.header("x-data-parallel-rank"),
        "the rank the prefill hop named"
    );
    assert_eq!(request.log_field("model").as_deref(), Some("m"));
    let millis: f64 = request.log_field("prefill_ms").unwrap().parse().unwrap();
    assert!(millis >= 0.0);
}

#[test]
fn unpinned_hops_log_how_they_were_placed() {
    let (request, _) = through_both_hops(&[]);
    assert_eq!(request.log_field("prefill_choice").as_deref(), Some("load"));
    assert_eq!(request.log_field("decode_choice").as_deref(), Some("load"));
    let prefill = request.log_field("prefill_worker").unwrap();
    assert!(["101", "102"].contains(&prefill.as_str()), "{prefill}");
    let decode = request.log_field("decode_worker").unwrap();
    assert!(["201", "202"].contains(&decode.as_str()), "{decode}");
}

#[test]
fn a_failed_prefill_logs_the_choice_but_no_worker_that_served() {
    let mut request =
        Request::completion(REGISTRY, &[("x-dynamo-prefill-instance-id", "101")], PROMPT);
    let call = request.prefill_call();
    request.answer(&call, Some(500), "boom");
    request.end();
    assert_eq!(request.log_field("prefill_choice").as_deref(), Some("pin"));
    assert_eq!(request.log_field("prefill_worker"), None);
    assert_eq!(request.log_field("prefill_ms"), None);
    assert_eq!(request.log_field("decode_worker"), None);
}

#[test]
fn a_client_model_is_logged_cut() {
    let model = "m".repeat(300);
    let body = PROMPT.replace(r#""model": "m""#, &format!(r#""model": "{model}""#));
    let (request, _) = through_both_hops_with(&[], &body);
    assert_eq!(request.log_field("model").map(|m| m.len()), Some(256));
}
