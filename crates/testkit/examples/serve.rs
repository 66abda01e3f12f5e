//! Starts real services of its own (whatever the `EXACTLY_*` variables say)
//! and prints their addresses as environment variable assignments, then
//! keeps them running until Enter (or end of input).
//!
//! ```text
//! cargo run -p exactly-testkit --example serve -- postgres redis kafka
//! cargo run -p exactly-testkit --example serve -- kafka-cluster
//! ```
//!
//! The printed lines can be exported in another shell so that tests use
//! these services as external ones (`EXACTLY_DATABASE_URL`,
//! `EXACTLY_REDIS_URL`, `EXACTLY_KAFKA_BOOTSTRAP`) instead of starting
//! their own. `kafka-cluster` starts a three-broker cluster and prints its
//! bootstrap servers (as `EXACTLY_KAFKA_BOOTSTRAP`, so only one of `kafka`
//! and `kafka-cluster` fits one shell).

use std::io::BufRead;

use exactly_testkit::{KafkaBroker, KafkaCluster, PostgresServer, RedisServer, TestkitError};

fn main() -> Result<(), TestkitError> {
    let mut wanted: Vec<String> = std::env::args().skip(1).collect();
    if wanted.is_empty() {
        wanted = vec!["postgres".into(), "redis".into(), "kafka".into()];
    }
    let mut keep: Vec<Box<dyn std::any::Any>> = Vec::new();
    for name in &wanted {
        match name.as_str() {
            "postgres" => {
                let pg = PostgresServer::start_own()?;
                println!("EXACTLY_DATABASE_URL={}", pg.url());
                keep.push(Box::new(pg));
            }
            "redis" => {
                let redis = RedisServer::start_own()?;
                println!("EXACTLY_REDIS_URL={}", redis.url());
                keep.push(Box::new(redis));
            }
            "kafka" => {
                let kafka = KafkaBroker::start()?;
                println!("EXACTLY_KAFKA_BOOTSTRAP={}", kafka.bootstrap());
                keep.push(Box::new(kafka));
            }
            "kafka-cluster" => {
                let cluster = KafkaCluster::start()?;
                println!("EXACTLY_KAFKA_BOOTSTRAP={}", cluster.bootstrap());
                keep.push(Box::new(cluster));
            }
            other => eprintln!("unknown service {other:?}: use postgres, redis, kafka or kafka-cluster"),
        }
    }
    eprintln!("running; press Enter to stop");
    let _ = std::io::stdin().lock().lines().next();
    drop(keep);
    Ok(())
}
