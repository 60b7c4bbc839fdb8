#![allow(clippy::unwrap_used)]

use super::*;
use crate::policy::testing::test;

#[test]
fn members_keep_order_and_raw_bytes() {
    let text = r#"{"b": 1.50, "a": "\u00e9", "n": 123456789012345678901234567890}"#;
    let object = JsonObject::parse(text.as_bytes()).unwrap();
    let members: Vec<_> = object
        .members()
        .map(|(k, v)| (k.to_string(), v.get().to_string()))
        .collect();
    assert_eq!(
        members,
        vec![
            ("b".into(), "1.50".into()),
            ("a".into(), r#""\u00e9""#.into()),
            ("n".into(), "123456789012345678901234567890".into()),
        ]
    );
}

#[test]
fn escaped_keys_are_decoded() {
    let object = JsonObject::parse(br#"{"nv\u0065xt": {}}"#).unwrap();
    assert!(object.get("nvext").is_some());
}

#[test]
fn refuses_what_is_not_one_json_object() {
    let cases: [(&[u8], &str); 8] = [
        (b"[1]", "not a JSON object"),
        (b"\"x\"", "not a JSON object"),
        (b"5", "not a JSON object"),
        (b"", "not valid JSON"),
        (b"{", "not valid JSON"),
        (b"{} {}", "not valid JSON"),
        (b"{\"a\": \xff}", "not valid JSON"),
        (br#"{"a": 1, "a": 2}"#, "appears more than once"),
    ];
    for (bytes, why) in cases {
        let error = JsonObject::parse(bytes).unwrap_err();
        assert!(
            error.to_string().contains(why),
            "{:?}: {error}",
            String::from_utf8_lossy(bytes)
        );
    }
}

#[test]
fn nesting_up_to_the_limit_is_accepted_and_deeper_is_refused() {
    let nested =
        |levels: usize| format!("{{\"a\": {}1{}}}", "[".repeat(levels), "]".repeat(levels));
    assert!(JsonObject::parse(nested(MAX_DEPTH - 1).as_bytes()).is_ok());
    let error = JsonObject::parse(nested(MAX_DEPTH).as_bytes()).unwrap_err();
    assert_eq!(error, JsonObjectError::TooDeep("a".into()));
    assert!(error.to_string().contains("deeper than 128"), "{error}");
    let deep = nested(100_000);
    assert_eq!(
        JsonObject::parse(deep.as_bytes()).unwrap_err(),
        JsonObjectError::TooDeep("a".into())
    );
    let unbalanced = format!("{{\"a\": {}}}", "[".repeat(100_000));
    assert!(matches!(
        JsonObject::parse(unbalanced.as_bytes()),
        Err(JsonObjectError::NotJson(_))
    ));
}

#[test]
fn brackets_and_escapes_inside_strings_do_not_count_as_nesting() {
    let text = format!(
        r#"{{"messages": [{{"content": "{}\"\\{}"}}]}}"#,
        "[".repeat(500),
        "{".repeat(500)
    );
    assert!(JsonObject::parse(text.as_bytes()).is_ok(), "{text}");
    let big_prompt = format!(r#"{{"prompt": "{}"}}"#, "[{".repeat(200_000));
    assert!(JsonObject::parse(big_prompt.as_bytes()).is_ok());
}

#[test]
fn write_key_escapes() {
    let mut out = String::new();
    write_key(&mut out, "a\"b");
    assert_eq!(out, r#""a\"b":"#);
}

#[test]
fn write_key_writes_what_serde_json_writes_for_every_kind_of_key() {
    let keys = [
        "model",
        "",
        "é✓",
        "a\\b",
        "tab\t",
        "\u{1}\u{1f}\u{7f}",
        "q\"",
        "/",
    ];
    for key in keys {
        let mut out = String::new();
        write_key(&mut out, key);
        assert_eq!(
            out,
            format!("{}:", serde_json::to_string(key).unwrap()),
            "{key:?}"
        );
    }
}

#[test]
fn a_duplicate_key_is_found_whether_or_not_either_copy_has_escapes() {
    let error = JsonObject::parse(br#"{"nvext": 1, "nv\u0065xt": 2}"#).unwrap_err();
    assert_eq!(error, JsonObjectError::DuplicateKey("nvext".into()));
}

#[test]
fn a_duplicate_key_is_named_whatever_follows_it() {
    let error = JsonObject::parse(br#"{"a": 1, "a": 2, "b": 3}"#).unwrap_err();
    assert_eq!(error, JsonObjectError::DuplicateKey("a".into()));
    let error = JsonObject::parse(br#"{"a": 1, "b": 2, "a": 3, "b": 4} x"#).unwrap_err();
    assert!(
        matches!(error, JsonObjectError::NotJson(_)),
        "trailing data is still found: {error}"
    );
}

#[test]
fn an_object_of_more_members_than_any_request_has_is_refused_at_the_first_too_many() {
    let members = |n: usize| {
        let inner: Vec<String> = (0..n).map(|i| format!(r#""m{i}":1"#)).collect();
        format!("{{{}}}", inner.join(","))
    };
    assert_eq!(
        JsonObject::parse(members(MAX_MEMBERS).as_bytes())
            .unwrap()
            .members()
            .count(),
        MAX_MEMBERS
    );
    let refused = JsonObject::parse(members(MAX_MEMBERS + 1).as_bytes()).unwrap_err();
    assert_eq!(refused, JsonObjectError::TooManyMembers);
    assert_eq!(refused.to_string(), "an object of more than 256 members");
    let mut unfinished = members(MAX_MEMBERS + 1);
    unfinished.truncate(unfinished.len() - 1);
    assert_eq!(
        JsonObject::parse(unfinished.as_bytes()).unwrap_err(),
        JsonObjectError::TooManyMembers,
        "refused before the end is read"
    );
}
