//! TLS and passwords for every connection the sink opens, as libpq does
//! them.
//!
//! The connection string takes libpq's `sslmode` (`disable`, `prefer`
//! — the default —, `require`, `verify-ca`, `verify-full`), `sslrootcert`
//! (a PEM file of trusted CAs, or `system` for the system's trust store;
//! default `~/.postgresql/root.crt`), `sslcert` and `sslkey` (a client
//! certificate and its unencrypted key, for `cert` authentication), also
//! from `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY`. As in
//! libpq, `prefer` and `require` encrypt without checking the certificate
//! — unless a root certificate file is there, which makes `require` check
//! the CA like `verify-ca` — `verify-ca` checks that a trusted CA signed
//! it and `verify-full` also that it is issued for the host connected to.
//! TLS runs on rustls (through `tokio-postgres-rustls`, which also gives
//! SCRAM channel binding).//!
//! The settings come from the connection string ([`super::url`]).
//!
//! Refused connections that no retry can fix — an untrusted or misnamed
//! certificate, a server that requires TLS reached without it, a wrong or
//! missing password — are fatal errors naming the setting and the fix.

use std::path::Path;
use std::sync::Arc;

use exactly_core::ConnectorError;
use exactly_tls::PartialVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{CertificateError, ClientConfig, RootCertStore};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Connection, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::error::connect_error;
use crate::url::{fill_password, RootCert, SslMode, TlsSettings};

const CONTEXT: &str = "postgres sink: connecting";

/// The stream under a connection (TLS, or plain when sslmode allows).
pub(crate) type TlsStream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

/// The rustls settings for `tls`. A CA or client certificate file that
/// cannot be read is a fatal error naming its key.
fn client_config(tls: &TlsSettings) -> Result<ClientConfig, ConnectorError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    match &tls.root_cert {
        Some(RootCert::File(path)) => {
            let certificates = read_certificates(path, "sslrootcert")?;
            roots.add_parsable_certificates(certificates);
            if roots.is_empty() {
                return Err(config_error(
                    "sslrootcert",
                    &format!("{} holds no usable CA certificate", path.display()),
                ));
            }
        }
        Some(RootCert::System) => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
        None => {}
    }
    let check = match tls.mode {
        SslMode::VerifyFull => Check::Full,
        SslMode::VerifyCa => Check::CaOnly,
        // libpq: `require` with a root certificate file behaves as verify-ca.
        SslMode::Require if tls.root_cert.is_some() => Check::CaOnly,
        _ => Check::None,
    };
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error("sslmode", "no TLS version available").caused_by(e))?;
    let roots = Arc::new(roots);
    let builder = match check {
        Check::Full => builder.with_root_certificates(roots),
        Check::CaOnly => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PartialVerifier::trusted_chain(roots, provider))),
        Check::None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PartialVerifier::no_certificate_check(provider))),
    };
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let chain = read_certificates(cert, "sslcert")?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                config_error(
                    "sslkey",
                    &format!(
                        "cannot read a PEM private key from {} (give an unencrypted key)",
                        key.display()
                    ),
                )
                .caused_by(e)
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| config_error("sslkey", "does not fit the certificate of sslcert").caused_by(e))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

fn read_certificates(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, ConnectorError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            config_error(key, &format!("cannot read PEM certificates from {}", path.display())).caused_by(e)
        })?;
    if certificates.is_empty() {
        return Err(config_error(
            key,
            &format!("{} holds no PEM certificate", path.display()),
        ));
    }
    Ok(certificates)
}

fn config_error(key: &str, problem: &str) -> ConnectorError {
    ConnectorError::fatal(CONTEXT, format!("`{key}` in sink.postgres.url: {problem}"))
}

/// Opens a connection with `config` (the sink's settings plus what the
/// caller set, e.g. `application_name`) and the TLS of `tls`, filling the
/// password in as libpq does. `url` is the redacted server for messages.
pub(crate) async fn connect(
    config: &tokio_postgres::Config,
    tls: &TlsSettings,
    url: &str,
) -> Result<(Client, Connection<Socket, TlsStream>), ConnectorError> {
    let mut config = config.clone();
    fill_password(&mut config);
    let connector = MakeRustlsConnect::new(client_config(tls)?);
    config
        .connect(connector)
        .await
        .map_err(|error| refused(url, tls, &config, error))
}

