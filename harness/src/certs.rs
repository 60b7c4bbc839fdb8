//! A local certificate authority for the TLS tests and `up --tls`: it issues server
//! certificates (for the gateway's listener, for workers) and client certificates (for the
//! gateway calling workers that verify it), all written as PEM files.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA whose certificate is in `ca.pem` under its folder.
pub struct LocalCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
    dir: PathBuf,
}

/// A certificate and its key, as files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What an issued certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    Server,
    Client,
}

impl LocalCa {
    /// A fresh CA named `name`, its certificate written to `dir/ca.pem`.
    pub fn create(dir: &Path, name: &str) -> Result<LocalCa> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let pem = cert.pem();
        write(&dir.join("ca.pem"), &pem)?;
        Ok(LocalCa {
            issuer: Issuer::new(params, key),
            pem,
            dir: dir.to_owned(),
        })
    }

    pub fn cert_path(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A certificate for `names` (DNS names or IP addresses), written as `<file>.pem` and
    /// `<file>.key`.
    pub fn issue(&self, file: &str, names: &[&str], usage: Usage) -> Result<Issued> {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, file);
        params.extended_key_usages = vec![match usage {
            Usage::Server => ExtendedKeyUsagePurpose::ServerAuth,
            Usage::Client => ExtendedKeyUsagePurpose::ClientAuth,
        }];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let issued = Issued {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        };
        write(&issued.cert, &cert.pem())?;
        write(&issued.key, &key.serialize_pem())?;
        Ok(issued)
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_issues_pem_files() {
        let dir = tempfile::tempdir().unwrap();
        let ca = LocalCa::create(dir.path(), "pinroute test CA").unwrap();
        let server = ca
            .issue("gateway", &["localhost", "127.0.0.1"], Usage::Server)
            .unwrap();
        let text = fs::read_to_string(&server.cert).unwrap();
        assert!(text.starts_with("-----BEGIN CERTIFICATE-----"), "{text}");
        assert!(
            fs::read_to_string(&server.key)
                .unwrap()
                .contains("PRIVATE KEY")
        );
        assert!(ca.pem().starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(ca.cert_path().is_file());
    }
}
