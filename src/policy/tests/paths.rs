use super::*;
use crate::policy::testing::test;

/// Where a request's raw `:path` goes.
fn destination(raw: &str, routed: &[String]) -> Destination {
    destination_of(canonical_path(raw), routed)
}

fn completion_path(raw: &str) -> Option<&'static str> {
    match destination(raw, &[]) {
        Destination::Generation(api) => Some(api.path()),
        _ => None,
    }
}

#[test]
fn only_the_routed_paths_reach_a_worker_however_they_are_spelled() {
    let routed: Vec<String> = ["/v1/models", "/health", "/admin/*"]
        .map(String::from)
        .into();
    for raw in ["/health", "/admin/a/b"] {
        assert_eq!(destination(raw, &routed), Destination::Other, "{raw}");
    }
    for raw in ["/v1/models", "/v1//models?x", "/v1/%6dodels"] {
        assert_eq!(destination(raw, &routed), Destination::ModelList, "{raw}");
    }
    assert_eq!(
        destination("/v1/models", &[]),
        Destination::NotRouted("/v1/models".into()),
        "an operator who does not route the model list gets it answered by no one"
    );
    for (raw, canonical) in [
        ("/reset_prefix_cache", "/reset_prefix_cache"),
        ("/%72eset_prefix_cache", "/reset_prefix_cache"),
        ("/v1/models/../sleep", "/v1/sleep"),
        ("/healthz", "/healthz"),
        ("/admin", "/admin"),
    ] {
        assert_eq!(
            destination(raw, &routed),
            Destination::NotRouted(canonical.into()),
            "{raw}"
        );
    }
}

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

#[test]
fn a_trailing_slash_or_dot_is_still_the_plain_completion_path() {
    for raw in [
        "/v1/completions/",
        "/v1/completions/.",
        "/v1/%63ompletions",
        "//v1/completions%2f",
        "/v1/completions/?a=1",
    ] {
        assert_eq!(
            destination(raw, &[]),
            Destination::Generation(Api::Completions),
            "{raw}"
        );
    }
}

#[test]
fn every_generation_api_takes_two_hops() {
    for api in Api::ALL {
        assert_eq!(destination(api.path(), &[]), Destination::Generation(api));
    }
    assert_eq!(
        destination("/inference/v1//generate?x", &[]),
        Destination::Generation(Api::Generate)
    );
}

#[test]
fn a_stored_response_is_read_and_cancelled_at_its_own_paths() {
    let stored = |raw: &str| match destination(raw, &[]) {
        Destination::StoredResponse(stored) => {
            let method = stored.method();
            Some((stored.id, method, stored.path))
        }
        _ => None,
    };
    assert_eq!(
        stored("/v1/responses/resp_1"),
        Some(("resp_1".into(), "GET", "/v1/responses/resp_1".into()))
    );
    assert_eq!(
        stored("/v1//responses/resp_1/./cancel?x"),
        Some((
            "resp_1".into(),
            "POST",
            "/v1/responses/resp_1/cancel".into()
        ))
    );
    for other in [
        "/v1/responses/",
        "/v1/responses/resp_1/input_items",
        "/v1/responses/cancel",
        "/v1/responses/a/b/cancel",
    ] {
        let kept = stored(other).filter(|(id, _, _)| id != "cancel");
        assert_eq!(kept, None, "{other}");
    }
}

#[test]
fn a_path_taken_as_canonical_is_what_canonicalising_it_gives() {
    let paths = [
        "/v1/completions",
        "/",
        "",
        "v1/completions",
        "/v1//completions",
        "/v1/completions/",
        "/v1/./completions",
        "/v1/../v1/completions",
        "/v1/.",
        "/v1/..",
        "/v1/completions?x=1",
        "/v1/completions#f",
        "/v1/%63ompletions",
        "/v1/.hidden/..x/x..",
        "/é/✓",
    ];
    for raw in paths {
        assert_eq!(canonical_path(raw), canonicalised(raw), "{raw:?}");
    }
    assert!(is_canonical("/v1/completions") && is_canonical("/v1/.hidden/..x/x.."));
    for raw in [
        "/", "", "/v1/", "/v1//x", "/v1/./x", "/v1/../x", "/v1?x", "/%41",
    ] {
        assert!(!is_canonical(raw), "{raw:?}");
    }
}
