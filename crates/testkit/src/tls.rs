//! Certificates for secured test services: a certificate authority made
//! for one test run (rcgen, ECDSA P-256), and server and client
//! certificates it signs, written as PEM files.
//!
//! Nothing here is meant to protect anything: the keys live in a temp
//! folder for the life of a test.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

use crate::error::{Result, TestkitError};

const SERVICE: &str = "test certificates";

/// A certificate and its private key (unencrypted PKCS#8), as PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, `PRIVATE KEY`).
    pub key: PathBuf,
}

/// A certificate authority of one test run, whose certificate is
/// [`ca_file`](Self::ca_file). Every CA generated is a new one: a client
/// that trusts one refuses the certificates of another.
pub struct TestCa {
    dir: PathBuf,
    ca_file: PathBuf,
    key: KeyPair,
    certificate: rcgen::Certificate,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").field("ca_file", &self.ca_file).finish()
    }
}

impl TestCa {
    /// A new CA, its certificate written to `<dir>/ca.crt` (`dir` is
    /// created if missing).
    pub fn generate(dir: &Path) -> Result<TestCa> {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let key = KeyPair::generate().map_err(rcgen_error("generating the CA key"))?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rcgen_error("CA parameters"))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("exactly-testkit CA {}", std::process::id()));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let certificate = params.self_signed(&key).map_err(rcgen_error("signing the CA"))?;
        let ca_file = dir.join("ca.crt");
        write(&ca_file, &certificate.pem())?;
        Ok(TestCa {
            dir: dir.to_path_buf(),
            ca_file,
            key,
            certificate,
        })
    }

    /// The CA's certificate (PEM): what clients trust.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// A server certificate for `hosts` (DNS names, or IP addresses, which
    /// become IP subject alternative names), written to `<name>.crt` and
    /// `<name>.key` beside the CA's.
    pub fn server_cert(&self, name: &str, hosts: &[&str]) -> Result<CertFiles> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rcgen_error("server parameters"))?;
        for host in hosts {
            let san = match host.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(
                    (*host)
                        .try_into()
                        .map_err(rcgen_error("a server certificate's host name"))?,
                ),
            };
            params.subject_alt_names.push(san);
        }
        params
            .distinguished_name
            .push(DnType::CommonName, hosts.first().copied().unwrap_or(name));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        self.issue(name, params)
    }

    /// A client certificate whose subject common name is `common_name`
    /// (PostgreSQL's `cert` authentication takes it as the user name).
    pub fn client_cert(&self, name: &str, common_name: &str) -> Result<CertFiles> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rcgen_error("client parameters"))?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.issue(name, params)
    }

    fn issue(&self, name: &str, params: CertificateParams) -> Result<CertFiles> {
        let key = KeyPair::generate().map_err(rcgen_error("generating a key"))?;
        let certificate = params
            .signed_by(&key, &self.certificate, &self.key)
            .map_err(rcgen_error("signing a certificate"))?;
        let files = CertFiles {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
        };
        write(&files.cert, &certificate.pem())?;
        write(&files.key, &key.serialize_pem())?;
        restrict(&files.key)?;
        Ok(files)
    }
}

/// Owner-only permissions: PostgreSQL refuses a key others can read.
pub(crate) fn restrict(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io(format!("restricting {}", path.display())))
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(io(format!("writing {}", path.display())))
}

fn io(action: String) -> impl FnOnce(std::io::Error) -> TestkitError {
    move |source| TestkitError::Io {
        service: SERVICE,
        action,
        fix: "make sure the temp folder is writable",
        source,
    }
}

fn rcgen_error(action: &'static str) -> impl FnOnce(rcgen::Error) -> TestkitError {
    move |error| TestkitError::Io {
        service: SERVICE,
        action: action.to_string(),
        fix: "this is a bug of the test kit's certificate generation",
        source: std::io::Error::other(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_signs_server_and_client_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::generate(dir.path()).unwrap();
        let server = ca.server_cert("server", &["localhost", "127.0.0.1"]).unwrap();
        let client = ca.client_cert("client", "exactly").unwrap();
        for file in [ca.ca_file(), &server.cert, &client.cert] {
            let text = std::fs::read_to_string(file).unwrap();
            assert!(text.starts_with("-----BEGIN CERTIFICATE-----"), "{text}");
        }
        for key in [&server.key, &client.key] {
            let text = std::fs::read_to_string(key).unwrap();
            assert!(text.starts_with("-----BEGIN PRIVATE KEY-----"), "{text}");
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(key).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let other = TestCa::generate(&dir.path().join("other")).unwrap();
        assert_ne!(
            std::fs::read(ca.ca_file()).unwrap(),
            std::fs::read(other.ca_file()).unwrap()
        );
    }
}
