//! A client of a Confluent-compatible schema registry (Confluent Schema
//! Registry, Apicurio's `/apis/ccompat/v7`, Redpanda, Karapace): the Avro
//! schema of an id (`GET <url>/schemas/ids/<id>`), fetched once and cached
//! for the client's life (a registry never changes the schema of an id).
//! TLS with the system's roots or a CA file, HTTP basic auth; the password
//! is in no message and no `Debug` output.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::Value;

use crate::avro::AvroSchema;
use crate::error::FormatError;

/// Where the registry is and how to reach it.
#[derive(Clone, Default)]
pub struct RegistrySettings {
    /// `http://host:port/path` or `https://…`: the base the
    /// Confluent-compatible API is under (`…/apis/ccompat/v7` for Apicurio).
    /// A `user:password@` in it is taken as the credentials.
    pub url: String,
    /// Basic auth user.
    pub username: Option<String>,
    /// Basic auth password.
    pub password: Option<String>,
    /// PEM file of the CAs that sign the registry's certificate (default:
    /// the system's roots).
    pub ca_file: Option<PathBuf>,
}

impl fmt::Debug for RegistrySettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistrySettings")
            .field("url", &redact(&self.url))
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// `url` without the password of a `user:password@` in it.
pub fn redact(url: &str) -> String {
    match split_userinfo(url) {
        (rest, Some((user, Some(_)))) => rest.replacen("://", &format!("://{user}:***@"), 1),
        (rest, Some((user, None))) => rest.replacen("://", &format!("://{user}@"), 1),
        (rest, None) => rest,
    }
}

/// The URL without its user info, and the user info (user, password).
fn split_userinfo(url: &str) -> (String, Option<(String, Option<String>)>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_string(), None);
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return (url.to_string(), None);
    };
    let creds = match userinfo.split_once(':') {
        Some((user, password)) => (user.to_string(), Some(password.to_string())),
        None => (userinfo.to_string(), None),
    };
    (format!("{scheme}://{host}{path}"), Some(creds))
}

/// Why a schema could not be had.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The registry did not answer (connection refused or reset, timeout):
    /// worth retrying.
    #[error("schema registry {url}: {problem}")]
    Unreachable {
        /// The registry, without credentials.
        url: String,
        /// What happened.
        problem: String,
        /// The underlying error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The registry answered, but not with the schema: wrong credentials,
    /// an unknown id, a schema that is not Avro. Retrying does not help.
    #[error("schema registry {url}: {problem}. Fix: {fix}")]
    Refused {
        /// The registry, without credentials.
        url: String,
        /// What it said.
        problem: String,
        /// How to fix it.
        fix: String,
        /// The underlying error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl RegistryError {
    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, RegistryError::Unreachable { .. })
    }
}

/// A registry client with its schema cache. Cheap to share (`Arc`).
pub struct RegistryClient {
    /// `https://host:port/path` without credentials, for messages.
    shown: String,
    host: String,
    port: u16,
    /// The path prefix, without a trailing `/`.
    base_path: String,
    /// `Basic …`.
    authorization: Option<String>,
    tls: Option<Arc<rustls::ClientConfig>>,
    timeout: Duration,
    cache: Mutex<HashMap<u32, Arc<AvroSchema>>>,
}

