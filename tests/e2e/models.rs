//! Several models and LoRA adapters behind one gateway, through Envoy (`docs/semantics.md`
//! §3): each hop on workers serving the request's model (the sims refuse any other, as vLLM
//! does, and load KV prefilled for the same model only), typed answers for a model or a pin
//! that does not fit, the gateway's model list, an adapter loaded on decode workers only, and
//! Prometheus series per model.

use pinroute_harness::sim::{SimConfig, SimRole};
use pinroute_harness::stack::StackSpec;
use reqwest::Method;
use serde_json::{Value, json};

use crate::client::{post, send};
use crate::{Deployment, nothing_reached_a_worker, start, wasm};

const PROMPT: &str = "The quick brown fox jumps over the lazy dog";

/// Prefill 101 and decode 201, 203 serve `tiny`; prefill 102 and decode 202 serve `big` and
/// its adapter `big-lora`; the adapter `tiny-lora` is loaded on decode 201 alone.
async fn two_models() -> Deployment {
    let serving = |id, role, models: &[&str]| SimConfig::new(id, role).with_served_models(models);
    let workers = vec![
        serving(101, SimRole::Prefill, &["tiny"]),
        serving(102, SimRole::Prefill, &["big", "big-lora"]),
        serving(201, SimRole::Decode, &["tiny", "tiny-lora"]),
        serving(202, SimRole::Decode, &["big", "big-lora"]),
        serving(203, SimRole::Decode, &["tiny"]),
    ];
    start(StackSpec::new(workers, wasm())).await
}

fn completion(model: &str) -> Value {
    json!({"model": model, "prompt": PROMPT, "max_tokens": 4})
}

fn chat(model: &str) -> Value {
    json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": PROMPT}]})
}

#[tokio::test]
async fn each_model_and_adapter_takes_two_hops_on_workers_serving_it() {
    let deployment = two_models().await;
    let cases: [(&str, &[u64], &[u64]); 3] = [
        ("tiny", &[101], &[201, 203]),
        ("big", &[102], &[202]),
        ("big-lora", &[102], &[202]),
    ];
    for (model, prefill_workers, decode_workers) in cases {
        for (path, body) in [
            ("/v1/completions", completion(model)),
            ("/v1/chat/completions", chat(model)),
        ] {
            for _ in 0..3 {
                let reply = post(&deployment, path, &[], &body).await;
                reply.assert_ok(model);
                let prefill = reply.worker("prefill").unwrap();
                let decode = reply.worker("decode").unwrap();
                assert!(
                    prefill_workers.contains(&prefill),
                    "{model}: prefill {prefill}"
                );
                assert!(decode_workers.contains(&decode), "{model}: decode {decode}");
                let answer = reply.json();
                assert_eq!(answer["sim"]["kv_from"], prefill, "{model}: {}", reply.text);
                assert_eq!(answer["model"], model);
            }
        }
    }
}

#[tokio::test]
async fn an_adapter_loaded_on_decode_workers_only_is_served_in_one_hop_there() {
    let deployment = two_models().await;
    for _ in 0..3 {
        let reply = post(
            &deployment,
            "/v1/completions",
            &[],
            &completion("tiny-lora"),
        )
        .await;
        reply.assert_ok("tiny-lora");
        assert_eq!(
            reply.worker("prefill"),
            None,
            "no prefill worker has the adapter"
        );
        assert_eq!(reply.worker("decode"), Some(201));
        assert_eq!(reply.json()["sim"]["kv_from"], Value::Null);
    }
    for prefill in [101, 102] {
        assert!(deployment.worker(prefill).unwrap().requests().is_empty());
    }
    let fallbacks = crate::stat(
        &deployment,
        "wasmcustom.pinroute.prefill.aggregated_fallback",
    );
    assert_eq!(fallbacks.await, 3);
}

#[tokio::test]
async fn a_model_or_a_pin_that_does_not_fit_is_answered_before_any_worker() {
    let deployment = two_models().await;
    let reply = post(&deployment, "/v1/completions", &[], &completion("gpt-9")).await;
    let message = reply.error(404, "model_not_found");
    assert!(message.contains("\"gpt-9\""), "{message}");
    let messages = json!({"model": "gpt-9", "max_tokens": 4,
                          "messages": [{"role": "user", "content": PROMPT}]});
    let anthropic = post(&deployment, "/v1/messages", &[], &messages).await;
    assert_eq!(anthropic.status, 404);
    assert_eq!(anthropic.json()["error"]["type"], "not_found_error");
    assert_eq!(anthropic.json()["error"]["code"], "model_not_found");

    let pinned = [("x-dynamo-worker-instance-id", "202")];
    let reply = post(&deployment, "/v1/completions", &pinned, &completion("tiny")).await;
    let message = reply.error(400, "model_not_served");
    assert!(
        message.contains("worker 202") && message.contains("\"tiny\""),
        "{message}"
    );
    let pinned = [("x-dynamo-prefill-instance-id", "102")];
    let reply = post(&deployment, "/v1/completions", &pinned, &completion("tiny")).await;
    assert!(
        reply
            .error(400, "model_not_served")
            .starts_with("prefill hop")
    );

    let unnamed = json!({"prompt": PROMPT, "max_tokens": 4});
    let reply = post(&deployment, "/v1/completions", &[], &unnamed).await;
    assert!(reply.error(400, "invalid_field").starts_with("model: "));
    let typed = json!({"model": ["tiny"], "prompt": PROMPT});
    post(&deployment, "/v1/completions", &[], &typed)
        .await
        .error(400, "invalid_field");
    assert!(nothing_reached_a_worker(&deployment));

    let pinned = [("x-dynamo-worker-instance-id", "203")];
    let reply = post(&deployment, "/v1/completions", &pinned, &completion("tiny")).await;
    reply.assert_ok("a pin to a worker serving the model");
    assert_eq!(reply.worker("decode"), Some(203));
}

