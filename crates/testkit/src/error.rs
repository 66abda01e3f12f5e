//! The single error type of the testkit.
//!
//! Every variant names what went wrong *and* how to fix it, so that a failing
//! integration test tells the reader what to install or which environment
//! variable to set.

/// Everything that can go wrong while starting, stopping or restarting a
/// service.
///
/// `Debug` prints the same text as `Display`, so that `.expect()` and tests
/// returning `Result` show the readable message with its fix.
#[derive(thiserror::Error)]
pub enum TestkitError {
    /// A program the service needs is neither on `PATH` nor in the usual
    /// install locations, and no container could be started instead.
    #[error("{service}: cannot find `{binary}` (looked in {searched}); {docker}. Fix: {fix}")]
    BinaryNotFound {
        /// Human name of the service, e.g. `PostgreSQL`.
        service: &'static str,
        /// The program that is missing.
        binary: &'static str,
        /// Where the testkit looked.
        searched: String,
        /// Why the Docker fallback was not used (no engine answered, it was
        /// disabled by `EXACTLY_TESTKIT_DOCKER=never`, or the service has none).
        docker: String,
        /// How to install it, how to let the testkit use Docker, or how to
        /// point the testkit at an existing server.
        fix: &'static str,
    },

    /// A testkit setting read from the environment has a value the testkit
    /// does not understand.
    #[error("{var}={value:?} is not a valid setting. Fix: {fix}")]
    InvalidSetting {
        /// The environment variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// The values it accepts.
        fix: &'static str,
    },

    /// An operating-system call failed (creating a temp dir, spawning a
    /// process, opening a log file, ...).
    #[error("{service}: {action} failed: {source}. Fix: {fix}")]
    Io {
        /// Human name of the service.
        service: &'static str,
        /// What the testkit was doing.
        action: String,
        /// How to fix it.
        fix: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A helper command (such as `initdb` or `pg_ctl`) exited unsuccessfully.
    #[error("{service}: `{command}` failed ({status}). Output:\n{output}\nFix: {fix}")]
    CommandFailed {
        /// Human name of the service.
        service: &'static str,
        /// The command line that failed.
        command: String,
        /// Its exit status.
        status: String,
        /// Its captured stdout and stderr (and the server log tail, if any).
        output: String,
        /// How to fix it.
        fix: &'static str,
    },

    /// The service did not start accepting TCP connections in time, or its
    /// process exited during startup.
    #[error(
        "{service} did not become ready on 127.0.0.1:{port}: {reason}. \
         Log tail of {log}:\n{log_tail}\nFix: {fix}"
    )]
    StartFailed {
        /// Human name of the service.
        service: &'static str,
        /// The loopback port it was asked to listen on.
        port: u16,
        /// Why it gave up (timeout, process exited, ...).
        reason: String,
        /// Path of the service's log file.
        log: String,
        /// The last lines of that log.
        log_tail: String,
        /// How to fix it.
        fix: &'static str,
    },

    /// The container engine refused or failed an operation on a container
    /// (only in a build with the `containers` feature).
    #[cfg(feature = "containers")]
    #[error("{service}: {action} failed: {source}. Fix: {fix}")]
    Container {
        /// Human name of the service.
        service: &'static str,
        /// What the testkit asked the engine, naming the container.
        action: String,
        /// How to fix it.
        fix: &'static str,
        /// The engine's answer.
        #[source]
        source: Box<testcontainers::TestcontainersError>,
    },

    /// Freezing or thawing a service's processes did not take effect in
    /// time.
    #[error(
        "{service}: {action} did not take effect within 5 s; threads still not there: {threads}. \
         Fix: look at their state (`ps -L -o pid,lwp,stat,wchan -p <pid>`): a thread in \
         uninterruptible sleep (D) or under a debugger does not stop or resume until it is released"
    )]
    SignalNotTaken {
        /// Human name of the service.
        service: &'static str,
        /// What was asked.
        action: &'static str,
        /// The threads (`pid/tid`) not yet in the state asked for.
        threads: String,
    },

    /// A request to a Kafka broker of a cluster the kit started failed, or
    /// the broker (or its controller) refused it.
    #[error("{service}: {action} failed: {source}. Fix: {fix}")]
    Kafka {
        /// Human name of the service.
        service: &'static str,
        /// What the kit asked for (`creating topic t`, ...).
        action: String,
        /// How to fix it.
        fix: &'static str,
        /// Why it failed: a socket error, or the broker's error code and
        /// message.
        #[source]
        source: crate::kafka::KafkaRequestError,
    },

    /// An HTTP request to a service the kit started (the schema registry's
    /// REST API) failed, or the service refused it.
    #[error("{service}: {action} failed: {detail}. Fix: {fix}")]
    Http {
        /// Human name of the service.
        service: &'static str,
        /// What the kit asked for (`registering a schema under subject s`).
        action: String,
        /// The transport error, or the HTTP status and the service's answer.
        detail: String,
        /// How to fix it.
        fix: &'static str,
    },

    /// A condition the kit waits for (a broker back in a cluster, a topic's
    /// leaders and in-sync replicas, ...) did not hold in time.
    #[error("{service}: {condition} did not hold within {waited_s} s; last seen: {last}. Fix: {fix}")]
    Timeout {
        /// Human name of the service.
        service: &'static str,
        /// What was waited for.
        condition: String,
        /// How long.
        waited_s: u64,
        /// The state last observed (or the last error).
        last: String,
        /// How to fix it.
        fix: &'static str,
    },

    /// The operation is not possible because the handle points at an
    /// externally managed service given through an environment variable.
    #[error(
        "{service} at {address} comes from the environment variable {env_var}; the testkit \
         cannot {action} a service it did not start. Fix: a test that stops, restarts, freezes or \
         reconfigures a service starts its own (`start_own`, `KafkaBroker::start`), whatever \
         {env_var} says"
    )]
    External {
        /// Human name of the service.
        service: &'static str,
        /// The environment variable that supplied the address.
        env_var: &'static str,
        /// The address from that variable.
        address: String,
        /// The refused action (`stop`, `restart`).
        action: &'static str,
    },
}

