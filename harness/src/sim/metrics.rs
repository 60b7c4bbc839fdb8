//! `GET /metrics`: the simulator's own `sim_*` counters and, as vLLM publishes them per
//! data-parallel engine, its load (`vllm:num_requests_running`,
//! `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`); or, under a [`MetricsFault`],
//! an answer a scraping gateway must survive.

use std::convert::Infallible;
use std::fmt::Write as _;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::config::MetricsFault;
use super::load::RankLoad;
use super::server::close_connection;
use super::state::{SimState, read};

const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The body of [`MetricsFault::Huge`] is at least this long.
const HUGE_BODY_BYTES: usize = 100 << 20;
const HUGE_CHUNK_LINES: usize = 1024;
/// Bytes of noise around the hostile samples of [`MetricsFault::Garbage`].
const GARBAGE_NOISE_BYTES: usize = 4 << 10;
const GARBAGE_LABEL_BYTES: usize = 10 << 10;

pub(crate) async fn answer(state: &SimState) -> Response {
    match state.metrics_fault() {
        MetricsFault::None => text_response(Body::from(metrics_text(state))),
        MetricsFault::Garbage => text_response(Body::from(garbage(&state.config.model))),
        MetricsFault::Huge => huge(&state.config.model),
        MetricsFault::Hang => {
            state.stopped().await;
            close_connection()
        }
        MetricsFault::Status(code) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let message = format!(
                "simulated metrics fault: worker {} answers {}\n",
                state.config.id,
                status.as_u16()
            );
            (status, message).into_response()
        }
    }
}

fn text_response(body: Body) -> Response {
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    response
}

fn write_metric(out: &mut String, name: &str, kind: &str, help: &str, value: u64) {
    let _ = write!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
    );
}

fn metrics_text(state: &SimState) -> String {
    let counters = &state.counters;
    let mut out = String::new();
    write_metric(
        &mut out,
        "sim_requests_total",
        "counter",
        "Completion requests received.",
        read(&counters.requests),
    );
    write_metric(
        &mut out,
        "sim_kv_produced_total",
        "counter",
        "KV entries produced by prefill hops.",
        read(&counters.kv_produced),
    );
    write_metric(
        &mut out,
        "sim_kv_loaded_total",
        "counter",
        "KV entries loaded from prefill workers.",
        read(&counters.kv_loaded),
    );
    write_metric(
        &mut out,
        "sim_prompt_tokens_cached_total",
        "counter",
        "Prompt tokens this worker prefilled that its prefix cache held.",
        read(&counters.cached_prompt_tokens),
    );
    write_metric(
        &mut out,
        "sim_prompt_tokens_computed_total",
        "counter",
        "Prompt tokens this worker computed.",
        read(&counters.computed_prompt_tokens),
    );
    write_metric(
        &mut out,
        "sim_generated_tokens_total",
        "counter",
        "Tokens generated.",
        read(&counters.generated_tokens),
    );
    write_metric(
        &mut out,
        "sim_kv_pending",
        "gauge",
        "KV entries waiting for a decode worker.",
        state.kv.len() as u64,
    );
    out.push_str(
        "# HELP sim_dp_rank_requests_total Completion requests served per data-parallel rank.\n",
    );
    out.push_str("# TYPE sim_dp_rank_requests_total counter\n");
    for (rank, counter) in state.rank_requests.iter().enumerate() {
        let _ = writeln!(
            out,
            "sim_dp_rank_requests_total{{dp_rank=\"{rank}\"}} {}",
            read(counter)
        );
    }
    let ranks = state.load.ranks(state.kv_capacity_blocks());
    write_vllm_gauges(&mut out, &state.config.model, &ranks);
    out
}

/// One of vLLM's load gauges.
struct Gauge {
    name: &'static str,
    help: &'static str,
    value: fn(&RankLoad) -> f64,
}

const VLLM_GAUGES: [Gauge; 3] = [
    Gauge {
        name: "vllm:num_requests_running",
        help: "Number of requests in model execution batches.",
        value: |load| load.running as f64,
    },
    Gauge {
        name: "vllm:num_requests_waiting",
        help: "Number of requests waiting to be processed.",
        value: |load| load.waiting as f64,
    },
    Gauge {
        name: "vllm:kv_cache_usage_perc",
        help: "KV-cache usage. 1 means 100 percent usage.",
        value: |load| load.kv_cache_usage,
    },
];

/// Each gauge once, with a sample per rank, as `prometheus_client` prints them (labels
/// sorted by name).
fn write_vllm_gauges(out: &mut String, model: &str, ranks: &[RankLoad]) {
    let model = escape_label(model);
    for Gauge { name, help, value } in VLLM_GAUGES {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n");
        for (rank, load) in ranks.iter().enumerate() {
            let value = go_float(value(load));
            let _ = writeln!(
                out,
                "{name}{{engine=\"{rank}\",model_name=\"{model}\"}} {value}"
            );
        }
    }
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('"', "\\\"")
}

