//! A throwaway PostgreSQL cluster, or an external one named by
//! `EXACTLY_DATABASE_URL`.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::error::{Result, TestkitError};
use crate::handle::{Kind, Lifecycle, ServiceHandle};
use crate::process::{self, Startup};

/// Environment variable that points the testkit at an existing PostgreSQL
/// instead of starting one. The server must allow `PREPARE TRANSACTION`
/// (`max_prepared_transactions > 0`).
pub const DATABASE_URL_ENV: &str = "EXACTLY_DATABASE_URL";

/// Value of `max_prepared_transactions` in a testkit cluster.
pub const MAX_PREPARED_TRANSACTIONS: u32 = 64;

const SERVICE: &str = "PostgreSQL";
const OS_USER: &str = "postgres";
const FIX_INSTALL: &str = "install PostgreSQL (`apt-get install -y postgresql`, or run \
     .ci/install-services.sh), or set EXACTLY_DATABASE_URL=postgres://USER@HOST:PORT/DB to use \
     an existing server with max_prepared_transactions > 0";
const FIX_START: &str = "read the server log above; a stale cluster may hold the port or \
     shared memory may be exhausted. Set EXACTLY_DATABASE_URL to use an existing server instead";

/// A PostgreSQL server for tests.
///
/// Started by [`PostgresServer::start`]: either a fresh cluster in a temp dir
/// on a free loopback port (stopped and deleted when the handle drops), or,
/// when [`DATABASE_URL_ENV`] is set, a handle that only carries that URL.
#[derive(Debug)]
pub struct PostgresServer {
    handle: ServiceHandle<Cluster>,
}

static KIND: Kind = Kind::new(SERVICE, DATABASE_URL_ENV, 5432);

impl PostgresServer {
    /// Uses `EXACTLY_DATABASE_URL` when set; otherwise creates a cluster with
    /// the local PostgreSQL binaries (`initdb`, `pg_ctl`, `postgres` on `PATH`
    /// or under `/usr/lib/postgresql/*/bin`), starts it on a free port of
    /// 127.0.0.1 with trust authentication for user `postgres` and
    /// `max_prepared_transactions = 64`, and waits (at most 30 s) until it
    /// accepts connections.
    ///
    /// When running as root, the cluster runs as the `postgres` OS user.
    pub fn start() -> Result<PostgresServer> {
        if let Some(handle) = ServiceHandle::from_env(&KIND) {
            return Ok(PostgresServer { handle });
        }
        let cluster = Cluster::create()?;
        let port = cluster.port;
        let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        let handle = ServiceHandle::managed(&KIND, url, port, cluster, None);
        Ok(PostgresServer { handle })
    }

    service_handle_methods! {
        address: url,
        address_doc: "Connection URL, `postgres://postgres@127.0.0.1:PORT/postgres` for a testkit \
                      cluster, the value of `EXACTLY_DATABASE_URL` otherwise.",
        what: "PostgreSQL server",
        env: "EXACTLY_DATABASE_URL",
        stop_doc: "Stops the cluster abruptly (`pg_ctl stop -m immediate`), like a crash or an \
                   outage; the data directory and port are kept for [`restart`](Self::restart). \
                   Does nothing if already stopped.",
        restart_doc: "Stops the cluster (if running) as [`stop`](Self::stop) does, then starts it \
                      again on the same data directory and port, and waits until it accepts \
                      connections.",
    }

    /// Data directory of a testkit cluster (`None` for an external server).
    pub fn data_dir(&self) -> Option<&Path> {
        self.handle.inner().map(|c| c.data_dir.as_path())
    }
}

/// Paths of the PostgreSQL programs.
struct Binaries {
    initdb: PathBuf,
    pg_ctl: PathBuf,
    postgres: PathBuf,
    pg_isready: Option<PathBuf>,
}

impl Binaries {
    /// The first directory, of `PATH` then `/usr/lib/postgresql/*/bin`
    /// (newest version first), that holds `initdb`, `pg_ctl` and `postgres`.
    fn find() -> Result<Binaries> {
        let versioned = versioned_bin_dirs();
        let dirs = process::search_dirs(&versioned);
        let dir = dirs
            .iter()
            .find(|dir| {
                ["initdb", "pg_ctl", "postgres"]
                    .iter()
                    .all(|name| process::is_executable(&dir.join(name)))
            })
            .ok_or_else(|| TestkitError::BinaryNotFound {
                service: SERVICE,
                binary: "initdb",
                searched: format!(
                    "{} for a directory holding initdb, pg_ctl and postgres",
                    process::describe_search(&[PathBuf::from("/usr/lib/postgresql/*/bin")])
                ),
                fix: FIX_INSTALL,
            })?;
        let pg_isready = Some(dir.join("pg_isready"))
            .filter(|p| process::is_executable(p))
            .or_else(|| process::find_binary("pg_isready", &versioned));
        Ok(Binaries {
            initdb: dir.join("initdb"),
            pg_ctl: dir.join("pg_ctl"),
            postgres: dir.join("postgres"),
            pg_isready,
        })
    }
}

