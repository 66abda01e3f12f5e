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
//! SCRAM channel binding).
//!
//! Without a password in the connection string, `PGPASSWORD` and then the
//! password file (`PGPASSFILE`, default `~/.pgpass`:
//! `host:port:database:user:password` lines, `*` matching anything) are
//! used, as libpq does.
//!
//! Refused connections that no retry can fix — an untrusted or misnamed
//! certificate, a server that requires TLS reached without it, a wrong or
//! missing password — are fatal errors naming the setting and the fix.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use exactly_core::ConnectorError;
use exactly_tls::PartialVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{CertificateError, ClientConfig, RootCertStore};
use tokio_postgres::config::{Host, SslMode as DriverSslMode};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Connection, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::connect_error;

const CONTEXT: &str = "postgres sink: connecting";

/// The stream under a connection (TLS, or plain when sslmode allows).
pub(crate) type TlsStream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

/// libpq's `sslmode` values (`allow` is refused: it tries without TLS
/// first, which no sink should want).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode, String> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => {
                return Err(
                    "sslmode=allow tries without TLS first; use sslmode=prefer (TLS when the server \
                            offers it) or sslmode=disable"
                        .into(),
                )
            }
            other => {
                return Err(format!(
                    "sslmode={other} is not one of disable, prefer, require, verify-ca, verify-full"
                ))
            }
        })
    }
}

/// Where the trusted CAs come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RootCert {
    /// A PEM file.
    File(PathBuf),
    /// `sslrootcert=system`: the system's trust store.
    System,
}

/// The TLS settings of a connection string.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TlsSettings {
    pub mode: SslMode,
    /// `sslrootcert`, or `~/.postgresql/root.crt` when it exists.
    pub root_cert: Option<RootCert>,
    /// Whether `root_cert` was given (not the default file).
    pub root_cert_given: bool,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// The keys this module takes out of the connection string (tokio-postgres
/// knows only some of them, and not their libpq meaning).
const TLS_KEYS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// Parses `url` (`postgres://…?sslmode=…` or `key=value …`): the driver's
/// settings without the TLS keys, and the TLS settings (with libpq's
/// environment variables and default files filled in). The error is a
/// message naming what is wrong, without the password.
pub(crate) fn parse(url: &str) -> Result<(tokio_postgres::Config, TlsSettings), String> {
    parse_in(url, &|name| std::env::var(name).ok(), home_dir().as_deref())
}

/// The home folder, where `.postgresql/` and `.pgpass` are looked for.
fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from)
}

/// [`parse`] with the environment `env` and the home folder `home`.
fn parse_in(
    url: &str,
    env: &dyn Fn(&str) -> Option<String>,
    home: Option<&Path>,
) -> Result<(tokio_postgres::Config, TlsSettings), String> {
    let (rest, taken) = take_tls_keys(url)?;
    let mut config: tokio_postgres::Config = rest.parse().map_err(|e| format!("{e}"))?;
    let value = |key: &str, var: &str| {
        taken
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .or_else(|| env(var).filter(|v| !v.is_empty()))
    };
    let mode = match value("sslmode", "PGSSLMODE") {
        Some(mode) => SslMode::parse(&mode)?,
        None => SslMode::default(),
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
    config.ssl_mode(match mode {
        SslMode::Disable => DriverSslMode::Disable,
        SslMode::Prefer => DriverSslMode::Prefer,
        _ => DriverSslMode::Require,
    });
    let tls = TlsSettings {
        mode,
        root_cert,
        root_cert_given,
        cert,
        key,
    };
    Ok((config, tls))
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
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
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
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(format!("`{key}` has no `=value`"));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    Some('\\') => value.push(chars.next().ok_or("a value ends in `\\`")?),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => return Err(format!("the value of `{key}` has no closing quote")),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    value.push(chars.next().ok_or("a value ends in `\\`")?);
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

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
        .map_err(|e| config_error("sslmode", &format!("no TLS version available: {e}")))?;
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
                        "cannot read a PEM private key from {}: {e} (give an unencrypted key)",
                        key.display()
                    ),
                )
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| config_error("sslkey", &format!("does not fit the certificate of sslcert: {e}")))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

fn read_certificates(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, ConnectorError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            config_error(
                key,
                &format!("cannot read PEM certificates from {}: {e}", path.display()),
            )
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

/// The password libpq would use when the connection string has none:
/// `PGPASSWORD`, then the first matching line of the password file.
fn fill_password(config: &mut tokio_postgres::Config) {
    if config.get_password().is_some() {
        return;
    }
    if let Some(password) = std::env::var("PGPASSWORD").ok().filter(|p| !p.is_empty()) {
        config.password(password);
        return;
    }
    let file = std::env::var_os("PGPASSFILE")
        .map(PathBuf::from)
        .or_else(|| home_dir().map(|home| home.join(".pgpass")));
    let Some(text) = file.and_then(|file| std::fs::read_to_string(file).ok()) else {
        return;
    };
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(name)) => name.clone(),
        Some(Host::Unix(_)) | None => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432).to_string();
    let user = config.get_user().unwrap_or_default().to_string();
    let database = config.get_dbname().map_or_else(|| user.clone(), str::to_string);
    if let Some(password) = passfile_password(&text, &host, &port, &database, &user) {
        config.password(password);
    }
}

