//! The demo's data: the orders it produces into Kafka, and what the
//! PostgreSQL table holds of them.

use anyhow::{bail, Context, Result};
use exactly::kafka::admin::{KafkaAdmin, ProduceRecord};

/// Orders produced.
pub(crate) const ORDERS: i64 = 50_000;
/// Partitions of the topic.
pub(crate) const PARTITIONS: i32 = 4;
/// The topic, and the table.
pub(crate) const NAME: &str = "orders";

/// Creates the topic and produces [`ORDERS`] orders (`{"id":…}` keyed by
/// id); checks that the broker acknowledged every one.
pub(crate) async fn produce(bootstrap: &str) -> Result<()> {
    let admin = KafkaAdmin::new(bootstrap);
    admin
        .create_topic(NAME, PARTITIONS)
        .await
        .context("creating the topic")?;
    let orders = (0..ORDERS).map(|id| {
        ProduceRecord::new(format!(
            r#"{{"id":{id},"customer":"c{}","amount":{}.{:02}}}"#,
            id % 1000,
            id % 500,
            id % 100
        ))
        .with_key(id.to_string())
    });
    let delivered = admin.produce(NAME, orders).await.context("producing the orders")?;
    if delivered.len() as i64 != ORDERS {
        bail!("the broker acknowledged {} of {ORDERS} orders", delivered.len());
    }
    Ok(())
}

async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .context("connecting to PostgreSQL")?;
    tokio::spawn(connection);
    Ok(client)
}

/// Rows in the table (committed ones: what any reader sees).
pub(crate) async fn rows(url: &str) -> Result<i64> {
    let client = connect(url).await?;
    let row = client
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .context("counting the rows")?;
    Ok(row.get(0))
}

/// What the table holds of the orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Rows.
    pub(crate) rows: i64,
    /// Rows beyond the first of each Kafka record (partition, offset).
    pub(crate) duplicates: i64,
    /// Order ids with no row.
    pub(crate) missing: i64,
}

impl Verdict {
    /// Every order once.
    pub(crate) fn exactly_once(&self) -> bool {
        *self
            == Verdict {
                rows: ORDERS,
                duplicates: 0,
                missing: 0,
            }
    }
}

/// Reads the verdict from the table.
pub(crate) async fn verdict(url: &str) -> Result<Verdict> {
    let client = connect(url).await?;
    let row = client
        .query_one(
            "SELECT count(*), count(*) - count(DISTINCT (part, off)), \
             (SELECT count(*) FROM generate_series(0, $1::bigint - 1) g \
              WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = g)) \
             FROM orders",
            &[&ORDERS],
        )
        .await
        .context("checking the table")?;
    Ok(Verdict {
        rows: row.get(0),
        duplicates: row.get(1),
        missing: row.get(2),
    })
}
