//! The connection string, as libpq reads it: the driver's settings, libpq's
//! TLS keys and the password lookups (see [`crate::conn::tls`] for what the TLS
//! settings do), and the server described for messages without the
//! password.
//!
//! The connection string takes libpq's `sslmode` (`disable`, `prefer`
//! — the default —, `require`, `verify-ca`, `verify-full`), `sslrootcert`
//! (a PEM file of trusted CAs, or `system` for the system's trust store;
//! default `~/.postgresql/root.crt`), `sslcert` and `sslkey` (a client
//! certificate and its unencrypted key, for `cert` authentication), also
//! from `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY`.
//!
//! Without a password in the connection string, `PGPASSWORD` and then the
//! password file (`PGPASSFILE`, default `~/.pgpass`:
//! `host:port:database:user:password` lines, `*` matching anything) are
//! used, as libpq does.

use std::path::{Path, PathBuf};

use tokio_postgres::config::{Host, SslMode as DriverSslMode};

/// Why a connection string cannot be used. Its text never holds the
/// password.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnStringError {
    /// A libpq key the sink reads has a value it does not take.
    #[error("{0}")]
    Invalid(String),
    /// The driver cannot read the rest of it.
    #[error("the driver cannot read it")]
    Driver(#[source] tokio_postgres::Error),
}

impl From<String> for ConnStringError {
    fn from(problem: String) -> Self {
        ConnStringError::Invalid(problem)
    }
}

impl From<&str> for ConnStringError {
    fn from(problem: &str) -> Self {
        ConnStringError::Invalid(problem.to_string())
    }
}

// The TLS settings of a connection string are libpq's, read by the TLS
// crate for the sink and the PostgreSQL checkpoint store alike.
pub(crate) use exactly_tls::libpq::{RootCert, SslMode, TlsSettings};

/// Parses `url` (`postgres://…?sslmode=…` or `key=value …`): the driver's
/// settings without the TLS keys, and the TLS settings (with libpq's
/// environment variables and default files filled in). The error is a
/// message naming what is wrong, without the password.
pub(crate) fn parse(url: &str) -> Result<(tokio_postgres::Config, TlsSettings), ConnStringError> {
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
) -> Result<(tokio_postgres::Config, TlsSettings), ConnStringError> {
    let (rest, tls) = exactly_tls::libpq::split_in(url, env, home)?;
    let mut config: tokio_postgres::Config = rest.parse().map_err(ConnStringError::Driver)?;
    let mode = tls.mode;
    config.ssl_mode(match mode {
        SslMode::Disable => DriverSslMode::Disable,
        SslMode::Prefer => DriverSslMode::Prefer,
        _ => DriverSslMode::Require,
    });
    Ok((config, tls))
}

/// The password libpq would use when the connection string has none:
/// `PGPASSWORD`, then the first matching line of the password file.
pub(crate) fn fill_password(config: &mut tokio_postgres::Config) {
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

/// `postgres://user@host:port/db` for messages: never the password.
pub(crate) fn describe_url(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let name = match host {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string(),
            };
            match ports.get(i).or(ports.first()) {
                Some(port) => format!("{name}:{port}"),
                None => name,
            }
        })
        .collect();
    let hosts = if hosts.is_empty() {
        "localhost".to_string()
    } else {
        hosts.join(",")
    };
    let user = config.get_user().map(|u| format!("{u}@")).unwrap_or_default();
    let db = config.get_dbname().unwrap_or_default();
    format!("postgres://{user}{hosts}/{db}")
}

/// The connection string with its password hidden (for `Debug`).
pub(crate) fn redact_url(url: &str) -> String {
    match parse(url) {
        Ok((config, _)) => describe_url(&config),
        Err(_) => "<unparsable url>".into(),
    }
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
        let e = parse("postgres://u@h/d?sslmode=allow").unwrap_err().to_string();
        assert!(e.contains("sslmode=prefer"), "{e}");
        let e = parse("postgres://u@h/d?sslmode=strict").unwrap_err().to_string();
        assert!(e.contains("verify-full"), "{e}");
        let e = parse("postgres://u@h/d?sslcert=/c.crt").unwrap_err().to_string();
        assert!(e.contains("sslkey"), "{e}");
        let nothing = |_: &str| None;
        let e = parse_in("postgres://u@h/d?sslmode=verify-full", &nothing, None)
            .unwrap_err()
            .to_string();
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
    fn urls_are_described_without_password() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db.example:6543/shop"),
            "postgres://app@db.example:6543/shop"
        );
        assert_eq!(
            redact_url("host=h1,h2 port=1,2 user=u password=p dbname=d"),
            "postgres://u@h1:1,h2:2/d"
        );
        assert_eq!(redact_url("postgres:///db"), "postgres://localhost/db");
        assert!(!redact_url("postgres://u:pw@h/db").contains("pw"));
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