impl TestkitError {
    /// Whether this error looks like a lost race for a TCP port (another
    /// process bound the port between it being picked and the service
    /// binding it). The testkit retries such start-ups on a fresh port.
    pub fn is_port_conflict(&self) -> bool {
        let text = match self {
            TestkitError::StartFailed { log_tail, .. } => log_tail.clone(),
            TestkitError::CommandFailed { output, .. } => output.clone(),
            #[cfg(feature = "containers")]
            TestkitError::Container { source, .. } => source.to_string(),
            _ => return false,
        };
        let text = text.to_ascii_lowercase();
        // The last one is Docker's wording when it cannot publish a port.
        text.contains("address already in use")
            || text.contains("addrinuse")
            || text.contains("port is already allocated")
    }
}

impl std::fmt::Debug for TestkitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Short alias used throughout the crate.
pub type Result<T, E = TestkitError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_small_enough_for_clippy_result_large_err() {
        assert!(std::mem::size_of::<TestkitError>() <= 120);
    }

    #[test]
    fn recognises_port_conflicts_and_prints_the_fix() {
        let err = TestkitError::StartFailed {
            service: "Redis",
            port: 1234,
            reason: "the process exited early".into(),
            log: "/tmp/x.log".into(),
            log_tail: "Could not create server TCP listening socket: Address already in use".into(),
            fix: "do this",
        };
        assert!(err.is_port_conflict());
        let docker = TestkitError::CommandFailed {
            service: "PostgreSQL",
            command: "docker run".into(),
            status: "exit status: 125".into(),
            output: "Bind for 127.0.0.1:1234 failed: port is already allocated".into(),
            fix: "retry",
        };
        assert!(docker.is_port_conflict());
        let text = format!("{err:?}");
        assert!(
            text.contains("127.0.0.1:1234") && text.contains("Fix: do this"),
            "{text}"
        );
    }
}
