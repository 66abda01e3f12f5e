//! Scratch measurement: upsert write paths (temporary).
mod common;

use std::time::Instant;

use common::*;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

struct Row {
    id: i64,
    name: String,
    amount: f64,
    doc: serde_json::Value,
}

fn rows(n: usize) -> Vec<Row> {
    (0..n)
        .map(|i| {
            let id = ((i as i64) * 7919) % (n as i64 / 2);
            Row {
                id,
                name: format!("customer number {i}"),
                amount: i as f64 * 0.25,
                doc: serde_json::json!({"i": i, "tags": ["a", "b"], "note": "some text here"}),
            }
        })
        .collect()
}

const UPDATE: &str = "ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, amount = EXCLUDED.amount, doc = EXCLUDED.doc";

async fn fresh(db: &Client, table: &str) {
    db.batch_execute(&format!(
        "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id bigint PRIMARY KEY, name text, amount float8, doc jsonb)"
    ))
    .await
    .unwrap();
}

async fn via_copy(db: &Client, table: &str, all: &[Row], batch: usize, txn: bool) {
    db.batch_execute(
        "DROP TABLE IF EXISTS pg_temp.stage; CREATE TEMP TABLE stage (seq bigint, id bigint, name text, amount float8, doc jsonb) ON COMMIT DELETE ROWS",
    )
    .await
    .unwrap();
    let merge = format!(
        "INSERT INTO {table} (id, name, amount, doc) SELECT DISTINCT ON (id) id, name, amount, doc FROM pg_temp.stage ORDER BY id, seq DESC {UPDATE}; {}",
        if txn { "TRUNCATE pg_temp.stage" } else { "COMMIT" }
    );
    let types = [Type::INT8, Type::INT8, Type::TEXT, Type::FLOAT8, Type::JSONB];
    for chunk in all.chunks(batch) {
        if !txn {
            db.batch_execute("BEGIN").await.unwrap();
        }
        let sink = db
            .copy_in("COPY pg_temp.stage (seq, id, name, amount, doc) FROM STDIN (FORMAT binary)")
            .await
            .unwrap();
        let w = BinaryCopyInWriter::new(sink, &types);
        let mut w = std::pin::pin!(w);
        for (i, r) in chunk.iter().enumerate() {
            let seq = i as i64;
            w.as_mut()
                .write(&[&seq, &r.id, &r.name, &r.amount, &r.doc])
                .await
                .unwrap();
        }
        w.finish().await.unwrap();
        db.batch_execute(&merge).await.unwrap();
    }
}

async fn via_values(db: &Client, table: &str, all: &[Row], batch: usize, _txn: bool) {
    let mut cache: std::collections::HashMap<usize, tokio_postgres::Statement> = Default::default();
    for chunk in all.chunks(batch) {
        let n = chunk.len();
        if !cache.contains_key(&n) {
            let tuples: Vec<String> = (0..n)
                .map(|i| {
                    let b = i * 4;
                    format!("(${}::int8, ${}::text, ${}::float8, ${}::jsonb, {i})", b + 1, b + 2, b + 3, b + 4)
                })
                .collect();
            let sql = format!(
                "INSERT INTO {table} (id, name, amount, doc) SELECT DISTINCT ON (id) id, name, amount, doc FROM (VALUES {}) v(id, name, amount, doc, seq) ORDER BY id, seq DESC {UPDATE}",
                tuples.join(", ")
            );
            cache.insert(n, db.prepare(&sql).await.unwrap());
        }
        let params: Vec<&(dyn ToSql + Sync)> = chunk
            .iter()
            .flat_map(|r| [&r.id as &(dyn ToSql + Sync), &r.name, &r.amount, &r.doc])
            .collect();
        db.execute(&cache[&n], &params).await.unwrap();
    }
}

