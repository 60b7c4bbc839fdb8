//! Who may call (`docs/deploy.md` §2.8): with API keys (Envoy's `api_key_auth`) or tokens
//! (`jwt_authn`), a caller without a listed key or a valid token gets an OpenAI-shaped 401
//! before the filter runs; an accepted caller's name reaches both hops, its credential no
//! worker and no log.

use std::time::Duration;

use pinroute_harness::envoy::{ApiKey, ApiKeys, Callers, DEFAULT_IDENTITY_HEADER, Jwt};
use pinroute_harness::jwt::{Lifetime, TokenIssuer};
use tempfile::TempDir;

use crate::client::{complete, prompt};
use crate::{Deployment, StackSpec, disaggregated_spec, nothing_reached_a_worker, start};

const KEY: &str = "sk-team-a-0123456789";

const OPS_KEY: &str = "sk-ops-9876543210";

fn keys_spec() -> StackSpec {
    let mut spec = disaggregated_spec();
    let key = |client: &str, key: &str| ApiKey {
        client: client.into(),
        key: key.into(),
    };
    spec.edge.callers = Some(Callers::ApiKeys(ApiKeys {
        keys: vec![key("team-a", KEY), key("ops", OPS_KEY)],
        identity_header: DEFAULT_IDENTITY_HEADER.into(),
    }));
    spec
}

async fn with_keys() -> Deployment {
    start(keys_spec()).await
}

#[tokio::test]
async fn a_caller_without_a_listed_key_gets_401_and_reaches_no_worker() {
    let deployment = with_keys().await;
    let refused: [&[(&str, &str)]; 4] = [
        &[],
        &[("authorization", "Bearer sk-someone-else")],
        &[("x-api-key", "sk-someone-else")],
        // A forged identity gets nothing either.
        &[(DEFAULT_IDENTITY_HEADER, "team-a")],
    ];
    for headers in refused {
        let reply = complete(&deployment, headers, &prompt()).await;
        let message = reply.error(401, "invalid_api_key");
        assert!(message.contains("API key"), "{message}");
        assert_eq!(reply.json()["error"]["type"], "invalid_request_error");
    }
    assert!(
        nothing_reached_a_worker(&deployment),
        "a refused caller reached a worker"
    );
}

#[tokio::test]
async fn a_listed_key_gets_in_and_only_the_callers_name_reaches_the_workers() {
    let deployment = with_keys().await;
    let bearer = format!("Bearer {KEY}");
    let accepted: [&[(&str, &str)]; 2] = [
        // A forged identity is replaced by the key's.
        &[
            ("authorization", &bearer),
            (DEFAULT_IDENTITY_HEADER, "admin"),
        ],
        &[("x-api-key", KEY)],
    ];
    for headers in accepted {
        deployment.clear_requests();
        let reply = complete(&deployment, headers, &prompt()).await;
        reply.assert_ok("a caller with a listed key");
        for id in [
            reply.worker("prefill").unwrap(),
            reply.worker("decode").unwrap(),
        ] {
            let requests = deployment.worker(id).unwrap().requests();
            assert_eq!(requests.len(), 1, "worker {id}");
            let request = &requests[0];
            assert_eq!(
                request.header(DEFAULT_IDENTITY_HEADER),
                Some("team-a"),
                "worker {id}"
            );
            for name in ["authorization", "x-api-key"] {
                assert_eq!(request.header(name), None, "worker {id} got {name}");
            }
        }
    }
    let log = std::fs::read_to_string(deployment.envoy.access_log_path()).unwrap_or_default();
    assert!(!log.contains(KEY), "the key is in the access log");
}

const ISSUER: &str = "https://issuer.pinroute.test";
const AUDIENCE: &str = "pinroute";

async fn with_tokens(issuer: &TokenIssuer, dir: &TempDir) -> Deployment {
    let jwks = dir.path().join("jwks.json");
    issuer.write_jwks(&jwks).unwrap();
    let mut spec = disaggregated_spec();
    spec.edge.callers = Some(Callers::Jwt(Jwt {
        issuer: ISSUER.into(),
        jwks,
        audiences: vec![AUDIENCE.into()],
        identity_claim: "sub".into(),
        identity_header: DEFAULT_IDENTITY_HEADER.into(),
    }));
    start(spec).await
}