impl fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryClient")
            .field("url", &self.shown)
            .field("auth", &self.authorization.as_ref().map(|_| "basic ***"))
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl RegistryClient {
    /// Checks the settings and reads the CA file; connects to nothing.
    pub fn new(settings: &RegistrySettings) -> Result<RegistryClient, FormatError> {
        let (url, userinfo) = split_userinfo(settings.url.trim());
        let bad_url = |problem: &str| {
            FormatError::config(
                "registry.url",
                format!("`{}` {problem}", redact(&settings.url)),
                "write http://HOST:PORT/PATH or https://HOST:PORT/PATH (for Apicurio, …/apis/ccompat/v7)",
            )
        };
        let (https, rest) = if let Some(rest) = url.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(bad_url("is not an http:// or https:// URL"));
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !host.ends_with(']') || authority.starts_with('[') => {
                let port = port
                    .parse::<u16>()
                    .map_err(|_| bad_url("has a port that is not a number"))?;
                (host, port)
            }
            _ => (authority, if https { 443 } else { 80 }),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        if host.is_empty() {
            return Err(bad_url("has no host"));
        }
        let (mut username, mut password) = (settings.username.clone(), settings.password.clone());
        if let Some((user, pass)) = userinfo {
            username.get_or_insert(user);
            if pass.is_some() && password.is_none() {
                password = pass;
            }
        }
        let authorization = match (&username, &password) {
            (Some(user), password) => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{user}:{}", password.as_deref().unwrap_or_default()))
            )),
            (None, Some(_)) => {
                return Err(FormatError::config(
                    "registry.password",
                    "a password without a username",
                    "set registry.username too",
                ))
            }
            (None, None) => None,
        };
        let tls = if https {
            Some(Arc::new(tls_config(settings.ca_file.as_ref())?))
        } else {
            if settings.ca_file.is_some() {
                return Err(FormatError::config(
                    "registry.ca_file",
                    "is set, but the URL is http://",
                    "use an https:// URL, or remove ca_file",
                ));
            }
            None
        };
        Ok(RegistryClient {
            shown: url.clone(),
            host,
            port,
            base_path: path.trim_end_matches('/').to_string(),
            authorization,
            tls,
            timeout: Duration::from_secs(10),
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The registry's URL without credentials.
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// The Avro schema registered under `id`, from the cache or fetched.
    pub async fn avro_schema(&self, id: u32) -> Result<Arc<AvroSchema>, RegistryError> {
        if let Some(schema) = self.cached(id) {
            return Ok(schema);
        }
        let path = format!("{}/schemas/ids/{id}", self.base_path);
        let (status, body) = self.get(&path).await?;
        let refused = |problem: String, fix: &str| RegistryError::Refused {
            url: self.shown.clone(),
            problem,
            fix: fix.to_string(),
            source: None,
        };
        match status {
            200 => {}
            401 | 403 => {
                return Err(refused(
                    format!("refused the credentials (HTTP {status})"),
                    "set registry.username and registry.password to an account that may read schemas",
                ))
            }
            404 => {
                return Err(refused(
                    format!("has no schema with id {id} (HTTP 404)"),
                    "point registry.url at the registry the producers register their schemas in",
                ))
            }
            500..=599 => {
                return Err(RegistryError::Unreachable {
                    url: self.shown.clone(),
                    problem: format!("answered HTTP {status} for schema {id}"),
                    source: None,
                })
            }
            _ => {
                return Err(refused(
                    format!("answered HTTP {status} for schema {id}"),
                    "check registry.url: it must be the base of the Confluent-compatible API",
                ))
            }
        }
        let json: Value = serde_json::from_slice(&body).map_err(|e| RegistryError::Refused {
            url: self.shown.clone(),
            problem: format!("answered schema {id} with something that is not JSON"),
            fix: "check registry.url: it must be the base of the Confluent-compatible API".into(),
            source: Some(Box::new(e)),
        })?;
        if let Some(kind) = json.get("schemaType").and_then(Value::as_str) {
            if !kind.eq_ignore_ascii_case("AVRO") {
                return Err(refused(
                    format!("schema {id} is {kind}, not Avro"),
                    "set the format the topic is written in",
                ));
            }
        }
        let text = json.get("schema").and_then(Value::as_str).ok_or_else(|| {
            refused(
                format!("answered schema {id} without a \"schema\" string"),
                "check registry.url: it must be the base of the Confluent-compatible API",
            )
        })?;
        let schema = AvroSchema::parse(text).map_err(|e| RegistryError::Refused {
            url: self.shown.clone(),
            problem: format!("schema {id} cannot be used"),
            fix: "register an Avro record schema".into(),
            source: Some(Box::new(e)),
        })?;
        let schema = Arc::new(schema);
        tracing::debug!(registry = %self.shown, id, "fetched an Avro schema");
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(id, schema.clone());
        Ok(schema)
    }

    /// The schema of `id` if it was fetched already.
    pub fn cached(&self, id: u32) -> Option<Arc<AvroSchema>> {
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&id)
            .cloned()
    }

    async fn get(&self, path: &str) -> Result<(u16, Bytes), RegistryError> {
        tokio::time::timeout(self.timeout, self.get_once(path))
            .await
            .unwrap_or_else(|_| {
                Err(RegistryError::Unreachable {
                    url: self.shown.clone(),
                    problem: format!("no answer within {:?}", self.timeout),
                    source: None,
                })
            })
    }

    async fn get_once(&self, path: &str) -> Result<(u16, Bytes), RegistryError> {
        let unreachable = |problem: &str, e: Box<dyn std::error::Error + Send + Sync>| RegistryError::Unreachable {
            url: self.shown.clone(),
            problem: problem.to_string(),
            source: Some(e),
        };
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| unreachable("cannot connect", Box::new(e)))?;
        let request = hyper::Request::get(if path.is_empty() { "/" } else { path })
            .header(hyper::header::HOST, format!("{}:{}", self.host, self.port))
            .header(
                hyper::header::ACCEPT,
                "application/vnd.schemaregistry.v1+json, application/json",
            );
        let request = match &self.authorization {
            Some(auth) => request.header(hyper::header::AUTHORIZATION, auth),
            None => request,
        };
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| RegistryError::Refused {
                url: self.shown.clone(),
                problem: "the request cannot be built".into(),
                fix: "check registry.url and registry.username".into(),
                source: Some(Box::new(e)),
            })?;
        match &self.tls {
            Some(config) => {
                let name = ServerName::try_from(self.host.clone()).map_err(|e| RegistryError::Refused {
                    url: self.shown.clone(),
                    problem: "the host is no name a certificate can be checked for".into(),
                    fix: "use the registry's DNS name or IP address in registry.url".into(),
                    source: Some(Box::new(e)),
                })?;
                let stream = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| self.tls_error(e))?;
                self.exchange(TokioIo::new(stream), request).await
            }
            None => self.exchange(TokioIo::new(tcp), request).await,
        }
    }

    fn tls_error(&self, e: std::io::Error) -> RegistryError {
        let is_certificate = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .is_some_and(|r| {
                matches!(
                    r,
                    rustls::Error::InvalidCertificate(_) | rustls::Error::AlertReceived(_)
                )
            });
        if is_certificate {
            RegistryError::Refused {
                url: self.shown.clone(),
                problem: "its TLS certificate is not trusted (or not issued for this host)".into(),
                fix:
                    "set registry.ca_file to the PEM of the CA that signed it, and use the host name it was issued for"
                        .into(),
                source: Some(Box::new(e)),
            }
        } else {
            RegistryError::Unreachable {
                url: self.shown.clone(),
                problem: "the TLS handshake failed".into(),
                source: Some(Box::new(e)),
            }
        }
    }

    async fn exchange<S>(
        &self,
        io: TokioIo<S>,
        request: hyper::Request<Empty<Bytes>>,
    ) -> Result<(u16, Bytes), RegistryError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let unreachable = |problem: &str, e: hyper::Error| RegistryError::Unreachable {
            url: self.shown.clone(),
            problem: problem.to_string(),
            source: Some(Box::new(e)),
        };
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| unreachable("the HTTP handshake failed", e))?;
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| unreachable("the request failed", e));
        let result = match response {
            Ok(response) => {
                let status = response.status().as_u16();
                response
                    .into_body()
                    .collect()
                    .await
                    .map(|body| (status, body.to_bytes()))
                    .map_err(|e| unreachable("the answer broke off", e))
            }
            Err(e) => Err(e),
        };
        driver.abort();
        result
    }
}

