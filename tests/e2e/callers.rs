//! Who may call (`docs/deploy.md` §2.8): with API keys, Envoy's `api_key_auth` refuses a
//! caller without a listed key with an OpenAI-shaped 401 before the filter runs, forwards the
//! caller's name to both hops and the key to no worker and no log.

use pinroute_harness::envoy::{ApiKey, ApiKeys, DEFAULT_IDENTITY_HEADER};

use crate::client::{complete, prompt};
use crate::{Deployment, disaggregated_spec, start};

const KEY: &str = "sk-team-a-0123456789";

async fn with_keys() -> Deployment {
    let mut spec = disaggregated_spec();
    spec.edge.api_keys = Some(ApiKeys {
        keys: vec![ApiKey {
            client: "team-a".into(),
            key: KEY.into(),
        }],
        identity_header: DEFAULT_IDENTITY_HEADER.into(),
    });
    start(spec).await
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
    for id in [101, 102, 201, 202, 203] {
        let requests = deployment.worker(id).unwrap().requests();
        assert!(requests.is_empty(), "a refused caller reached worker {id}");
    }
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
