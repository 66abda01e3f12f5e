//! The sink subtask of mode `two-phase`: one PostgreSQL transaction per
//! checkpoint interval.
//!
//! The data path, one batch at a time:
//!
//! ```text
//! write:      records ─rows::convert─► rows ─staged─► Writer::stream (COPY into the table or the staging table)
//!                              └─────► bad records ──► DeadLetters ──► Writer::copy_once (dead-letter table)
//! end of a COPY (full, before dead letters, at pre-commit): refused rows isolated (rejected.rs)
//! pre_commit: Writer::prepare (commit marker, PREPARE TRANSACTION)
//! commit:     Committer::commit_prepared, Committer::merge (with an upsert key)
//! ```

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use exactly_core::{CheckpointId, ConnectorError, Record, ReplayCheck, SinkContext, TwoPhaseCommitSink};
use tokio_postgres::types::ToSql;

use super::committer::{checkpoint_i64, Committer};
use super::fence;
use super::gid::{gid, gid_prefix};
use super::io_faults;
use super::markers::MarkerFloor;
use super::transaction::{PostgresCommittable, PostgresTransaction};
use super::writer::{Finished, Writer, COPY_SEGMENT_BYTES};
use crate::config::{Format, OnRejectedRow, Settings, SinkMode, Targets};
use crate::conn::subtask::Subtask;
use crate::rows::evolve::{plan, NewColumn};
use crate::rows::{convert, schemad, BadRecord, Cell, DeadLetters, Rows};
use crate::sql::QualifiedName;
use crate::tables::{add_columns, marker_sql, prepare_commit_log, prepare_tables, upgrade_staging, Layout};

/// One subtask of the PostgreSQL sink. Created by
/// [`PostgresSinkFactory`](crate::PostgresSinkFactory); see the crate
/// documentation for the protocol.
pub struct PostgresSink {
    pub(super) subtask: Subtask,
    /// Prefix of every gid of this subtask.
    prefix: String,
    /// The subtasks whose transactions this sink owns and whose locks its
    /// write connection holds: its own, the adopted ones, and orphaned ones
    /// found by `recover`.
    pub(super) owned: Vec<usize>,
    /// The connection that holds the open write transaction and the locks.
    pub(super) writer: Writer,
    /// The connection for `COMMIT PREPARED`, recovery and table checks.
    pub(super) committer: Committer,
    /// Set by `recover`: whether commit markers count their records.
    recovered: Option<bool>,
    /// The tables prepared so far (created when configured, checked), by
    /// name: the one table, or those of the topics seen.
    pub(super) layouts: HashMap<String, Arc<Layout>>,
    /// With a table per topic: the table of each topic seen.
    by_topic: HashMap<String, Arc<Layout>>,
    /// The table whose COPY of rows is open.
    open: Option<Arc<Layout>>,
    /// When this sink last deleted its old commit markers.
    last_prune: Option<Instant>,
    /// Which commit markers may be deleted (see [`super::markers`]).
    pub(super) markers: MarkerFloor,
    /// The checkpoints of this sink's prepared transactions that wait for
    /// their commit.
    prepared: BTreeSet<u64>,
    /// Those of them that added columns: until their commit they hold the
    /// lock of their tables, which a write would wait for.
    ddl_prepared: BTreeSet<u64>,
    /// Records written to the open transaction but held back, in order:
    /// they add columns (or go to a table a prepared transaction added
    /// columns to), which must wait for the commit of this sink's prepared
    /// transactions (see [`write`](TwoPhaseCommitSink::write)).
    held: Vec<Record>,
}

/// How often a sink deletes its commit markers older than
/// `commit_log_retention` (or every retention, when that is shorter).
const PRUNE_EVERY: Duration = Duration::from_secs(600);

impl std::fmt::Debug for PostgresSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSink")
            .field("url", &self.subtask.settings.url)
            .field("table", &self.subtask.settings.table_label)
            .field("prefix", &self.prefix)
            .field("open", &self.writer.is_open())
            .finish_non_exhaustive()
    }
}

impl PostgresSink {
    pub(crate) fn new(settings: Arc<Settings>, context: SinkContext) -> Self {
        let prefix = gid_prefix(&context.pipeline, &settings.table_label, context.subtask);
        let owned = context.owned_subtasks().collect();
        let isolating = settings.on_rejected_row == OnRejectedRow::DeadLetter;
        let subtask = Subtask { settings, context };
        PostgresSink {
            writer: Writer::new(subtask.clone(), isolating),
            committer: Committer::new(subtask.clone()),
            subtask,
            prefix,
            owned,
            recovered: None,
            layouts: HashMap::new(),
            by_topic: HashMap::new(),
            open: None,
            last_prune: None,
            markers: MarkerFloor::default(),
            prepared: BTreeSet::new(),
            ddl_prepared: BTreeSet::new(),
            held: Vec::new(),
        }
    }

