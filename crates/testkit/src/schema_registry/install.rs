//! Where Apicurio Registry's runnable distribution and a Java runtime are
//! found.
//!
//! `.ci/install-services.sh` fetches
//! `io.apicurio:apicurio-registry-app:<version>:tar.gz:all` from Maven
//! Central with Maven and unpacks it into [`default_home`];
//! [`SCHEMA_REGISTRY_HOME_ENV`] points the test kit (and any other tool) at
//! another unpacked copy of the same version.

use std::path::{Path, PathBuf};

use crate::error::{Result, TestkitError};
use crate::process;

/// The Apicurio Registry release the test kit runs. The 3.0.x line runs on
/// Java 17 (3.3.x needs Java 21).
pub const APICURIO_VERSION: &str = "3.0.9";

/// Environment variable naming the folder of an unpacked
/// `apicurio-registry-app-<version>-all.tar.gz` (the runner jar and its
/// `lib/`), instead of [`default_home`].
pub const SCHEMA_REGISTRY_HOME_ENV: &str = "EXACTLY_SCHEMA_REGISTRY_HOME";

pub(crate) const SERVICE: &str = "Schema registry";

/// `$XDG_CACHE_HOME/exactly/apicurio-registry-<version>`, or
/// `~/.cache/exactly/apicurio-registry-<version>`: where the install script
/// unpacks the distribution.
pub fn default_home() -> PathBuf {
    process::cache_dir().join(format!("apicurio-registry-{APICURIO_VERSION}"))
}

/// The runner jar's file name.
pub(crate) fn runner_jar_name() -> String {
    format!("apicurio-registry-app-{APICURIO_VERSION}-runner.jar")
}

/// A Java runtime and the registry's runner jar.
#[derive(Clone, Debug)]
pub(crate) struct Installation {
    pub(crate) java: PathBuf,
    pub(crate) jar: PathBuf,
}

impl Installation {
    /// `java` from `JAVA_HOME` or `PATH`, and the runner jar from
    /// [`SCHEMA_REGISTRY_HOME_ENV`] or [`default_home`]; a
    /// [`TestkitError::BinaryNotFound`] naming the fix when either is
    /// missing.
    pub(crate) fn find() -> Result<Installation> {
        let home = process::external_address(SCHEMA_REGISTRY_HOME_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(default_home);
        let java = process::find_java().map_err(|searched| not_found("java", searched))?;
        let jar = runner_jar(&home).ok_or_else(|| {
            not_found(
                "apicurio-registry-app-*-runner.jar",
                format!("{} ({SCHEMA_REGISTRY_HOME_ENV} or the default folder)", home.display()),
            )
        })?;
        Ok(Installation { java, jar })
    }
}

/// The runner jar of [`APICURIO_VERSION`] in `home`, if it is there.
fn runner_jar(home: &Path) -> Option<PathBuf> {
    let jar = home.join(runner_jar_name());
    jar.is_file().then_some(jar)
}

/// The error for a missing Java runtime or distribution.
pub(crate) fn not_found(binary: &'static str, searched: String) -> TestkitError {
    TestkitError::BinaryNotFound {
        service: SERVICE,
        binary,
        searched,
        docker: "the schema registry runs from its jar only".into(),
        fix: "run `bash .ci/install-services.sh` (it installs OpenJDK if missing and unpacks \
             io.apicurio:apicurio-registry-app:3.0.9:tar.gz:all from Maven Central into \
             ~/.cache/exactly/apicurio-registry-3.0.9), or set EXACTLY_SCHEMA_REGISTRY_HOME to an unpacked \
             copy of that distribution; or set EXACTLY_SCHEMA_REGISTRY_URL to the Confluent-compatible API \
             of a running registry (e.g. http://host:8080/apis/ccompat/v7)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_install_script_fetches_the_version_the_kit_runs() {
        let script = include_str!("../../../../.ci/install-services.sh");
        assert!(
            script.contains(&format!("apicurio_version={APICURIO_VERSION}\n")),
            ".ci/install-services.sh must fetch Apicurio Registry {APICURIO_VERSION}"
        );
        let text = not_found("java", String::new()).to_string();
        assert!(text.contains(APICURIO_VERSION), "{text}");
    }

    #[test]
    fn the_default_folder_names_the_version() {
        let dir = default_home();
        assert!(
            dir.ends_with(format!("exactly/apicurio-registry-{APICURIO_VERSION}")),
            "{}",
            dir.display()
        );
    }

    #[test]
    fn a_folder_without_the_runner_jar_is_not_an_installation() {
        let dir = tempfile::tempdir().unwrap();
        assert!(runner_jar(dir.path()).is_none());
        std::fs::write(dir.path().join(runner_jar_name()), b"").unwrap();
        assert!(runner_jar(dir.path()).is_some());
    }

    #[test]
    fn the_missing_registry_error_names_every_way_out() {
        let text = not_found("java", "PATH=/bin".into()).to_string();
        for part in [
            "bash .ci/install-services.sh",
            SCHEMA_REGISTRY_HOME_ENV,
            "EXACTLY_SCHEMA_REGISTRY_URL",
            "PATH=/bin",
        ] {
            assert!(text.contains(part), "{part} missing from: {text}");
        }
    }
}
