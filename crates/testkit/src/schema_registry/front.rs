//! A front for a schema registry: a small HTTP/1.1 reverse proxy on a
//! loopback port of its own that asks for HTTP basic authentication and,
//! optionally, speaks TLS with a certificate of a CA made for the run, so
//! that a client's credentials and certificate checks meet a real server.
//! Apicurio Registry's own authentication needs an OpenID Connect server;
//! this is all a test needs of it.
//!
//! Every request is checked on its own (a kept-alive connection gets no
//! pass): without the right `Authorization: Basic …` header the answer is
//! `401` with `WWW-Authenticate` and the registry's error body shape
//! (`{"error_code":40101,"message":…}`); with it, the request goes to the
//! registry unchanged and its answer comes back. The front counts the
//! requests it forwarded, per path, so a test can see what a client asked
//! the registry.
//!
//! It runs on a thread of its own (hyper on a current-thread tokio
//! runtime) until its handle drops.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tempfile::TempDir;

use super::install::SERVICE;
use crate::error::{Result, TestkitError};
use crate::tls::TestCa;

/// Settings of a [`RegistryFront`]; see [`SchemaRegistry::front`](super::SchemaRegistry::front).
#[derive(Clone, Debug)]
pub struct RegistryFrontBuilder {
    upstream: String,
    tls: bool,
    username: String,
    password: String,
}

impl RegistryFrontBuilder {
    pub(crate) fn new(upstream: &str) -> RegistryFrontBuilder {
        RegistryFrontBuilder {
            upstream: upstream.trim_end_matches('/').to_string(),
            tls: false,
            username: "exactly".into(),
            password: format!("registry-secret-{:016x}", rand::random::<u64>()),
        }
    }

    /// Serves TLS (a certificate for `localhost` and `127.0.0.1` signed by
    /// a CA made for this front, [`RegistryFront::ca_file`]) instead of
    /// plain HTTP.
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// The user the front accepts (default `exactly`).
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.username = username.into();
        self
    }

    /// The password the front accepts (default: random per front).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = password.into();
        self
    }

    /// Starts the front on a free loopback port.
    pub fn start(self) -> Result<RegistryFront> {
        let (scheme, authority, path) = split_url(&self.upstream).ok_or_else(|| TestkitError::InvalidSetting {
            var: "SchemaRegistry::front upstream",
            value: self.upstream.clone(),
            fix: "front a registry whose URL is http://HOST:PORT/PATH",
        })?;
        if scheme != "http" {
            return Err(TestkitError::InvalidSetting {
                var: "SchemaRegistry::front upstream",
                value: self.upstream.clone(),
                fix: "front a plain-HTTP registry (the front adds TLS itself)",
            });
        }
        let dir = crate::process::service_temp_dir(SERVICE, "exactly-registry-front-")?;
        let tls = if self.tls {
            Some(server_config(dir.path())?)
        } else {
            None
        };
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(io("binding 127.0.0.1:0"))?;
        listener
            .set_nonblocking(true)
            .map_err(io("making the listener non-blocking"))?;
        let port = listener
            .local_addr()
            .map_err(io("reading the listener's address"))?
            .port();
        let state = Arc::new(State {
            upstream: authority.to_string(),
            expected: format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", self.username, self.password))
            ),
            forwarded: Mutex::new(BTreeMap::new()),
            refused: Mutex::new(0),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread_state = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("exactly-registry-front".into())
            .spawn(move || serve(listener, tls.map(|(config, _)| config), thread_state, stopped))
            .map_err(io("starting the front's thread"))?;
        let host = if self.tls { "localhost" } else { "127.0.0.1" };
        let url = format!("{}://{host}:{port}{path}", if self.tls { "https" } else { "http" });
        tracing::info!(%url, upstream = %self.upstream, "schema registry front started");
        Ok(RegistryFront {
            url,
            ca_file: self.tls.then(|| dir.path().join("ca.crt")),
            username: self.username,
            password: self.password,
            state,
            stop: Some(stop),
            thread: Some(thread),
            _dir: dir,
        })
    }
}

/// A started front: its [`url`](Self::url) (the same API path as the
/// registry behind it), the credentials it accepts and, with TLS, the CA a
/// client must trust. Stops when dropped.
pub struct RegistryFront {
    url: String,
    ca_file: Option<PathBuf>,
    username: String,
    password: String,
    state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: TempDir,
}

impl std::fmt::Debug for RegistryFront {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryFront")
            .field("url", &self.url)
            .field("ca_file", &self.ca_file)
            .field("username", &self.username)
            .field("password", &"***")
            .finish()
    }
}

impl RegistryFront {
    /// `http://127.0.0.1:PORT/<path>` or, with TLS,
    /// `https://localhost:PORT/<path>`, where `<path>` is the registry's
    /// (`/apis/ccompat/v7`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The PEM certificate of the CA that signed the front's certificate
    /// (TLS fronts only).
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca_file.as_deref()
    }

    /// The user the front accepts.
    pub fn username(&self) -> &str {
        &self.username
    }

    /// The password the front accepts.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// How many requests for `path` (without the query; e.g.
    /// `/apis/ccompat/v7/schemas/ids/1`) the front forwarded so far.
    pub fn forwarded(&self, path: &str) -> u64 {
        lock(&self.state.forwarded).get(path).copied().unwrap_or(0)
    }

    /// How many requests the front refused for want of the right
    /// credentials.
    pub fn refused(&self) -> u64 {
        *lock(&self.state.refused)
    }
}