/// `/usr/lib/postgresql/*/bin`, highest major version first.
fn versioned_bin_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .collect();
    dirs.sort_by_key(|(version, _)| std::cmp::Reverse(*version));
    dirs.into_iter().map(|(_, dir)| dir).collect()
}

/// The OS user a cluster runs as when the testkit runs as root.
#[derive(Clone, Copy)]
struct RunAs {
    uid: u32,
    gid: u32,
}

impl RunAs {
    /// `None` when not root; the `postgres` user when root.
    fn detect() -> Result<Option<RunAs>> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(None);
        }
        let name = std::ffi::CString::new(OS_USER).expect("no NUL in user name");
        // SAFETY: an all-zero passwd (null pointers, zero ids) is a valid
        // value that getpwnam_r overwrites.
        let mut record: libc::passwd = unsafe { std::mem::zeroed() };
        let mut buffer = vec![0 as libc::c_char; 16 * 1024];
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: all pointers are valid for the duration of the call and
        // `buffer.len()` is the buffer's real size; getpwnam_r (unlike
        // getpwnam) is safe to call from parallel test threads.
        let rc = unsafe {
            libc::getpwnam_r(
                name.as_ptr(),
                &mut record,
                buffer.as_mut_ptr(),
                buffer.len(),
                &mut found,
            )
        };
        if rc != 0 || found.is_null() {
            return Err(TestkitError::BinaryNotFound {
                service: SERVICE,
                binary: "postgres (OS user)",
                searched: "the user database (getpwnam_r)".into(),
                fix: "PostgreSQL refuses to run as root and the testkit runs it as the `postgres` \
                      user, which does not exist: install the `postgresql` package (it creates \
                      the user) or `useradd --system postgres`, or run the tests as a non-root \
                      user",
            });
        }
        let (uid, gid) = (record.pw_uid, record.pw_gid);
        Ok(Some(RunAs { uid, gid }))
    }
}

/// A cluster owned by the testkit.
struct Cluster {
    bins: Binaries,
    run_as: Option<RunAs>,
    port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    running: bool,
    /// Removed (with everything in it) after the cluster was stopped in
    /// `Drop`; declared last so it drops last.
    dir: TempDir,
}

impl Cluster {
    fn create() -> Result<Cluster> {
        let bins = Binaries::find()?;
        let run_as = RunAs::detect()?;
        let dir = process::service_temp_dir(SERVICE, "exactly-postgres-")?;
        let socket_dir = dir.path().join("sock");
        let log = dir.path().join("server.log");
        let io = |action: String| {
            move |source| TestkitError::Io {
                service: SERVICE,
                action,
                fix: "make sure /tmp is writable",
                source,
            }
        };
        fs::create_dir(&socket_dir).map_err(io(format!("creating {}", socket_dir.display())))?;
        fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        if let Some(user) = run_as {
            for path in [dir.path(), &socket_dir, &log] {
                std::os::unix::fs::chown(path, Some(user.uid), Some(user.gid))
                    .map_err(io(format!("handing {} to the postgres user", path.display())))?;
            }
        }
        let mut cluster = Cluster {
            bins,
            run_as,
            port: 0,
            data_dir: dir.path().join("data"),
            log,
            running: false,
            dir,
        };
        cluster.init(&socket_dir)?;
        process::with_free_port(SERVICE, |port| {
            cluster.port = port;
            cluster.start()
        })?;
        Ok(cluster)
    }