/// Connection failures that need a setting changed are fatal and say
/// which; everything else is left to [`connect_error`]. Each keeps `error`
/// as its cause.
fn refused(
    url: &str,
    tls: &TlsSettings,
    config: &tokio_postgres::Config,
    error: tokio_postgres::Error,
) -> ConnectorError {
    let Some(message) = refusal(url, tls, config, &error) else {
        return connect_error(url, error);
    };
    ConnectorError::fatal(CONTEXT, message).caused_by(error)
}

/// What a connection failure that needs a setting changed says, if it is
/// one.
fn refusal(
    url: &str,
    tls: &TlsSettings,
    config: &tokio_postgres::Config,
    error: &tokio_postgres::Error,
) -> Option<String> {
    let fatal = Some;
    if let Some(db) = error.as_db_error() {
        let message = db.message();
        if db.code().code() == "28000" && message.contains("no encryption") {
            return fatal(format!(
                "PostgreSQL at {url} accepts this user only over TLS ({message}); fix: set sslmode=require, or \
                 verify-full with sslrootcert, in sink.postgres.url"
            ));
        }
        if db.code().code() == "28P01" {
            return fatal(format!(
                "PostgreSQL at {url} refused the password of user `{}` ({message}); fix: check the password in \
                 PGPASSWORD, the password file (PGPASSFILE, ~/.pgpass) or sink.postgres.url (e.g. url = {{ env = \
                 \"…\" }})",
                config.get_user().unwrap_or_default()
            ));
        }
        return None;
    }
    let text = with_causes(error);
    if text.contains("password missing") {
        return fatal(format!(
            "PostgreSQL at {url} asks for a password for user `{}` and none is set; fix: set PGPASSWORD, add a \
             line to the password file (PGPASSFILE, ~/.pgpass), or put it in sink.postgres.url",
            config.get_user().unwrap_or_default()
        ));
    }
    if let Some(rustls_error) = rustls_cause(error) {
        let (problem, fix) = match rustls_error {
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer | CertificateError::BadSignature) => (
                "the server's certificate is not signed by a trusted CA".to_string(),
                if tls.root_cert_given {
                    "set sslrootcert to the PEM file of the CA that signed the server's certificate".to_string()
                } else {
                    "set sslrootcert in sink.postgres.url to the PEM file of the CA that signed the server's \
                     certificate"
                        .to_string()
                },
            ),
            rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ) => (
                "the server's certificate is not issued for the host name connected to (sslmode=verify-full)"
                    .to_string(),
                "connect to a host name the certificate names (host in sink.postgres.url; hostaddr can give the \
                 address), or use sslmode=verify-ca to check only the CA"
                    .to_string(),
            ),
            rustls::Error::InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. }) => (
                "the server's certificate has expired".to_string(),
                "renew the server's certificate".to_string(),
            ),
            rustls::Error::AlertReceived(alert) => (
                format!("the server ended the TLS handshake ({alert:?})"),
                "if the server requires client certificates, set sslcert and sslkey in sink.postgres.url".to_string(),
            ),
            _ => (
                "the TLS handshake failed".to_string(),
                "check sslmode, sslrootcert, sslcert and sslkey in sink.postgres.url".to_string(),
            ),
        };
        return fatal(format!("TLS with PostgreSQL at {url} failed: {problem}; fix: {fix}"));
    }
    if text.contains("server does not support TLS") {
        return fatal(format!(
            "PostgreSQL at {url} does not offer TLS and sslmode asks for it; fix: enable ssl on the server, or set \
             sslmode=prefer (or disable) in sink.postgres.url"
        ));
    }
    None
}

/// `error` and its causes, `: `-separated.
fn with_causes(error: &tokio_postgres::Error) -> String {
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(current) = cause {
        text.push_str(&format!(": {current}"));
        cause = current.source();
    }
    text
}

/// The rustls error somewhere in `error`'s causes.
fn rustls_cause(error: &tokio_postgres::Error) -> Option<&rustls::Error> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(current) = cause {
        if let Some(found) = current.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        if let Some(io) = current.downcast_ref::<std::io::Error>() {
            if let Some(found) = io.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
                return Some(found);
            }
        }
        cause = current.source();
    }
    None
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    Full,
    CaOnly,
    None,
}
