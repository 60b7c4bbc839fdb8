use super::*;
use crate::policy::testing::test;

fn completion(body: &str) -> Result<(), RouteError> {
    check_completion(&JsonObject::parse(body.as_bytes()).unwrap())
}

#[test]
fn nested_steering_fields_on_a_completion_path_are_refused() {
    for (body, field) in [
        (
            r#"{"prompt": "p", "vllm_xargs": {"kv_transfer_params": {"remote_host": "10.0.0.9"}}}"#,
            KV_TRANSFER_PARAMS,
        ),
        (
            r#"{"prompt": "p", "nvext": {"kv_transfer_params": {}}}"#,
            KV_TRANSFER_PARAMS,
        ),
        (
            r#"{"messages": [{"role": "user", "content": [{"ec_transfer_params": 1}]}]}"#,
            EC_TRANSFER_PARAMS,
        ),
        (
            r#"{"prompt": "p", "ec_transfer_params": {}}"#,
            EC_TRANSFER_PARAMS,
        ),
        (
            r#"{"vllm_xargs": {"kv_transfer_param\u0073": null}}"#,
            KV_TRANSFER_PARAMS,
        ),
    ] {
        let error = completion(body).unwrap_err();
        assert_eq!(error.code(), "invalid_field", "{body}");
        assert!(error.to_string().starts_with(field), "{body}: {error}");
    }
}

#[test]
fn a_completions_own_top_level_kv_transfer_params_are_left_to_the_rewrites() {
    let body = r#"{"prompt": "kv_transfer_params", "kv_transfer_params": {"remote_host": "h"}}"#;
    assert_eq!(completion(body), Ok(()));
    let escaped = r#"{"messages": [{"role": "user", "content": "caf\u00e9 ec_transfer_params"}]}"#;
    assert_eq!(completion(escaped), Ok(()), "a value is not a key");
}

#[test]
fn a_large_body_is_scanned_without_a_parsed_copy() {
    let numbers = format!("[{}1]", "1,".repeat(1 << 20));
    assert_eq!(check(numbers.as_bytes()), Ok(()));
    let late = format!("[{}{{\"kv_transfer_params\": 1}}]", "1,".repeat(1 << 20));
    assert_eq!(check(late.as_bytes()).unwrap_err().code(), "invalid_field");
}