    /// A command that runs `program` as the cluster's OS user, in the temp
    /// dir (a working directory that user can enter).
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.current_dir(self.dir.path());
        if let Some(user) = self.run_as {
            cmd.uid(user.uid).gid(user.gid);
        }
        cmd
    }

    /// Runs `initdb` and appends the testkit's settings to postgresql.conf.
    fn init(&self, socket_dir: &Path) -> Result<()> {
        let mut initdb = self.command(&self.bins.initdb);
        initdb
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8"])
            .args(["--locale=C", "--no-sync"]);
        process::run_command(SERVICE, &mut initdb, None, FIX_START)?;
        // fsync = off only skips flushing the OS cache, which a process kill
        // does not lose. synchronous_commit must stay on: a commit that
        // returned has to survive `stop()`, which simulates a crash.
        let settings = format!(
            "\n# added by exactly-testkit\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}'\n\
             max_prepared_transactions = {MAX_PREPARED_TRANSACTIONS}\n\
             fsync = off\n",
            socket_dir.display()
        );
        let conf = self.data_dir.join("postgresql.conf");
        OpenOptions::new()
            .append(true)
            .open(&conf)
            .and_then(|mut file| file.write_all(settings.as_bytes()))
            .map_err(|source| TestkitError::Io {
                service: SERVICE,
                action: format!("appending settings to {}", conf.display()),
                fix: "make sure the temp dir is writable",
                source,
            })
    }

    /// `pg_ctl start` on the cluster's port, then waits until the port
    /// accepts connections and `pg_isready` (if installed) agrees.
    fn start(&mut self) -> Result<()> {
        let started = Instant::now();
        let timeout_secs = process::STARTUP_TIMEOUT.as_secs().to_string();
        let mut pg_ctl = self.command(&self.bins.pg_ctl);
        pg_ctl
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(&self.log)
            .arg("-p")
            .arg(&self.bins.postgres)
            .args(["-o", &format!("-p {}", self.port)])
            .args(["-w", "-t", &timeout_secs, "start"]);
        process::run_command(SERVICE, &mut pg_ctl, Some(&self.log), FIX_START)?;
        self.running = true;
        let startup = Startup {
            service: SERVICE,
            port: self.port,
            log: &self.log,
            fix: FIX_START,
        };
        startup.wait_for_port(started, || None)?;
        if let Some(pg_isready) = &self.bins.pg_isready {
            self.wait_pg_isready(pg_isready, started, &startup)?;
        }
        tracing::info!(port = self.port, data_dir = %self.data_dir.display(), "PostgreSQL started");
        Ok(())
    }

    fn wait_pg_isready(&self, pg_isready: &Path, started: Instant, startup: &Startup) -> Result<()> {
        let port = self.port.to_string();
        loop {
            let ready = Command::new(pg_isready)
                .args(["-q", "-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-t", "2"])
                .stdin(std::process::Stdio::null())
                .status()
                .map(|status| status.success())
                .unwrap_or(true); // pg_isready unusable: the port check must do
            if ready {
                return Ok(());
            }
            if started.elapsed() >= process::STARTUP_TIMEOUT {
                return Err(startup.failed("pg_isready never reported the server ready"));
            }
            sleep(Duration::from_millis(100));
        }
    }

    /// `pg_ctl stop -m immediate`; falls back to killing the postmaster's
    /// process group if pg_ctl cannot stop it.
    fn stop(&mut self) -> Result<()> {
        let pid_file = self.data_dir.join("postmaster.pid");
        if !self.running && !pid_file.exists() {
            return Ok(());
        }
        let mut pg_ctl = self.command(&self.bins.pg_ctl);
        pg_ctl
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-m", "immediate", "-w", "stop"]);
        let result = process::run_command(SERVICE, &mut pg_ctl, Some(&self.log), FIX_START);
        if let Err(err) = &result {
            tracing::warn!(%err, "pg_ctl stop failed, killing the postmaster");
            if let Some(pid) = process::read_pid(&pid_file) {
                // pg_ctl starts the postmaster in its own session, so its pid
                // is also its process group id.
                process::kill_process_group(pid);
            }
        }
        self.running = false;
        if !process::wait_port_closed(self.port) {
            result?;
            return Err(TestkitError::CommandFailed {
                service: SERVICE,
                command: "pg_ctl stop -m immediate".into(),
                status: "port still open".into(),
                output: process::log_tail(&self.log),
                fix: "kill the stray postgres process by hand",
            });
        }
        tracing::info!(port = self.port, "PostgreSQL stopped");
        Ok(())
    }
}

impl Lifecycle for Cluster {
    fn stop(&mut self) -> Result<()> {
        Cluster::stop(self)
    }

    fn restart(&mut self) -> Result<()> {
        Cluster::stop(self)?;
        self.start()
    }

    fn is_running(&mut self) -> bool {
        self.running
    }

    fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(err) = self.stop() {
            tracing::warn!(%err, "could not stop the PostgreSQL test cluster");
        }
        // `self.dir` (a TempDir) is dropped after this and removes the files.
    }
}
