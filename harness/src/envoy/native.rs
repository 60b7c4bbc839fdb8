//! The filter as an Envoy dynamic module (`libpinroute.so`, `src/filter/host/dynamic/`) in
//! place of the wasm filter: the rendered bootstrap with its wasm filter swapped for the
//! `envoy.filters.http.dynamic_modules` filter, with the same plugin configuration. Envoy
//! finds the module by name in [`SEARCH_PATH_ENV`].

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::repo_root;

/// The module's name: Envoy loads `lib{MODULE_NAME}.so`.
pub const MODULE_NAME: &str = "pinroute";
/// The folder Envoy looks for a dynamic module in first.
pub const SEARCH_PATH_ENV: &str = "ENVOY_DYNAMIC_MODULES_SEARCH_PATH";
/// Set to `1`, the module counts its own time apart from Envoy's in two counters
/// ([`OWN_TIME_STATS`]).
pub const OWN_TIME_ENV: &str = "PINROUTE_OWN_TIME";
/// The counters of [`OWN_TIME_ENV`] as `/stats` names them: the module's own nanoseconds,
/// those inside the callbacks it made into Envoy, and its readings of the clock.
pub const OWN_TIME_STATS: [&str; 3] = [
    "wasmcustom.pinroute.module.own_ns",
    "wasmcustom.pinroute.module.envoy_ns",
    "wasmcustom.pinroute.module.clock_reads",
];
/// The histogram of [`OWN_TIME_ENV`]: each request's own nanoseconds in the module.
pub const OWN_TIME_REQUEST_HISTOGRAM: &str = "wasmcustom.pinroute.module.request_own_ns";
/// The cargo profile that builds the module (release, but unwinding: the module catches its
/// panics rather than abort Envoy).
pub const PROFILE: &str = "dynamic-module";

/// Where `cargo build -p pinroute --profile dynamic-module --features dynamic-module` puts
/// the module.
pub fn default_module_path() -> PathBuf {
    repo_root()
        .join("target")
        .join(PROFILE)
        .join(format!("lib{MODULE_NAME}.so"))
}

/// The environment Envoy needs to load `module`: its folder as the search path. The file
/// must be named `libpinroute.so`.
pub fn module_env(module: &Path) -> Result<(String, String)> {
    let expected = format!("lib{MODULE_NAME}.so");
    if module
        .file_name()
        .is_none_or(|name| name != expected.as_str())
    {
        bail!("{} is not named {expected}", module.display());
    }
    let module =
        std::path::absolute(module).with_context(|| format!("resolving {}", module.display()))?;
    let folder = module
        .parent()
        .with_context(|| format!("{} has no folder", module.display()))?;
    Ok((SEARCH_PATH_ENV.to_owned(), folder.display().to_string()))
}

const WASM_FILTER: &str = "- name: envoy.filters.http.wasm";

/// `bootstrap` (rendered by [`super::render_bootstrap`]) with the dynamic module in place of
/// the wasm filter. Its stats keep their names: the module's metrics namespace is the wasm
/// filter's (`wasmcustom`), so the bootstrap's stats tags apply alike.
pub fn with_native_module(bootstrap: &str) -> Result<String> {
    let lines: Vec<&str> = bootstrap.lines().collect();
    let Some(start) = lines.iter().position(|l| l.trim() == WASM_FILTER) else {
        bail!("the bootstrap has no wasm filter to replace");
    };
    let indent = indentation(lines.get(start).copied().unwrap_or_default());
    let end = lines
        .iter()
        .enumerate()
        .skip(start + 1)
        .find(|(_, l)| !l.trim().is_empty() && indentation(l) <= indent)
        .map_or(lines.len(), |(at, _)| at);
    let block = lines.get(start..end).unwrap_or_default();
    let Some(config) = block
        .iter()
        .find_map(|l| l.trim_start().strip_prefix("value: "))
    else {
        bail!("the wasm filter has no plugin configuration");
    };
    let pad = " ".repeat(indent);
    let module = [
        "- name: envoy.filters.http.dynamic_modules".to_owned(),
        "  typed_config:".to_owned(),
        "    \"@type\": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter".to_owned(),
        format!("    dynamic_module_config: {{ name: {MODULE_NAME}, metrics_namespace: wasmcustom }}"),
        format!("    filter_name: {MODULE_NAME}"),
        "    filter_config:".to_owned(),
        "      \"@type\": type.googleapis.com/google.protobuf.StringValue".to_owned(),
        format!("      value: {config}"),
    ];
    let mut out: Vec<String> = lines
        .get(..start)
        .unwrap_or_default()
        .iter()
        .map(|l| (*l).to_owned())
        .collect();
    out.extend(module.iter().map(|l| format!("{pad}{l}")));
    out.extend(
        lines
            .get(end..)
            .unwrap_or_default()
            .iter()
            .map(|l| (*l).to_owned()),
    );
    if lines.iter().any(|l| l.starts_with("layered_runtime:")) {
        bail!("the bootstrap has a runtime already: the module's stats prefix is set there");
    }
    out.extend(STATS_RUNTIME.iter().map(|l| (*l).to_owned()));
    let mut text = out.join("\n");
    text.push('\n');
    Ok(text)
}

/// Envoy strips a dynamic module's metrics namespace from Prometheus names (as it does the
/// wasm filter's) only with this runtime flag: with it, `/stats/prometheus` shows the
/// module's counters as the wasm filter's (`pinroute_requests`, not
/// `envoy_wasmcustom_pinroute_requests`). The admin layer keeps `/runtime_modify` working.
const STATS_RUNTIME: [&str; 8] = [
    "# The native module's stats keep the wasm filter's Prometheus names.",
    "layered_runtime:",
    "  layers:",
    "  - name: pinroute_native",
    "    static_layer:",
    "      envoy.reloadable_features.dynamic_modules_strip_custom_stat_prefix: true",
    "  - name: admin",
    "    admin_layer: {}",
];

fn indentation(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const RENDERED: &str = "filters:
          - name: first
          - name: envoy.filters.http.wasm
            typed_config:
              config:
                configuration:
                  value: \"{\\\"workers\\\":[]}\"
                vm_config:
                  runtime: envoy.wasm.runtime.v8
          # 4. Router.
          - name: envoy.filters.http.router
";

    #[test]
    fn the_wasm_filter_becomes_the_module_with_the_same_configuration() {
        let native = with_native_module(RENDERED).unwrap();
        assert!(!native.contains("wasm.runtime"), "{native}");
        assert!(native.contains(
            "          - name: envoy.filters.http.dynamic_modules\n            typed_config:\n"
        ));
        assert!(
            native
                .contains("              value: \"{\\\"workers\\\":[]}\"\n          # 4. Router."),
            "{native}"
        );
        assert!(native.starts_with("filters:\n          - name: first\n"));
        assert!(native.contains("- name: envoy.filters.http.router\n# The native module"));
        assert!(native.contains("dynamic_modules_strip_custom_stat_prefix: true\n"));
    }

    #[test]
    fn the_module_is_found_in_its_folder() {
        let (name, value) = module_env(Path::new("/x/y/libpinroute.so")).unwrap();
        assert_eq!((name.as_str(), value.as_str()), (SEARCH_PATH_ENV, "/x/y"));
        assert!(module_env(Path::new("/x/y/pinroute.so")).is_err());
    }
}