fn tls_config(ca_file: Option<&PathBuf>) -> Result<rustls::ClientConfig, FormatError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certificates: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .and_then(|iter| iter.collect::<Result<_, _>>())
                .map_err(|e| FormatError::Config {
                    key: "registry.ca_file".into(),
                    problem: format!("cannot read PEM certificates from {}", path.display()),
                    fix: "give the path of a PEM file of the registry's CA".into(),
                    source: Some(Box::new(e)),
                })?;
            if certificates.is_empty() {
                return Err(FormatError::config(
                    "registry.ca_file",
                    format!("{} holds no certificate", path.display()),
                    "give the path of a PEM file of the registry's CA",
                ));
            }
            for certificate in certificates {
                roots.add(certificate).map_err(|e| FormatError::Config {
                    key: "registry.ca_file".into(),
                    problem: format!("a certificate of {} is not usable as a CA", path.display()),
                    fix: "give the path of a PEM file of the registry's CA".into(),
                    source: Some(Box::new(e)),
                })?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            for certificate in native.certs {
                let _ = roots.add(certificate);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| FormatError::Config {
            key: "registry.url".into(),
            problem: "no TLS version is available".into(),
            fix: "report this: the TLS library has no protocol version".into(),
            source: Some(Box::new(e)),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_the_url_are_taken_out_and_never_shown() {
        let settings = RegistrySettings {
            url: "http://reader:s3cret-pw@127.0.0.1:8081/apis/ccompat/v7/".into(),
            ..RegistrySettings::default()
        };
        let client = RegistryClient::new(&settings).unwrap();
        assert_eq!(client.url(), "http://127.0.0.1:8081/apis/ccompat/v7/");
        assert_eq!(client.base_path, "/apis/ccompat/v7");
        assert_eq!(client.port, 8081);
        assert!(client.authorization.is_some());
        for shown in [format!("{client:?}"), format!("{settings:?}"), redact(&settings.url)] {
            assert!(!shown.contains("s3cret-pw"), "{shown}");
        }
        let with_password = RegistrySettings {
            url: "https://registry.example.com".into(),
            username: Some("u".into()),
            password: Some("hunter2-pw".into()),
            ca_file: None,
        };
        assert!(!format!("{with_password:?}").contains("hunter2-pw"));
        let client = RegistryClient::new(&with_password).unwrap();
        assert_eq!((client.port, client.base_path.as_str()), (443, ""));
    }

    #[test]
    fn settings_that_cannot_work_are_config_errors_naming_the_key() {
        let bad = |url: &str, ca: Option<&str>| {
            RegistryClient::new(&RegistrySettings {
                url: url.into(),
                ca_file: ca.map(PathBuf::from),
                ..RegistrySettings::default()
            })
            .unwrap_err()
            .to_string()
        };
        assert!(bad("ftp://h:1", None).contains("registry.url"));
        assert!(bad("http://h:port", None).contains("port"));
        assert!(bad("http://h:1", Some("/ca.pem")).contains("registry.ca_file"));
        assert!(bad("https://h:1", Some("/nonexistent/ca.pem")).contains("registry.ca_file"));
        let orphan = RegistryClient::new(&RegistrySettings {
            url: "http://h:1".into(),
            password: Some("p".into()),
            ..RegistrySettings::default()
        })
        .unwrap_err();
        assert!(orphan.to_string().contains("registry.username"));
    }

    #[tokio::test]
    async fn an_unreachable_registry_is_transient() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let client = RegistryClient::new(&RegistrySettings {
            url: format!("http://127.0.0.1:{port}"),
            ..RegistrySettings::default()
        })
        .unwrap();
        let error = client.avro_schema(1).await.unwrap_err();
        assert!(error.is_transient(), "{error}");
    }
}
