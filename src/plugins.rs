//! Connectors of your own under exactly's own command line: a binary
//! registers its source and sink factories under the kinds a pipeline file
//! names (`[source.<kind>]`, `[sink.<kind>]`) and hands the registry to
//! [`cli::main_with`](crate::cli::main_with). Every command of the `exactly`
//! binary then works for them as for the built-in connectors — `run` with
//! the metrics and health endpoint, JSON logs and the progress line,
//! `status`, `checkpoints list/show` — and their sections are read like the
//! built-ins': `{ env = … }` and `{ file = … }` secrets resolved, unknown
//! keys refused by name (with `#[serde(deny_unknown_fields)]` on the config
//! type), errors naming the file and the section.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use exactly::core::{ConnectorError, SinkFactory};
//! use exactly::plugins::Connectors;
//!
//! #[derive(serde::Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct MySinkConfig {
//!     path: std::path::PathBuf,
//! }
//!
//! # fn my_factory(_: MySinkConfig) -> Arc<dyn SinkFactory> { unimplemented!() }
//! fn main() -> anyhow::Result<()> {
//!     let connectors = Connectors::default().sink("mine", |config: MySinkConfig, context| {
//!         let _relative_to = context.base_dir();
//!         Ok::<_, ConnectorError>(my_factory(config))
//!     });
//!     exactly::cli::main_with(std::env::args_os(), connectors)
//! }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use exactly_core::{ConnectorError, SinkFactory, SourceFactory};
use serde::de::DeserializeOwned;

/// The kinds the `exactly` binary has built in: a registered kind may not
/// take one of these names.
pub const BUILT_IN_SOURCES: [&str; 2] = ["sequence", "kafka"];
/// See [`BUILT_IN_SOURCES`].
pub const BUILT_IN_SINKS: [&str; 4] = ["file", "redis", "postgres", "kafka"];

/// What a registered builder gets besides its section.
#[derive(Clone, Debug)]
pub struct PluginContext {
    pipeline: String,
    base_dir: Option<PathBuf>,
}

impl PluginContext {
    /// The pipeline's name (`name` in the file).
    pub fn pipeline(&self) -> &str {
        &self.pipeline
    }

    /// The folder of the pipeline file, against which relative paths in the
    /// section are meant (as the built-in connectors resolve theirs); `None`
    /// for a pipeline parsed from text.
    pub fn base_dir(&self) -> Option<&Path> {
        self.base_dir.as_deref()
    }

    /// `path` resolved against [`base_dir`](Self::base_dir) when relative.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        match &self.base_dir {
            Some(base) if path.is_relative() => base.join(path),
            _ => path.to_path_buf(),
        }
    }

    pub(crate) fn new(pipeline: &str, base_dir: Option<&Path>) -> PluginContext {
        PluginContext {
            pipeline: pipeline.to_string(),
            base_dir: base_dir.map(Path::to_path_buf),
        }
    }
}

type Check = dyn Fn(toml::Value) -> Result<(), String> + Send + Sync;
type Build<F> = dyn Fn(toml::Value, &PluginContext) -> Result<Arc<F>, ConnectorError> + Send + Sync;

struct Registered<F: ?Sized> {
    /// Deserializes the section into the config type (at load: every
    /// command checks the file before it does anything).
    check: Box<Check>,
    /// Deserializes it and builds the factory (when the pipeline is built;
    /// a factory connects to nothing until its `create`).
    build: Box<Build<F>>,
}

/// The connectors a pipeline file may name beyond the built-in ones.
/// Cheap to clone (the builders are shared). [`Connectors::default`] has none: the `exactly` binary.
#[derive(Clone, Default)]
pub struct Connectors {
    sources: BTreeMap<String, Arc<Registered<dyn SourceFactory>>>,
    sinks: BTreeMap<String, Arc<Registered<dyn SinkFactory>>>,
}

impl fmt::Debug for Connectors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connectors")
            .field("sources", &self.sources.keys().collect::<Vec<_>>())
            .field("sinks", &self.sinks.keys().collect::<Vec<_>>())
            .finish()
    }
}