/// The password of the first line of a `.pgpass` file that matches.
pub(crate) fn passfile_password(text: &str, host: &str, port: &str, database: &str, user: &str) -> Option<String> {
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .find_map(|line| {
            let fields = split_passfile_line(line);
            let [h, p, d, u, password] = fields.as_slice() else {
                return None;
            };
            let matches = |field: &str, value: &str| field == "*" || field == value;
            (matches(h, host) && matches(p, port) && matches(d, database) && matches(u, user)).then(|| password.clone())
        })
}

/// The `:`-separated fields of a password file line (`\:` and `\\`
/// escaped).
fn split_passfile_line(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    fields.last_mut().expect("one field").push(next);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().expect("one field").push(c),
        }
    }
    fields
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
        .map_err(|error| refused(url, tls, &config, &error))
}

/// Connection failures that need a setting changed are fatal and say
/// which; everything else is left to [`connect_error`].
fn refused(
    url: &str,
    tls: &TlsSettings,
    config: &tokio_postgres::Config,
    error: &tokio_postgres::Error,
) -> ConnectorError {
    let fatal = |message: String| ConnectorError::fatal(CONTEXT, message);
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
        return connect_error(url, error);
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
            other => (
                format!("TLS failed: {other}"),
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
    connect_error(url, error)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_keys_leave_the_url_and_map_to_the_driver() {
        let (config, tls) = parse(
            "postgres://app:pw@db.example:6543/shop?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.root_cert, Some(RootCert::File("/etc/ca.pem".into())));
        assert!(tls.root_cert_given);
        assert_eq!(config.get_ssl_mode(), DriverSslMode::Require);
        assert_eq!(config.get_application_name(), Some("x"));
        assert_eq!(config.get_password(), Some(&b"pw"[..]));

        let (config, tls) =
            parse("host=db user=app sslmode=require sslcert='/c/client.crt' sslkey=/c/client.key dbname='my db'")
                .unwrap();
        assert_eq!(tls.mode, SslMode::Require);
        assert_eq!(tls.cert.as_deref(), Some(Path::new("/c/client.crt")));
        assert_eq!(config.get_dbname(), Some("my db"));
        assert_eq!(config.get_ssl_mode(), DriverSslMode::Require);

        let (config, tls) = parse("postgres://u@h/d?sslmode=disable").unwrap();
        assert_eq!(
            (tls.mode, config.get_ssl_mode()),
            (SslMode::Disable, DriverSslMode::Disable)
        );
        let (_, tls) = parse("postgres://u@h/d?sslmode=verify-ca&sslrootcert=system").unwrap();
        assert_eq!(tls.root_cert, Some(RootCert::System));
    }

    #[test]
    fn bad_tls_settings_are_named() {
        let e = parse("postgres://u@h/d?sslmode=allow").unwrap_err();
        assert!(e.contains("sslmode=prefer"), "{e}");
        let e = parse("postgres://u@h/d?sslmode=strict").unwrap_err();
        assert!(e.contains("verify-full"), "{e}");
        let e = parse("postgres://u@h/d?sslcert=/c.crt").unwrap_err();
        assert!(e.contains("sslkey"), "{e}");
        let nothing = |_: &str| None;
        let e = parse_in("postgres://u@h/d?sslmode=verify-full", &nothing, None).unwrap_err();
        assert!(e.contains("sslrootcert") && e.contains("root.crt"), "{e}");
    }

    #[test]
    fn libpq_environment_and_default_files() {
        let home = tempfile::tempdir().unwrap();
        let env = |name: &str| match name {
            "PGSSLMODE" => Some("verify-ca".to_string()),
            _ => None,
        };
        // PGSSLMODE applies; verify-ca needs a CA and ~/.postgresql has none.
        assert!(parse_in("postgres://u@h/d", &env, Some(home.path())).is_err());
        std::fs::create_dir(home.path().join(".postgresql")).unwrap();
        let root = home.path().join(".postgresql/root.crt");
        std::fs::write(&root, "").unwrap();
        let (config, tls) = parse_in("postgres://u@h/d", &env, Some(home.path())).unwrap();
        assert_eq!(tls.mode, SslMode::VerifyCa);
        assert_eq!(tls.root_cert, Some(RootCert::File(root)));
        assert!(!tls.root_cert_given);
        assert_eq!(config.get_ssl_mode(), DriverSslMode::Require);
        // The URL wins over the environment.
        let (_, tls) = parse_in("postgres://u@h/d?sslmode=disable", &env, Some(home.path())).unwrap();
        assert_eq!(tls.mode, SslMode::Disable);
    }

    #[test]
    fn password_files_match_like_libpq() {
        let text = "# comment\n\
                    other:5432:*:app:wrong\n\
                    db.example:5432:shop:app:s3cr\\:et\n\
                    *:*:*:*:fallback\n";
        assert_eq!(
            passfile_password(text, "db.example", "5432", "shop", "app").as_deref(),
            Some("s3cr:et")
        );
        assert_eq!(
            passfile_password(text, "db.example", "5433", "shop", "app").as_deref(),
            Some("fallback")
        );
        assert_eq!(passfile_password("h:1:d:u\n", "h", "1", "d", "u"), None);
    }
}
