//! Which brokers to talk to, and how.

use std::time::Duration;

use crate::error::WireError;
use crate::security::{Security, SecurityProperties};

/// How long a request may wait for its answer unless configured otherwise.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long opening a TCP connection may take unless configured otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a call waits for a transaction coordinator that is not ready
/// yet unless configured otherwise (see [`WireConfig::coordinator_wait`]).
pub const DEFAULT_COORDINATOR_WAIT: Duration = Duration::from_secs(30);
/// The client id sent with every request unless configured otherwise.
pub const DEFAULT_CLIENT_ID: &str = "exactly-kafka-wire";

/// The client properties [`WireConfig::from_properties`] reads (librdkafka's
/// names); it ignores every other key.
pub const CLIENT_PROPERTIES: [&str; 16] = [
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.ca.pem",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
    "client.id",
    "request.timeout.ms",
    "socket.timeout.ms",
    "socket.connection.setup.timeout.ms",
];

/// Settings of one connection: client id, timeouts and security.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionOptions {
    /// Sent as `client_id` in every request header.
    pub client_id: String,
    /// Limit for opening the TCP connection.
    pub connect_timeout: Duration,
    /// Limit for each request, from sending it to its complete answer.
    pub request_timeout: Duration,
    /// TLS and SASL (plain TCP by default). `Debug` hides the password.
    pub security: Security,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        ConnectionOptions {
            client_id: DEFAULT_CLIENT_ID.to_string(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            security: Security::default(),
        }
    }
}

/// A bootstrap list (`HOST:PORT[,HOST:PORT...]`) plus [`ConnectionOptions`].
///
/// Connections are plain TCP unless the properties given to
/// [`from_properties`](Self::from_properties) ask for TLS or SASL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireConfig {
    bootstrap: String,
    servers: Vec<String>,
    /// Client id and timeouts used for every connection.
    pub options: ConnectionOptions,
    /// How long FindCoordinator is asked again, with backoff, while it
    /// answers that the coordinator is not ready (COORDINATOR_NOT_AVAILABLE,
    /// COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR): a fresh cluster
    /// creates its transaction log on the first transactional request, and
    /// a coordinator that moved loads its state first.
    pub coordinator_wait: Duration,
}

impl WireConfig {
    /// Parses `bootstrap` (`HOST:PORT[,HOST:PORT...]`; a `PLAINTEXT://`,
    /// `SSL://`, `SASL_PLAINTEXT://` or `SASL_SSL://` prefix per server is
    /// accepted and, as in librdkafka, `security.protocol` decides).
    pub fn new(bootstrap: &str) -> Result<WireConfig, WireError> {
        let servers = bootstrap
            .split(',')
            .map(str::trim)
            .filter(|server| !server.is_empty())
            .map(parse_server)
            .collect::<Result<Vec<_>, _>>()?;
        if servers.is_empty() {
            return Err(WireError::InvalidConfig {
                key: "bootstrap.servers".into(),
                message: format!("`{bootstrap}` names no server; expected HOST:PORT[,HOST:PORT...]"),
            });
        }
        Ok(WireConfig {
            bootstrap: bootstrap.to_string(),
            servers,
            options: ConnectionOptions::default(),
            coordinator_wait: DEFAULT_COORDINATOR_WAIT,
        })
    }

    /// Like [`new`](Self::new), then applies librdkafka-style client
    /// `properties`, the same ones librdkafka gets:
    ///
    /// - `security.protocol` (`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT`,
    ///   `SASL_SSL`); with SASL, `sasl.mechanism` (`PLAIN`, `SCRAM-SHA-256`,
    ///   `SCRAM-SHA-512`; GSSAPI and OAUTHBEARER are
    ///   [`WireError::Unsupported`]), `sasl.username`, `sasl.password`;
    /// - with TLS, `ssl.ca.location` (a PEM file or folder; without it the
    ///   system's trust store), `ssl.ca.pem`, `ssl.certificate.location` +
    ///   `ssl.key.location` (an unencrypted PEM key),
    ///   `ssl.endpoint.identification.algorithm` (`https`, the default, or
    ///   `none`: the CA is checked, not the host name) and
    ///   `enable.ssl.certificate.verification`;
    /// - `client.id`, `socket.connection.setup.timeout.ms` and
    ///   `request.timeout.ms`/`socket.timeout.ms`.
    ///
    /// Every other key is ignored (they tune librdkafka, not this client).
    pub fn from_properties<'a, I, K, V>(bootstrap: &str, properties: I) -> Result<WireConfig, WireError>
    where
        I: IntoIterator<Item = (&'a K, &'a V)>,
        K: AsRef<str> + ?Sized + 'a,
        V: AsRef<str> + ?Sized + 'a,
    {
        let mut config = WireConfig::new(bootstrap)?;
        let mut security = SecurityProperties::default();
        for (key, value) in properties {
            let (key, value) = (key.as_ref(), value.as_ref());
            if !security.take(key, value)? {
                config.apply(key, value)?;
            }
        }
        config.options.security = security.finish()?;
        Ok(config)
    }

    fn apply(&mut self, key: &str, value: &str) -> Result<(), WireError> {
        let millis = || {
            value
                .trim()
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| WireError::InvalidConfig {
                    key: key.to_string(),
                    message: format!("`{value}` is not a number of milliseconds"),
                })
        };
        match key {
            "client.id" => self.options.client_id = value.to_string(),
            "request.timeout.ms" | "socket.timeout.ms" => self.options.request_timeout = millis()?,
            "socket.connection.setup.timeout.ms" => self.options.connect_timeout = millis()?,
            _ => {}
        }
        Ok(())
    }

    /// The bootstrap list as given.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The servers of the bootstrap list, as `HOST:PORT`.
    pub fn servers(&self) -> &[String] {
        &self.servers
    }
}