fn registered<C, F, B>(build: B) -> Registered<F>
where
    C: DeserializeOwned + 'static,
    F: ?Sized + 'static,
    B: Fn(C, &PluginContext) -> Result<Arc<F>, ConnectorError> + Send + Sync + 'static,
{
    Registered {
        check: Box::new(|value| value.try_into::<C>().map(drop).map_err(|e| e.to_string())),
        build: Box::new(move |value, context| {
            let config: C = value
                .try_into()
                .map_err(|e| ConnectorError::fatal("plugin config", crate::ops::redact::redact(&e.to_string())))?;
            build(config, context)
        }),
    }
}

/// Panics with a message naming the problem: registering is the author's
/// code, run at start, so a clash is a bug to fix there.
fn check_kind(kind: &str, built_in: &[&str], taken: bool, what: &str) {
    assert!(
        !kind.is_empty()
            && kind
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
        "the {what} kind `{kind}` must be lowercase letters, digits and `_` (it is a TOML key: [{what}.{kind}])"
    );
    assert!(
        !built_in.contains(&kind),
        "the {what} kind `{kind}` is built in: register yours under another name"
    );
    assert!(!taken, "the {what} kind `{kind}` is registered twice");
}

impl Connectors {
    /// Adds a source kind: `[source.<kind>]` is deserialized into `C` and
    /// `build` makes the factory from it.
    ///
    /// # Panics
    /// When `kind` is built in, registered already, or not a plain
    /// lowercase name.
    pub fn source<C, B>(mut self, kind: &str, build: B) -> Self
    where
        C: DeserializeOwned + 'static,
        B: Fn(C, &PluginContext) -> Result<Arc<dyn SourceFactory>, ConnectorError> + Send + Sync + 'static,
    {
        check_kind(kind, &BUILT_IN_SOURCES, self.sources.contains_key(kind), "source");
        self.sources.insert(kind.to_string(), Arc::new(registered(build)));
        self
    }

    /// Adds a sink kind: `[sink.<kind>]` is deserialized into `C` and
    /// `build` makes the factory from it.
    ///
    /// # Panics
    /// When `kind` is built in, registered already, or not a plain
    /// lowercase name.
    pub fn sink<C, B>(mut self, kind: &str, build: B) -> Self
    where
        C: DeserializeOwned + 'static,
        B: Fn(C, &PluginContext) -> Result<Arc<dyn SinkFactory>, ConnectorError> + Send + Sync + 'static,
    {
        check_kind(kind, &BUILT_IN_SINKS, self.sinks.contains_key(kind), "sink");
        self.sinks.insert(kind.to_string(), Arc::new(registered(build)));
        self
    }

    /// The registered source kinds.
    pub fn source_kinds(&self) -> impl Iterator<Item = &str> {
        self.sources.keys().map(String::as_str)
    }

    /// The registered sink kinds.
    pub fn sink_kinds(&self) -> impl Iterator<Item = &str> {
        self.sinks.keys().map(String::as_str)
    }

    pub(crate) fn check_source(&self, kind: &str, section: toml::Value) -> Result<(), String> {
        let registered = self
            .sources
            .get(kind)
            .ok_or_else(|| unknown("source", kind, &BUILT_IN_SOURCES))?;
        (registered.check)(section)
    }

    pub(crate) fn check_sink(&self, kind: &str, section: toml::Value) -> Result<(), String> {
        let registered = self
            .sinks
            .get(kind)
            .ok_or_else(|| unknown("sink", kind, &BUILT_IN_SINKS))?;
        (registered.check)(section)
    }

    pub(crate) fn build_source(
        &self,
        kind: &str,
        section: toml::Value,
        context: &PluginContext,
    ) -> Result<Arc<dyn SourceFactory>, ConnectorError> {
        let registered = self
            .sources
            .get(kind)
            .ok_or_else(|| ConnectorError::fatal("pipeline file", unknown("source", kind, &BUILT_IN_SOURCES)))?;
        (registered.build)(section, context)
    }

    pub(crate) fn build_sink(
        &self,
        kind: &str,
        section: toml::Value,
        context: &PluginContext,
    ) -> Result<Arc<dyn SinkFactory>, ConnectorError> {
        let registered = self
            .sinks
            .get(kind)
            .ok_or_else(|| ConnectorError::fatal("pipeline file", unknown("sink", kind, &BUILT_IN_SINKS)))?;
        (registered.build)(section, context)
    }
}

