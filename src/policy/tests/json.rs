#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn members_keep_order_and_raw_bytes() {
    let text = r#"{"b": 1.50, "a": "\u00e9", "n": 123456789012345678901234567890}"#;
    let object = JsonObject::parse(text.as_bytes()).unwrap();
    let members: Vec<_> = object.members().map(|(k, v)| (k.to_string(), v.get().to_string())).collect();
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
        assert!(error.to_string().contains(why), "{:?}: {error}", String::from_utf8_lossy(bytes));
    }
}

#[test]
fn deep_nesting_inside_a_member_is_kept_raw_without_recursion() {
    let deep = format!("{{\"a\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    let object = JsonObject::parse(deep.as_bytes()).unwrap();
    assert_eq!(object.get("a").unwrap().get().len(), 200_000);
    let unbalanced = format!("{{\"a\": {}}}", "[".repeat(100_000));
    assert!(matches!(JsonObject::parse(unbalanced.as_bytes()), Err(JsonObjectError::NotJson(_))));
}

#[test]
fn write_key_escapes() {
    let mut out = String::new();
    write_key(&mut out, "a\"b");
    assert_eq!(out, r#""a\"b":"#);
}
