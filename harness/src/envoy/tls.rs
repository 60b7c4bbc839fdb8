//! TLS on both sides of the gateway and who may call it (`docs/deploy.md` §2.8): the listener
//! terminates clients' TLS (optionally verifying their certificates), the worker clusters
//! speak TLS or mutual TLS to the workers on both hops, and Envoy's `api_key_auth` or
//! `jwt_authn` refuses callers without a listed key or a valid token before anything else
//! sees the request.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use pinroute::policy::config::is_header_name;
use pinroute::policy::headers::must_strip;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::bootstrap::absolute_utf8;

const TLS_SOCKET: &str = "envoy.transport_sockets.tls";
const DOWNSTREAM_TLS: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";
const UPSTREAM_TLS: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";

/// The client-facing listener's certificate, and the CA its clients' certificates must chain
/// to when they must present one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// How the worker clusters check the workers, and the certificate they present to them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerTls {
    /// The CA a worker's certificate must chain to.
    pub ca: PathBuf,
    /// The gateway's own certificate and key, for workers that verify their callers.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// DNS names a worker's certificate may carry (any one suffices); none: any certificate
    /// the CA signed.
    pub names: Vec<String>,
}

/// The callers allowed in, by API key, and the request header that tells the workers who
/// called (the key itself never reaches a worker or a log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeys {
    pub keys: Vec<ApiKey>,
    pub identity_header: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    /// Who holds the key: forwarded to the workers, counted in nothing else.
    pub client: String,
    pub key: String,
}

/// Callers allowed in by a token their identity provider signed: `jwt_authn` checks it
/// against a local JWKS file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jwt {
    /// The `iss` a token must carry.
    pub issuer: String,
    /// The provider's public keys (JWKS, JSON).
    pub jwks: PathBuf,
    /// `aud` values accepted (any one); none: any audience.
    pub audiences: Vec<String>,
    /// The claim that names the caller, forwarded to the workers.
    pub identity_claim: String,
    pub identity_header: String,
}

/// Who may call: a caller proves it with a listed API key, or with a signed token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Callers {
    ApiKeys(ApiKeys),
    Jwt(Jwt),
}

impl Callers {
    /// The request header that names the caller to the workers.
    pub fn identity_header(&self) -> &str {
        match self {
            Callers::ApiKeys(keys) => &keys.identity_header,
            Callers::Jwt(jwt) => &jwt.identity_header,
        }
    }
}

impl Jwt {
    pub fn check(&self) -> Result<()> {
        ensure!(
            !self.issuer.is_empty(),
            "the token issuer must not be empty"
        );
        ensure!(
            self.jwks.is_file(),
            "the JWKS file {} does not exist",
            self.jwks.display()
        );
        check_identity_header(&self.identity_header)
    }
}

fn check_identity_header(header: &str) -> Result<()> {
    ensure!(is_header_name(header), "{header:?} is not a header name");
    ensure!(
        !must_strip(header, "") && !KEY_HEADERS.contains(&header),
        "{header:?} cannot carry the caller's name: the filter removes it (docs/semantics.md §7) \
         or it holds the credential"
    );
    Ok(())
}

/// The header `api_key_auth` forwards the caller's name in, unless the operator names another:
/// the one the filter's caller rules read by default.
pub use pinroute::policy::callers::DEFAULT_IDENTITY_HEADER;
/// Where a key is read: OpenAI's clients send `Authorization: Bearer KEY`, Anthropic's
/// `x-api-key: KEY`.
pub const KEY_HEADERS: [&str; 2] = ["authorization", "x-api-key"];

impl ApiKeys {
    /// Reads a JSON list of `{"client": NAME, "key": KEY}`: names and keys non-empty, no key
    /// listed twice.
    pub fn from_file(path: &Path, identity_header: &str) -> Result<ApiKeys> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the API keys {}", path.display()))?;
        let keys: Vec<ApiKey> = serde_json::from_str(&text).with_context(|| {
            format!(
                "{}: a JSON list of {{\"client\": NAME, \"key\": KEY}}",
                path.display()
            )
        })?;
        let keys = ApiKeys {
            keys,
            identity_header: identity_header.to_ascii_lowercase(),
        };
        keys.check().with_context(|| path.display().to_string())?;
        Ok(keys)
    }

    fn check(&self) -> Result<()> {
        ensure!(!self.keys.is_empty(), "no API key listed");
        let mut seen = BTreeSet::new();
        for (position, key) in self.keys.iter().enumerate() {
            ensure!(
                !key.client.is_empty() && !key.key.is_empty(),
                "entry {position}: client and key must not be empty"
            );
            ensure!(
                key.key.bytes().all(|b| b.is_ascii_graphic()),
                "entry {position}: a key is printable ASCII without spaces"
            );
            ensure!(
                seen.insert(key.key.as_str()),
                "entry {position}: the key of an earlier entry"
            );
        }
        check_identity_header(&self.identity_header)
    }
}

