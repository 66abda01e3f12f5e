//! [`PgCheckpointStore`]: a pipeline's checkpoints in PostgreSQL.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use exactly_core::store::{AccessError, Cas, Layout, StoreLock};
use exactly_core::{CheckpointStore, Scope, SequenceStore, StoreError};

use crate::schema::{scope_name, REGION_PREFIX};
use crate::sequence::{shared, PgSequence};
use crate::session::{Effect, Session, Target, CALL_TIMEOUT};

/// A bad connection string or TLS setting.
#[derive(Debug, thiserror::Error)]
#[error("checkpoint store `{server}`: {problem}")]
pub struct ConfigError {
    /// The server as far as it could be read, without the password.
    pub server: String,
    /// What is wrong.
    pub problem: String,
}

/// A pipeline's checkpoint store in a PostgreSQL database: every machine
/// that reaches the database reaches the checkpoints. Connections are
/// opened on first use (one per sequence, one for the pipeline's own
/// calls, one for the lock) and again after they broke.
#[derive(Clone)]
pub struct PgCheckpointStore {
    target: Arc<Target>,
    pipeline: String,
    retain: usize,
    /// For the pipeline-level calls.
    session: Arc<Session>,
    /// The session a refused [`lock`](CheckpointStore::lock) kept, to try
    /// again on (a standby tries every 250 ms: one session, not a new
    /// connection each time).
    spare: Arc<tokio::sync::Mutex<Option<tokio_postgres::Client>>>,
}

impl std::fmt::Debug for PgCheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCheckpointStore")
            .field("server", &self.target.server)
            .field("pipeline", &self.pipeline)
            .field("retain", &self.retain)
            .finish()
    }
}

/// `postgres://user@host:port/db`, never with a password.
fn server_of(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(name)) => name.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or_default();
    let db = config.get_dbname().unwrap_or(user);
    format!("postgres://{user}@{host}:{port}/{db}")
}

const LAYOUT: &str = "SELECT layout FROM exactly_pipelines WHERE pipeline = $1";
const RECORD_LAYOUT: &str = "INSERT INTO exactly_pipelines (pipeline, layout) VALUES ($1, $3)
    ON CONFLICT (pipeline) DO UPDATE SET layout = EXCLUDED.layout
    WHERE exactly_pipelines.layout IS NOT DISTINCT FROM $2
    RETURNING 1";
const REGIONS: &str = "SELECT s.scope FROM exactly_sequences s
    WHERE s.pipeline = $1 AND s.scope LIKE 'region-%'
      AND (s.id_watermark IS NOT NULL OR s.committed_through IS NOT NULL
           OR EXISTS (SELECT 1 FROM exactly_checkpoints c WHERE c.pipeline = s.pipeline AND c.scope = s.scope))";
const ENSURE: &str =
    "INSERT INTO exactly_sequences (pipeline, scope) VALUES ($1, $2) ON CONFLICT (pipeline, scope) DO NOTHING";
/// Copies the sequence under the retired name, moves its entries there, and
/// starts it over empty at a higher epoch (logged), in one statement.
const RETIRE: &str = "WITH old AS (
        SELECT * FROM exactly_sequences WHERE pipeline = $1 AND scope = $2 FOR UPDATE),
    copied AS (
        INSERT INTO exactly_sequences (pipeline, scope, epoch, owner, id_watermark, committed_through)
        SELECT pipeline, $3, epoch, owner, id_watermark, committed_through FROM old),
    moved AS (
        UPDATE exactly_checkpoints SET scope = $3 WHERE pipeline = $1 AND scope = $2),
    reset AS (
        UPDATE exactly_sequences s
        SET epoch = old.epoch + 1, owner = NULL, id_watermark = NULL, committed_through = NULL
        FROM old WHERE s.pipeline = old.pipeline AND s.scope = old.scope),
    logged AS (
        INSERT INTO exactly_epochs (pipeline, scope, epoch) SELECT pipeline, scope, epoch + 1 FROM old)
    SELECT count(*) FROM old";

