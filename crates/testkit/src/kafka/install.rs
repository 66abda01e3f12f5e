//! Where the Apache Kafka broker's jars and a Java runtime are found.
//!
//! `.ci/install-services.sh` fetches the jars of [`KAFKA_VERSION`] with
//! Maven (`crates/testkit/kafka/pom.xml`) into [`default_libs_dir`];
//! [`KAFKA_LIBS_ENV`] points the test kit (and any other tool) at another
//! folder of the same jars.

use std::path::{Path, PathBuf};

use crate::error::{Result, TestkitError};
use crate::process;

/// The Apache Kafka release the test kit runs (`org.apache.kafka:kafka_2.13`).
pub const KAFKA_VERSION: &str = "4.1.1";

/// Environment variable naming the folder of the broker's jars (the
/// `libs/` of a Kafka release, or what the install script copied), instead
/// of [`default_libs_dir`].
pub const KAFKA_LIBS_ENV: &str = "EXACTLY_KAFKA_LIBS";

/// The command that installs the broker's jars (and the other services).
pub const KAFKA_INSTALL: &str = "bash .ci/install-services.sh";

/// The main jar every Kafka `libs/` folder holds.
const BROKER_JAR_PREFIX: &str = "kafka_2.13-";

pub(crate) const SERVICE: &str = "Kafka broker";

/// `$XDG_CACHE_HOME/exactly/kafka-<version>/libs`, or
/// `~/.cache/exactly/kafka-<version>/libs`: where the install script puts
/// the jars.
pub fn default_libs_dir() -> PathBuf {
    process::cache_dir().join(format!("kafka-{KAFKA_VERSION}")).join("libs")
}

/// A Java runtime and a folder of Kafka jars to run it with.
#[derive(Clone, Debug)]
pub(crate) struct Installation {
    pub(crate) java: PathBuf,
    pub(crate) libs: PathBuf,
}

impl Installation {
    /// `java` from `JAVA_HOME` or `PATH`, and the jars from
    /// [`KAFKA_LIBS_ENV`] or [`default_libs_dir`]; a
    /// [`TestkitError::BinaryNotFound`] naming the fix when either is
    /// missing.
    pub(crate) fn find() -> Result<Installation> {
        let libs = process::external_address(KAFKA_LIBS_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(default_libs_dir);
        let java = process::find_java().map_err(|searched| not_found("java", searched))?;
        if !has_broker_jar(&libs) {
            return Err(not_found(
                "kafka_2.13-*.jar",
                format!("{} ({KAFKA_LIBS_ENV} or the default folder)", libs.display()),
            ));
        }
        Ok(Installation { java, libs })
    }

    /// The class path argument: every jar of the folder (Java expands `*`).
    pub(crate) fn class_path(&self) -> std::ffi::OsString {
        self.libs.join("*").into_os_string()
    }
}

/// Whether `libs` holds `kafka_2.13-<version>.jar`.
fn has_broker_jar(libs: &Path) -> bool {
    std::fs::read_dir(libs).is_ok_and(|entries| {
        entries.flatten().any(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name.starts_with(BROKER_JAR_PREFIX) && name.ends_with(".jar")
        })
    })
}

/// The error for a missing Java runtime or missing jars, naming every way
/// to get a broker; the Docker fallback fills in why it did not run a
/// container.
pub(crate) fn not_found(binary: &'static str, searched: String) -> TestkitError {
    TestkitError::BinaryNotFound {
        service: SERVICE,
        binary,
        searched,
        docker: String::new(),
        fix: "run `bash .ci/install-services.sh` (it installs OpenJDK if missing and copies the jars of \
             org.apache.kafka:kafka_2.13 with Maven into ~/.cache/exactly/kafka-<version>/libs), or set \
             EXACTLY_KAFKA_LIBS to a folder of Kafka 4.x jars (a release's libs/); or make a Docker engine \
             answer the `docker` CLI (install Docker and start the engine, or point DOCKER_HOST at one) \
             so that the test kit runs apache/kafka:4.1.1 in a container; or set \
             EXACTLY_KAFKA_BOOTSTRAP=HOST:PORT to use a running Kafka",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pom_fetches_the_version_the_kit_runs() {
        let pom = include_str!("../../kafka/pom.xml");
        assert!(
            pom.contains(&format!("<kafka.version>{KAFKA_VERSION}</kafka.version>")),
            "crates/testkit/kafka/pom.xml must fetch Kafka {KAFKA_VERSION}"
        );
        assert!(
            pom.contains("log4j-slf4j-impl"),
            "the pom must add the log4j SLF4J binding"
        );
    }

    #[test]
    fn the_default_folder_names_the_version() {
        let dir = default_libs_dir();
        assert!(
            dir.ends_with(format!("exactly/kafka-{KAFKA_VERSION}/libs")),
            "{}",
            dir.display()
        );
    }

    #[test]
    fn a_folder_without_the_broker_jar_is_not_an_installation() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!has_broker_jar(dir.path()));
        std::fs::write(dir.path().join("kafka-clients-4.1.1.jar"), b"").unwrap();
        assert!(!has_broker_jar(dir.path()));
        std::fs::write(dir.path().join("kafka_2.13-4.1.1.jar"), b"").unwrap();
        assert!(has_broker_jar(dir.path()));
    }

    #[test]
    fn the_missing_broker_error_names_every_way_out() {
        let text = not_found("java", "PATH=/bin".into()).to_string();
        for part in [
            KAFKA_INSTALL,
            KAFKA_LIBS_ENV,
            super::super::KAFKA_IMAGE,
            "DOCKER_HOST",
            "EXACTLY_KAFKA_BOOTSTRAP",
            "PATH=/bin",
        ] {
            assert!(text.contains(part), "{part} missing from: {text}");
        }
    }
}