    /// The prefix shared by the gids of this subtask's transactions
    /// (`exactly:<pipeline>:<table>:<subtask>:`).
    pub fn gid_prefix(&self) -> &str {
        &self.prefix
    }

    pub(super) fn settings(&self) -> &Settings {
        &self.subtask.settings
    }

    /// The layout of the one table ([`Targets::One`]), once recovered.
    fn one(&self) -> Option<Arc<Layout>> {
        match self.settings().targets {
            Targets::One => self.layouts.get(&self.settings().table.to_string()).cloned(),
            Targets::ByTopic(_) => None,
        }
    }

    /// The layout of `table` (with a table per topic): the first time, the
    /// table is created (with `create_table`) or checked like the one table
    /// at `recover`, and committed staged rows an interrupted commit left
    /// in its staging table are merged.
    pub(super) async fn layout_of(&mut self, table: &QualifiedName) -> Result<Arc<Layout>, ConnectorError> {
        let name = table.to_string();
        if let Some(layout) = self.layouts.get(&name) {
            return Ok(layout.clone());
        }
        let settings = self.settings().for_table(table.clone());
        let client = self.committer.client().await?;
        let mut layout = prepare_tables(client, &settings).await?;
        if layout.staged.is_some_and(|s| s.upgrade_pending) && self.recovered.is_some() {
            upgrade_staging(client, &settings).await?;
            layout = prepare_tables(client, &settings).await?;
        }
        tracing::info!(table = %name, "writing into a table of its own");
        let layout = Arc::new(layout);
        self.layouts.insert(name, layout.clone());
        self.merge_leftovers_of(&layout).await?;
        Ok(layout)
    }

    /// The layout of the table `record` goes to: its topic's, or, when
    /// the record carries a [`ROUTE_HEADER`](crate::ROUTE_HEADER) (a route
    /// transform set it), the table that value resolves to as if it were
    /// the topic.
    async fn layout_for(&mut self, record: &Record) -> Result<Arc<Layout>, ConnectorError> {
        let Targets::ByTopic(targets) = &self.subtask.settings.targets else {
            return self.one().ok_or_else(|| self.subtask.not_opened("recover()"));
        };
        let routed = record
            .headers
            .iter()
            .rev()
            .find(|(name, _)| name == crate::ROUTE_HEADER);
        let topic = match routed {
            Some((_, Some(value))) => std::str::from_utf8(value).map_err(|_| {
                ConnectorError::fatal(
                    self.subtask.label("choosing the table"),
                    format!(
                        "record {}@{} is routed by a header `{}` that is not UTF-8. Fix: route by a text field",
                        record.split,
                        record.offset,
                        crate::ROUTE_HEADER
                    ),
                )
            })?,
            Some((_, None)) => {
                return Err(ConnectorError::fatal(
                    self.subtask.label("choosing the table"),
                    format!(
                        "record {}@{} is routed by a null header `{}`. Fix: route by a field every record has",
                        record.split,
                        record.offset,
                        crate::ROUTE_HEADER
                    ),
                ))
            }
            None => match record.topic_partition() {
                Some((topic, _)) => topic,
                None => {
                    return Err(ConnectorError::fatal(
                        self.subtask.label("choosing the table"),
                        format!(
                            "record {}@{} has no topic (its split is not <topic>-<partition>), and the table \
                             depends on the topic. Fix: read from Kafka, route by a field, or set one table",
                            record.split, record.offset
                        ),
                    ))
                }
            },
        };
        if let Some(layout) = self.by_topic.get(topic) {
            return Ok(layout.clone());
        }
        let table = targets
            .resolve(topic)
            .map_err(|problem| ConnectorError::fatal(self.subtask.label("choosing the table"), problem))?;
        let layout = self.layout_of(&table).await?;
        self.by_topic.insert(topic.to_string(), layout.clone());
        Ok(layout)
    }