fn unknown(what: &str, kind: &str, built_in: &[&str]) -> String {
    format!(
        "unknown {what} kind `{kind}`: the built-in {what}s are {}; a connector of your own runs under a binary \
         that registers it with exactly::plugins::Connectors (docs/connectors.md, \"Running your connector in \
         production\")",
        built_in.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PipelineFile, SinkSection};

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct NotesConfig {
        path: PathBuf,
        token: String,
    }

    const FILE: &str = r#"
name = "p"
[checkpoint]
dir = "ck"
[source.sequence]
splits = 1
records_per_split = 3
[sink.notes]
path = "out/notes.db"
token = { env = "EXACTLY_PLUGINS_TEST_TOKEN" }
"#;

    fn notes() -> Connectors {
        Connectors::default().sink("notes", |config: NotesConfig, context| {
            assert_eq!(
                config.token, "s3cret",
                "secrets are resolved before the config type reads them"
            );
            let dir = context.resolve(&config.path);
            Ok(Arc::new(exactly_file::FileSinkFactory {
                dir,
                format: Default::default(),
            }) as Arc<dyn SinkFactory>)
        })
    }

    #[test]
    fn a_registered_kind_is_read_by_its_config_type_with_secrets_and_built() {
        // SAFETY: no other test reads or writes this variable.
        unsafe { std::env::set_var("EXACTLY_PLUGINS_TEST_TOKEN", "s3cret") };
        let file = PipelineFile::parse_with(FILE, "p.toml", &notes()).unwrap();
        assert!(matches!(&file.sink, SinkSection::Plugin(p) if p.kind == "notes"));
        let debug = format!("{file:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        let (sink, _) = file.sink_factory().unwrap();
        assert!(sink.identity().starts_with("file:"), "{}", sink.identity());
        file.build().expect("the pipeline builds with the registered sink");

        let typo = FILE.replace("path = ", "pth = ");
        let error = PipelineFile::parse_with(&typo, "p.toml", &notes())
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`sink.notes`") && error.contains("unknown field `pth`"),
            "{error}"
        );
    }

    #[test]
    fn an_unknown_kind_names_the_built_in_ones_and_where_to_register_it() {
        unsafe { std::env::set_var("EXACTLY_PLUGINS_TEST_TOKEN", "s3cret") };
        let error = PipelineFile::parse(FILE, "p.toml").unwrap_err().to_string();
        assert!(
            error.contains("unknown sink kind `notes`")
                && error.contains("file, redis, postgres, kafka")
                && error.contains("Running your connector in production"),
            "{error}"
        );
        let two = FILE.replace("[sink.notes]", "[sink.file]\ndir = \"x\"\n[sink.notes]");
        let error = PipelineFile::parse_with(&two, "p.toml", &notes())
            .unwrap_err()
            .to_string();
        assert!(error.contains("names two kinds, `file` and `notes`"), "{error}");
    }

    #[test]
    #[should_panic(expected = "the sink kind `postgres` is built in")]
    fn a_built_in_kind_cannot_be_registered() {
        let _ = Connectors::default().sink("postgres", |_: NotesConfig, _| unreachable!());
    }

    #[test]
    fn the_built_in_lists_match_the_pipeline_file() {
        for kind in BUILT_IN_SINKS {
            let text = FILE.replace("[sink.notes]", &format!("[sink.{kind}]"));
            let error = PipelineFile::parse(&text, "p.toml").map(drop).unwrap_err().to_string();
            assert!(!error.contains("unknown sink kind"), "{kind}: {error}");
        }
        for kind in BUILT_IN_SOURCES {
            let text = FILE.replace("[source.sequence]", &format!("[source.{kind}]"));
            let error = PipelineFile::parse_with(&text, "p.toml", &notes())
                .map(drop)
                .map_or_else(|e| e.to_string(), |_| String::new());
            assert!(!error.contains("unknown source kind"), "{kind}: {error}");
        }
    }
}
