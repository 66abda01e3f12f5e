//! A throwaway Redis server, or an external one named by `EXACTLY_REDIS_URL`.

use std::ffi::OsString;

use crate::error::{Result, TestkitError};
use crate::handle::{Kind, ServiceHandle};
use crate::process::{self, ChildService, ChildSpec};

/// Environment variable that points the testkit at an existing Redis
/// (`redis://HOST:PORT/`) instead of starting one.
pub const REDIS_URL_ENV: &str = "EXACTLY_REDIS_URL";

const SERVICE: &str = "Redis";
const FIX_INSTALL: &str = "install Redis with `apt-get install -y redis-server` (or run \
     .ci/install-services.sh), or set EXACTLY_REDIS_URL=redis://HOST:PORT/ to use an existing server";
const FIX_START: &str = "read the redis-server log above, or set EXACTLY_REDIS_URL to use an \
     existing server instead";

/// A Redis server for tests.
///
/// Started by [`RedisServer::start`]: either `redis-server` on a free
/// loopback port without persistence (killed, and its temp dir deleted, when
/// the handle drops), or, when [`REDIS_URL_ENV`] is set, a handle that only
/// carries that URL.
#[derive(Debug)]
pub struct RedisServer {
    handle: ServiceHandle<ChildService>,
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
        let program = process::find_binary("redis-server", &[]).ok_or_else(|| TestkitError::BinaryNotFound {
            service: SERVICE,
            binary: "redis-server",
            searched: process::describe_search(&[]),
            docker: "the testkit has no container fallback for Redis".into(),
            fix: FIX_INSTALL,
        })?;
        let dir = process::service_temp_dir(SERVICE, "exactly-redis-")?;
        let data_dir = dir.path().as_os_str().to_os_string();
        let args = move |port: u16| -> Vec<OsString> {
            let mut args: Vec<OsString> = vec!["--port".into(), port.to_string().into()];
            let durability: &[&str] = if persistent {
                &["--appendonly", "yes", "--appendfsync", "always"]
            } else {
                &["--appendonly", "no"]
            };
            for arg in ["--bind", "127.0.0.1", "--save", ""].iter().chain(durability) {
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
        let port = service.port();
        let url = format!("redis://127.0.0.1:{port}/");
        let handle = ServiceHandle::managed(&KIND, url, port, service, Some(dir));
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
