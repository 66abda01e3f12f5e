//! A throwaway PostgreSQL cluster (from local binaries or in a container),
//! or an external one named by `EXACTLY_DATABASE_URL`.

// The container path's settings are used only with the `containers`
// feature; the build with it checks them.
#![cfg_attr(not(feature = "containers"), allow(dead_code))]

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
#[cfg(any(test, feature = "containers"))]
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use tempfile::TempDir;

#[cfg(feature = "containers")]
use crate::container::ContainerSpec;
use crate::container::{self, Container, DockerMode, Engine, Managed};
use crate::error::{Result, TestkitError};
use crate::handle::{Kind, Lifecycle, ServiceHandle};
use crate::process::{self, Startup};

/// Environment variable that points the testkit at an existing PostgreSQL
/// instead of starting one. The server must allow `PREPARE TRANSACTION`
/// (`max_prepared_transactions > 0`).
pub const DATABASE_URL_ENV: &str = "EXACTLY_DATABASE_URL";

/// Value of `max_prepared_transactions` in a testkit cluster.
pub const MAX_PREPARED_TRANSACTIONS: u32 = 64;

/// Expands to the PostgreSQL image of the Docker fallback (a macro so that
/// `concat!` can use it).
macro_rules! postgres_image {
    () => {
        "postgres:15"
    };
}

/// The tag of [`POSTGRES_IMAGE`] (the module's image is `postgres`).
const POSTGRES_TAG: &str = "15";

/// The image the testkit runs when it starts PostgreSQL in a Docker
/// container.
pub const POSTGRES_IMAGE: &str = postgres_image!();

const SERVICE: &str = "PostgreSQL";
const CONTAINER_SERVICE: &str = "PostgreSQL (container)";
const OS_USER: &str = "postgres";
const FIX_INSTALL: &str = concat!(
    "install PostgreSQL (`apt-get install -y postgresql`, or run .ci/install-services.sh); or \
     make a Docker engine answer (install Docker and start the engine, or point DOCKER_HOST at \
     one) so that the testkit runs ",
    postgres_image!(),
    " in a container; or set EXACTLY_DATABASE_URL=postgres://USER@HOST:PORT/DB to use an \
     existing server with max_prepared_transactions > 0"
);
const FIX_START: &str = "read the server log above; a stale cluster may hold the port or \
     shared memory may be exhausted. Set EXACTLY_DATABASE_URL to use an existing server instead";
const FIX_CONTAINER: &str = concat!(
    "read the container log above; check that the Docker engine can pull ",
    postgres_image!(),
    " and publish ports on 127.0.0.1; or install PostgreSQL (`apt-get install -y postgresql`), \
     or set EXACTLY_DATABASE_URL to use an existing server instead"
);
/// The port PostgreSQL listens on inside its container.
const CONTAINER_PORT: u16 = 5432;

/// A PostgreSQL server for tests.
///
/// Started by [`PostgresServer::start`], which uses, in this order:
///
/// 1. the server named by [`DATABASE_URL_ENV`], when set (the handle only
///    carries that URL);
/// 2. a fresh cluster in a temp dir, made with the local PostgreSQL
///    programs, on a free loopback port (stopped and deleted when the handle
///    drops);
/// 3. when those programs are missing (or
///    [`EXACTLY_TESTKIT_DOCKER`](crate::DOCKER_MODE_ENV)`=always`) and a
///    Docker engine answers: a [`POSTGRES_IMAGE`] container published on a
///    free loopback port (removed, with its data volume, when the handle
///    drops).
///
/// Both testkit clusters have user `postgres` with trust authentication and
/// `max_prepared_transactions =` [`MAX_PREPARED_TRANSACTIONS`]. Otherwise
/// `start` fails with [`TestkitError::BinaryNotFound`], which says how to
/// install PostgreSQL and why Docker was not used.
#[derive(Debug)]
pub struct PostgresServer {
    handle: ServiceHandle<Managed<Cluster>>,
    tls: Option<PostgresTls>,
}

