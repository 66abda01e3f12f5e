//! libpq's TLS settings in a PostgreSQL connection string, for clients that
//! connect with tokio-postgres and rustls (the PostgreSQL checkpoint store;
//! the PostgreSQL sink keeps the same rules in its own module).
//!
//! The connection string is a URL (`postgres://…?sslmode=…`) or libpq's
//! `key=value` form. It takes `sslmode` (`disable`, `prefer` — the default —,
//! `require`, `verify-ca`, `verify-full`; `allow` is refused), `sslrootcert`
//! (a PEM file of trusted CAs, or `system`; default
//! `~/.postgresql/root.crt` when it exists), `sslcert` and `sslkey` (a
//! client certificate and its unencrypted key), each also from `PGSSLMODE`,
//! `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY`. As in libpq, `prefer` and
//! `require` encrypt without checking the certificate — unless a root
//! certificate is given, which makes `require` check the CA —, `verify-ca`
//! checks that a trusted CA signed it and `verify-full` also the host name.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::PartialVerifier;

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// TLS when the server offers it, certificate unchecked (the default).
    #[default]
    Prefer,
    /// TLS, certificate unchecked (checked against the CA when a root
    /// certificate is given).
    Require,
    /// TLS, signed by a trusted CA, any name.
    VerifyCa,
    /// TLS, signed by a trusted CA, for the host connected to.
    VerifyFull,
}

/// Where the trusted CAs come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file.
    File(PathBuf),
    /// `sslrootcert=system`: the system's trust store.
    System,
}

/// The TLS settings of a connection string.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// `sslmode`.
    pub mode: SslMode,
    /// `sslrootcert`, or `~/.postgresql/root.crt` when it exists.
    pub root_cert: Option<RootCert>,
    /// Whether `root_cert` was given (not the default file).
    pub root_cert_given: bool,
    /// `sslcert`.
    pub cert: Option<PathBuf>,
    /// `sslkey`.
    pub key: Option<PathBuf>,
}

const TLS_KEYS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// Splits `url` into the connection string without the TLS keys (for the
/// driver) and the TLS settings, with libpq's environment variables and
/// default root file filled in. The error names what is wrong, without the
/// password.
pub fn split(url: &str) -> Result<(String, TlsSettings), String> {
    split_in(
        url,
        &|name| std::env::var(name).ok(),
        std::env::var_os("HOME").map(PathBuf::from).as_deref(),
    )
}

/// [`split`] with the environment `env` and the home folder `home`.
pub fn split_in(
    url: &str,
    env: &dyn Fn(&str) -> Option<String>,
    home: Option<&Path>,
) -> Result<(String, TlsSettings), String> {
    let (rest, taken) = take_tls_keys(url)?;
    let value = |key: &str, var: &str| {
        taken
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .or_else(|| env(var).filter(|v| !v.is_empty()))
    };
    let mode = match value("sslmode", "PGSSLMODE").as_deref() {
        None | Some("prefer") => SslMode::Prefer,
        Some("disable") => SslMode::Disable,
        Some("require") => SslMode::Require,
        Some("verify-ca") => SslMode::VerifyCa,
        Some("verify-full") => SslMode::VerifyFull,
        Some("allow") => {
            return Err(
                "sslmode=allow tries without TLS first; use sslmode=prefer (TLS when the server offers it) or \
                 sslmode=disable"
                    .into(),
            )
        }
        Some(other) => {
            return Err(format!(
                "sslmode={other} is not one of disable, prefer, require, verify-ca, verify-full"
            ))
        }
    };
    let given_root = value("sslrootcert", "PGSSLROOTCERT");
    let root_cert_given = given_root.is_some();
    let root_cert = match given_root {
        Some(root) if root == "system" => Some(RootCert::System),
        Some(root) => Some(RootCert::File(PathBuf::from(root))),
        None => home
            .map(|home| home.join(".postgresql").join("root.crt"))
            .filter(|p| p.is_file())
            .map(RootCert::File),
    };
    let cert = value("sslcert", "PGSSLCERT").map(PathBuf::from);
    let key = value("sslkey", "PGSSLKEY").map(PathBuf::from);
    if cert.is_some() != key.is_some() {
        return Err("a client certificate needs sslcert and sslkey together".into());
    }
    if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && root_cert.is_none() {
        return Err(format!(
            "sslmode={} checks the server's certificate, and no CA is given: set sslrootcert to the PEM file of \
             the CA that signed it (or sslrootcert=system for the system's CAs), or put it in \
             ~/.postgresql/root.crt",
            if mode == SslMode::VerifyCa {
                "verify-ca"
            } else {
                "verify-full"
            }
        ));
    }
    Ok((
        rest,
        TlsSettings {
            mode,
            root_cert,
            root_cert_given,
            cert,
            key,
        },
    ))
}

