use super::*;
use crate::policy::testing::test;

#[test]
fn the_completion_paths_are_found_with_or_without_a_query() {
    assert_eq!(completion_path("/v1/completions"), Some("/v1/completions"));
    assert_eq!(
        completion_path("/v1/chat/completions?x=1"),
        Some("/v1/chat/completions")
    );
    assert_eq!(
        completion_path("/v1/completions#frag"),
        Some("/v1/completions")
    );
}

#[test]
fn spellings_a_server_reads_as_a_completion_path_are_completion_paths() {
    for raw in [
        "/v1/%63ompletions",
        "/v1/chat%2Fcompletions",
        "/v1/chat%2fcompletions",
        "%2Fv1%2Fcompletions",
        "//v1//completions",
        "/v1/./completions",
        "/v1/models/../completions",
        "/x/../../v1/completions",
    ] {
        assert!(completion_path(raw).is_some(), "{raw}");
    }
}

#[test]
fn other_paths_are_not() {
    for raw in [
        "/v1/models",
        "/health",
        "/v1/completions/x",
        "/V1/completions",
        "/v1/%2563ompletions",
        "",
        "/",
    ] {
        assert_eq!(completion_path(raw), None, "{raw}");
    }
}

#[test]
fn broken_escapes_and_bytes_are_kept_as_they_are() {
    assert_eq!(canonical_path("/a%2"), "/a%2");
    assert_eq!(canonical_path("/a%zz/b"), "/a%zz/b");
    assert_eq!(canonical_path("/a%ff"), "/a\u{fffd}");
    assert_eq!(canonical_path("/é/%"), "/é/%");
}