async fn via_unnest(db: &Client, table: &str, all: &[Row], batch: usize, _txn: bool) {
    let stmt = db
        .prepare(&format!(
            "INSERT INTO {table} (id, name, amount, doc) SELECT DISTINCT ON (id) id, name, amount, doc FROM unnest($1::int8[], $2::text[], $3::float8[], $4::jsonb[]) WITH ORDINALITY AS v(id, name, amount, doc, seq) ORDER BY id, seq DESC {UPDATE}"
        ))
        .await
        .unwrap();
    for chunk in all.chunks(batch) {
        let ids: Vec<i64> = chunk.iter().map(|r| r.id).collect();
        let names: Vec<&str> = chunk.iter().map(|r| r.name.as_str()).collect();
        let amounts: Vec<f64> = chunk.iter().map(|r| r.amount).collect();
        let docs: Vec<&serde_json::Value> = chunk.iter().map(|r| &r.doc).collect();
        db.execute(&stmt, &[&ids, &names, &amounts, &docs]).await.unwrap();
    }
}

async fn append_copy(db: &Client, table: &str, all: &[Row], batch: usize) {
    let types = [Type::INT8, Type::TEXT, Type::FLOAT8, Type::JSONB];
    for chunk in all.chunks(batch) {
        let sink = db
            .copy_in(&format!("COPY {table} (id, name, amount, doc) FROM STDIN (FORMAT binary)"))
            .await
            .unwrap();
        let w = BinaryCopyInWriter::new(sink, &types);
        let mut w = std::pin::pin!(w);
        for r in chunk {
            w.as_mut().write(&[&r.id, &r.name, &r.amount, &r.doc]).await.unwrap();
        }
        w.finish().await.unwrap();
    }
}

async fn append_unnest(db: &Client, table: &str, all: &[Row], batch: usize) {
    let stmt = db
        .prepare(&format!(
            "INSERT INTO {table} (id, name, amount, doc) SELECT * FROM unnest($1::int8[], $2::text[], $3::float8[], $4::jsonb[])"
        ))
        .await
        .unwrap();
    for chunk in all.chunks(batch) {
        let ids: Vec<i64> = chunk.iter().map(|r| r.id).collect();
        let names: Vec<&str> = chunk.iter().map(|r| r.name.as_str()).collect();
        let amounts: Vec<f64> = chunk.iter().map(|r| r.amount).collect();
        let docs: Vec<&serde_json::Value> = chunk.iter().map(|r| &r.doc).collect();
        db.execute(&stmt, &[&ids, &names, &amounts, &docs]).await.unwrap();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::test]
#[ignore]
async fn measure_upsert_paths() {
    let pg = shared_server();
    let db = client(pg.url()).await;
    let all = rows(60_000);
    for txn in [false, true] {
        for batch in [20usize, 100, 500, 2000] {
            for path in ["copy", "values", "unnest", "append-copy", "append-unnest"] {
                if path.starts_with("append") && !txn {
                    continue;
                }
                let mut times = Vec::new();
                for _round in 0..3 {
                    let table = format!("bench_{}", path.replace('-', "_"));
                    fresh(&db, &table).await;
                    if path.starts_with("append") {
                        db.batch_execute(&format!("ALTER TABLE {table} DROP CONSTRAINT {table}_pkey")).await.unwrap();
                    }
                    let t = Instant::now();
                    if txn {
                        db.batch_execute("BEGIN").await.unwrap();
                    }
                    match path {
                        "copy" => via_copy(&db, &table, &all, batch, txn).await,
                        "values" => via_values(&db, &table, &all, batch, txn).await,
                        "unnest" => via_unnest(&db, &table, &all, batch, txn).await,
                        "append-copy" => append_copy(&db, &table, &all, batch).await,
                        _ => append_unnest(&db, &table, &all, batch).await,
                    }
                    if txn {
                        db.batch_execute("COMMIT").await.unwrap();
                    }
                    times.push(t.elapsed().as_secs_f64());
                }
                let m = median(times);
                println!(
                    "{} batch {batch:5} {path:13} median {:7.1} ms  {:7.0} rows/s",
                    if txn { "one-txn   " } else { "autocommit" },
                    m * 1000.0,
                    all.len() as f64 / m
                );
            }
        }
    }
}
