//! How a connection is secured: TLS and SASL settings, read from the same
//! librdkafka properties the rest of exactly passes to librdkafka
//! (`security.protocol`, `sasl.mechanism`, `sasl.username`,
//! `sasl.password`, `ssl.ca.location`, ...).

use std::fmt;
use std::path::PathBuf;

use crate::error::WireError;

/// `security.protocol`: whether the connection uses TLS and whether it
/// authenticates with SASL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SecurityProtocol {
    /// Plain TCP, no authentication (librdkafka's default).
    #[default]
    Plaintext,
    /// TLS, no SASL.
    Ssl,
    /// SASL over plain TCP.
    SaslPlaintext,
    /// SASL over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// Parses librdkafka's values, in any case.
    pub fn parse(value: &str) -> Option<SecurityProtocol> {
        Some(match value.trim().to_ascii_lowercase().as_str() {
            "plaintext" => SecurityProtocol::Plaintext,
            "ssl" => SecurityProtocol::Ssl,
            "sasl_plaintext" => SecurityProtocol::SaslPlaintext,
            "sasl_ssl" => SecurityProtocol::SaslSsl,
            _ => return None,
        })
    }

    /// Whether the connection is wrapped in TLS.
    pub fn uses_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    /// Whether the connection authenticates with SASL.
    pub fn uses_sasl(self) -> bool {
        matches!(self, SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl)
    }
}

impl fmt::Display for SecurityProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        })
    }
}

/// `sasl.mechanism`: the SASL mechanisms this client implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    /// `PLAIN`: user name and password sent as they are (use it over TLS only).
    Plain,
    /// `SCRAM-SHA-256`.
    ScramSha256,
    /// `SCRAM-SHA-512`.
    ScramSha512,
}

impl SaslMechanism {
    /// The mechanism's name as brokers spell it.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

impl fmt::Display for SaslMechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the broker's certificate is checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CertificateCheck {
    /// Signed by a trusted CA and issued for the host name connected to
    /// (librdkafka's default, `ssl.endpoint.identification.algorithm=https`).
    #[default]
    Full,
    /// Signed by a trusted CA, whatever name it is issued for
    /// (`ssl.endpoint.identification.algorithm=none`).
    CaOnly,
    /// Not checked at all (`enable.ssl.certificate.verification=false`):
    /// encrypted, but anyone in the middle can read along.
    None,
}

/// Where trusted CAs, and the client's own certificate, come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// `ssl.ca.location`: a PEM file (or a folder of them) of trusted CAs;
    /// without it (or with `probe`), the system's trust store.
    pub ca_location: Option<PathBuf>,
    /// `ssl.ca.pem`: trusted CAs as PEM text.
    pub ca_pem: Option<String>,
    /// `ssl.certificate.location`: the client's certificate chain (PEM), for
    /// brokers that require client certificates (`ssl.client.auth=required`).
    pub certificate_location: Option<PathBuf>,
    /// `ssl.key.location`: the client certificate's private key (PEM, not
    /// encrypted).
    pub key_location: Option<PathBuf>,
    /// How the broker's certificate is checked.
    pub check: CertificateCheck,
}

/// SASL credentials. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct SaslSettings {
    /// The mechanism (`sasl.mechanism`).
    pub mechanism: SaslMechanism,
    /// `sasl.username`.
    pub username: String,
    /// `sasl.password`.
    pub password: String,
}

impl fmt::Debug for SaslSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SaslSettings")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &"***")
            .finish()
    }
}

/// The security of every connection: the protocol, and its TLS and SASL
/// settings (present exactly when the protocol uses them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Security {
    /// `security.protocol`.
    pub protocol: SecurityProtocol,
    /// TLS settings, when `protocol` uses TLS.
    pub tls: Option<TlsSettings>,
    /// SASL settings, when `protocol` uses SASL.
    pub sasl: Option<SaslSettings>,
}

/// The `security.protocol`, `sasl.*` and `ssl.*` properties, collected
/// before they are checked together.
#[derive(Debug, Default)]
pub(crate) struct SecurityProperties {
    protocol: Option<String>,
    mechanism: Option<String>,
    username: Option<String>,
    password: Option<String>,
    tls: TlsSettings,
    key_password: bool,
}

