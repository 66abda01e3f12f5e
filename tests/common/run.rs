//! A run of the `exactly` binary in the background: its metrics endpoint
//! on a port of its own and its stderr in a file, read while it runs.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A run with its metrics endpoint and its stderr in a file (read while it
/// runs).
pub struct Worker {
    pub child: Child,
    log: PathBuf,
    pub base: String,
}

impl Worker {
    pub fn start(file: &Path, dir: &Path, tag: &str) -> Worker {
        Worker::start_with(file, dir, tag, &[])
    }

    /// [`Worker::start`] inside `netns` (see [`super::netns`]).
    pub fn start_inside(netns: &super::netns::Netns, file: &Path, dir: &Path, tag: &str) -> Worker {
        let mut command = netns.exec();
        command.arg(env!("CARGO_BIN_EXE_exactly"));
        Worker::spawn(command, file, dir, tag, &[])
    }

    /// [`Worker::start`] with `env` set (a fault-injection plan).
    pub fn start_with(file: &Path, dir: &Path, tag: &str, env: &[(&str, &str)]) -> Worker {
        Worker::spawn(Command::new(env!("CARGO_BIN_EXE_exactly")), file, dir, tag, env)
    }

    fn spawn(mut command: Command, file: &Path, dir: &Path, tag: &str, env: &[(&str, &str)]) -> Worker {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = dir.join(format!("{tag}.log"));
        let child = command
            .args(["run", file.to_str().unwrap(), "--metrics-listen"])
            .arg(format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "info")
            .env_remove("EXACTLY_CRASH_AT")
            .env_remove("EXACTLY_DELAY_AT")
            .env_remove("EXACTLY_STOP_AT")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .expect("starting exactly");
        Worker {
            child,
            log,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits until its log shows `what`; fails the test with the log when
    /// it ends or `timeout` passes first.
    pub fn wait_for_log(&mut self, what: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.log().contains(what) {
            assert!(
                self.is_running() && Instant::now() < deadline,
                "waiting for {what:?} in the log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kill(mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }

    /// SIGTERM, then the exit status (at most `timeout`).
    pub fn stop(mut self, timeout: Duration) -> (bool, String) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status.success(), self.log());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the run did not stop within {timeout:?} of SIGTERM:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `signal` (SIGSTOP, SIGCONT…) to the run.
    pub fn signal(&self, signal: i32) {
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }
}
