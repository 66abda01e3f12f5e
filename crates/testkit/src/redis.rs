//! A throwaway Redis server (from the local `redis-server` or in a
//! container), or an external one named by `EXACTLY_REDIS_URL`.

// The container path's settings are used only with the `containers`
// feature; the build with it checks them.
#![cfg_attr(not(feature = "containers"), allow(dead_code))]

use std::ffi::OsString;
#[cfg(feature = "containers")]
use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    time::Duration,
};

use tempfile::TempDir;

#[cfg(feature = "containers")]
use crate::container::ContainerSpec;
use crate::container::{self, Container, DockerMode, Engine, Managed};
use crate::error::{Result, TestkitError};
use crate::handle::{Kind, ServiceHandle};
use crate::process::{self, ChildService, ChildSpec};

/// Environment variable that points the testkit at an existing Redis
/// (`redis://HOST:PORT/`) instead of starting one.
pub const REDIS_URL_ENV: &str = "EXACTLY_REDIS_URL";

const SERVICE: &str = "Redis";
/// Expands to the Redis image of the Docker fallback (a macro so that
/// `concat!` can use it).
macro_rules! redis_image {
    () => {
        "redis:7"
    };
}

/// The image the testkit runs when it starts Redis in a Docker container
/// (the Redis image of `testcontainers-modules`, at this tag).
pub const REDIS_IMAGE: &str = redis_image!();
const REDIS_TAG: &str = "7";
/// The port Redis listens on inside its container.
const CONTAINER_PORT: u16 = 6379;
const CONTAINER_SERVICE: &str = "Redis (container)";

const FIX_INSTALL: &str = concat!(
    "install Redis with `apt-get install -y redis-server` (or run .ci/install-services.sh); or make a \
     Docker engine answer (install Docker and start the engine, or point DOCKER_HOST at one) so that the \
     testkit runs ",
    redis_image!(),
    " in a container; or set EXACTLY_REDIS_URL=redis://HOST:PORT/ to use an existing server"
);
const FIX_CONTAINER: &str = concat!(
    "read the container log above; check that the Docker engine can pull ",
    redis_image!(),
    " and publish ports on 127.0.0.1; or install Redis (`apt-get install -y redis-server`), or set \
     EXACTLY_REDIS_URL to use an existing server instead"
);
const FIX_START: &str = "read the redis-server log above, or set EXACTLY_REDIS_URL to use an \
     existing server instead";

/// A Redis server for tests.
///
/// Started by [`RedisServer::start`]: `redis-server` on a free loopback
/// port without persistence (killed, and its temp dir deleted, when the
/// handle drops); without `redis-server`, a [`REDIS_IMAGE`] container when a
/// Docker engine answers (see the crate's docs); or, when [`REDIS_URL_ENV`]
/// is set, a handle that only carries that URL.
#[derive(Debug)]
pub struct RedisServer {
    handle: ServiceHandle<Managed<ChildService>>,
}

static KIND: Kind = Kind::new(SERVICE, REDIS_URL_ENV, 6379);

impl RedisServer {
    /// Uses `EXACTLY_REDIS_URL` when set; otherwise starts `redis-server`
    /// from `PATH` with `--port P --bind 127.0.0.1 --save "" --appendonly no
    /// --dir <temp dir>` on a free port and waits (at most 30 s) until it
    /// accepts connections.
    ///
    /// A test that stops, restarts or freezes the server must use
    /// [`start_own`](Self::start_own) or
    /// [`start_persistent`](Self::start_persistent) instead.
    pub fn start() -> Result<RedisServer> {
        if let Some(handle) = ServiceHandle::from_env(&KIND) {
            return Ok(RedisServer { handle });
        }
        Self::start_with(false)
    }

    /// Like [`start`](Self::start), but always starts a server of the
    /// caller's own, whatever `EXACTLY_REDIS_URL` says.
    pub fn start_own() -> Result<RedisServer> {
        Self::start_with(false)
    }

    /// Like [`start`](Self::start), but durable: `--appendonly yes
    /// --appendfsync always`, so everything acknowledged survives `stop()` /
    /// `restart()` (a crash of the server). Always a server of the caller's
    /// own, whatever `EXACTLY_REDIS_URL` says.
    pub fn start_persistent() -> Result<RedisServer> {
        Self::start_with(true)
    }