/// What a client of a server started with [`PostgresServer::start_tls`]
/// needs: the CA, the password, a client certificate, and a way in for the
/// test's own checks.
#[derive(Clone)]
pub struct PostgresTls {
    /// The PEM certificate of the CA that signed the server's certificate
    /// (issued for `localhost` only).
    pub ca_file: PathBuf,
    /// The password of user `postgres` (scram-sha-256).
    pub password: String,
    /// A certificate for user [`CERT_USER`](Self::CERT_USER), who logs in
    /// with it alone (`cert` authentication).
    pub client: crate::tls::CertFiles,
    /// A key-value connection string for user `postgres` over the Unix
    /// socket (trust, no TLS): for the test's own set-up and checks.
    pub admin_url: String,
}

impl PostgresTls {
    /// The user of [`client`](Self::client).
    pub const CERT_USER: &'static str = "exactly_cert";
}

impl std::fmt::Debug for PostgresTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresTls")
            .field("ca_file", &self.ca_file)
            .field("password", &"***")
            .field("client", &self.client)
            .field("admin_url", &self.admin_url)
            .finish()
    }
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
    ///
    /// Without those binaries (or without the `postgres` OS user), starts a
    /// container instead (see the type's docs) and waits (at most 90 s after
    /// the image is there) until the server accepts TCP connections after
    /// the image's initialisation.
    ///
    /// A test that stops, restarts, freezes or reconfigures the server
    /// (`ALTER SYSTEM`) must use [`start_own`](Self::start_own) instead.
    pub fn start() -> Result<PostgresServer> {
        if let Some(handle) = ServiceHandle::from_env(&KIND) {
            return Ok(PostgresServer { handle, tls: None });
        }
        Self::start_own()
    }

    /// A cluster of the caller's own (local binaries only) that accepts
    /// TCP connections only over TLS: `ssl = on` with a certificate for
    /// `localhost` signed by a CA made for this server, and `pg_hba.conf`
    /// allowing `hostssl` with scram-sha-256 for every user (user
    /// `postgres` gets a random password) and `cert` authentication for
    /// [`PostgresTls::CERT_USER`]; Unix-socket connections are trusted
    /// ([`PostgresTls::admin_url`]). [`url`](Self::url) is
    /// `postgres://postgres@localhost:PORT/postgres?sslmode=verify-full&sslrootcert=<CA>`,
    /// without the password ([`tls`](Self::tls) has it).
    pub fn start_tls() -> Result<PostgresServer> {
        let cluster = Cluster::create_with(true)?;
        let port = cluster.port;
        let tls = cluster.tls.clone().expect("a TLS cluster has its TLS files");
        let url = format!(
            "postgres://postgres@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={}",
            tls.ca_file.display()
        );
        let handle = ServiceHandle::managed(&KIND, url, port, Managed::Local(cluster), None);
        Ok(PostgresServer { handle, tls: Some(tls) })
    }

    /// The TLS files and password of a server started with
    /// [`start_tls`](Self::start_tls).
    pub fn tls(&self) -> Option<&PostgresTls> {
        self.tls.as_ref()
    }

    /// Like [`start`](Self::start), but always starts a cluster of the
    /// caller's own, whatever `EXACTLY_DATABASE_URL` says: for tests that
    /// stop, restart, freeze or reconfigure it.
    pub fn start_own() -> Result<PostgresServer> {
        let (managed, dir) = container::local_then_container(
            SERVICE,
            DockerMode::from_env()?,
            container::engine,
            || Ok((Managed::Local(Cluster::create()?), None)),
            |engine| {
                let (container, dir) = start_container(engine)?;
                Ok((Managed::Container(Box::new(container)), Some(dir)))
            },
            binaries_not_found,
        )?;
        let port = match &managed {
            Managed::Local(cluster) => cluster.port,
            Managed::Container(container) => container.port(),
        };
        let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        let handle = ServiceHandle::managed(&KIND, url, port, managed, dir);
        Ok(PostgresServer { handle, tls: None })
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

    /// Data directory of a cluster started from local binaries (`None` for
    /// an external server, and for a container, whose data lives in a
    /// Docker volume).
    pub fn data_dir(&self) -> Option<&Path> {
        self.handle
            .inner()
            .and_then(Managed::local)
            .map(|c| c.data_dir.as_path())
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
            .ok_or_else(|| {
                binaries_not_found(format!(
                    "{} for a directory holding initdb, pg_ctl and postgres",
                    process::describe_search(&[PathBuf::from("/usr/lib/postgresql/*/bin")])
                ))
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

/// The error for missing PostgreSQL programs, naming every way to get a
/// server; the Docker fallback fills in why it did not run a container.
fn binaries_not_found(searched: String) -> TestkitError {
    TestkitError::BinaryNotFound {
        service: SERVICE,
        binary: "initdb",
        searched,
        docker: String::new(),
        fix: FIX_INSTALL,
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
                docker: String::new(),
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
    /// TLS-only clusters ([`PostgresServer::start_tls`]).
    tls: Option<PostgresTls>,
    /// Removed (with everything in it) after the cluster was stopped in
    /// `Drop`; declared last so it drops last.
    dir: TempDir,
}

impl Cluster {
    fn create() -> Result<Cluster> {
        Self::create_with(false)
    }

    fn create_with(tls: bool) -> Result<Cluster> {
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
            tls: None,
            dir,
        };
        cluster.init(&socket_dir)?;
        if tls {
            cluster.secure(&socket_dir)?;
        }
        process::with_free_port(SERVICE, |port| {
            cluster.port = port;
            cluster.start()
        })?;
        if tls {
            cluster.create_cert_user(&socket_dir)?;
        }
        Ok(cluster)
    }

    /// Makes the cluster TLS-only: certificates, `ssl = on`, a password
    /// for `postgres` and a `pg_hba.conf` of `hostssl` lines only.
    fn secure(&mut self, socket_dir: &Path) -> Result<()> {
        let io = |action: String| {
            move |source| TestkitError::Io {
                service: SERVICE,
                action,
                fix: "make sure the temp dir is writable",
                source,
            }
        };
        let tls_dir = self.dir.path().join("tls");
        let ca = crate::tls::TestCa::generate(&tls_dir)?;
        let server = ca.server_cert("server", &["localhost"])?;
        let client = ca.client_cert("client", PostgresTls::CERT_USER)?;
        if let Some(user) = self.run_as {
            for path in [&tls_dir, &server.cert, &server.key, &ca.ca_file().to_path_buf()] {
                std::os::unix::fs::chown(path, Some(user.uid), Some(user.gid))
                    .map_err(io(format!("handing {} to the postgres user", path.display())))?;
            }
        }
        let password = format!("pg-secret-{}", random_suffix());
        let settings = format!(
            "\n# TLS only, added by exactly-testkit\n\
             ssl = on\n\
             ssl_cert_file = '{}'\n\
             ssl_key_file = '{}'\n\
             ssl_ca_file = '{}'\n\
             password_encryption = 'scram-sha-256'\n",
            server.cert.display(),
            server.key.display(),
            ca.ca_file().display()
        );
        let conf = self.data_dir.join("postgresql.conf");
        OpenOptions::new()
            .append(true)
            .open(&conf)
            .and_then(|mut file| file.write_all(settings.as_bytes()))
            .map_err(io(format!("appending settings to {}", conf.display())))?;
        let hba = format!(
            "# written by exactly-testkit: TCP only over TLS\n\
             local all all trust\n\
             hostssl all {cert_user} 127.0.0.1/32 cert\n\
             hostssl all {cert_user} ::1/128 cert\n\
             hostssl all all 127.0.0.1/32 scram-sha-256\n\
             hostssl all all ::1/128 scram-sha-256\n",
            cert_user = PostgresTls::CERT_USER
        );
        let hba_file = self.data_dir.join("pg_hba.conf");
        fs::write(&hba_file, hba).map_err(io(format!("writing {}", hba_file.display())))?;
        // The password is set in single-user mode, before the server
        // listens: nothing else can see it being set.
        let mut single = self.command(&self.bins.postgres);
        single
            .args(["--single", "-D"])
            .arg(&self.data_dir)
            .arg("postgres")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let mut child = single.spawn().map_err(io("starting postgres --single".into()))?;
        let sql = format!("ALTER ROLE postgres PASSWORD '{password}';\n");
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(sql.as_bytes())
            .map_err(io("setting the password".into()))?;
        let output = child.wait_with_output().map_err(io("setting the password".into()))?;
        if !output.status.success() {
            return Err(TestkitError::CommandFailed {
                service: SERVICE,
                command: "postgres --single (ALTER ROLE postgres PASSWORD ...)".into(),
                status: output.status.to_string(),
                output: String::from_utf8_lossy(&output.stderr).into_owned(),
                fix: FIX_START,
            });
        }
        let admin_url = format!(
            "host={} port={{port}} user=postgres dbname=postgres sslmode=disable",
            socket_dir.display()
        );
        self.tls = Some(PostgresTls {
            ca_file: ca.ca_file().to_path_buf(),
            password,
            client,
            admin_url,
        });
        Ok(())
    }

    /// Creates [`PostgresTls::CERT_USER`] (single-user mode cannot run
    /// while the server does, so through `psql` on the socket), and fills
    /// the port into the admin URL.
    fn create_cert_user(&mut self, socket_dir: &Path) -> Result<()> {
        let port = self.port;
        if let Some(tls) = &mut self.tls {
            tls.admin_url = tls.admin_url.replace("{port}", &port.to_string());
        }
        let psql = process::find_binary("psql", &versioned_bin_dirs()).ok_or_else(|| TestkitError::BinaryNotFound {
            service: SERVICE,
            binary: "psql",
            searched: "PATH and /usr/lib/postgresql/*/bin".into(),
            docker: "a TLS server runs from the local programs only".into(),
            fix: "install postgresql-client (apt-get install -y postgresql-client, or run .ci/install-services.sh)",
        })?;
        let mut command = Command::new(psql);
        command
            .arg("-h")
            .arg(socket_dir)
            .args([
                "-p",
                &port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
            ])
            .arg(format!("CREATE ROLE {} LOGIN SUPERUSER", PostgresTls::CERT_USER));
        process::run_command(SERVICE, &mut command, Some(&self.log), FIX_START).map(drop)
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

    /// Signals the postmaster's process group (pg_ctl starts it in its own
    /// session, so its pid is the group id): every backend stops with it.
    fn set_frozen(&mut self, frozen: bool) -> Result<()> {
        match process::read_pid(&self.data_dir.join("postmaster.pid")) {
            Some(pid) => process::freeze_process_group(pid, frozen, "PostgreSQL"),
            None => Ok(()),
        }
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

/// A [`POSTGRES_IMAGE`] container (the PostgreSQL image of
/// `testcontainers-modules`) with trust authentication for `postgres` and
/// the testkit's settings, ready once the server started by the image after
/// its initialisation accepts TCP connections.
#[cfg(feature = "containers")]
fn start_container(engine: &Engine) -> Result<(Container, TempDir)> {
    use testcontainers::core::IntoContainerPort;
    use testcontainers::ImageExt;
    let dir = process::service_temp_dir(CONTAINER_SERVICE, "exactly-postgres-")?;
    let request = container::create(|port| {
        testcontainers_modules::postgres::Postgres::default()
            .with_host_auth()
            .with_tag(POSTGRES_TAG)
            .with_env_var("POSTGRES_INITDB_ARGS", "--locale=C --encoding=UTF8 --no-sync")
            // Same settings as a local cluster (see `Cluster::init`); the
            // image's entrypoint passes them to `postgres`.
            .with_cmd(command_line())
            .with_mapped_port(port, CONTAINER_PORT.tcp())
    });
    let container = Container::start(
        engine,
        ContainerSpec {
            service: CONTAINER_SERVICE,
            slug: "postgres",
            image: POSTGRES_IMAGE,
            inner_port: Some(CONTAINER_PORT),
            request,
            ready: container_ready,
            fresh_on_restart: false,
            before_remove: None,
            log: dir.path().join("server.log"),
            fix: FIX_CONTAINER,
        },
    )?;
    Ok((container, dir))
}

/// No container in a build without the `containers` feature (no engine
/// either, so this is never called).
#[cfg(not(feature = "containers"))]
fn start_container(engine: &Engine) -> Result<(Container, TempDir)> {
    match *engine {}
}

/// The server's settings in the container: those of a local cluster.
#[cfg(feature = "containers")]
fn command_line() -> Vec<String> {
    vec![
        "-c".into(),
        format!("max_prepared_transactions={MAX_PREPARED_TRANSACTIONS}"),
        "-c".into(),
        "fsync=off".into(),
    ]
}

/// Whether the container's final server is up. The image first runs a
/// temporary server for its initialisation that listens on the Unix socket
/// only, so `pg_isready` must go through TCP; the host-side probe then checks
/// the published port reaches it.
#[cfg(feature = "containers")]
fn container_ready(container: &Container) -> bool {
    let port = container.inner_port().to_string();
    container.exec_ok(&["pg_isready", "-q", "-h", "127.0.0.1", "-p", &port, "-U", "postgres"])
        && postgres_answers(container.port())
}

/// Whether a PostgreSQL server answers on `127.0.0.1:port`: it replies `S`
/// or `N` to an SSLRequest. A published Docker port may accept connections
/// before the server inside listens, so accepting alone proves nothing.
#[cfg(any(test, feature = "containers"))]
fn postgres_answers(port: u16) -> bool {
    const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    let timeout = Duration::from_secs(2);
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let mut answer = [0u8; 1];
    stream.write_all(&SSL_REQUEST).is_ok() && stream.read_exact(&mut answer).is_ok() && matches!(answer[0], b'S' | b'N')
}

/// Random letters for a password (16 bytes of the kernel's random source,
/// hex).
fn random_suffix() -> String {
    let mut bytes = [0u8; 16];
    if let Ok(mut random) = fs::File::open("/dev/urandom") {
        let _ = random.read_exact(&mut bytes);
    }
    if bytes == [0; 16] {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes = (nanos ^ (u128::from(std::process::id()) << 64)).to_be_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_server_answers_the_probe_and_a_closed_port_does_not() {
        let pg = PostgresServer::start_own().expect("start PostgreSQL");
        assert!(postgres_answers(pg.port()), "{pg:?} did not answer an SSLRequest");
        let port = pg.port();
        drop(pg);
        assert!(!postgres_answers(port));
    }

    #[test]
    fn the_missing_binaries_error_names_every_way_out() {
        let text = binaries_not_found("PATH=/bin".into()).to_string();
        for part in [
            "apt-get install -y postgresql",
            POSTGRES_IMAGE,
            "DOCKER_HOST",
            DATABASE_URL_ENV,
        ] {
            assert!(text.contains(part), "{part} missing from: {text}");
        }
    }

    #[cfg(feature = "containers")]
    #[test]
    fn the_container_gets_the_local_clusters_settings() {
        let args = command_line().join(" ");
        assert_eq!(
            args,
            format!("-c max_prepared_transactions={MAX_PREPARED_TRANSACTIONS} -c fsync=off")
        );
        assert!(POSTGRES_IMAGE.ends_with(&format!(":{POSTGRES_TAG}")));
    }
}