/// The listener's `transport_socket` (a line of YAML, JSON flow style), or nothing without
/// TLS. The certificate files are watched: replacing them by a move (as Kubernetes updates a
/// mounted secret) makes Envoy load the new ones without a restart.
pub fn listener_transport_socket(tls: Option<&ListenerTls>) -> Result<String> {
    let Some(tls) = tls else {
        return Ok(String::new());
    };
    let mut common = Map::new();
    // HTTP/2 when the client offers it (the connection manager's codec is AUTO).
    common.insert("alpn_protocols".into(), json!(["h2", "http/1.1"]));
    common.insert(
        "tls_certificates".into(),
        json!([certificate(&tls.cert, &tls.key)?]),
    );
    let mut context = Map::new();
    if let Some(ca) = &tls.client_ca {
        common.insert(
            "validation_context".into(),
            json!({"trusted_ca": file(ca)?}),
        );
        context.insert("require_client_certificate".into(), json!(true));
    }
    context.insert("common_tls_context".into(), Value::Object(common));
    transport_socket(DOWNSTREAM_TLS, context)
}

/// A worker cluster's `transport_socket`, or nothing without TLS to the workers. The same
/// for the three worker clusters: the filter's own prefill call goes through one of them.
pub fn worker_transport_socket(tls: Option<&WorkerTls>) -> Result<String> {
    let Some(tls) = tls else {
        return Ok(String::new());
    };
    let mut validation = Map::new();
    validation.insert("trusted_ca".into(), file(&tls.ca)?);
    if !tls.names.is_empty() {
        let names: Vec<Value> = tls
            .names
            .iter()
            .map(|name| json!({"san_type": "DNS", "matcher": {"exact": name}}))
            .collect();
        validation.insert("match_typed_subject_alt_names".into(), Value::Array(names));
    }
    let mut common = Map::new();
    common.insert("validation_context".into(), Value::Object(validation));
    if let Some((cert, key)) = &tls.client_cert {
        common.insert("tls_certificates".into(), json!([certificate(cert, key)?]));
    }
    let mut context = Map::new();
    context.insert("common_tls_context".into(), Value::Object(common));
    transport_socket(UPSTREAM_TLS, context)
}

/// The filter that checks callers, one more item of `http_filters` (after CORS, so that
/// preflights, which carry no credential, are still answered; before the picker and the
/// filter, so that a refused caller costs neither), or nothing when anyone may call.
pub fn caller_filter(callers: Option<&Callers>) -> Result<String> {
    let filter = match callers {
        None => return Ok(String::new()),
        Some(Callers::ApiKeys(keys)) => api_key_filter(keys),
        Some(Callers::Jwt(jwt)) => jwt_filter(jwt)?,
    };
    Ok(format!("- {filter}"))
}

fn api_key_filter(keys: &ApiKeys) -> Value {
    let credentials: Vec<Value> = keys
        .keys
        .iter()
        .map(|k| json!({"key": k.key, "client": k.client}))
        .collect();
    let sources: Vec<Value> = KEY_HEADERS.iter().map(|h| json!({"header": h})).collect();
    json!({
        "name": "envoy.filters.http.api_key_auth",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.api_key_auth.v3.ApiKeyAuth",
            "credentials": credentials,
            "key_sources": sources,
            // The caller's name to the workers; the key to no one.
            "forwarding": {"header": keys.identity_header, "hide_credentials": true},
        },
    })
}

/// `jwt_authn` requiring a token from the one provider on every route: read from
/// `Authorization: Bearer`, removed once checked (`forward: false`), its identity claim
/// forwarded.
fn jwt_filter(jwt: &Jwt) -> Result<Value> {
    let mut provider = json!({
        "issuer": jwt.issuer,
        "local_jwks": file(&jwt.jwks)?,
        "forward": false,
        "claim_to_headers": [{"header_name": jwt.identity_header, "claim_name": jwt.identity_claim}],
    });
    if let Some(provider) = provider
        .as_object_mut()
        .filter(|_| !jwt.audiences.is_empty())
    {
        provider.insert("audiences".into(), json!(jwt.audiences));
    }
    Ok(json!({
        "name": "envoy.filters.http.jwt_authn",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
            "providers": {"pinroute": provider},
            "rules": [{"match": {"prefix": "/"}, "requires": {"provider_name": "pinroute"}}],
        },
    }))
}

/// The edge's removal of a client's own copy of the identity header, which only the
/// caller filter may set.
pub fn identity_header_removal(callers: Option<&Callers>) -> Result<String> {
    match callers {
        Some(callers) => Ok(format!(
            "- remove: {}",
            super::bootstrap::yaml_string(callers.identity_header())?
        )),
        None => Ok(String::new()),
    }
}

