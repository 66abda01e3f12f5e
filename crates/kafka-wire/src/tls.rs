//! TLS for connections to `SSL` and `SASL_SSL` listeners, on rustls (ring):
//! the trusted CAs of `ssl.ca.location` (or the system's), an optional
//! client certificate, and the certificate check librdkafka's settings ask
//! for. A failed handshake becomes a [`WireError::Tls`] naming the problem
//! and the setting that fixes it.

use std::io;
use std::path::Path;
use std::sync::Arc;

use exactly_tls::PartialVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{CertificateError, ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::error::WireError;
use crate::security::{CertificateCheck, TlsSettings};

/// The rustls client settings for `settings`. Reads the CA and client
/// certificate files; an unreadable or empty one is an
/// [`WireError::InvalidConfig`] naming its setting.
pub(crate) fn client_config(settings: &TlsSettings) -> Result<Arc<ClientConfig>, WireError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = Arc::new(trusted_roots(settings)?);
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("security.protocol", format!("no TLS version available: {e}")))?;
    let builder = match settings.check {
        CertificateCheck::Full => builder.with_root_certificates(roots),
        CertificateCheck::CaOnly => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PartialVerifier::trusted_chain(roots, provider))),
        CertificateCheck::None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PartialVerifier::no_certificate_check(provider))),
    };
    let config = match (&settings.certificate_location, &settings.key_location) {
        (Some(certificate), Some(key)) => {
            let chain = read_certificates(certificate, "ssl.certificate.location")?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                invalid(
                    "ssl.key.location",
                    format!(
                        "cannot read a PEM private key from {}: {e}; give an unencrypted PKCS#8, PKCS#1 or SEC1 key",
                        key.display()
                    ),
                )
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                invalid(
                    "ssl.key.location",
                    format!("the key does not fit the certificate of ssl.certificate.location: {e}"),
                )
            })?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The CAs of `ssl.ca.location` / `ssl.ca.pem`, else the system's.
fn trusted_roots(settings: &TlsSettings) -> Result<RootCertStore, WireError> {
    let mut roots = RootCertStore::empty();
    let mut add = |certificates: Vec<CertificateDer<'static>>, key: &str, origin: &str| {
        let (added, _ignored) = roots.add_parsable_certificates(certificates);
        if added == 0 {
            return Err(invalid(key, format!("{origin} holds no usable CA certificate")));
        }
        Ok(())
    };
    if let Some(location) = &settings.ca_location {
        let certificates = if location.is_dir() {
            let mut all = Vec::new();
            let entries = std::fs::read_dir(location)
                .map_err(|e| invalid("ssl.ca.location", format!("cannot list {}: {e}", location.display())))?;
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_file() {
                    all.extend(CertificateDer::pem_file_iter(&path).into_iter().flatten().flatten());
                }
            }
            all
        } else {
            read_certificates(location, "ssl.ca.location")?
        };
        add(certificates, "ssl.ca.location", &location.display().to_string())?;
    }
    if let Some(pem) = &settings.ca_pem {
        let certificates: Vec<_> = CertificateDer::pem_slice_iter(pem.as_bytes()).flatten().collect();
        add(certificates, "ssl.ca.pem", "ssl.ca.pem")?;
    }
    if settings.ca_location.is_none() && settings.ca_pem.is_none() {
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        if roots.is_empty() {
            return Err(invalid(
                "ssl.ca.location",
                "is not set and the system trust store holds no CA certificate; set it to the PEM file of the CA \
                 that signed the brokers' certificates",
            ));
        }
    }
    Ok(roots)
}

/// Every certificate of the PEM file `path`.
fn read_certificates(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, WireError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            invalid(
                key,
                format!("cannot read PEM certificates from {}: {e}", path.display()),
            )
        })?;
    if certificates.is_empty() {
        return Err(invalid(key, format!("{} holds no PEM certificate", path.display())));
    }
    Ok(certificates)
}

/// Opens TLS over `stream` to `addr` (`HOST:PORT`; the host is the name the
/// certificate must be issued for).
pub(crate) async fn handshake(
    config: Arc<ClientConfig>,
    addr: &str,
    stream: TcpStream,
) -> Result<TlsStream<TcpStream>, WireError> {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_string()).map_err(|e| WireError::Tls {
        addr: addr.to_string(),
        problem: format!("`{host}` is not a host name or IP address TLS can check a certificate against ({e})"),
        fix: "write the broker as HOST:PORT in bootstrap (and in the brokers' advertised.listeners)".into(),
    })?;
    TlsConnector::from(config)
        .connect(name, stream)
        .await
        .map_err(|error| handshake_error(addr, &error))
}

/// What a failed handshake means, and which setting fixes it.
pub(crate) fn handshake_error(addr: &str, error: &io::Error) -> WireError {
    let tls = |problem: String, fix: &str| WireError::Tls {
        addr: addr.to_string(),
        problem,
        fix: fix.to_string(),
    };
    let rustls_error = error.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>());
    match rustls_error {
        Some(rustls::Error::InvalidCertificate(certificate)) => match certificate {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => tls(
                format!("the broker's certificate is not signed by a trusted CA ({certificate:?})"),
                "set ssl.ca.location to the PEM file of the CA that signed the brokers' certificates",
            ),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => tls(
                format!("the broker's certificate is not issued for the host connected to ({certificate:?})"),
                "connect to a host name the certificate names (bootstrap and the brokers' advertised.listeners), \
                 or set ssl.endpoint.identification.algorithm=none to check only that a trusted CA signed it",
            ),
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => tls(
                format!("the broker's certificate has expired ({certificate:?})"),
                "renew the brokers' certificates",
            ),
            other => tls(
                format!("the broker's certificate was refused ({other:?})"),
                "check the brokers' certificates and ssl.ca.location",
            ),
        },
        Some(rustls::Error::AlertReceived(alert)) => tls(
            format!("the broker ended the handshake with alert {alert:?}"),
            "if the broker requires client certificates, set ssl.certificate.location and ssl.key.location",
        ),
        Some(rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. }) => tls(
            format!("the broker does not answer in TLS ({error})"),
            "the listener speaks no TLS: set security.protocol to PLAINTEXT or SASL_PLAINTEXT, or use the \
             brokers' SSL / SASL_SSL listener",
        ),
        Some(other) => tls(
            format!("{other}"),
            "check security.protocol and the ssl.* settings against the broker's listener",
        ),
        None if error.kind() == io::ErrorKind::UnexpectedEof => tls(
            "the broker closed the connection during the TLS handshake".into(),
            "the listener may speak no TLS: set security.protocol to PLAINTEXT or SASL_PLAINTEXT, or use the \
             brokers' SSL / SASL_SSL listener",
        ),
        None => tls(
            format!("the handshake failed: {error}"),
            "check that the broker is reachable and its listener speaks TLS",
        ),
    }
}

fn invalid(key: &str, message: impl Into<String>) -> WireError {
    WireError::InvalidConfig {
        key: key.to_string(),
        message: message.into(),
    }
}