/// The connection string without [`TLS_KEYS`], and their values.
fn take_tls_keys(url: &str) -> Result<(String, Vec<(String, String)>), String> {
    let mut taken = Vec::new();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_string(), taken));
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if TLS_KEYS.contains(&key) {
                taken.push((key.to_string(), percent_decode(value)?));
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return Ok((rest, taken));
    }
    let mut kept = Vec::new();
    for (key, value) in key_values(url)? {
        if TLS_KEYS.contains(&key.as_str()) {
            taken.push((key, value));
        } else {
            let escaped = value.replace('\\', "\\\\").replace('\'', "\\'");
            kept.push(format!("{key}='{escaped}'"));
        }
    }
    Ok((kept.join(" "), taken))
}

/// `%XX` escapes of a URL query value.
fn percent_decode(value: &str) -> Result<String, String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("`{value}` has a broken %-escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{value}` is not UTF-8 once decoded"))
}

/// The pairs of a libpq `key=value` string (values optionally in single
/// quotes, `\` escaping).
fn key_values(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    let skip_spaces = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
    };
    loop {
        skip_spaces(&mut chars);
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        skip_spaces(&mut chars);
        if chars.next() != Some('=') {
            return Err(format!("`{key}` has no `=value`"));
        }
        skip_spaces(&mut chars);
        let mut value = String::new();
        let quoted = chars.peek() == Some(&'\'');
        if quoted {
            chars.next();
        }
        loop {
            match chars.next() {
                Some('\\') => value.push(chars.next().ok_or("a value ends in `\\`")?),
                Some('\'') if quoted => break,
                Some(c) if !quoted && c.is_whitespace() => break,
                Some(c) => value.push(c),
                None if quoted => return Err(format!("the value of `{key}` has no closing quote")),
                None => break,
            }
        }
        pairs.push((key, value));
    }
}

/// The rustls settings for `tls` (`sslmode=disable` needs none). A CA or
/// client certificate file that cannot be read is an error naming its key.
pub fn client_config(tls: &TlsSettings) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    match &tls.root_cert {
        Some(RootCert::File(path)) => {
            roots.add_parsable_certificates(read_certificates(path, "sslrootcert")?);
            if roots.is_empty() {
                return Err(format!(
                    "sslrootcert: {} holds no usable CA certificate",
                    path.display()
                ));
            }
        }
        Some(RootCert::System) => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
        None => {}
    }
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("no TLS version available: {e}"))?;
    let roots = Arc::new(roots);
    let builder = match tls.mode {
        SslMode::VerifyFull => builder.with_root_certificates(roots),
        SslMode::VerifyCa => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PartialVerifier::trusted_chain(roots, provider))),
        SslMode::Require if tls.root_cert.is_some() => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PartialVerifier::trusted_chain(roots, provider))),
        _ => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PartialVerifier::no_certificate_check(provider))),
    };
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let chain = read_certificates(cert, "sslcert")?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                format!(
                    "sslkey: cannot read a PEM private key from {}: {e} (give an unencrypted key)",
                    key.display()
                )
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("sslkey does not fit the certificate of sslcert: {e}"))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

fn read_certificates(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{key}: cannot read PEM certificates from {}: {e}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!("{key}: {} holds no PEM certificate", path.display()));
    }
    Ok(certificates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn urls_and_key_values_lose_their_tls_keys_to_the_settings() {
        let (rest, tls) = split_in(
            "postgres://u:p@db:5432/x?sslmode=verify-ca&sslrootcert=%2Fca.pem&application_name=a",
            &none,
            None,
        )
        .unwrap();
        assert_eq!(rest, "postgres://u:p@db:5432/x?application_name=a");
        assert_eq!(tls.mode, SslMode::VerifyCa);
        assert_eq!(tls.root_cert, Some(RootCert::File("/ca.pem".into())));
        let (rest, tls) = split_in("host=db user='o\\'k' sslmode=require", &none, None).unwrap();
        assert_eq!(rest, "host='db' user='o\\'k'");
        assert_eq!(tls.mode, SslMode::Require);
        let (_, tls) = split_in(
            "postgres://db/x",
            &|v| (v == "PGSSLMODE").then(|| "disable".into()),
            None,
        )
        .unwrap();
        assert_eq!(tls.mode, SslMode::Disable, "from the environment");
    }

    #[test]
    fn settings_that_cannot_work_are_refused() {
        assert!(split_in("postgres://db/x?sslmode=allow", &none, None).is_err());
        assert!(split_in("postgres://db/x?sslmode=verify-full", &none, None)
            .unwrap_err()
            .contains("sslrootcert"));
        assert!(split_in("postgres://db/x?sslcert=/c.pem", &none, None).is_err());
        assert!(split_in("host=db user='open", &none, None).is_err());
    }
}
