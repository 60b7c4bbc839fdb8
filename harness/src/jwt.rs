//! A token issuer for the JWT tests (`docs/deploy.md` §2.8): an ES256 key whose public half
//! is written as a JWKS file for Envoy's `jwt_authn`, and tokens it signs.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde_json::{Value, json};

const KEY_ID: &str = "pinroute-test";

pub struct TokenIssuer {
    pub issuer: String,
    key: EcdsaKeyPair,
    rng: SystemRandom,
}

impl TokenIssuer {
    /// A fresh key for `issuer`.
    pub fn new(issuer: &str) -> Result<TokenIssuer> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|_| anyhow!("generating a P-256 key"))?;
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .map_err(|_| anyhow!("reading the P-256 key"))?;
        Ok(TokenIssuer {
            issuer: issuer.to_owned(),
            key,
            rng,
        })
    }

    /// The public key as a JWKS document.
    pub fn jwks(&self) -> Value {
        // An uncompressed P-256 point: 0x04, then x and y, 32 bytes each.
        let point = self.key.public_key().as_ref();
        let coordinates = point.get(1..).unwrap_or_default();
        let (x, y) = coordinates.split_at(coordinates.len() / 2);
        json!({"keys": [{
            "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": KEY_ID,
            "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y),
        }]})
    }

    /// Writes [`Self::jwks`] to `path`.
    pub fn write_jwks(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.jwks().to_string())
            .with_context(|| format!("writing {}", path.display()))
    }

    /// A token for `subject` and `audience` that expires `lifetime` from now (a negative
    /// lifetime, as `expired_by`, makes it expired already).
    pub fn token(&self, subject: &str, audience: &str, lifetime: Lifetime) -> Result<String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let expiry = match lifetime {
            Lifetime::ValidFor(d) => now.saturating_add(d.as_secs()),
            Lifetime::ExpiredFor(d) => now.saturating_sub(d.as_secs()),
        };
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": KEY_ID});
        let claims = json!({
            "iss": self.issuer, "sub": subject, "aud": audience,
            "iat": now.saturating_sub(60), "exp": expiry,
        });
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = self
            .key
            .sign(&self.rng, input.as_bytes())
            .map_err(|_| anyhow!("signing a token"))?;
        Ok(format!(
            "{input}.{}",
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        ))
    }
}

/// How long a token is valid, or how long ago it expired.
#[derive(Debug, Clone, Copy)]
pub enum Lifetime {
    ValidFor(Duration),
    ExpiredFor(Duration),
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn a_token_has_three_parts_and_names_its_issuer() {
        let issuer = TokenIssuer::new("https://issuer.test").unwrap();
        let token = issuer
            .token(
                "team-a",
                "pinroute",
                Lifetime::ValidFor(Duration::from_secs(60)),
            )
            .unwrap();
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3);
        let claims: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["iss"], "https://issuer.test");
        assert_eq!(URL_SAFE_NO_PAD.decode(parts[2]).unwrap().len(), 64);
        let jwks = issuer.jwks();
        assert_eq!(
            URL_SAFE_NO_PAD
                .decode(jwks["keys"][0]["x"].as_str().unwrap())
                .unwrap()
                .len(),
            32
        );
    }
}
