//! The container fallback of a build without the `containers` feature:
//! there is no engine, so no container is ever started and the types that
//! would hold one have no values.

use std::path::Path;

use crate::error::Result;

/// No engine can exist in this build.
#[derive(Debug)]
pub(crate) enum Engine {}

impl Engine {
    /// Never called: there is no engine.
    pub(crate) fn version(&self) -> &str {
        match *self {}
    }
}

/// Why no container is tried, for the error that lists what was.
pub(crate) fn engine() -> std::result::Result<&'static Engine, String> {
    Err("the test kit was built without its `containers` feature (the tests enable it; the demo does not)".into())
}

/// No container can exist in this build.
pub(crate) enum Container {}

// The same methods as a container build's, so that the services compile
// unchanged; some are called only by the container path.
#[allow(dead_code)]
impl Container {
    /// See the container build's.
    pub(crate) fn log_path(&self) -> &Path {
        match *self {}
    }
    /// See the container build's.
    pub(crate) fn name(&self) -> &str {
        match *self {}
    }
    /// See the container build's.
    pub(crate) fn port(&self) -> u16 {
        match *self {}
    }
    /// See the container build's.
    pub(crate) fn inner_port(&self) -> u16 {
        match *self {}
    }
    /// See the container build's.
    pub(crate) fn exec(&self, _args: &[&str]) -> Result<String> {
        match *self {}
    }
    /// See the container build's.
    pub(crate) fn exec_ok(&self, _args: &[&str]) -> bool {
        match *self {}
    }
    /// See the container build's.
    pub(crate) fn is_running(&self) -> bool {
        match *self {}
    }
    /// See the container build's.
    pub(crate) fn set_frozen(&mut self, _frozen: bool) -> Result<()> {
        match *self {}
    }
    /// See the container build's.
    pub(crate) fn stop(&mut self) -> Result<()> {
        match *self {}
    }
    /// See the container build's.
    pub(crate) fn restart(&mut self) -> Result<()> {
        match *self {}
    }
}
