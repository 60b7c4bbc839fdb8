//! The pair behind vLLM's own mutual TLS (`--ssl-certfile`, `--ssl-keyfile`, `--ssl-ca-certs`,
//! `--ssl-cert-reqs 2`), the gateway reaching both engines over it (`docs/deploy.md` §2.8): a
//! two-hop completion whose KV decode loads, and gateways that trust another CA or present
//! another CA's certificate are refused with a typed 502, not a hang.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use pinroute_harness::certs::{Issued, LocalCa, Usage};
use pinroute_harness::envoy::{EdgeOptions, Envoy, WorkerTls};
use pinroute_harness::vllm::{
    Connector, DECODE_ID, EngineTls, PREFILL_ID, VllmPair, VllmPairOptions, start_gateway_on,
};
use serde_json::{Value, json};

use crate::handoff::{PATIENCE, example_handoff, wait_for};
use crate::reply::Reply;
use crate::wasm;

const PROMPT: &str = "[tls] the quick brown fox jumps over the lazy dog while a prefill worker \
                      computes the KV cache of the prompt and a decode worker generates the \
                      tokens, and the quick brown fox jumps over the lazy dog again, ok";
const MAX_TOKENS: u64 = 8;

pub async fn run(dir: &Path) {
    let ca = LocalCa::create(&dir.join("ca"), "pinroute engines CA").unwrap();
    let tls = EngineTls {
        ca: ca.cert_path(),
        server: ca
            .issue("engine", &["127.0.0.1", "localhost"], Usage::Server)
            .unwrap(),
        client: ca.issue("gateway", &[], Usage::Client).unwrap(),
    };
    let stranger = LocalCa::create(&dir.join("stranger"), "another CA").unwrap();
    let stranger_client = stranger.issue("stranger", &[], Usage::Client).unwrap();
    let started = Instant::now();
    let options = VllmPairOptions {
        connector: Connector::Example,
        tls: Some(tls.clone()),
        ..VllmPairOptions::new(&dir.join("vllm"))
    };
    let pair = VllmPair::start(&options)
        .await
        .expect("starting the TLS pair");
    eprintln!("vllm suite (tls): pair ready in {:.1?}", started.elapsed());

    let gateway = gateway_of(
        &pair,
        dir,
        "envoy",
        worker_tls(&ca.cert_path(), &tls.client),
    )
    .await;
    two_hops_over_mutual_tls(&pair, &gateway).await;
    for (name, worker_tls, why) in [
        (
            "envoy-wrong-ca",
            worker_tls(&stranger.cert_path(), &tls.client),
            "the engines' certificate is not the CA's the gateway trusts",
        ),
        (
            "envoy-wrong-client",
            worker_tls(&ca.cert_path(), &stranger_client),
            "the gateway presents a certificate the engines' CA did not sign",
        ),
    ] {
        let refused = gateway_of(&pair, dir, name, worker_tls).await;
        refused_with_a_typed_502(&refused, why).await;
    }
    pair.ensure_running().expect("an engine exited");
    eprintln!("vllm suite (tls): passed in {:.1?}", started.elapsed());
}

fn worker_tls(ca: &Path, client: &Issued) -> WorkerTls {
    WorkerTls {
        ca: ca.to_owned(),
        client_cert: Some((client.cert.clone(), client.key.clone())),
        names: Vec::new(),
    }
}

async fn gateway_of(pair: &VllmPair, dir: &Path, name: &str, tls: WorkerTls) -> Envoy {
    let config = pair.plugin_config(&json!({"prefill_timeout_ms": 120_000}));
    let work_dir = dir.join(name);
    std::fs::create_dir_all(&work_dir).unwrap();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let edge = EdgeOptions {
        worker_tls: Some(tls),
        ..EdgeOptions::default()
    };
    start_gateway_on(&config, &wasm(), &work_dir, (any, any), edge)
        .await
        .expect("starting Envoy")
}

async fn post(envoy: &Envoy, path: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut request = client.post(envoy.url(path)).json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = tokio::time::timeout(Duration::from_secs(180), request.send())
        .await
        .expect("an answer, not a hang")
        .expect("the gateway answered");
    Reply::read(response).await
}

/// Both hops over mutual TLS, and decode loaded the prompt's KV that prefill stored.
async fn two_hops_over_mutual_tls(pair: &VllmPair, gateway: &Envoy) {
    let model = pair.served_model_name();
    let tokenized = post(
        gateway,
        "/tokenize",
        &[],
        &json!({"model": model, "prompt": PROMPT}),
    )
    .await;
    tokenized.assert_ok("tokenize through the gateway, over TLS");
    let tokens = tokenized.json()["count"].as_u64().unwrap();
    let before = pair.kv_evidence().await.unwrap();
    let body = json!({"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                      "temperature": 0, "ignore_eos": true});
    let reply = post(
        gateway,
        "/v1/completions",
        &[("x-dynamo-worker-instance-id", "201")],
        &body,
    )
    .await;
    reply.assert_ok("a completion over mutual TLS");
    assert_eq!(
        (reply.worker("prefill"), reply.worker("decode")),
        (Some(PREFILL_ID), Some(DECODE_ID)),
        "{}",
        reply.text
    );
    let expected = example_handoff(tokens, MAX_TOKENS);
    wait_for(pair, &before, &expected, PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("the hand-off over TLS: {e}"));
}

async fn refused_with_a_typed_502(gateway: &Envoy, why: &str) {
    let body = json!({"model": "any", "prompt": PROMPT, "max_tokens": 2});
    let pins = [
        ("x-dynamo-prefill-instance-id", "101"),
        ("x-dynamo-worker-instance-id", "201"),
    ];
    let reply = post(gateway, "/v1/completions", &pins, &body).await;
    assert_eq!(reply.status, 502, "{why}: {}", reply.text);
    assert_eq!(
        reply.json()["error"]["code"],
        "pinned_worker_failed",
        "{why}: {}",
        reply.text
    );
    let unpinned = post(gateway, "/v1/completions", &[], &body).await;
    assert_eq!(unpinned.status, 502, "{why}: {}", unpinned.text);
    assert_eq!(
        unpinned.json()["error"]["code"],
        "upstream_failed",
        "{why}: {}",
        unpinned.text
    );
}