#[tokio::test]
async fn the_gateway_lists_the_registrys_models_and_routes_other_paths_by_model() {
    let deployment = two_models().await;
    let reply = send(&deployment, Method::GET, "/v1/models", &[], None).await;
    reply.assert_ok("/v1/models");
    let ids: Vec<Value> = reply.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(
        ids,
        ["big", "big-lora", "tiny", "tiny-lora"].map(Value::from)
    );
    assert!(nothing_reached_a_worker(&deployment));

    let count = json!({"model": "big-lora", "max_tokens": 4,
                       "messages": [{"role": "user", "content": PROMPT}]});
    for _ in 0..3 {
        post(&deployment, "/v1/messages/count_tokens", &[], &count)
            .await
            .assert_ok("count_tokens");
    }
    let counted = deployment.worker(202).unwrap().requests();
    assert_eq!(counted.len(), 3, "the only decode worker serving big-lora");
}

#[tokio::test]
async fn prometheus_has_requests_placements_and_errors_per_model() {
    let deployment = two_models().await;
    for _ in 0..2 {
        post(&deployment, "/v1/completions", &[], &completion("big-lora"))
            .await
            .assert_ok("big-lora");
    }
    let pinned = [("x-dynamo-worker-instance-id", "202")];
    post(&deployment, "/v1/completions", &pinned, &completion("tiny"))
        .await
        .error(400, "model_not_served");
    post(
        &deployment,
        "/v1/completions",
        &[],
        &completion("client-made-up"),
    )
    .await
    .error(404, "model_not_found");
    let prometheus = deployment.envoy.stats_prometheus().await.unwrap();
    let series = |name: &str| {
        prometheus
            .lines()
            .find(|line| line.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in\n{prometheus}"))
            .to_owned()
    };
    assert!(series("pinroute_model_requests{model=\"big-lora\"}").ends_with(" 2"));
    assert!(series("pinroute_model_requests{model=\"tiny\"}").ends_with(" 1"));
    let placed = series("pinroute_model_placement_prefill{model=\"big-lora\",choice=\"load\"}");
    assert!(placed.ends_with(" 2"), "{placed}");
    let refused = series("pinroute_model_errors{model=\"tiny\",code=\"model_not_served\"}");
    assert!(refused.ends_with(" 1"), "{refused}");
    assert!(series("pinroute_errors{code=\"model_not_found\"}").ends_with(" 1"));
    assert!(
        !prometheus.contains("client-made-up"),
        "a client's model is never a label"
    );
}

#[tokio::test]
async fn the_live_registry_carries_the_models() {
    let workers = vec![
        SimConfig::new(101, SimRole::Prefill).with_served_models(&["tiny"]),
        SimConfig::new(201, SimRole::Decode).with_served_models(&["tiny"]),
        SimConfig::new(202, SimRole::Decode).with_served_models(&["big"]),
    ];
    let mut spec = StackSpec::new(workers, wasm());
    spec.live_registry = Some(std::time::Duration::from_millis(200));
    let deployment = start(spec).await;
    let registry = deployment.registry.as_ref().unwrap();
    let mut entries = deployment.entries(&[101, 201, 202]);
    for entry in &mut entries {
        entry.as_object_mut().unwrap().remove("models");
    }
    registry.set_workers(&entries);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while send(&deployment, Method::GET, "/v1/models", &[], None)
        .await
        .json()["data"][0]["owned_by"]
        == "pinroute"
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the list without models never came"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // One Envoy thread answered from the new registry: every thread adopts it within half a
    // second (of its next request, natively).
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let anywhere = post(
        &deployment,
        "/v1/completions",
        &[("x-dynamo-worker-instance-id", "202")],
        &completion("tiny"),
    )
    .await;
    assert_eq!(
        anywhere.status, 404,
        "the sim refuses what the registry no longer tells apart"
    );

    registry.set_workers(&deployment.entries(&[101, 201, 202]));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let reply = send(&deployment, Method::GET, "/v1/models", &[], None).await;
        if reply.json()["data"][0]["owned_by"] == "pinroute" {
            assert_eq!(reply.json()["data"].as_array().unwrap().len(), 2);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the models never came"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let pinned = [("x-dynamo-worker-instance-id", "202")];
    post(&deployment, "/v1/completions", &pinned, &completion("tiny"))
        .await
        .error(400, "model_not_served");
    let reply = post(&deployment, "/v1/completions", &[], &completion("big")).await;
    reply.assert_ok("big");
    assert_eq!(reply.worker("decode"), Some(202));
}