/// `HOST:PORT` of one bootstrap entry.
fn parse_server(server: &str) -> Result<String, WireError> {
    let address = match server.split_once("://") {
        None => server,
        Some((scheme, address)) if crate::security::SecurityProtocol::parse(scheme).is_some() => address,
        Some((scheme, _)) => {
            return Err(WireError::InvalidConfig {
                key: "bootstrap.servers".into(),
                message: format!(
                    "`{server}` has the unknown scheme `{scheme}`; write HOST:PORT (security.protocol chooses TLS \
                     and SASL)"
                ),
            });
        }
    };
    let port_ok = address
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !port_ok {
        return Err(WireError::InvalidConfig {
            key: "bootstrap.servers".into(),
            message: format!("`{server}` is not HOST:PORT"),
        });
    }
    Ok(address.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn client_properties_are_the_keys_read() {
        let base = [
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "PLAIN"),
            ("sasl.username", "u"),
            ("sasl.password", "p"),
        ];
        let config = |extra: &[(&str, &str)]| {
            let properties: BTreeMap<&str, &str> = base.iter().chain(extra).copied().collect();
            WireConfig::from_properties("h:1", &properties).ok()
        };
        let changed = [
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "SCRAM-SHA-256"),
            ("sasl.mechanisms", "SCRAM-SHA-512"),
            ("sasl.username", "v"),
            ("sasl.password", "q"),
            ("ssl.ca.location", "/ca.pem"),
            ("ssl.ca.pem", "PEM"),
            ("ssl.certificate.location", "/c.pem"),
            ("ssl.key.location", "/k.pem"),
            ("ssl.key.password", "secret"),
            ("ssl.endpoint.identification.algorithm", "none"),
            ("enable.ssl.certificate.verification", "false"),
            ("client.id", "me"),
            ("request.timeout.ms", "5"),
            ("socket.timeout.ms", "6"),
            ("socket.connection.setup.timeout.ms", "7"),
        ];
        assert_eq!(changed.map(|(k, _)| k), CLIENT_PROPERTIES);
        for pair in changed {
            assert_ne!(config(&[pair]), config(&[]), "{} is not read", pair.0);
        }
        assert_eq!(
            config(&[("fetch.max.bytes", "1")]),
            config(&[]),
            "other keys are ignored"
        );
    }

    #[test]
    fn parses_bootstrap_lists() {
        let config = WireConfig::new(" 127.0.0.1:9092, PLAINTEXT://[::1]:9093 ,").unwrap();
        assert_eq!(config.servers(), ["127.0.0.1:9092", "[::1]:9093"]);
        for bad in ["", " , ", "localhost", "host:port", ":9092"] {
            let err = WireConfig::new(bad).unwrap_err();
            assert!(matches!(err, WireError::InvalidConfig { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn reads_tls_and_sasl_settings() {
        let config = WireConfig::new("SASL_SSL://broker:9093,SSL://b2:9094").unwrap();
        assert_eq!(config.servers(), ["broker:9093", "b2:9094"]);
        let err = WireConfig::new("HTTPS://broker:9093").unwrap_err();
        assert!(matches!(err, WireError::InvalidConfig { .. }), "{err}");

        let properties = BTreeMap::from([
            ("security.protocol".to_string(), "SASL_SSL".to_string()),
            ("sasl.mechanism".to_string(), "SCRAM-SHA-256".to_string()),
            ("sasl.username".to_string(), "exactly".to_string()),
            ("sasl.password".to_string(), "not-in-debug".to_string()),
            ("ssl.ca.location".to_string(), "/etc/kafka-ca.pem".to_string()),
        ]);
        let config = WireConfig::from_properties("127.0.0.1:9093", &properties).unwrap();
        let security = &config.options.security;
        assert_eq!(security.protocol, crate::SecurityProtocol::SaslSsl);
        assert_eq!(
            security.sasl.as_ref().unwrap().mechanism,
            crate::SaslMechanism::ScramSha256
        );
        assert!(security.tls.as_ref().unwrap().ca_location.is_some());
        assert!(!format!("{config:?}").contains("not-in-debug"));

        for (key, value) in [("sasl.mechanism", "OAUTHBEARER"), ("sasl.mechanism", "GSSAPI")] {
            let properties = BTreeMap::from([
                ("security.protocol".to_string(), "sasl_plaintext".to_string()),
                (key.to_string(), value.to_string()),
            ]);
            let err = WireConfig::from_properties("127.0.0.1:9092", &properties).unwrap_err();
            assert!(matches!(err, WireError::Unsupported { .. }), "{key}={value}: {err}");
            assert!(err.to_string().contains(value), "{err}");
        }
    }

    #[test]
    fn honours_client_settings() {
        let properties = [
            ("security.protocol", "PLAINTEXT"),
            ("client.id", "sink-3"),
            ("request.timeout.ms", "1500"),
            ("socket.connection.setup.timeout.ms", "250"),
            ("compression.type", "lz4"),
        ];
        let config = WireConfig::from_properties("127.0.0.1:9092", properties.iter().map(|(k, v)| (*k, *v))).unwrap();
        assert_eq!(config.options.client_id, "sink-3");
        assert_eq!(config.options.request_timeout, Duration::from_millis(1500));
        assert_eq!(config.options.connect_timeout, Duration::from_millis(250));

        let bad = [("request.timeout.ms", "soon")];
        let err = WireConfig::from_properties("127.0.0.1:9092", bad.iter().map(|(k, v)| (*k, *v))).unwrap_err();
        assert!(matches!(err, WireError::InvalidConfig { .. }), "{err}");
    }
}