#[tokio::test]
async fn a_signed_token_gets_in_a_bad_one_gets_401_another_audiences_403() {
    let dir = TempDir::new().unwrap();
    let issuer = TokenIssuer::new(ISSUER).unwrap();
    let deployment = with_tokens(&issuer, &dir).await;
    let hour = Duration::from_secs(3600);
    let forger = TokenIssuer::new(ISSUER).unwrap();
    let refused = [
        None,
        Some(
            issuer
                .token("team-a", AUDIENCE, Lifetime::ExpiredFor(hour))
                .unwrap(),
        ),
        Some(
            forger
                .token("team-a", AUDIENCE, Lifetime::ValidFor(hour))
                .unwrap(),
        ),
        Some("not.a.token".to_owned()),
    ];
    for token in &refused {
        let bearer = token.as_ref().map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = bearer
            .iter()
            .map(|b| ("authorization", b.as_str()))
            .collect();
        let reply = complete(&deployment, &headers, &prompt()).await;
        reply.error(401, "invalid_api_key");
    }
    let elsewhere = issuer
        .token("team-a", "another-service", Lifetime::ValidFor(hour))
        .unwrap();
    let bearer = format!("Bearer {elsewhere}");
    let reply = complete(&deployment, &[("authorization", &bearer)], &prompt()).await;
    reply.error(403, "permission_denied");
    assert!(
        nothing_reached_a_worker(&deployment),
        "a refused caller reached a worker"
    );
    let token = issuer
        .token("team-b", AUDIENCE, Lifetime::ValidFor(hour))
        .unwrap();
    let bearer = format!("Bearer {token}");
    let reply = complete(&deployment, &[("authorization", &bearer)], &prompt()).await;
    reply.assert_ok("a caller with a signed token");
    for id in [
        reply.worker("prefill").unwrap(),
        reply.worker("decode").unwrap(),
    ] {
        let request = deployment.worker(id).unwrap().requests().remove(0);
        assert_eq!(
            request.header(DEFAULT_IDENTITY_HEADER),
            Some("team-b"),
            "worker {id}"
        );
        assert_eq!(
            request.header("authorization"),
            None,
            "worker {id} got the token"
        );
    }
}

/// `callers` (`docs/semantics.md` §7): with keys, only the callers listed may pin or name a
/// session; the others are served unpinned.
#[tokio::test]
async fn only_the_callers_the_operator_lists_may_pin_or_name_a_session() {
    let mut spec = keys_spec();
    spec.settings =
        serde_json::json!({"callers": {"may_pin": ["ops"], "may_use_sessions": ["ops"]}});
    let deployment = start(spec).await;
    let team_a = format!("Bearer {KEY}");
    let ops = format!("Bearer {OPS_KEY}");
    let refused: [(&[(&str, &str)], &str); 3] = [
        (
            &[
                ("authorization", &team_a),
                ("x-dynamo-worker-instance-id", "202"),
            ],
            "pin_not_allowed",
        ),
        (
            // The identity is the key's, whatever the client claims.
            &[
                ("authorization", &team_a),
                (DEFAULT_IDENTITY_HEADER, "ops"),
                ("x-dynamo-prefill-instance-id", "102"),
            ],
            "pin_not_allowed",
        ),
        (
            &[("authorization", &team_a), ("x-dynamo-session-id", "s-1")],
            "session_not_allowed",
        ),
    ];
    for (headers, code) in refused {
        let message = complete(&deployment, headers, &prompt())
            .await
            .error(403, code);
        assert!(message.contains("\"team-a\""), "{message}");
    }
    let mut body = prompt();
    body["nvext"] = serde_json::json!({"decode_worker_id": 202});
    let reply = complete(&deployment, &[("authorization", &team_a)], &body).await;
    reply.error(403, "pin_not_allowed");
    assert!(
        nothing_reached_a_worker(&deployment),
        "a refused pin reached a worker"
    );
    let reply = complete(&deployment, &[("authorization", &team_a)], &prompt()).await;
    reply.assert_ok("team-a unpinned");
    let pinned = [
        ("authorization", ops.as_str()),
        ("x-dynamo-worker-instance-id", "202"),
        ("x-dynamo-prefill-instance-id", "102"),
    ];
    let reply = complete(&deployment, &pinned, &prompt()).await;
    reply.assert_ok("ops pinned");
    assert_eq!(
        (reply.worker("prefill"), reply.worker("decode")),
        (Some(102), Some(202))
    );
}