fn transport_socket(context_type: &str, mut context: Map<String, Value>) -> Result<String> {
    context.insert("@type".into(), json!(context_type));
    let socket = json!({"name": TLS_SOCKET, "typed_config": context});
    Ok(format!("transport_socket: {socket}"))
}

fn certificate(cert: &Path, key: &Path) -> Result<Value> {
    Ok(json!({"certificate_chain": file(cert)?, "private_key": file(key)?}))
}

fn file(path: &Path) -> Result<Value> {
    Ok(json!({"filename": absolute_utf8(path)?}))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn socket(line: &str) -> Value {
        let json = line.strip_prefix("transport_socket: ").unwrap();
        serde_json::from_str::<Value>(json).unwrap()["typed_config"].clone()
    }

    #[test]
    fn without_tls_nothing_is_rendered() {
        assert_eq!(listener_transport_socket(None).unwrap(), "");
        assert_eq!(worker_transport_socket(None).unwrap(), "");
        assert_eq!(caller_filter(None).unwrap(), "");
        assert_eq!(identity_header_removal(None).unwrap(), "");
    }

    #[test]
    fn client_certificates_are_required_only_with_a_client_ca() {
        let tls = ListenerTls {
            cert: "/tls/cert.pem".into(),
            key: "/tls/key.pem".into(),
            client_ca: None,
        };
        let context = socket(&listener_transport_socket(Some(&tls)).unwrap());
        assert_eq!(context["@type"], DOWNSTREAM_TLS);
        assert_eq!(
            context["common_tls_context"]["alpn_protocols"],
            json!(["h2", "http/1.1"])
        );
        assert!(context.get("require_client_certificate").is_none());
        let mutual = ListenerTls {
            client_ca: Some("/tls/ca.pem".into()),
            ..tls
        };
        let context = socket(&listener_transport_socket(Some(&mutual)).unwrap());
        assert_eq!(context["require_client_certificate"], true);
        assert_eq!(
            context["common_tls_context"]["validation_context"]["trusted_ca"]["filename"],
            "/tls/ca.pem"
        );
    }

    #[test]
    fn workers_are_checked_against_the_ca_and_the_listed_names() {
        let tls = WorkerTls {
            ca: "/tls/ca.pem".into(),
            client_cert: Some(("/tls/gw.pem".into(), "/tls/gw.key".into())),
            names: vec!["vllm.llm.svc".into()],
        };
        let context = socket(&worker_transport_socket(Some(&tls)).unwrap());
        let common = &context["common_tls_context"];
        assert_eq!(
            common["validation_context"]["match_typed_subject_alt_names"],
            json!([{"san_type": "DNS", "matcher": {"exact": "vllm.llm.svc"}}])
        );
        assert_eq!(
            common["tls_certificates"][0]["private_key"]["filename"],
            "/tls/gw.key"
        );
    }

    #[test]
    fn a_key_file_is_checked_before_anything_is_rendered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.json");
        for (text, expected) in [
            ("[]", "no API key"),
            (r#"[{"client": "", "key": "k"}]"#, "must not be empty"),
            (r#"[{"client": "a", "key": "k 1"}]"#, "without spaces"),
            (
                r#"[{"client": "a", "key": "k"}, {"client": "b", "key": "k"}]"#,
                "earlier entry",
            ),
            (r#"[{"client": "a", "secret": "k"}]"#, "JSON list"),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = ApiKeys::from_file(&path, DEFAULT_IDENTITY_HEADER).unwrap_err();
            assert!(format!("{err:#}").contains(expected), "{text}: {err:#}");
            assert!(!format!("{err:#}").contains("\"k\""), "no key is echoed");
        }
        std::fs::write(&path, r#"[{"client": "team-a", "key": "sk-1"}]"#).unwrap();
        for header in [
            "x-pinroute-caller",
            "x-dynamo-worker-instance-id",
            "authorization",
        ] {
            let err = ApiKeys::from_file(&path, header).unwrap_err();
            assert!(
                format!("{err:#}").contains("cannot carry"),
                "{header}: {err:#}"
            );
        }
        let keys = ApiKeys::from_file(&path, "X-Caller").unwrap();
        assert_eq!(keys.identity_header, "x-caller");
        let rendered = caller_filter(Some(&Callers::ApiKeys(keys))).unwrap();
        let filter: Value = serde_json::from_str(rendered.strip_prefix("- ").unwrap()).unwrap();
        assert_eq!(
            filter["typed_config"]["forwarding"],
            json!({"header": "x-caller", "hide_credentials": true})
        );
    }
}
