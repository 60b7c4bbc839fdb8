//! The Grafana dashboard shipped in `envoy/grafana/pinroute.json`: its panels and their
//! PromQL, as the dashboard test checks them against a real Prometheus and `pinroute-lab
//! dashboard` renders them.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::envoy::repo_root;
use crate::sim::{SimConfig, SimRole};
use crate::stack::{Stack, StackSpec};

/// One panel: its title, unit and queries.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub unit: String,
    pub queries: Vec<Query>,
}

/// A panel's query: its PromQL as written in the dashboard and its legend template.
#[derive(Debug, Clone)]
pub struct Query {
    pub expr: String,
    pub legend: String,
}

impl Query {
    /// The PromQL with Grafana's `$__rate_interval` set to `rate_interval` (such as `1m`), as
    /// Grafana would send it.
    pub fn promql(&self, rate_interval: &str) -> String {
        self.expr.replace("$__rate_interval", rate_interval)
    }

    /// The legend of one series: `{{label}}` replaced by the series' label.
    pub fn legend_of(&self, labels: &Value) -> String {
        let mut legend = self.legend.clone();
        if let Some(labels) = labels.as_object() {
            for (name, value) in labels {
                let value = value.as_str().unwrap_or_default();
                legend = legend.replace(&format!("{{{{{name}}}}}"), value);
            }
        }
        legend
    }
}

pub fn dashboard_path() -> PathBuf {
    repo_root().join("envoy/grafana/pinroute.json")
}

/// The dashboard's panels in order, rows left out.
pub fn panels() -> Result<Vec<Panel>> {
    let path = dashboard_path();
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let dashboard: Value = serde_json::from_str(&text)?;
    Ok(panels_of(&dashboard))
}

fn panels_of(dashboard: &Value) -> Vec<Panel> {
    let empty = Vec::new();
    let panels = dashboard["panels"].as_array().unwrap_or(&empty);
    panels
        .iter()
        .filter(|panel| panel["type"] != "row")
        .map(|panel| Panel {
            title: text(panel.get("title")),
            unit: text(panel.pointer("/fieldConfig/defaults/unit")),
            queries: panel["targets"]
                .as_array()
                .unwrap_or(&empty)
                .iter()
                .map(|target| Query {
                    expr: text(target.get("expr")),
                    legend: text(target.get("legendFormat")),
                })
                .collect(),
        })
        .collect()
}

fn text(value: Option<&Value>) -> String {
    value.and_then(Value::as_str).unwrap_or_default().to_owned()
}

/// A deployment whose traffic moves the panels: two models (one with a LoRA adapter) on
/// their own workers, a prefill worker that refuses connections (failures, retries, an
/// ejection, and panic mode, the threshold being above one healthy worker in two).
pub fn demo_spec(wasm: PathBuf) -> StackSpec {
    let serving = |id, role, models: &[&str]| SimConfig::new(id, role).with_served_models(models);
    let workers = vec![
        serving(101, SimRole::Prefill, &["tiny"]),
        serving(102, SimRole::Prefill, &["big", "big-lora"]),
        serving(201, SimRole::Decode, &["tiny"]),
        serving(202, SimRole::Decode, &["big", "big-lora"]),
    ];
    let mut spec = StackSpec::new(workers, wasm);
    spec.dead = vec![(109, SimRole::Prefill, 1)];
    spec.settings = json!({"eject_after_failures": 1, "panic_threshold_percent": 60});
    spec
}

/// One round of the demo's traffic on a [`demo_spec`] stack: unpinned completions and chats
/// of each model (new prompts each round), a pinned one, a pin to an unknown worker and an
/// unknown model. Fails if an answer is not the one its request must get.
pub async fn send_demo_round(stack: &Stack, http: &reqwest::Client, round: u32) -> Result<()> {
    let prompt = format!("Round {round} of the dashboard's traffic: tell me about the weather");
    let completion = |model: &str| json!({"model": model, "prompt": prompt, "max_tokens": 4});
    let chat = |model: &str| {
        json!({"model": model, "max_tokens": 4,
               "messages": [{"role": "user", "content": prompt}]})
    };
    let requests = [
        ("/v1/completions", completion("tiny"), None, 200),
        ("/v1/chat/completions", chat("tiny"), None, 200),
        ("/v1/completions", completion("big"), None, 200),
        ("/v1/chat/completions", chat("big-lora"), None, 200),
        ("/v1/completions", completion("tiny"), Some("201"), 200),
        ("/v1/completions", completion("tiny"), Some("299"), 400),
        ("/v1/completions", completion("no-such-model"), None, 404),
    ];
    for (path, body, pin, expected) in requests {
        let mut request = http.post(stack.url(path)).json(&body);
        if let Some(worker) = pin {
            request = request.header("x-dynamo-worker-instance-id", worker);
        }
        let reply = request.send().await?;
        let status = reply.status().as_u16();
        let text = reply.text().await?;
        ensure!(
            status == expected,
            "{path} {body} pinned to {pin:?}: {status} {text}"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_panel_has_a_title_a_unit_and_queries_on_the_chosen_datasource() {
        let panels = panels().unwrap();
        assert!(panels.len() >= 15, "{} panels", panels.len());
        for panel in &panels {
            assert!(
                !panel.title.is_empty() && !panel.unit.is_empty(),
                "{panel:?}"
            );
            assert!(!panel.queries.is_empty(), "{}: no query", panel.title);
            for query in &panel.queries {
                assert!(!query.expr.is_empty(), "{}: an empty query", panel.title);
            }
        }
        let text = std::fs::read_to_string(dashboard_path()).unwrap();
        let datasources = text.matches("\"uid\": \"${datasource}\"").count();
        let queries: usize = panels.iter().map(|p| p.queries.len()).sum();
        assert_eq!(
            datasources,
            panels.len() + queries,
            "a panel or query off the variable"
        );
    }

    #[test]
    fn legends_name_the_series_labels() {
        let query = Query {
            expr: String::new(),
            legend: "prefill {{model}} {{choice}}".to_owned(),
        };
        let labels = serde_json::json!({"model": "tiny", "choice": "affinity"});
        assert_eq!(query.legend_of(&labels), "prefill tiny affinity");
        let query = Query {
            expr: "sum(rate(pinroute_requests[$__rate_interval]))".to_owned(),
            legend: String::new(),
        };
        assert_eq!(query.promql("1m"), "sum(rate(pinroute_requests[1m]))");
    }
}