    /// The records of `batch` by table, in the order of their first
    /// record (each table's records in batch order).
    async fn by_table<'a>(
        &mut self,
        batch: &'a [Record],
    ) -> Result<Vec<(Arc<Layout>, Vec<&'a Record>)>, ConnectorError> {
        if let Some(one) = self.one() {
            return Ok(vec![(one, batch.iter().collect())]);
        }
        let mut groups: Vec<(Arc<Layout>, Vec<&'a Record>)> = Vec::new();
        for record in batch {
            let layout = self.layout_for(record).await?;
            match groups.iter_mut().find(|(l, _)| Arc::ptr_eq(l, &layout)) {
                Some((_, records)) => records.push(record),
                None => groups.push((layout, vec![record])),
            }
        }
        Ok(groups)
    }

    /// Takes the locks of the owned subtasks on the write connection (see
    /// [`Writer::lock`]).
    async fn lock_writer(&mut self) -> Result<(), ConnectorError> {
        self.writer.lock(&self.owned).await
    }

    /// `COMMIT PREPARED` (see [`Committer::commit_prepared`]), then the
    /// merge of staged rows in upsert mode.
    pub(super) async fn commit_and_merge(&mut self, c: &PostgresCommittable) -> Result<(), ConnectorError> {
        self.committer.commit_prepared(c).await?;
        if self.settings().add_columns && self.recovered.is_none() {
            // The transaction may have added columns (to the staging table
            // too): its staged rows merge with them.
            self.refresh_layouts().await?;
        }
        if let Some(one) = self.one() {
            return self.merge(&one, &c.gid).await;
        }
        for table in &c.tables {
            let name = QualifiedName::parse(table).map_err(|problem| {
                ConnectorError::fatal(
                    self.subtask.label("merging staged rows"),
                    format!(
                        "transaction {} lists `{table}`, which is no table name ({problem})",
                        c.gid
                    ),
                )
            })?;
            let layout = self.layout_of(&name).await?;
            self.merge(&layout, &c.gid).await?;
        }
        Ok(())
    }

    /// Reads the tables again (with `schema_evolution`, after a commit in
    /// recovery that may have added columns).
    async fn refresh_layouts(&mut self) -> Result<(), ConnectorError> {
        match self.settings().targets {
            Targets::One => {
                let settings = self.subtask.settings.clone();
                let client = self.committer.client().await?;
                let layout = prepare_tables(client, &settings).await?;
                self.layouts.insert(layout.table.to_string(), Arc::new(layout));
            }
            Targets::ByTopic(_) => {
                self.layouts.clear();
                self.by_topic.clear();
            }
        }
        Ok(())
    }

    /// The settings of the table of `layout`.
    fn table_settings(&self, layout: &Layout) -> Settings {
        match self.settings().targets {
            Targets::One => self.settings().clone(),
            Targets::ByTopic(_) => self.settings().for_table(layout.table.clone()),
        }
    }

    /// `format = "avro"`: fetches the schemas of `batch` the registry
    /// client has not cached.
    async fn fetch_schemas(&self, batch: &[Record]) -> Result<(), ConnectorError> {
        let Some(registry) = &self.settings().registry else {
            return Ok(());
        };
        for id in schemad::avro_ids(batch) {
            if registry.cached(id).is_some() {
                continue;
            }
            registry.avro_schema(id).await.map_err(|e| {
                let context = self.subtask.label("fetching an Avro schema");
                let message = e.to_string();
                if e.is_transient() {
                    ConnectorError::transient(context, message).caused_by(e)
                } else {
                    ConnectorError::fatal(context, message).caused_by(e)
                }
            })?;
        }
        Ok(())
    }

    /// `schema_evolution = "add-columns"`: the columns each table must get
    /// for the schemas of `decoded`.
    async fn plan_columns(
        &mut self,
        decoded: &[schemad::Decoded],
    ) -> Result<Vec<(Arc<Layout>, Vec<NewColumn>)>, ConnectorError> {
        let rendered = self.settings().format != Format::Debezium;
        let mut seen: Vec<(Arc<Layout>, Arc<exactly_formats::schema::ConnectSchema>)> = Vec::new();
        let mut plans: Vec<(Arc<Layout>, Vec<NewColumn>)> = Vec::new();
        for d in decoded {
            let Some(schema) = &d.schema else { continue };
            let layout = self.layout_for(&d.record).await?;
            if seen
                .iter()
                .any(|(l, s)| Arc::ptr_eq(l, &layout) && (Arc::ptr_eq(s, schema) || s == schema))
            {
                continue;
            }
            seen.push((layout.clone(), schema.clone()));
            let at = format!("record {}@{}", d.record.split, d.record.offset);
            let added = plan(schema, &layout.shape.columns, rendered, &layout.table.to_string(), &at)
                .map_err(|problem| ConnectorError::fatal(self.subtask.label("following a schema change"), problem))?;
            if added.is_empty() {
                continue;
            }
            let index = match plans.iter().position(|(l, _)| Arc::ptr_eq(l, &layout)) {
                Some(index) => index,
                None => {
                    plans.push((layout.clone(), Vec::new()));
                    plans.len() - 1
                }
            };
            for new in added {
                match plans[index].1.iter().find(|c| c.name == new.name) {
                    Some(known) if known.ty != new.ty => {
                        return Err(ConnectorError::fatal(
                            self.subtask.label("following a schema change"),
                            format!(
                                "sink.postgres.schema_evolution = \"add-columns\": records for table {} give new field \
                                 `{}` two types ({} and {}). Fix: give the field one type in the producers' schemas, \
                                 or add the column yourself",
                                layout.table,
                                new.name,
                                known.ty.sql_name(),
                                new.ty.sql_name()
                            ),
                        ))
                    }
                    Some(_) => {}
                    None => plans[index].1.push(new),
                }
            }
        }
        Ok(plans)
    }

    /// Adds `added` to the table of `layout` in the open transaction and
    /// writes them from now on.
    async fn evolve(
        &mut self,
        txn: &mut PostgresTransaction,
        layout: &Arc<Layout>,
        added: &[NewColumn],
    ) -> Result<(), ConnectorError> {
        self.end_segment(txn).await?;
        let settings = self.table_settings(layout);
        let client = self.writer.client()?;
        let evolved = Arc::new(add_columns(client, &settings, layout, added).await?);
        self.layouts.insert(evolved.table.to_string(), evolved.clone());
        for known in self.by_topic.values_mut() {
            if Arc::ptr_eq(known, layout) {
                *known = evolved.clone();
            }
        }
        txn.ddl = true;
        Ok(())
    }

    /// Writes `batch` now, or returns `false` (writing nothing) when its
    /// schemas add columns while a prepared transaction of this sink waits
    /// for its commit: the `ALTER TABLE` would wait for that transaction's
    /// locks, and its commit waits for this sink.
    async fn write_now(&mut self, txn: &mut PostgresTransaction, batch: &[Record]) -> Result<bool, ConnectorError> {
        let format = self.settings().format;
        if format == Format::Json {
            for (layout, records) in self.by_table(batch).await? {
                self.write_table(txn, &layout, &records).await?;
            }
            return Ok(true);
        }
        if format == Format::Avro {
            self.fetch_schemas(batch).await?;
        }
        let registry = self.settings().registry.clone();
        let (decoded, bad) = schemad::decode(batch, format, |id| registry.as_ref().and_then(|r| r.cached(id)));
        if self.settings().add_columns {
            let plans = self.plan_columns(&decoded).await?;
            if !plans.is_empty() && !self.prepared.is_empty() {
                return Ok(false);
            }
            for (layout, added) in plans {
                self.evolve(txn, &layout, &added).await?;
            }
        }
        let records: Vec<Record> = decoded.into_iter().map(|d| d.record).collect();
        for (layout, group) in self.by_table(&records).await? {
            self.write_table(txn, &layout, &group).await?;
        }
        for (i, error) in bad {
            let record = &batch[i];
            let layout = self.layout_for(record).await?;
            self.end_segment(txn).await?;
            txn.records += 1;
            self.write_dead_letters(txn, &layout, &[BadRecord { record, error }])
                .await?;
        }
        Ok(true)
    }

    /// Writes the held records when nothing holds them back any more;
    /// whether none is left.
    async fn release_held(&mut self, txn: &mut PostgresTransaction) -> Result<bool, ConnectorError> {
        if self.held.is_empty() {
            return Ok(true);
        }
        if !self.ddl_prepared.is_empty() {
            return Ok(false);
        }
        let held = std::mem::take(&mut self.held);
        if self.write_now(txn, &held).await? {
            tracing::info!(records = held.len(), "wrote the records held for a schema change");
            Ok(true)
        } else {
            self.held = held;
            Ok(false)
        }
    }

    /// Upsert mode: moves the committed rows of `gid` from the staging table
    /// of `layout` into its target (rows the server refuses to the
    /// dead-letter table, when so configured). Idempotent.
    pub(super) async fn merge(&mut self, layout: &Layout, gid: &str) -> Result<(), ConnectorError> {
        if layout.merge.is_none() {
            return Ok(());
        }
        self.committer.merge(layout, gid).await
    }

    /// Ends the open COPY of rows; rows the server refused in it are
    /// isolated and become dead letters (see `rejected.rs`).
    async fn end_segment(&mut self, txn: &PostgresTransaction) -> Result<(), ConnectorError> {
        let open = self.open.take();
        match self.writer.finish_copy(txn.checkpoint).await? {
            Finished::Stored => Ok(()),
            Finished::Refused { refusal, records } => {
                let layout = open.ok_or_else(|| {
                    ConnectorError::fatal(
                        self.subtask.label("COPY of rows"),
                        "a COPY of rows without its table (a bug in exactly-postgres)",
                    )
                })?;
                self.isolate_segment(txn, &layout, refusal, records).await
            }
        }
    }

    /// Writes dead-letter rows of `bad` in the transaction of `txn`, logs
    /// and counts them. The open COPY of rows must be ended first
    /// ([`end_segment`](Self::end_segment)).
    pub(super) async fn write_dead_letters(
        &mut self,
        txn: &PostgresTransaction,
        layout: &Layout,
        bad: &[BadRecord<'_>],
    ) -> Result<(), ConnectorError> {
        if bad.is_empty() {
            return Ok(());
        }
        let dead_letters = DeadLetters {
            pipeline: &self.subtask.context.pipeline,
            table: &self.subtask.settings.table_label,
            null_values: layout.dead_letter_null_values,
        };
        let rows = dead_letters.rows(bad, checkpoint_i64(txn.checkpoint));
        self.writer
            .copy_once(
                txn.checkpoint,
                &layout.copy_dead_letters,
                &layout.dead_letter_types,
                &rows,
                "COPY of dead letters",
            )
            .await?;
        for d in bad {
            tracing::warn!(split = %d.record.split, offset = d.record.offset, error = %d.error,
                "record sent to the dead-letter table {}", self.settings().dead_letters);
        }
        self.subtask.context.metrics.add_dead_letters(bad.len() as u64);
        Ok(())
    }

    /// The records of one table: see [`write`](TwoPhaseCommitSink::write).
    async fn write_table(
        &mut self,
        txn: &mut PostgresTransaction,
        layout: &Arc<Layout>,
        records: &[&Record],
    ) -> Result<(), ConnectorError> {
        if self.open.as_ref().is_some_and(|open| !Arc::ptr_eq(open, layout)) {
            // One COPY is into one table.
            self.end_segment(txn).await?;
        }
        let (rows, dead) = convert(records.iter().copied(), &layout.shape);
        // What a replay would write a second time: every record, or with an
        // upsert key (rows merge by key) only the dead letters.
        let rewritten = if layout.merge.is_some() {
            dead.len()
        } else {
            records.len()
        };
        txn.records += i64::try_from(rewritten).unwrap_or(i64::MAX);
        if !rows.is_empty() {
            let first_seq = txn.next_seq;
            txn.next_seq += i64::try_from(rows.len()).unwrap_or(i64::MAX);
            let retained = rows.sources().iter().enumerate();
            self.writer
                .retain(retained.map(|(i, record)| ((*record).clone(), first_seq + i as i64)));
            let rows = staged(layout, rows, &txn.gid, |i| first_seq + i as i64);
            let bytes = records
                .iter()
                .map(|r| r.value.as_ref().map_or(0, |v| v.len()) + r.key.as_ref().map_or(0, |k| k.len()))
                .sum::<usize>();
            if layout.merge.is_some() && self.one().is_none() {
                txn.tables.insert(layout.table.to_string());
            }
            self.writer
                .stream(&layout.copy_rows, &layout.row_types, &rows, bytes)
                .await?;
            self.open = Some(layout.clone());
            if self.writer.copy_bytes() >= COPY_SEGMENT_BYTES {
                self.end_segment(txn).await?;
            } else if self.writer.copy_bytes() >= io_faults::MID_COPY_BYTES {
                let pid = self.writer.pid();
                let subtask = self.subtask.context.subtask;
                io_faults::mid_copy(self.writer.open_copy(), self.committer.if_up(), pid, subtask).await;
            }
        }
        if !dead.is_empty() {
            self.end_segment(txn).await?;
        }
        self.write_dead_letters(txn, layout, &dead).await
    }

    /// Deletes the commit markers of the owned subtasks that are older than
    /// `commit_log_retention` (counted from their commit) and that no
    /// checkpoint the pipeline may restore lists any more: those at or below
    /// the floor of [`MarkerFloor`] (see [`super::markers`] for the rule and
    /// why it is safe). At most every [`PRUNE_EVERY`] (or every retention,
    /// when that is shorter); only after a commit, never during recovery.
    /// Rows another transaction holds are skipped. Best effort: a failure is
    /// logged and tried again at a later commit.
    async fn prune_markers(&mut self) {
        let restorable = self.subtask.context.restorable.oldest().map(|c| c.0);
        let Some(floor) = self.markers.floor(restorable) else {
            return;
        };
        let retention = self.settings().commit_log_retention;
        if self
            .last_prune
            .is_some_and(|at| at.elapsed() < retention.min(PRUNE_EVERY))
        {
            return;
        }
        self.last_prune = Some(Instant::now());
        let owned = self.owned_i32();
        self.committer.prune_markers(&owned, floor, retention).await;
    }

    /// A worker's recovery: raises the owned subtasks' fence rows to
    /// `epoch` (see [`super::fence`]); while an older owner's transaction
    /// holds one, ends what it may (commits what `pending` lists, rolls
    /// back the rest below its first checkpoint, ends older owners' open
    /// transactions) and tries again, a bounded number of times.
    async fn raise_fence(&mut self, pending: &[PostgresCommittable], epoch: u64) -> Result<(), ConnectorError> {
        let owned = self.owned_i32();
        fence::create(self.committer.client().await?, &self.subtask).await?;
        let mut tries = 0;
        loop {
            let client = self.committer.client().await?;
            match fence::raise(client, &self.subtask, &owned, epoch).await? {
                fence::Raise::Done => {
                    tracing::info!(%epoch, "raised the subtask's fence: no earlier owner can prepare any more");
                    return Ok(());
                }
                fence::Raise::Blocked => {
                    tries += 1;
                    if let Some(e) = fence::gave_up(&self.subtask, tries) {
                        return Err(e);
                    }
                    let client = self.committer.client().await?;
                    if let Some(newer) = fence::newer(client, &self.subtask, &owned, epoch).await? {
                        return Err(fence::fenced(&self.subtask, epoch, newer));
                    }
                    tracing::info!(%epoch, tries, "an earlier owner's transaction holds the fence: ending it");
                    fence::end_older_sessions(client, &self.subtask, epoch).await?;
                    self.recover_owned(pending).await?;
                    tokio::time::sleep(fence::RAISE_PAUSE).await;
                }
            }
        }
    }

    /// The owned subtasks as the commit log stores them.
    pub(super) fn owned_i32(&self) -> Vec<i32> {
        self.owned
            .iter()
            .map(|s| i32::try_from(*s).unwrap_or(i32::MAX))
            .collect()
    }
}

/// `rows` as the COPY of rows takes them: with a key, framed for the staging
/// table — gid and sequence number (`seq(i)` for row `i`) before the
/// columns, the record's split, offset, key and value after them when the
/// merge isolates refused rows.
pub(super) fn staged<'a>(layout: &Layout, rows: Rows<'a>, gid: &'a str, seq: impl Fn(usize) -> i64) -> Rows<'a> {
    let Some(staged) = layout.staged else {
        return rows;
    };
    let sources = rows.sources().to_vec();
    rows.framed(
        |i, cells| cells.extend([Cell::Text(gid.into()), Cell::BigInt(seq(i))]),
        |i, cells| {
            if staged.records {
                let record = sources[i];
                cells.extend([
                    Cell::Text(record.split.as_str().into()),
                    Cell::BigInt(record.offset),
                    record.key.as_deref().map_or(Cell::Null, |k| Cell::Bytes(k.into())),
                    record.value.as_deref().map_or(Cell::Null, |v| Cell::Bytes(v.into())),
                ]);
            }
        },
    )
}

#[async_trait]
impl TwoPhaseCommitSink for PostgresSink {
    type Transaction = PostgresTransaction;
    type Committable = PostgresCommittable;

    /// Connects and takes the lock of every owned subtask on the write
    /// connection (a fatal error naming the holder when another process has
    /// one, see the crate documentation), checks `max_prepared_transactions`,
    /// creates the commit-log and dead-letter tables (and the target with
    /// `create_table`, and the staging table in upsert mode) when absent,
    /// checks every table against the configuration, then rolls back the
    /// prepared transactions of the owned subtasks (its own, adopted ones and
    /// orphans above the parallelism) that `pending`
    /// does not list and commits the listed ones (oldest first, as
    /// [`commit`](Self::commit) does). Idempotent.
    async fn recover(&mut self, pending: &[PostgresCommittable]) -> Result<(), ConnectorError> {
        if self.settings().mode != SinkMode::TwoPhase {
            return Err(ConnectorError::fatal(
                self.subtask.label("recover"),
                format!(
                    "PostgresSink is the sink of mode \"two-phase\", but the mode is \"{}\": create the sink with \
                     PostgresSinkFactory::create, which picks the mode's sink",
                    self.settings().mode.as_str()
                ),
            ));
        }
        self.writer.discard_open().await;
        self.open = None;
        self.recovered = None;
        self.prepared.clear();
        self.ddl_prepared.clear();
        self.held.clear();
        self.layouts.clear();
        self.by_topic.clear();
        // Before anything else: the locks, so that a second process of this
        // pipeline touches nothing of the first one's.
        self.lock_writer().await?;
        self.committer.check_prepared_transactions().await?;
        let settings = self.subtask.settings.clone();
        let client = self.committer.client().await?;
        let counts_records = match settings.targets {
            Targets::One => {
                let layout = prepare_tables(client, &settings).await?;
                let counts_records = layout.marker_counts_records;
                self.layouts.insert(layout.table.to_string(), Arc::new(layout));
                counts_records
            }
            // The tables are prepared as their topics come (and those of
            // the transactions recovery commits, now).
            Targets::ByTopic(_) => prepare_commit_log(client, &settings).await?,
        };
        if let Some(epoch) = self.subtask.context.ownership.as_ref().map(|o| o.epoch.0) {
            self.raise_fence(pending, epoch).await?;
        }
        self.recover_owned(pending).await?;
        // Nothing of this pipeline holds staged rows now: staging tables of
        // older versions get the columns they lack.
        let upgrades: Vec<Arc<Layout>> = (self.layouts.values())
            .filter(|l| l.staged.is_some_and(|s| s.upgrade_pending))
            .cloned()
            .collect();
        for old in upgrades {
            let settings = match self.settings().targets {
                Targets::One => self.settings().clone(),
                Targets::ByTopic(_) => self.settings().for_table(old.table.clone()),
            };
            let client = self.committer.client().await?;
            upgrade_staging(client, &settings).await?;
            let layout = prepare_tables(client, &settings).await?;
            self.layouts.insert(layout.table.to_string(), Arc::new(layout));
        }
        self.recovered = Some(counts_records);
        Ok(())
    }

    /// Opens the transaction (`BEGIN`) on the write connection, reconnecting
    /// (and taking the subtask locks again) if it was lost. Inside it, lock
    /// waits end after 60 s and `statement_timeout` is off: the COPY of rows
    /// stays open across writes, up to a whole checkpoint interval when data
    /// is slow, and a server's or role's `statement_timeout` would cancel it
    /// every interval.
    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<PostgresTransaction, ConnectorError> {
        if self.recovered.is_none() {
            return Err(self.subtask.not_opened("recover()"));
        }
        self.open = None;
        self.writer.discard_open().await;
        self.lock_writer().await?;
        self.writer.begin().await?;
        self.markers.began(checkpoint.0);
        Ok(PostgresTransaction {
            checkpoint,
            gid: gid(&self.prefix, checkpoint.0),
            next_seq: 0,
            generation: self.writer.generation(),
            records: 0,
            tables: Default::default(),
            ddl: false,
        })
    }

    /// Converts every record first; good rows stream into the
    /// transaction's COPY into the table (append) or the staging table
    /// (with a key), which stays open across writes and ends at pre-commit;
    /// bad ones go into the dead-letter table with the reason (ending the
    /// open COPY first), all inside the transaction. Dead letters are
    /// counted in the pipeline metrics. With `on_rejected_row =
    /// "dead-letter"`, rows the server refuses become dead letters too when
    /// their COPY ends.
    async fn write(&mut self, txn: &mut PostgresTransaction, batch: &[Record]) -> Result<(), ConnectorError> {
        self.writer.check(txn.generation, "writing")?;
        if self.held.is_empty() && self.ddl_prepared.is_empty() {
            if self.write_now(txn, batch).await? {
                return Ok(());
            }
            tracing::info!(
                waiting_for = ?self.prepared,
                "holding records whose schema adds columns until the prepared transactions commit"
            );
            self.held.extend(batch.iter().cloned());
            return Ok(());
        }
        self.held.extend(batch.iter().cloned());
        self.release_held(txn).await.map(|_| ())
    }

    /// Writes the commit marker (pipeline, table, subtask, checkpoint, gid,
    /// records, time) into the commit-log table and runs `PREPARE
    /// TRANSACTION`, then checks the transaction really is prepared.
    async fn pre_commit(&mut self, mut txn: PostgresTransaction) -> Result<PostgresCommittable, ConnectorError> {
        // On a newer connection than the transaction's, the statements below
        // would run outside any transaction.
        self.writer.check(txn.generation, "PREPARE TRANSACTION")?;
        if !self.release_held(&mut txn).await? {
            return Err(ConnectorError::transient(
                self.subtask.label("pre-commit"),
                format!(
                    "{} records of checkpoint {} add columns (schema_evolution = \"add-columns\"), which must wait \
                     for the commit of checkpoints {:?} of this sink, and that has not come before this pre-commit; \
                     the pipeline restarts, recovery commits them, and the records are written again",
                    self.held.len(),
                    txn.checkpoint,
                    self.prepared
                ),
            ));
        }
        self.end_segment(&txn).await?;
        let counts_records = self.recovered.ok_or_else(|| self.subtask.not_opened("recover()"))?;
        let marker = marker_sql(&self.settings().commit_log, counts_records);
        let subtask = i32::try_from(self.subtask.context.subtask).unwrap_or(i32::MAX);
        let checkpoint = checkpoint_i64(txn.checkpoint);
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![
            &txn.gid,
            &self.subtask.context.pipeline,
            &self.subtask.settings.table_label,
            &subtask,
            &checkpoint,
        ];
        if counts_records {
            params.push(&txn.records);
        }
        let watcher = self.committer.if_up();
        let answer = io_faults::before_prepare_answer(watcher, &txn.gid, self.subtask.context.subtask);
        self.writer
            .prepare(txn.checkpoint, &txn.gid, (&marker, &params), answer)
            .await?;
        tracing::debug!(gid = %txn.gid, checkpoint = %txn.checkpoint, "prepared");
        self.prepared.insert(txn.checkpoint.0);
        if txn.ddl {
            self.ddl_prepared.insert(txn.checkpoint.0);
        }
        Ok(PostgresCommittable {
            gid: txn.gid,
            checkpoint: txn.checkpoint,
            subtask: self.subtask.context.subtask,
            tables: txn.tables.into_iter().collect(),
        })
    }

    /// `COMMIT PREPARED` on the commit connection. When the gid is no longer
    /// prepared, its marker in the commit-log table decides: present →
    /// already committed (success); absent → [`ConnectorError::DataLoss`]. In
    /// upsert mode the staged rows are then merged into the table. Lost
    /// connections are transient errors. Only while the write connection's
    /// session holds the subtask locks: after a lost write connection, a new
    /// one takes them first (fatal when another process has them).
    async fn commit(&mut self, c: &PostgresCommittable) -> Result<(), ConnectorError> {
        self.lock_writer().await?;
        self.commit_and_merge(c).await?;
        self.prepared.remove(&c.checkpoint.0);
        self.ddl_prepared.remove(&c.checkpoint.0);
        self.markers.committed(c.checkpoint.0);
        self.prune_markers().await;
        Ok(())
    }

    /// A fallback to `checkpoint` (the newer checkpoint entries cannot be
    /// read) replays everything after it. [`ReplayCheck::CommittedLater`]
    /// when the commit log holds a marker of a later checkpoint of this
    /// subtask or of any subtask `j` with `j % parallelism` equal to it (the
    /// ones it adopts, and those of a higher parallelism the pipeline may
    /// have run at since), with the records those markers count (`None` when
    /// one predates the count); `Safe` when none does. Sound although markers are
    /// pruned: the marker of the pipeline's highest committed checkpoint is
    /// never deleted (see the rule in `markers.rs`). A transaction only
    /// prepared is no commit (its marker is invisible until `COMMIT
    /// PREPARED`; recovery rolls it back). With `upsert_key` the rows of a
    /// replay merge idempotently, but its dead letters would be written
    /// again, so a later commit is reported there too. Modes `upsert` and
    /// `fenced` answer `Safe` through their adapters (upserts by key;
    /// replays at or below the stored positions are dropped). Reads only.
    async fn check_replay_after(&mut self, checkpoint: CheckpointId) -> Result<ReplayCheck, ConnectorError> {
        self.committer.committed_after(checkpoint).await
    }

    /// `ROLLBACK` of the open transaction. A lost connection is success: the
    /// server rolled it back already.
    async fn abort(&mut self, txn: PostgresTransaction) -> Result<(), ConnectorError> {
        self.open = None;
        self.held.clear();
        self.writer.rollback(txn.generation, &txn.gid).await
    }
    /// Lets the subtask locks go at the server (`pg_advisory_unlock_all`
    /// on the write connection) and ends that connection: a process taking
    /// the pipeline over takes them at once, instead of waiting for this
    /// session to end or being refused by it.
    async fn close(&mut self) -> Result<exactly_core::Closed, ConnectorError> {
        self.open = None;
        self.held.clear();
        self.writer.close().await?;
        Ok(exactly_core::Closed::Released)
    }
}
