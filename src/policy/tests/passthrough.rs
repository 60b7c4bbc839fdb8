use super::*;
use crate::policy::testing::test;

#[test]
fn json_is_what_a_worker_would_read_as_json() {
    for content_type in [
        "",
        "application/json",
        "Application/JSON; charset=utf-8",
        "application/merge-patch+json",
    ] {
        assert!(read_as_json(content_type), "{content_type}");
    }
    for content_type in ["multipart/form-data; boundary=x", "text/plain", "audio/wav"] {
        assert!(!read_as_json(content_type), "{content_type}");
    }
}

#[test]
fn kv_transfer_params_anywhere_are_refused() {
    for body in [
        r#"{"token_ids": [1], "kv_transfer_params": {"do_remote_prefill": true}}"#,
        r#"{"sampling_params": {"extra_args": {"kv_transfer_params": {"remote_host": "10.0.0.9"}}}}"#,
        r#"{"a": [{"b": {"kv_transfer_param\u0073": null}}]}"#,
        r#"[{"kv_transfer_params": 1}]"#,
    ] {
        let error = check_body(body.as_bytes()).unwrap_err();
        assert_eq!(error.code(), "invalid_field", "{body}");
        assert_eq!(
            error.to_string(),
            "kv_transfer_params: is set by the gateway, never by a client"
        );
    }
}

#[test]
fn other_json_passes_and_what_is_not_json_is_refused() {
    assert_eq!(
        check_body(br#"{"input": "kv_transfer_params", "model": "m"}"#),
        Ok(())
    );
    assert_eq!(check_body(b"[1, 2]"), Ok(()));
    for body in [b"{".as_slice(), b"NaN", b"not json"] {
        assert_eq!(check_body(body).unwrap_err().code(), "invalid_body");
    }
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    assert_eq!(
        check_body(deep.as_bytes()).unwrap_err().code(),
        "invalid_body"
    );
}
