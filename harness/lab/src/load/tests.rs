#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::{get, post};
use http::Request;

use super::*;

async fn server() -> SocketAddr {
    let router = Router::new()
        .route("/ok", get(|| async { "hello" }))
        .route("/echo", post(|body: Bytes| async move { body }))
        .route(
            "/fail",
            get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "no") }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                "late"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// Every third request fails; the workload expects exactly that.
struct Mix {
    server: SocketAddr,
}

impl Workload for Mix {
    async fn call(&self, user: &mut VirtualUser, seq: u64) -> Sample {
        let (label, path, expected) = match seq % 3 {
            2 => ("fail", "/fail", StatusCode::SERVICE_UNAVAILABLE),
            _ => ("ok", "/ok", StatusCode::OK),
        };
        let started = Instant::now();
        let request = Request::get(path)
            .header("host", "test")
            .body(ChunkedBody::empty())
            .unwrap();
        match user.connections.exchange(self.server, request).await {
            Ok(exchange) => {
                let problem =
                    (exchange.status != expected).then(|| format!("{path}: {}", exchange.status));
                Sample::from_exchange(label, started, &exchange, problem)
            }
            Err(error) => Sample::transport_failure(label, started, &error),
        }
    }
}

fn spec(concurrency: usize, stop: Stop) -> LoadSpec {
    LoadSpec {
        concurrency,
        stop,
        warmup: Duration::ZERO,
        request_timeout: Duration::from_secs(5),
    }
}

#[tokio::test]
async fn counts_classes_per_label_and_reuses_connections() {
    let server = server().await;
    let report = run_load(Arc::new(Mix { server }), &spec(4, Stop::Requests(90))).await;
    assert_eq!(report.outcomes.total, 90);
    assert_eq!(report.outcomes.unexpected, 0, "{:?}", report.problems);
    let fails = report.outcomes.count(StatusClass::ServerError);
    assert!((25..=35).contains(&fails), "{fails} failures of 90");
    assert_eq!(report.by_label["fail"].total, fails);
    assert_eq!(report.first_byte.count(), 90);
    assert!(report.throughput() > 0.0);
    assert_eq!(
        report.connections_opened, 4,
        "one keep-alive connection per user"
    );
}

struct Echo {
    server: SocketAddr,
    body: Bytes,
}

impl Workload for Echo {
    async fn call(&self, user: &mut VirtualUser, _seq: u64) -> Sample {
        let started = Instant::now();
        let (head, tail) = self.body.split_at(self.body.len() / 2);
        let body = ChunkedBody::new([self.body.slice_ref(head), self.body.slice_ref(tail)]);
        let request = Request::post("/echo")
            .header("host", "test")
            .body(body)
            .unwrap();
        let exchange = user
            .connections
            .exchange(self.server, request)
            .await
            .unwrap();
        let problem = (exchange.body_len != self.body.len() as u64
            || !self.body.ends_with(&exchange.tail)
            || exchange.tail.len() != TAIL_BYTES)
            .then(|| format!("echoed {} bytes", exchange.body_len));
        Sample::from_exchange("echo", started, &exchange, problem)
    }
}

#[tokio::test]
async fn chunked_bodies_arrive_whole() {
    let server = server().await;
    let body = Bytes::from(
        (0..300_000u32)
            .map(|i| b'a' + (i % 26) as u8)
            .collect::<Vec<u8>>(),
    );
    let report = run_load(Arc::new(Echo { server, body }), &spec(2, Stop::Requests(6))).await;
    assert_eq!(report.outcomes.unexpected, 0, "{:?}", report.problems);
}

struct Slow {
    server: SocketAddr,
}

impl Workload for Slow {
    async fn call(&self, user: &mut VirtualUser, _seq: u64) -> Sample {
        let started = Instant::now();
        let request = Request::get("/slow")
            .header("host", "test")
            .body(ChunkedBody::empty())
            .unwrap();
        match user.connections.exchange(self.server, request).await {
            Ok(exchange) => Sample::from_exchange("slow", started, &exchange, None),
            Err(error) => Sample::transport_failure("slow", started, &error),
        }
    }
}

#[tokio::test]
async fn slow_requests_time_out() {
    let server = server().await;
    let spec = LoadSpec {
        request_timeout: Duration::from_millis(50),
        ..spec(2, Stop::Requests(4))
    };
    let report = run_load(Arc::new(Slow { server }), &spec).await;
    assert_eq!(report.outcomes.count(StatusClass::Timeout), 4);
    assert_eq!(report.outcomes.unexpected, 4);
    assert_eq!(
        report.first_byte.count(),
        0,
        "failed requests have no latency"
    );
}

#[tokio::test]
async fn duration_runs_stop_on_time_after_the_warmup() {
    let server = server().await;
    let spec = LoadSpec {
        warmup: Duration::from_millis(100),
        ..spec(2, Stop::Duration(Duration::from_millis(300)))
    };
    let started = Instant::now();
    let report = run_load(Arc::new(Mix { server }), &spec).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(report.elapsed, Duration::from_millis(300));
    assert!(report.outcomes.total > 0);
}

#[tokio::test]
async fn unreachable_servers_are_transport_failures() {
    let closed = pinroute_harness::stack::refusing_address().unwrap();
    let report = run_load(
        Arc::new(Mix { server: closed }),
        &spec(1, Stop::Requests(3)),
    )
    .await;
    assert_eq!(report.outcomes.count(StatusClass::Transport), 3);
    assert!(
        report.problems[0].contains("connecting to"),
        "{:?}",
        report.problems
    );
}
