//! The `exactly` command: run a pipeline from a TOML file, inspect its
//! checkpoints, or run the self-verifying demo.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use exactly::config::{parse_listen, PipelineFile};
use exactly::core::CheckpointStore;
use exactly::ops::{self, logging::LogFormat};

#[derive(Parser)]
#[command(name = "exactly", version, about = "End-to-end exactly-once data pipelines")]
struct Cli {
    /// Log lines as text or as one JSON object per line (stderr; RUST_LOG filters).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a pipeline until its sources finish or SIGINT/SIGTERM; on a signal take
    /// a last checkpoint and commit it before exiting.
    Run {
        /// The pipeline file.
        file: PathBuf,
        #[command(flatten)]
        flags: RunFlags,
        /// Serve /metrics, /health/live and /health/ready here (e.g.
        /// 127.0.0.1:9464); overrides `[metrics] listen`.
        #[arg(long, value_name = "ADDRESS")]
        metrics_listen: Option<String>,
    },
    /// What a pipeline is doing, without running it or taking its lock:
    /// the latest complete checkpoint (id, age, positions), what it lists
    /// as pending, the sink's prepared transactions of the pipeline, and
    /// the consumer lag per partition.
    Status {
        /// The pipeline file.
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Inspect a pipeline's externalized checkpoints.
    Checkpoints {
        #[command(subcommand)]
        command: CheckpointCmd,
    },
    /// Self-verifying demo on embedded defaults: generate records, run the
    /// pipeline, SIGKILL it mid-stream, restart it, and check every record is in
    /// the output exactly once.
    Demo {
        /// Working folder (default: a fresh temporary folder).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum CheckpointCmd {
    /// List entries, oldest first, marking unreadable ones.
    List {
        /// The pipeline file.
        file: PathBuf,
    },
    /// Print one entry (verified: checksum and name) readably.
    Show {
        /// The entry's file: `<checkpoint dir>/<pipeline>/<fingerprint>-<unix-ms>-<id>`.
        entry: PathBuf,
        /// Print the entry's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    ops::logging::init(cli.log_format);
    match cli.command {
        Cmd::Run {
            file,
            flags,
            metrics_listen,
        } => run(&file, flags, metrics_listen),
        Cmd::Status { file, json } => status(&file, json),
        Cmd::Checkpoints {
            command: CheckpointCmd::List { file },
        } => list_checkpoints(&file),
        Cmd::Checkpoints {
            command: CheckpointCmd::Show { entry, json },
        } => show_checkpoint(&entry, json),
        Cmd::Demo { dir } => demo(dir),
    }
}

/// The `--allow-*` flags of `exactly run`: each adds to the pipeline file's
/// key of the same name in `[checkpoint]`.
#[derive(clap::Args)]
struct RunFlags {
    /// Resume even if the latest checkpoint was written by a different pipeline definition.
    #[arg(long)]
    allow_fingerprint_change: bool,
    /// Resume from a checkpoint taken at another parallelism: the new sink
    /// subtasks commit what the old ones left pending and abort the rest.
    #[arg(long)]
    allow_parallelism_change: bool,
    /// Start as if for the first time although the checkpoint folder has a
    /// history none of whose entries can be read (they are kept as
    /// `<name>.unreadable`): sources go back to `start`.
    #[arg(long)]
    allow_first_start: bool,
    /// Restore the newest readable checkpoint although newer entries cannot
    /// be read and the sinks cannot prove that nothing after it was
    /// committed: the records after it are written again (duplicates).
    #[arg(long)]
    allow_fallback: bool,
}

fn run(file: &Path, flags: RunFlags, metrics_listen: Option<String>) -> Result<()> {
    let mut config = PipelineFile::load(file)?;
    let listen = match metrics_listen {
        Some(address) => Some(parse_listen(&address, "command line", "--metrics-listen")?),
        None => config.metrics.listen_address(&file.display().to_string())?,
    };
    config.checkpoint.allow_fingerprint_change |= flags.allow_fingerprint_change;
    config.checkpoint.allow_parallelism_change |= flags.allow_parallelism_change;
    config.checkpoint.allow_first_start |= flags.allow_first_start;
    config.checkpoint.allow_fallback |= flags.allow_fallback;
    let built = config.build_parts()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let summary = runtime.block_on(async {
        let observed = ops::observe(&config, &built);
        let mut background = ops::Background::default();
        let server = match listen {
            Some(address) => Some(ops::server::MetricsServer::start(address, observed.clone()).await?),
            None => None,
        };
        if server.is_some() || ops::progress::enabled() {
            background.push(ops::spawn_lag_monitor(&config, &observed, ops::lag_interval(&config)));
            background.push(Some(tokio::spawn(ops::progress::run(observed))));
        }
        let summary = built.pipeline.run(shutdown_signal()).await?;
        drop(background);
        drop(server);
        anyhow::Ok(summary)
    })?;
    println!("{}", serde_json::to_string(&summary.metrics)?);
    Ok(())
}

/// Loads a pipeline file for an inspecting command; a missing file's error
/// says what to pass.
fn load_for(command: &str, file: &Path) -> Result<PipelineFile> {
    PipelineFile::load(file).map_err(|e| match e {
        exactly::config::ConfigError::Read { .. } => anyhow::anyhow!(
            "{e}. Fix: pass the pipeline's TOML file, the one `exactly run` runs (`exactly {command} pipeline.toml`)"
        ),
        other => other.into(),
    })
}

fn status(file: &Path, json: bool) -> Result<()> {
    let config = load_for("status", file)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = runtime.block_on(ops::status::status(&config))?;
    if json {
        println!("{}", ops::redact::redact(&serde_json::to_string_pretty(&report)?));
    } else {
        print!("{}", ops::status::render_text(&report));
    }
    if !report.problems.is_empty() {
        bail!(
            "{} part(s) of the status could not be read:\n{}",
            report.problems.len(),
            report.problems.join("\n")
        );
    }
    Ok(())
}

fn show_checkpoint(entry: &Path, json: bool) -> Result<()> {
    let entry = ops::show::read_entry(entry)?;
    if json {
        println!("{}", ops::redact::redact(&serde_json::to_string_pretty(&entry)?));
    } else {
        print!("{}", ops::show::render_text(&entry));
    }
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Every checkpoint sequence's entries, oldest first: the pipeline folder's
/// own (global failover) and every region's, each line naming its region.
fn list_checkpoints(file: &Path) -> Result<()> {
    let config = load_for("checkpoints list", file)?;
    let store = config.store();
    let mut sequences: Vec<(Option<usize>, std::sync::Arc<dyn CheckpointStore>)> =
        vec![(None, std::sync::Arc::new(store.clone()))];
    for region in store.regions()? {
        sequences.push((Some(region), store.region(region)));
    }
    let mut listed = 0;
    for (region, sequence) in sequences {
        let label = region.map(|r| format!(" region={r}")).unwrap_or_default();
        for n in sequence.list()? {
            listed += 1;
            match sequence.read(&n.file_name) {
                Ok(e) => {
                    let pending: usize = e.checkpoint.pending.values().map(Vec::len).sum();
                    println!(
                        "{}{label}  id={} splits={} pending_transactions={}",
                        n.file_name,
                        n.id,
                        // Not the sources' own bookkeeping (a Kafka source's
                        // `<topic>@cluster:<id>`).
                        e.checkpoint
                            .positions
                            .0
                            .keys()
                            .filter(|split| !split.contains('@'))
                            .count(),
                        pending
                    );
                }
                Err(problem) => println!("{}{label}  UNREADABLE: {problem}", n.file_name),
            }
        }
    }
    if listed == 0 {
        println!("no checkpoints in {}", store.location());
    }
    Ok(())
}

const DEMO_ORDERS: i64 = 50_000;
const DEMO_PARTITIONS: i32 = 4;

fn demo(dir: Option<PathBuf>) -> Result<()> {
    let tmp;
    let dir = match dir {
        Some(d) => {
            std::fs::create_dir_all(&d)?;
            // A used folder holds the topic and checkpoints of an earlier
            // run, which the new run would resume instead of starting over.
            if std::fs::read_dir(&d)?.next().is_some() {
                bail!(
                    "demo folder {} is not empty: pass a new or empty folder to --dir (or none for a temporary one)",
                    d.display()
                );
            }
            d
        }
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    println!("exactly demo: Kafka -> PostgreSQL, exactly once across a SIGKILL");
    println!(
        "0. starting services (test kit): an Apache Kafka {} broker and a throwaway PostgreSQL",
        exactly_testkit::kafka::KAFKA_VERSION
    );
    let kafka = exactly_testkit::KafkaBroker::start_persistent(dir.join("broker"))?;
    // Its own server, whatever EXACTLY_DATABASE_URL says: the demo creates
    // table `orders` and counts every prepared transaction of the server.
    let postgres = exactly_testkit::PostgresServer::start_own()?;
    println!("   broker {}  postgres {}", kafka.bootstrap(), postgres.url());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;

    println!("1. producing {DEMO_ORDERS} orders into topic `orders` ({DEMO_PARTITIONS} partitions)");
    let produced = runtime.block_on(async {
        let admin = exactly::kafka::admin::KafkaAdmin::new(kafka.bootstrap());
        admin.create_topic("orders", DEMO_PARTITIONS).await?;
        let orders = (0..DEMO_ORDERS).map(|id| {
            exactly::kafka::admin::ProduceRecord::new(format!(
                r#"{{"id":{id},"customer":"c{}","amount":{}.{:02}}}"#,
                id % 1000,
                id % 500,
                id % 100
            ))
            .with_key(id.to_string())
        });
        // Every delivery acknowledged by the broker, with its offset.
        let delivered = admin.produce("orders", orders).await?;
        anyhow::Ok(delivered.len() as i64)
    })?;
    if produced != DEMO_ORDERS {
        bail!("the broker acknowledged {produced} of {DEMO_ORDERS} orders");
    }

    let file = dir.join("orders-to-pg.toml");
    std::fs::write(
        &file,
        format!(
            r#"name = "orders-to-pg"
guarantee = "exactly-once"
parallelism = 2
batch_size = 100

[checkpoint]
dir = "checkpoints"
interval = "50ms"

{sections}"#,
            sections = exactly::config::orders_sections(kafka.bootstrap(), "orders", postgres.url(), "orders")
        ),
    )?;
    let exe = std::env::current_exe()?;
    let config = file.to_str().context("non-UTF-8 path")?;
    println!("2. running {config}");
    println!("   it kills itself with SIGKILL right after its second checkpoint is persisted, before COMMIT PREPARED");
    let status = Command::new(&exe)
        .args(["run", config])
        .env("EXACTLY_CRASH_AT", "coordinator.after_persist:2")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .status()?;
    use std::os::unix::process::ExitStatusExt;
    if status.signal() != Some(9) {
        bail!("the first run was supposed to be killed mid-stream; it ended with {status}");
    }
    let (rows_after_crash, prepared) = runtime.block_on(count_rows(postgres.url()))?;
    println!("   killed by SIGKILL: {rows_after_crash} rows committed, {prepared} prepared transactions pending");
    println!("3. restarting: recovery commits what that checkpoint recorded, rolls back the rest, resumes");
    let status = Command::new(&exe)
        .args(["run", config])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .status()?;
    if !status.success() {
        bail!("the restarted pipeline failed: {status}");
    }
    let (rows, distinct, missing) = runtime.block_on(verify(postgres.url()))?;
    println!("4. verification");
    println!("   produced        {produced}");
    println!("   rows in table   {rows}");
    println!("   duplicates      {}", rows - distinct);
    println!("   missing         {missing}");
    if rows != produced || distinct != produced || missing != 0 {
        bail!("exactly-once violated");
    }
    println!("exactly once: OK");
    Ok(())
}

async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

async fn count_rows(url: &str) -> Result<(i64, i64)> {
    let client = connect(url).await?;
    let rows = client.query_one("SELECT count(*) FROM orders", &[]).await?.get(0);
    let prepared = client
        .query_one("SELECT count(*) FROM pg_prepared_xacts", &[])
        .await?
        .get(0);
    Ok((rows, prepared))
}

/// (rows, distinct partition/offset pairs, ids missing).
async fn verify(url: &str) -> Result<(i64, i64, i64)> {
    let client = connect(url).await?;
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT (part, off)), \
             (SELECT count(*) FROM generate_series(0, $1::bigint - 1) g WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = g)) \
             FROM orders",
            &[&DEMO_ORDERS],
        )
        .await?;
    Ok((row.get(0), row.get(1), row.get(2)))
}
