//! `docs/semantics.md` §7: only registry addresses are ever dialled.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpListener;

use crate::client::{complete, prompt, send};
use crate::{disaggregated, disaggregated_spec, start};

/// A listener that counts the connections it is offered.
async fn canary() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        while let Ok((_socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    (address, hits)
}

#[tokio::test]
async fn forged_routing_headers_never_reach_another_address() {
    let deployment = disaggregated().await;
    let (target, hits) = canary().await;
    let forged = [
        "x-envoy-original-dst-host",
        "x-pinroute-upstream",
        "x-gateway-destination-endpoint",
        "x-gateway-destination-endpoint-fallback",
        "x-prefiller-host-port",
    ];
    for name in forged {
        for pinned in [false, true] {
            let mut headers = vec![(name, target.as_str())];
            if pinned {
                headers.push(("x-dynamo-worker-instance-id", "201"));
            }
            let reply = complete(&deployment, &headers, &prompt()).await;
            assert_eq!(reply.status, 200, "{name}: {}", reply.text);
            assert!([201, 202].contains(&reply.worker("decode").unwrap()));
            let models = send(
                &deployment,
                reqwest::Method::GET,
                "/v1/models",
                &headers,
                None,
            )
            .await;
            assert_eq!(models.status, 200, "{name}");
        }
    }
    // All forged headers at once, as a body field too.
    let mut headers: Vec<(&str, &str)> = forged.iter().map(|n| (*n, target.as_str())).collect();
    headers.push(("x-pinroute-prefill-worker", "666"));
    let mut body = prompt();
    body["kv_transfer_params"] = serde_json::json!({"remote_host": "127.0.0.1", "remote_port": 1});
    let reply = complete(&deployment, &headers, &body).await;
    reply.assert_ok("the request");
    assert_ne!(reply.header("x-pinroute-prefill-worker"), Some("666"));
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "a forged header made Envoy dial {target}"
    );

    for id in [101, 102, 201, 202] {
        for request in deployment.worker(id).unwrap().requests() {
            for name in forged.iter().chain(&["x-dynamo-worker-instance-id"]) {
                assert_eq!(request.header(name), None, "worker {id} received {name}");
            }
        }
    }
}

#[tokio::test]
async fn other_paths_refuse_a_json_body_naming_kv_transfer_params() {
    let mut spec = disaggregated_spec();
    spec.settings = serde_json::json!({ "routed_paths": ["/inference/*"] });
    let deployment = start(spec).await;
    let pin = [("x-dynamo-worker-instance-id", "201")];
    let forged = serde_json::json!({"token_ids": [1, 2],
        "sampling_params": {"extra_args": {"kv_transfer_params": {"remote_host": "10.1.2.3"}}}});
    let refused = send(
        &deployment,
        reqwest::Method::POST,
        "/inference/v1/abort_requests",
        &pin,
        Some(forged.to_string()),
    )
    .await;
    assert_eq!(
        refused.error(400, "invalid_field"),
        "kv_transfer_params: is set by the gateway, never by a client"
    );
    let plain = serde_json::json!({"token_ids": [1, 2]});
    let passed = send(
        &deployment,
        reqwest::Method::POST,
        "/inference/v1/abort_requests",
        &pin,
        Some(plain.to_string()),
    )
    .await;
    assert_eq!(
        passed.status, 404,
        "on to the worker, which has no such route: {}",
        passed.text
    );
    assert_eq!(passed.worker("decode"), Some(201));
}

#[tokio::test]
async fn a_completion_body_ending_in_http2_trailers_gets_a_typed_error() {
    use http_body_util::BodyExt;
    let deployment = disaggregated().await;
    let tcp = tokio::net::TcpStream::connect(deployment.envoy.listen())
        .await
        .unwrap();
    let executor = hyper_util::rt::TokioExecutor::new();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(executor, hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(connection);
    let (mut body, channel) = http_body_util::channel::Channel::<bytes::Bytes>::new(2);
    let request = hyper::Request::post(format!(
        "http://{}/v1/completions",
        deployment.envoy.listen()
    ))
    .header("content-type", "application/json")
    .header("x-dynamo-worker-instance-id", "201")
    .body(channel)
    .unwrap();
    let answer = tokio::spawn(async move { sender.send_request(request).await });
    body.send_data(prompt().to_string().into()).await.unwrap();
    let mut trailers = hyper::HeaderMap::new();
    trailers.insert("x-checksum", hyper::header::HeaderValue::from_static("1"));
    body.send_trailers(trailers).await.unwrap();
    let response = answer.await.unwrap().unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(response.headers()["x-pinroute-error-code"], "invalid_body");
    let text = response.into_body().collect().await.unwrap().to_bytes();
    let error: serde_json::Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(
        error["error"]["message"],
        "request body: a body followed by trailers is not accepted"
    );
}