/// A sample value as `prometheus_client` prints it: Python's `repr` of the float, in Go's
/// exponent form from a seventh integer digit on (`3.0`, `0.25`, `1.5e+06`, `1e+010`).
fn go_float(value: f64) -> String {
    if value.is_nan() {
        return "NaN".to_owned();
    }
    if value.is_infinite() {
        return if value > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    let repr = python_repr(value);
    match repr.find('.') {
        Some(dot) if value > 0.0 && dot > 6 => {
            let (first, rest) = repr.split_at(1);
            let mantissa = format!("{first}.{}", rest.replacen('.', "", 1));
            let mantissa = mantissa.trim_end_matches(['0', '.']);
            format!("{mantissa}e+0{}", dot - 1)
        }
        _ => repr,
    }
}

/// Python's `repr` of a finite float: its shortest digits, fixed from 1e-4 to below 1e16,
/// else in exponent form (`1e-05`, `1.5e+16`).
fn python_repr(value: f64) -> String {
    let scientific = format!("{:e}", value.abs());
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits = mantissa.replace('.', "");
    let sign = if value.is_sign_negative() { "-" } else { "" };
    let unsigned = if (-4..16).contains(&exponent) {
        fixed_point(&digits, exponent)
    } else {
        exponent_form(&digits, exponent)
    };
    format!("{sign}{unsigned}")
}

/// `digits` (d.ddd × 10^exponent) with a decimal point and at least one digit after it.
fn fixed_point(digits: &str, exponent: i32) -> String {
    if exponent < 0 {
        let zeros = "0".repeat(exponent.unsigned_abs() as usize - 1);
        return format!("0.{zeros}{digits}");
    }
    let point = exponent as usize + 1;
    match digits.split_at_checked(point) {
        Some((whole, fraction)) if !fraction.is_empty() => format!("{whole}.{fraction}"),
        _ => format!("{digits:0<point$}.0"),
    }
}

fn exponent_form(digits: &str, exponent: i32) -> String {
    let (first, rest) = digits.split_at(1);
    let point = if rest.is_empty() { "" } else { "." };
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{first}{point}{rest}e{sign}{:02}", exponent.unsigned_abs())
}

/// [`MetricsFault::Garbage`]: noise around samples no parser should take as they are (NaN
/// and infinite values, an absurd engine index, a sample without value, a 10 KB label,
/// invalid UTF-8).
fn garbage(model: &str) -> Vec<u8> {
    let model = escape_label(model);
    let long_label = "x".repeat(GARBAGE_LABEL_BYTES);
    let samples = format!(
        "vllm:num_requests_waiting{{engine=\"0\"}} NaN\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"{model}\"}} NaN\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"{model}\"}} -Inf\n\
         vllm:num_requests_waiting{{engine=\"99999999999\"}} 1e308\n\
         vllm:num_requests_waiting{{engine=\"99999999999\",model_name=\"{model}\"}} 1e308\n\
         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"{model}\"}}\n\
         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"{long_label}\"}} 0.5\n"
    );
    let half = GARBAGE_NOISE_BYTES / 2;
    let mut body = noise(half, 1);
    body.push(b'\n');
    body.extend_from_slice(samples.as_bytes());
    body.extend_from_slice(
        b"vllm:num_requests_running{engine=\"0\",model_name=\"\xff\xfe\xc3\x28\"} 1.0\n",
    );
    body.extend(noise(half, 2));
    body
}

/// `bytes` random-looking bytes (the same for a seed).
fn noise(bytes: usize, seed: u64) -> Vec<u8> {
    (0..bytes.div_ceil(8) as u64)
        .flat_map(|word| xxh3_64_with_seed(&word.to_le_bytes(), seed).to_le_bytes())
        .take(bytes)
        .collect()
}

/// [`MetricsFault::Huge`]: at least [`HUGE_BODY_BYTES`] of valid-looking samples, with
/// their `content-length`, streamed from one chunk so the worker never holds the body.
fn huge(model: &str) -> Response {
    let line = format!(
        "vllm:num_requests_waiting{{engine=\"0\",model_name=\"{}\"}} 1.0\n",
        escape_label(model)
    );
    let chunk = Bytes::from(line.repeat(HUGE_CHUNK_LINES));
    let chunks = HUGE_BODY_BYTES.div_ceil(chunk.len());
    let length = chunks * chunk.len();
    let stream = futures_util::stream::repeat(chunk)
        .take(chunks)
        .map(Ok::<_, Infallible>);
    let mut response = text_response(Body::from_stream(stream));
    response
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    response
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn values_print_as_prometheus_client_prints_them() {
        let cases = [
            (0.0, "0.0"),
            (3.0, "3.0"),
            (0.25, "0.25"),
            (0.0001, "0.0001"),
            (0.000015, "1.5e-05"),
            (123456.0, "123456.0"),
            (1234567.0, "1.234567e+06"),
            (1e6, "1e+06"),
            (1e10, "1e+010"),
            (1e16, "1e+16"),
            (1e308, "1e+308"),
            (-2.5, "-2.5"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "+Inf"),
        ];
        for (value, printed) in cases {
            assert_eq!(go_float(value), printed, "{value:e}");
        }
    }

    #[test]
    fn each_gauge_is_described_once_and_sampled_per_rank() {
        let ranks = [
            RankLoad {
                running: 3,
                waiting: 1,
                kv_cache_usage: 0.25,
            },
            RankLoad::default(),
        ];
        let mut out = String::new();
        write_vllm_gauges(&mut out, "org/m\"1", &ranks);
        let expected = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="org/m\"1"} 3.0
vllm:num_requests_running{engine="1",model_name="org/m\"1"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="org/m\"1"} 1.0
vllm:num_requests_waiting{engine="1",model_name="org/m\"1"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="org/m\"1"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="org/m\"1"} 0.0
"#;
        assert_eq!(out, expected);
    }
}
