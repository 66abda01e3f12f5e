//! Nanoseconds per document for reading JSON pointers out of a record's
//! value, the per-record JSON work of the PostgreSQL sink.
//!
//! ```sh
//! cargo bench -p exactly-core --bench json_pointer
//! ```
//!
//! Rows: [`JsonPointer::scan_all`] (what the sinks run: the whole document
//! checked, `/id` built), [`exactly_core::validate_json`] (the check alone),
//! and two `serde_json` ways for comparison: a struct with only `id`
//! (what the bench's minimal loop does: the rest is skipped with
//! `IgnoredAny`, which checks less — strings are not checked as UTF-8 and
//! escapes not decoded) and a whole `Value` with `Value::pointer`.

use std::hint::black_box;
use std::time::Instant;

use exactly_core::JsonPointer;
use serde_json::Value;

/// The values of the Kafka → PostgreSQL bench (`benches/kafka_to_postgres/workload.rs`).
fn order_json(id: u64) -> Vec<u8> {
    format!(
        r#"{{"id":{id},"customer":"c{:05}","amount":{}.{:02},"currency":"EUR","status":"paid","note":"order {id:08}"}}"#,
        id % 10_007,
        id % 1000,
        id % 100
    )
    .into_bytes()
}

#[derive(serde::Deserialize)]
struct IdOnly {
    #[allow(dead_code)]
    id: i64,
}

/// Best of five rounds over every document, in ns per document.
fn time(docs: &[Vec<u8>], mut read: impl FnMut(&[u8])) -> f64 {
    (0..5)
        .map(|_| {
            let started = Instant::now();
            for doc in docs {
                read(black_box(doc));
            }
            started.elapsed().as_nanos() as f64 / docs.len() as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let docs: Vec<Vec<u8>> = (0..200_000).map(order_json).collect();
    let id = JsonPointer::parse("/id").expect("a pointer");
    let missing = JsonPointer::parse("/missing").expect("a pointer");
    let rows = [
        (
            "JsonPointer::scan_all(/id) (the sinks)",
            time(&docs, |d| {
                black_box(JsonPointer::scan_all(&[&id], d).expect("valid"));
            }),
        ),
        (
            "JsonPointer::scan_all(/missing)",
            time(&docs, |d| {
                black_box(JsonPointer::scan_all(&[&missing], d).expect("valid"));
            }),
        ),
        (
            "exactly_core::validate_json (the check alone)",
            time(&docs, |d| {
                black_box(exactly_core::validate_json(d).expect("valid"));
            }),
        ),
        (
            "serde_json struct { id } (the minimal loop; checks less)",
            time(&docs, |d| {
                black_box(serde_json::from_slice::<IdOnly>(d).expect("valid"));
            }),
        ),
        (
            "serde_json Value + Value::pointer",
            time(&docs, |d| {
                let v: Value = serde_json::from_slice(d).expect("valid");
                black_box(v.pointer("/id").cloned());
            }),
        ),
    ];
    println!("{} documents of ~{} bytes, best of 5 rounds", docs.len(), docs[0].len());
    println!();
    println!("| reader | ns per document |");
    println!("|---|---:|");
    for (name, ns) in rows {
        println!("| {name} | {ns:.0} |");
    }
}
