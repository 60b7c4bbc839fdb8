//! The Grafana dashboard (`envoy/grafana/pinroute.json`) against a real Prometheus scraping
//! Envoy during a short load: every panel's every query returns data, and the panels the
//! load moves show it (`docs/metrics.md`, "The dashboard").

use std::time::Duration;

use pinroute_harness::dashboard::{demo_spec, panels, send_demo_round};
use pinroute_harness::prometheus::Prometheus;
use tempfile::TempDir;

use crate::{start, wasm};

/// Panels the demo's traffic may leave at zero: its requests are over by the time of the
/// query, and it has no live registry.
const IDLE_PANELS: [&str; 2] = ["In flight", "Live registry fetches"];

#[tokio::test]
async fn every_panel_of_the_dashboard_has_data_on_a_real_prometheus() {
    let deployment = start(demo_spec(wasm())).await;
    let dir = TempDir::new().unwrap();
    let prometheus = Prometheus::start(deployment.envoy.admin(), dir.path())
        .await
        .unwrap();
    prometheus.wait_for_scrapes(2).await.unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for round in 0..12 {
        send_demo_round(&deployment, &http, round).await.unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    prometheus.wait_for_scrapes(2).await.unwrap();

    let mut quiet = Vec::new();
    for panel in panels().unwrap() {
        let mut moved = false;
        for query in &panel.queries {
            let promql = query.promql("1m");
            let samples = prometheus.query(&promql).await.unwrap();
            assert!(!samples.is_empty(), "{}: no data for {promql}", panel.title);
            for sample in &samples {
                let legend = query.legend_of(&sample.labels);
                assert!(
                    !legend.contains("{{"),
                    "{}: {legend} for {promql}",
                    panel.title
                );
            }
            moved |= samples.iter().any(|s| s.value.is_finite() && s.value > 0.0);
        }
        if !moved && !IDLE_PANELS.contains(&panel.title.as_str()) {
            quiet.push(panel.title);
        }
    }
    assert!(quiet.is_empty(), "panels the load did not move: {quiet:?}");
}
