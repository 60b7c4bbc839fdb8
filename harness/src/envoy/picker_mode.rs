//! Picker mode's parts of the bootstrap (`docs/semantics.md` §9): the edge removes client
//! copies of the picker's headers, `ext_proc` asks the picker, `header_to_metadata` reports
//! the endpoints that served back to it, and a cluster reaches it. Without a `picker` in the
//! plugin configuration each part renders as nothing and its marker line disappears.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use pinroute::policy::picker::{
    PICKER_HEADERS, PREFILL_SERVED_HEADER, PickerSettings, SERVED_HEADER,
};
use serde_json::json;

use super::bootstrap::{
    CONNECT_TIMEOUT, MAX_UPSTREAM_REQUESTS, envoy_duration, host_and_port, yaml_string,
};

const FILTERS_TEMPLATE: &str = include_str!("../../../envoy/picker-filters.yaml");

/// The Envoy cluster of the picker's gRPC `ext_proc` service.
pub const PICKER_CLUSTER: &str = "pinroute_picker";
/// Per-message timeout of `ext_proc`, the GIE standalone Envoy's value; Envoy applies none in
/// `FULL_DUPLEX_STREAMED` mode, so this matters only if the mode changes.
pub const PICKER_MESSAGE_TIMEOUT: Duration = Duration::from_secs(1000);

/// Markers whose whole line is replaced by a block of YAML, indented as the marker is.
pub const HEADER_REMOVALS_MARKER: &str = "{{PICKER_HEADER_REMOVALS}}";
pub const FILTERS_MARKER: &str = "{{PICKER_FILTERS}}";
pub const CLUSTER_MARKER: &str = "{{PICKER_CLUSTER}}";

/// Fills the picker's marker lines of `template`: with its parts, or with nothing.
pub fn render_picker_blocks(template: &str, picker: Option<&PickerSettings>) -> Result<String> {
    let blocks = match picker {
        Some(settings) => [
            (HEADER_REMOVALS_MARKER, header_removals()?),
            (FILTERS_MARKER, filters()?),
            (CLUSTER_MARKER, cluster(settings)?),
        ],
        None => [
            (HEADER_REMOVALS_MARKER, String::new()),
            (FILTERS_MARKER, String::new()),
            (CLUSTER_MARKER, String::new()),
        ],
    };
    Ok(blocks
        .iter()
        .fold(template.to_owned(), |text, (marker, block)| {
            fill_block(&text, marker, block)
        }))
}

/// The edge's removals of client copies of every header a picker sets.
fn header_removals() -> Result<String> {
    let mut lines =
        vec!["# Picker mode: what reaches the picker's filters is the picker's.".to_owned()];
    for header in PICKER_HEADERS {
        lines.push(format!("- remove: {}", yaml_string(header)?));
    }
    Ok(lines.join("\n"))
}

/// The `ext_proc` and `header_to_metadata` filters of `envoy/picker-filters.yaml`.
fn filters() -> Result<String> {
    let values = [
        ("{{PICKER_CLUSTER_NAME}}", yaml_string(PICKER_CLUSTER)?),
        (
            "{{PICKER_MESSAGE_TIMEOUT}}",
            envoy_duration(PICKER_MESSAGE_TIMEOUT),
        ),
        ("{{SERVED_HEADER}}", yaml_string(SERVED_HEADER)?),
        (
            "{{PREFILL_SERVED_HEADER}}",
            yaml_string(PREFILL_SERVED_HEADER)?,
        ),
    ];
    Ok(values.iter().fold(
        FILTERS_TEMPLATE.trim_end().to_owned(),
        |text, (marker, value)| text.replace(marker, value),
    ))
}

/// The picker's cluster, one more item of the `clusters` list (JSON flow style): gRPC, so
/// HTTP/2; an IP address is STATIC, a name STRICT_DNS.
fn cluster(settings: &PickerSettings) -> Result<String> {
    let Some(address) = &settings.address else {
        bail!(
            "picker.address (host:port of the picker's gRPC ext_proc service) is needed to render the {PICKER_CLUSTER:?} cluster"
        )
    };
    let (host, port) = host_and_port("picker.address", address)?;
    let discovery = if host.parse::<IpAddr>().is_ok() {
        "STATIC"
    } else {
        "STRICT_DNS"
    };
    let endpoint =
        json!({"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}});
    let limit = MAX_UPSTREAM_REQUESTS;
    let cluster = json!({
        "name": PICKER_CLUSTER,
        "type": discovery,
        "connect_timeout": envoy_duration(CONNECT_TIMEOUT),
        // One gRPC stream per request in flight: the gateway's limit, not Envoy's 1024.
        "circuit_breakers": {"thresholds": [{
            "max_connections": limit, "max_pending_requests": limit, "max_requests": limit,
        }]},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            },
        },
        "load_assignment": {"cluster_name": PICKER_CLUSTER, "endpoints": [{"lb_endpoints": [endpoint]}]},
    });
    let text = serde_json::to_string(&cluster).context("encoding the picker cluster")?;
    Ok(format!("  - {text}"))
}

/// Replaces each line that holds only `marker` by `block`, every line of it indented as the
/// marker was; an empty block removes the line.
pub fn fill_block(text: &str, marker: &str, block: &str) -> String {
    let mut filled = String::with_capacity(text.len() + block.len());
    for line in text.split_inclusive('\n') {
        let content = line.trim_end_matches('\n');
        if content.trim() != marker {
            filled.push_str(line);
            continue;
        }
        let indent = content.strip_suffix(content.trim_start()).unwrap_or("");
        for block_line in block.lines() {
            if !block_line.is_empty() {
                filled.push_str(indent);
            }
            filled.push_str(block_line);
            filled.push('\n');
        }
    }
    filled
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn a_block_takes_its_markers_indentation_and_nothing_removes_the_line() {
        let text = "a:\n  {{X}}\nb: 1\n";
        assert_eq!(
            fill_block(text, "{{X}}", "- 1\n\n- 2"),
            "a:\n  - 1\n\n  - 2\nb: 1\n"
        );
        assert_eq!(fill_block(text, "{{X}}", ""), "a:\nb: 1\n");
        assert_eq!(
            fill_block("x: {{X}}\n", "{{X}}", "1"),
            "x: {{X}}\n",
            "not alone"
        );
    }
}
