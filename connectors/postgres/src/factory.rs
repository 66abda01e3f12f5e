//! [`PostgresSinkFactory`]: the sink of the configured mode for each
//! subtask, from a checked configuration.

use std::sync::Arc;

use exactly_core::{
    erase, ConnectorError, ErasedSink, Fenced, FencedSinkFactory, IdempotentSinkFactory, PreparedTransaction,
    ReplaySafe, SinkContext, SinkFactory,
};

use crate::config::{PostgresSinkConfig, Settings, SinkMode};
use crate::conn::subtask::Subtask;
use crate::replay_safe::{PostgresFencedSink, PostgresUpsertSink};
use crate::two_phase::{self, PostgresSink};

/// Creates the sink subtasks of the configured mode from a checked
/// [`PostgresSinkConfig`].
#[derive(Clone, Debug)]
pub struct PostgresSinkFactory {
    config: PostgresSinkConfig,
    settings: Arc<Settings>,
}

impl PostgresSinkFactory {
    /// Checks the configuration (without connecting).
    ///
    /// Errors: [`ConnectorError::Fatal`] naming the key (`sink.postgres.<key>`)
    /// and the fix.
    pub fn new(config: PostgresSinkConfig) -> Result<Self, ConnectorError> {
        let settings = Arc::new(config.settings()?);
        Ok(PostgresSinkFactory { config, settings })
    }

    /// The configuration.
    pub fn config(&self) -> &PostgresSinkConfig {
        &self.config
    }

    /// The configured mode.
    pub fn mode(&self) -> SinkMode {
        self.settings.mode
    }

    /// Mode `two-phase`: the typed sink of one subtask (what
    /// [`SinkFactory::create`] erases). It connects in
    /// [`recover`](exactly_core::TwoPhaseCommitSink::recover), which refuses
    /// other modes.
    pub fn create_sink(&self, context: SinkContext) -> PostgresSink {
        PostgresSink::new(self.settings.clone(), context)
    }

    /// Mode `upsert`: the typed sink of one subtask (what
    /// [`SinkFactory::create`] wraps in [`ReplaySafe`]). It connects in
    /// [`open`](exactly_core::IdempotentSink::open).
    pub fn create_upsert_sink(&self, context: &SinkContext) -> Result<PostgresUpsertSink, ConnectorError> {
        self.require_mode(SinkMode::Upsert)?;
        Ok(PostgresUpsertSink::new(self.subtask(context)))
    }

    /// Mode `fenced`: the typed sink of one subtask (what
    /// [`SinkFactory::create`] wraps in [`Fenced`]), with the scope
    /// [`fence_scope`](Self::fence_scope). It connects and reads its positions
    /// in [`open`](exactly_core::FencedSink::open).
    pub fn create_fenced_sink(&self, context: &SinkContext) -> Result<PostgresFencedSink, ConnectorError> {
        self.require_mode(SinkMode::Fenced)?;
        Ok(PostgresFencedSink::new(
            self.subtask(context),
            self.fence_scope(&context.pipeline),
        ))
    }

    /// Mode `fenced`: the scope of the pipeline's rows in the positions
    /// table, `<pipeline>/postgres:<table>` — what [`Fenced`] passes to
    /// [`write_fenced`](exactly_core::FencedSink::write_fenced).
    pub fn fence_scope(&self, pipeline: &str) -> String {
        format!("{pipeline}/{}", self.fence_identity())
    }

    /// `postgres:<table>`: the fence scope is about what the table holds, so
    /// it leaves out the column mapping and the other settings in
    /// [`identity`](SinkFactory::identity).
    fn fence_identity(&self) -> String {
        format!("postgres:{}", self.settings.table_label)
    }

    fn subtask(&self, context: &SinkContext) -> Subtask {
        Subtask {
            settings: self.settings.clone(),
            context: context.clone(),
        }
    }

    /// The prepared transactions of pipeline `pipeline` and the configured
    /// table in the sink's database, oldest first (for `exactly status`:
    /// one connection of its own, read-only, no lock). Modes without
    /// prepared transactions (`upsert`, `fenced`) have none and ask nothing.
    pub async fn prepared_transactions_of(&self, pipeline: &str) -> Result<Vec<PreparedTransaction>, ConnectorError> {
        if self.settings.mode != SinkMode::TwoPhase {
            return Ok(Vec::new());
        }
        two_phase::prepared_transactions(&self.settings, pipeline).await
    }

    fn require_mode(&self, mode: SinkMode) -> Result<(), ConnectorError> {
        if self.settings.mode == mode {
            return Ok(());
        }
        Err(ConnectorError::fatal(
            "postgres sink",
            format!(
                "the sink of mode \"{}\" was asked for, but sink.postgres.mode is \"{}\". Fix: use \
                 PostgresSinkFactory::create, which picks the mode's sink",
                mode.as_str(),
                self.settings.mode.as_str()
            ),
        ))
    }
}

/// Mode `upsert` as the core's [`ReplaySafe`] adapter sees it.
struct UpsertMode(PostgresSinkFactory);

impl IdempotentSinkFactory for UpsertMode {
    type Sink = PostgresUpsertSink;
    fn identity(&self) -> String {
        self.0.identity()
    }
    fn create(&self, context: SinkContext) -> Result<PostgresUpsertSink, ConnectorError> {
        self.0.create_upsert_sink(&context)
    }
}

/// Mode `fenced` as the core's [`Fenced`] adapter sees it: its identity is
/// the fence scope's (see [`PostgresSinkFactory::fence_scope`]).
struct FencedMode(PostgresSinkFactory);

impl FencedSinkFactory for FencedMode {
    type Sink = PostgresFencedSink;
    fn identity(&self) -> String {
        self.0.fence_identity()
    }
    fn create(&self, context: SinkContext) -> Result<PostgresFencedSink, ConnectorError> {
        self.0.create_fenced_sink(&context)
    }
}

impl SinkFactory for PostgresSinkFactory {
    /// `postgres:table=...,columns=[...],mode=...` plus the upsert key and
    /// the commit-log or positions table: the settings that affect what the
    /// sink has written and where its markers are. The URL is not part of it.
    fn identity(&self) -> String {
        self.config.identity()
    }

    /// The sink of the configured mode: [`PostgresSink`] (`two-phase`),
    /// [`PostgresUpsertSink`] through [`ReplaySafe`] (`upsert`) or
    /// [`PostgresFencedSink`] through [`Fenced`] (`fenced`).
    fn create(&self, context: SinkContext) -> Result<Box<dyn ErasedSink>, ConnectorError> {
        match self.settings.mode {
            SinkMode::TwoPhase => Ok(erase(self.create_sink(context))),
            SinkMode::Upsert => ReplaySafe(UpsertMode(self.clone())).create(context),
            SinkMode::Fenced => Fenced(FencedMode(self.clone())).create(context),
        }
    }

    /// Mode `two-phase` fences zombies with a fence row per subtask in the
    /// sink's database (read `FOR SHARE` before every `PREPARE`, raised by
    /// each new owner's recovery); modes `upsert` and `fenced` do not (a
    /// zombie's late upsert could overwrite a newer row).
    fn fences_zombies(&self) -> bool {
        self.settings.mode == SinkMode::TwoPhase
    }

    /// The pipeline's prepared transactions of the table, from
    /// `pg_prepared_xacts` (none in modes `upsert` and `fenced`).
    fn prepared_transactions<'a>(&'a self, pipeline: &'a str) -> exactly_core::PreparedTransactionsFuture<'a> {
        Box::pin(async move { self.prepared_transactions_of(pipeline).await.map(Some) })
    }
}