impl PgCheckpointStore {
    /// The checkpoints of pipeline `pipeline` in the database `url` (a
    /// `postgres://` URL or libpq's `key=value` form, with libpq's TLS
    /// settings: `sslmode`, `sslrootcert`, `sslcert`, `sslkey`; the password
    /// in the URL or `PGPASSWORD`), keeping the newest `retain` entries per
    /// sequence. Nothing is connected yet.
    pub fn new(url: &str, pipeline: &str, retain: usize) -> Result<Self, ConfigError> {
        let (rest, tls) = exactly_tls::libpq::split(url).map_err(|problem| ConfigError {
            server: "?".into(),
            problem,
        })?;
        let mut config: tokio_postgres::Config = rest.parse().map_err(|e| ConfigError {
            server: "?".into(),
            problem: format!("not a PostgreSQL connection string: {e}"),
        })?;
        let server = server_of(&config);
        if config.get_password().is_none() {
            if let Some(password) = std::env::var("PGPASSWORD").ok().filter(|p| !p.is_empty()) {
                config.password(password);
            }
        }
        config.ssl_mode(match tls.mode {
            exactly_tls::libpq::SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            exactly_tls::libpq::SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        let tls = exactly_tls::libpq::client_config(&tls).map_err(|problem| ConfigError {
            server: server.clone(),
            problem,
        })?;
        let target = Arc::new(Target {
            config,
            tls,
            server,
            call_timeout: CALL_TIMEOUT,
        });
        Ok(Self::with_target(target, pipeline, retain))
    }

    fn with_target(target: Arc<Target>, pipeline: &str, retain: usize) -> Self {
        let location = format!("{} (pipeline {pipeline})", target.server);
        PgCheckpointStore {
            session: Arc::new(Session::new(
                target.clone(),
                &format!("exactly-store {pipeline}"),
                location,
            )),
            target,
            pipeline: pipeline.to_string(),
            retain: retain.max(1),
            spare: Arc::new(tokio::sync::Mutex::new(None)),
        }
    }

    /// The same store, giving up on a call after `timeout` (default 30 s):
    /// a write then reports an unknown outcome.
    pub fn with_call_timeout(&self, timeout: Duration) -> Self {
        let target = Arc::new(Target {
            config: self.target.config.clone(),
            tls: self.target.tls.clone(),
            server: self.target.server.clone(),
            call_timeout: timeout,
        });
        Self::with_target(target, &self.pipeline, self.retain)
    }

    /// The server, without secrets.
    pub fn server(&self) -> &str {
        &self.target.server
    }

    /// The pipeline's name.
    pub fn pipeline(&self) -> &str {
        &self.pipeline
    }

    /// Who holds the pipeline's lock (a running `exactly run`), asked
    /// without taking it: `None` when nobody does.
    pub async fn holder(&self) -> Result<Option<String>, AccessError> {
        let name = format!("exactly-status {}", self.pipeline);
        let client = Session::connect(&self.target, &name)
            .await
            .map_err(|e| AccessError::Determinate {
                location: self.location(),
                operation: "asking who holds the lock".into(),
                source: e,
            })?;
        Ok(crate::lock::holder(&client, crate::lock::key(&self.pipeline)).await)
    }

    /// The `application_name` of the sessions of sequence `scope`, to find
    /// them in `pg_stat_activity`.
    pub fn session_name(&self, scope: Scope) -> String {
        format!("exactly-store {} {}", self.pipeline, scope_name(scope))
    }

    /// The membership and region leases of the pipeline's workers, on a
    /// connection of their own (see [`PgLeases`](crate::PgLeases)).
    pub fn leases(&self) -> crate::PgLeases {
        crate::PgLeases {
            session: Session::new(
                self.target.clone(),
                &format!("exactly-leases {}", self.pipeline),
                format!("{} (pipeline {}, leases)", self.target.server, self.pipeline),
            ),
            pipeline: self.pipeline.clone(),
        }
    }
}

#[async_trait]
impl CheckpointStore for PgCheckpointStore {
    fn location(&self) -> String {
        self.session.location().to_string()
    }

    fn retain(&self) -> usize {
        self.retain
    }

    fn sequence(&self, scope: Scope) -> Arc<dyn SequenceStore> {
        let name = scope_name(scope);
        let location = format!("{} (pipeline {}, {name})", self.target.server, self.pipeline);
        let session = Session::new(self.target.clone(), &self.session_name(scope), location);
        shared(PgSequence::new(session, self.pipeline.clone(), name))
    }

    async fn regions(&self) -> Result<Vec<usize>, AccessError> {
        let rows = self
            .session
            .query("listing regions", Effect::Reads, REGIONS, &[&self.pipeline])
            .await?;
        let mut regions: Vec<usize> = rows
            .iter()
            .filter_map(|r| r.get::<_, String>(0).strip_prefix(REGION_PREFIX)?.parse().ok())
            .collect();
        regions.sort_unstable();
        Ok(regions)
    }

    async fn layout(&self) -> Result<Option<Layout>, AccessError> {
        let rows = self
            .session
            .query("reading the layout", Effect::Reads, LAYOUT, &[&self.pipeline])
            .await?;
        let Some(value) = rows.first().and_then(|r| r.get::<_, Option<serde_json::Value>>(0)) else {
            return Ok(None);
        };
        serde_json::from_value(value)
            .map(Some)
            .map_err(|e| AccessError::determinate(self.location(), "reading the layout", e))
    }

    async fn record_layout(
        &self,
        expected: Option<Layout>,
        layout: Layout,
    ) -> Result<Cas<(), Option<Layout>>, AccessError> {
        let json = |l: &Layout| serde_json::to_value(l).expect("a layout serializes");
        let rows = self
            .session
            .query(
                "recording the layout",
                Effect::Writes,
                RECORD_LAYOUT,
                &[&self.pipeline, &expected.as_ref().map(json), &json(&layout)],
            )
            .await?;
        if rows.is_empty() {
            return Ok(Cas::Moved(self.layout().await?));
        }
        Ok(Cas::Done(()))
    }

    async fn retire(&self, scope: Scope) -> Result<(), AccessError> {
        let name = scope_name(scope);
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let retired = format!("retired-{stamp}-{name}");
        let operation = format!("setting {scope} aside");
        self.session
            .query(&operation, Effect::Writes, ENSURE, &[&self.pipeline, &name])
            .await?;
        self.session
            .query(&operation, Effect::Writes, RETIRE, &[&self.pipeline, &name, &retired])
            .await?;
        Ok(())
    }

    async fn lock(&self) -> Result<StoreLock, StoreError> {
        let name = format!("exactly {}", exactly_core::store::this_process());
        crate::lock::take(&self.target, &self.pipeline, &name, &self.location(), &self.spare).await
    }

    fn leases(&self) -> Option<Arc<dyn exactly_core::membership::LeaseStore>> {
        Some(Arc::new(PgCheckpointStore::leases(self)))
    }
}