impl Drop for RegistryFront {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct State {
    /// `HOST:PORT` of the registry.
    upstream: String,
    /// The `Authorization` header value that is let through.
    expected: String,
    forwarded: Mutex<BTreeMap<String, u64>>,
    refused: Mutex<u64>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

type Body = BoxBody<Bytes, hyper::Error>;

/// The front's thread: accepts connections until `stopped` fires.
fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    state: Arc<State>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::error!(%err, "cannot start the schema registry front's runtime");
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(err) => {
                tracing::error!(%err, "cannot serve the schema registry front");
                return;
            }
        };
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        loop {
            let (stream, peer) = tokio::select! {
                _ = &mut stopped => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        tracing::warn!(%err, "schema registry front: accept failed");
                        continue;
                    }
                },
            };
            let state = Arc::clone(&state);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| handle(request, Arc::clone(&state)));
                let served = match acceptor {
                    Some(acceptor) => match acceptor.accept(stream).await {
                        Ok(stream) => {
                            hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await
                        }
                        Err(err) => {
                            tracing::debug!(%peer, %err, "schema registry front: TLS handshake failed");
                            return;
                        }
                    },
                    None => {
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                };
                if let Err(err) = served {
                    tracing::debug!(%peer, %err, "schema registry front: connection ended");
                }
            });
        }
    });
}

/// Refuses a request without the right credentials, forwards the others.
async fn handle(request: Request<Incoming>, state: Arc<State>) -> std::result::Result<Response<Body>, hyper::Error> {
    let authorized = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .is_some_and(|value| value.as_bytes() == state.expected.as_bytes());
    if !authorized {
        *lock(&state.refused) += 1;
        let body = r#"{"error_code":40101,"message":"Unauthorized: this registry needs HTTP basic authentication"}"#;
        let mut response = Response::new(full(body));
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        let headers = response.headers_mut();
        headers.insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Basic realm=\"exactly-testkit schema registry\""),
        );
        headers.insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        return Ok(response);
    }
    *lock(&state.forwarded)
        .entry(request.uri().path().to_string())
        .or_default() += 1;
    match forward(request, &state.upstream).await {
        Ok(response) => Ok(response.map(BodyExt::boxed)),
        Err(err) => {
            let mut response = Response::new(full(&format!(
                r#"{{"error_code":50201,"message":"the front cannot reach the registry: {err}"}}"#
            )));
            *response.status_mut() = StatusCode::BAD_GATEWAY;
            Ok(response)
        }
    }
}

/// Sends `request` to the registry on a connection of its own.
async fn forward(mut request: Request<Incoming>, upstream: &str) -> std::result::Result<Response<Incoming>, String> {
    let stream = tokio::net::TcpStream::connect(upstream)
        .await
        .map_err(|err| format!("connecting to {upstream}: {err}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|err| err.to_string())?;
    tokio::spawn(connection);
    let path = request
        .uri()
        .path_and_query()
        .map_or_else(|| "/".to_string(), ToString::to_string);
    *request.uri_mut() = path.parse().map_err(|err| format!("{err}"))?;
    let host = hyper::header::HeaderValue::from_str(upstream).map_err(|err| err.to_string())?;
    request.headers_mut().insert(hyper::header::HOST, host);
    request.headers_mut().remove(hyper::header::AUTHORIZATION);
    sender.send_request(request).await.map_err(|err| err.to_string())
}

fn full(text: &str) -> Body {
    Full::new(Bytes::from(text.to_string()))
        .map_err(|never| match never {})
        .boxed()
}

/// A CA in `dir` and a server certificate for `localhost` and `127.0.0.1`
/// it signs, as a rustls server configuration.
fn server_config(dir: &Path) -> Result<(Arc<rustls::ServerConfig>, PathBuf)> {
    let ca = TestCa::generate(dir)?;
    let files = ca.server_cert("registry", &["localhost", "127.0.0.1"])?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<std::result::Result<_, _>>())
        .map_err(|err| pem_error(&files.cert, err))?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|err| pem_error(&files.key, err))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|builder| builder.with_no_client_auth().with_single_cert(certs, key))
        .map_err(|err| TestkitError::Io {
            service: SERVICE,
            action: "building the front's TLS configuration".into(),
            fix: "this is a bug of the test kit's certificate generation",
            source: std::io::Error::other(err),
        })?;
    Ok((Arc::new(config), ca.ca_file().to_path_buf()))
}

fn pem_error(path: &Path, err: rustls::pki_types::pem::Error) -> TestkitError {
    TestkitError::Io {
        service: SERVICE,
        action: format!("reading {}", path.display()),
        fix: "this is a bug of the test kit's certificate generation",
        source: std::io::Error::other(err),
    }
}

fn io(action: &'static str) -> impl FnOnce(std::io::Error) -> TestkitError {
    move |source| TestkitError::Io {
        service: SERVICE,
        action: action.to_string(),
        fix: "make sure the loopback interface is up and the process may open sockets",
        source,
    }
}

/// `(scheme, host:port, path)` of `http://host:port/path`.
fn split_url(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    authority.contains(':').then_some((scheme, authority, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_scheme_authority_and_path() {
        assert_eq!(
            split_url("http://127.0.0.1:8080/apis/ccompat/v7"),
            Some(("http", "127.0.0.1:8080", "/apis/ccompat/v7"))
        );
        assert_eq!(split_url("http://h:1"), Some(("http", "h:1", "")));
        assert_eq!(split_url("http://h/x"), None);
    }
}