    fn start_with(persistent: bool) -> Result<RedisServer> {
        let (managed, dir) = container::local_then_container(
            SERVICE,
            DockerMode::from_env()?,
            container::engine,
            || {
                let (service, dir) = start_local(persistent)?;
                Ok((Managed::Local(service), dir))
            },
            |engine| {
                let (container, dir) = start_container(engine, persistent)?;
                Ok((Managed::Container(Box::new(container)), dir))
            },
            not_found,
        )?;
        let port = match &managed {
            Managed::Local(service) => service.port(),
            Managed::Container(container) => container.port(),
        };
        let url = format!("redis://127.0.0.1:{port}/");
        let handle = ServiceHandle::managed(&KIND, url, port, managed, Some(dir));
        Ok(RedisServer { handle })
    }

    service_handle_methods! {
        address: url,
        address_doc: "Connection URL, `redis://127.0.0.1:PORT/` for a testkit server, the value of \
                      `EXACTLY_REDIS_URL` otherwise.",
        what: "Redis server",
        env: "EXACTLY_REDIS_URL",
        stop_doc: "Kills the server (SIGKILL, like a crash) and waits until its port is closed. \
                   Does nothing if already stopped.",
        restart_doc: "Stops the server if it runs, then starts it again on the same port (empty: \
                      Redis runs without persistence here).",
    }
}

/// The error when `redis-server` is missing; the container fallback fills
/// in why it did not run a container.
fn not_found(searched: String) -> TestkitError {
    TestkitError::BinaryNotFound {
        service: SERVICE,
        binary: "redis-server",
        searched,
        docker: String::new(),
        fix: FIX_INSTALL,
    }
}

/// `redis-server`'s durability settings.
fn durability(persistent: bool) -> &'static [&'static str] {
    if persistent {
        &["--appendonly", "yes", "--appendfsync", "always"]
    } else {
        &["--appendonly", "no"]
    }
}

/// No container in a build without the `containers` feature (no engine
/// either, so this is never called).
#[cfg(not(feature = "containers"))]
fn start_container(engine: &Engine, _persistent: bool) -> Result<(Container, TempDir)> {
    match *engine {}
}

/// A [`REDIS_IMAGE`] container with the local server's settings.
#[cfg(feature = "containers")]
fn start_container(engine: &Engine, persistent: bool) -> Result<(Container, TempDir)> {
    use testcontainers::core::IntoContainerPort;
    use testcontainers::ImageExt;
    let dir = process::service_temp_dir(CONTAINER_SERVICE, "exactly-redis-")?;
    let mut command: Vec<String> = vec!["redis-server".into(), "--save".into(), String::new()];
    command.extend(durability(persistent).iter().map(|a| a.to_string()));
    let request = container::create(move |port| {
        testcontainers_modules::redis::Redis::default()
            .with_tag(REDIS_TAG)
            .with_cmd(command.clone())
            .with_mapped_port(port, CONTAINER_PORT.tcp())
    });
    let container = Container::start(
        engine,
        ContainerSpec {
            service: CONTAINER_SERVICE,
            slug: "redis",
            image: REDIS_IMAGE,
            inner_port: Some(CONTAINER_PORT),
            request,
            ready: |container| redis_answers(container.port()),
            fresh_on_restart: false,
            before_remove: None,
            log: dir.path().join("redis.log"),
            fix: FIX_CONTAINER,
        },
    )?;
    Ok((container, dir))
}

/// Whether Redis answers `PING` on `127.0.0.1:port` (a published Docker
/// port may accept connections before the server inside listens).
#[cfg(feature = "containers")]
fn redis_answers(port: u16) -> bool {
    let timeout = Duration::from_secs(2);
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let mut answer = [0u8; 5];
    stream.write_all(b"PING\r\n").is_ok() && stream.read_exact(&mut answer).is_ok() && &answer == b"+PONG"
}

/// `redis-server` from `PATH` on a free port, in a temp dir of its own.
fn start_local(persistent: bool) -> Result<(ChildService, TempDir)> {
    let program = process::find_binary("redis-server", &[]).ok_or_else(|| not_found(process::describe_search(&[])))?;
    let dir = process::service_temp_dir(SERVICE, "exactly-redis-")?;
    let data_dir = dir.path().as_os_str().to_os_string();
    let args = move |port: u16| -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["--port".into(), port.to_string().into()];
        for arg in ["--bind", "127.0.0.1", "--save", ""]
            .iter()
            .chain(durability(persistent))
        {
            args.push(arg.into());
        }
        args.extend(["--daemonize".into(), "no".into(), "--dir".into()]);
        args.push(data_dir.clone());
        args
    };
    let service = ChildService::start(ChildSpec {
        service: SERVICE,
        program,
        args: Box::new(args),
        env_remove: &[],
        cwd: dir.path().to_path_buf(),
        log: dir.path().join("redis.log"),
        fix: FIX_START,
    })?;
    Ok((service, dir))
}