/// librdkafka settings this client cannot honour, and what to do instead.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "ssl.keystore.location",
        "give the certificate and key as PEM files (ssl.certificate.location, ssl.key.location)",
    ),
    (
        "ssl.certificate.pem",
        "write the certificate to a file and set ssl.certificate.location",
    ),
    ("ssl.key.pem", "write the key to a file and set ssl.key.location"),
    ("ssl.engine.location", "use PEM files"),
    ("ssl.providers", "use PEM files"),
];

impl SecurityProperties {
    /// Takes `key` if it is a security setting; `Ok(false)` for any other.
    pub(crate) fn take(&mut self, key: &str, value: &str) -> Result<bool, WireError> {
        let path = || Some(PathBuf::from(value.trim()));
        match key {
            "security.protocol" => self.protocol = Some(value.to_string()),
            "sasl.mechanism" | "sasl.mechanisms" => self.mechanism = Some(value.to_string()),
            "sasl.username" => self.username = Some(value.to_string()),
            "sasl.password" => self.password = Some(value.to_string()),
            "ssl.ca.location" if value.trim().eq_ignore_ascii_case("probe") => self.tls.ca_location = None,
            "ssl.ca.location" => self.tls.ca_location = path(),
            "ssl.ca.pem" => self.tls.ca_pem = Some(value.to_string()),
            "ssl.certificate.location" => self.tls.certificate_location = path(),
            "ssl.key.location" => self.tls.key_location = path(),
            "ssl.key.password" => self.key_password = !value.is_empty(),
            "ssl.endpoint.identification.algorithm" => match value.trim().to_ascii_lowercase().as_str() {
                "https" => {
                    if self.tls.check == CertificateCheck::CaOnly {
                        self.tls.check = CertificateCheck::Full;
                    }
                }
                "none" => {
                    if self.tls.check == CertificateCheck::Full {
                        self.tls.check = CertificateCheck::CaOnly;
                    }
                }
                _ => return Err(invalid(key, format!("`{value}` is neither `https` nor `none`"))),
            },
            "enable.ssl.certificate.verification" => match value.trim().to_ascii_lowercase().as_str() {
                "false" => self.tls.check = CertificateCheck::None,
                "true" => {
                    if self.tls.check == CertificateCheck::None {
                        self.tls.check = CertificateCheck::Full;
                    }
                }
                _ => return Err(invalid(key, format!("`{value}` is neither `true` nor `false`"))),
            },
            _ => {
                if let Some((_, fix)) = UNSUPPORTED.iter().find(|(k, _)| *k == key) {
                    return Err(WireError::Unsupported {
                        what: format!("`{key}`"),
                        fix,
                    });
                }
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The settings, checked together: SASL needs a supported mechanism, a
    /// user name and a password. `ssl.*` settings without TLS apply to
    /// nothing, as in librdkafka.
    pub(crate) fn finish(self) -> Result<Security, WireError> {
        let protocol = match self.protocol.as_deref() {
            None => SecurityProtocol::Plaintext,
            Some(value) => SecurityProtocol::parse(value).ok_or_else(|| {
                invalid(
                    "security.protocol",
                    format!("`{value}` is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
                )
            })?,
        };
        if self.key_password {
            return Err(WireError::Unsupported {
                what: "an encrypted private key (`ssl.key.password`)".into(),
                fix: "give ssl.key.location an unencrypted PKCS#8 key (openssl pkcs8 -topk8 -nocrypt) on a \
                      file only exactly's user can read",
            });
        }
        let tls = if protocol.uses_tls() {
            if self.tls.certificate_location.is_some() != self.tls.key_location.is_some() {
                return Err(invalid(
                    "ssl.certificate.location",
                    "a client certificate needs its key and a key its certificate: set both \
                     ssl.certificate.location and ssl.key.location, or neither",
                ));
            }
            Some(self.tls)
        } else {
            None
        };
        let sasl = if protocol.uses_sasl() {
            let mechanism = match self.mechanism.as_deref().map(|m| m.trim().to_ascii_uppercase()) {
                None => {
                    return Err(invalid(
                        "sasl.mechanism",
                        format!(
                            "is not set, and security.protocol={protocol} needs it (librdkafka would try GSSAPI); \
                             set it to SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN, as the broker's listener enables"
                        ),
                    ))
                }
                Some(name) => match name.as_str() {
                    "PLAIN" => SaslMechanism::Plain,
                    "SCRAM-SHA-256" => SaslMechanism::ScramSha256,
                    "SCRAM-SHA-512" => SaslMechanism::ScramSha512,
                    other => {
                        return Err(WireError::Unsupported {
                            what: format!("SASL mechanism {other} (`sasl.mechanism`)"),
                            fix: "use SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN (over TLS) for exactly's pipelines",
                        })
                    }
                },
            };
            let username = self.username.ok_or_else(|| {
                invalid(
                    "sasl.username",
                    format!("is not set, and {mechanism} needs a user name"),
                )
            })?;
            let password = self
                .password
                .ok_or_else(|| invalid("sasl.password", format!("is not set, and {mechanism} needs a password")))?;
            Some(SaslSettings {
                mechanism,
                username,
                password,
            })
        } else {
            None
        };
        Ok(Security { protocol, tls, sasl })
    }
}

fn invalid(key: &str, message: impl Into<String>) -> WireError {
    WireError::InvalidConfig {
        key: key.to_string(),
        message: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn security(properties: &[(&str, &str)]) -> Result<Security, WireError> {
        let mut collected = SecurityProperties::default();
        for (key, value) in properties {
            collected.take(key, value)?;
        }
        collected.finish()
    }

    #[test]
    fn sasl_ssl_with_scram() {
        let s = security(&[
            ("security.protocol", "sasl_ssl"),
            ("sasl.mechanisms", "scram-sha-512"),
            ("sasl.username", "exactly"),
            ("sasl.password", "hunter2-secret"),
            ("ssl.ca.location", "/etc/ca.pem"),
            ("ssl.endpoint.identification.algorithm", "none"),
        ])
        .unwrap();
        assert_eq!(s.protocol, SecurityProtocol::SaslSsl);
        let tls = s.tls.as_ref().unwrap();
        assert_eq!(tls.ca_location.as_deref(), Some(std::path::Path::new("/etc/ca.pem")));
        assert_eq!(tls.check, CertificateCheck::CaOnly);
        let sasl = s.sasl.as_ref().unwrap();
        assert_eq!(sasl.mechanism, SaslMechanism::ScramSha512);
        assert!(!format!("{s:?}").contains("hunter2-secret"), "{s:?}");
    }

    #[test]
    fn what_is_missing_or_unsupported_is_named() {
        let e = security(&[("security.protocol", "tls")]).unwrap_err().to_string();
        assert!(e.contains("security.protocol") && e.contains("SASL_SSL"), "{e}");
        let e = security(&[("security.protocol", "SASL_SSL"), ("sasl.username", "u")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("sasl.mechanism"), "{e}");
        let e = security(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "PLAIN"),
            ("sasl.username", "u"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("sasl.password"), "{e}");
        let e = security(&[("security.protocol", "SASL_PLAINTEXT"), ("sasl.mechanism", "GSSAPI")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("GSSAPI") && e.contains("SCRAM-SHA-512"), "{e}");
        let e = security(&[("security.protocol", "SSL"), ("ssl.key.location", "/k.pem")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("ssl.certificate.location"), "{e}");
        let e = security(&[("ssl.keystore.location", "/k.p12")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("ssl.keystore.location"), "{e}");
        let e = security(&[("ssl.key.password", "pw")]).unwrap_err().to_string();
        assert!(e.contains("ssl.key.password") && !e.contains("pw`"), "{e}");
    }

    #[test]
    fn certificate_checks_follow_librdkafka() {
        let check = |properties: &[(&str, &str)]| {
            let mut all = vec![("security.protocol", "SSL")];
            all.extend_from_slice(properties);
            security(&all).unwrap().tls.unwrap().check
        };
        assert_eq!(check(&[]), CertificateCheck::Full);
        assert_eq!(
            check(&[("ssl.endpoint.identification.algorithm", "https")]),
            CertificateCheck::Full
        );
        assert_eq!(
            check(&[("enable.ssl.certificate.verification", "false")]),
            CertificateCheck::None
        );
        assert_eq!(
            check(&[
                ("enable.ssl.certificate.verification", "false"),
                ("ssl.endpoint.identification.algorithm", "none")
            ]),
            CertificateCheck::None
        );
        assert_eq!(
            security(&[("security.protocol", "SSL"), ("ssl.ca.location", "probe")])
                .unwrap()
                .tls
                .unwrap()
                .ca_location,
            None
        );
        // TLS settings without TLS apply to nothing.
        assert_eq!(security(&[("ssl.ca.location", "/ca.pem")]).unwrap().tls, None);
    }
}
