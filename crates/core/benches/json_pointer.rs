//! Nanoseconds per document for reading JSON pointers out of a record's
//! value, the per-record JSON work of the PostgreSQL sink, measured with
//! `divan` (it prints the table).
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
//!
//! One iteration reads one document; the iterations walk through 200,000
//! of the bench's values in turn, as the hand-timed loop before did, so a
//! row's `fastest` column (the best sample's mean) is what that loop
//! printed as the best of five rounds, in ns per document.

use std::hint::black_box;
use std::sync::LazyLock;

use divan::Bencher;
use exactly_core::JsonPointer;
use serde_json::Value;

fn main() {
    println!(
        "{} documents of ~{} bytes, each iteration reads the next one (ns per document)",
        DOCS.len(),
        DOCS[0].len()
    );
    divan::main();
}

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

static DOCS: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| (0..200_000).map(order_json).collect());

#[derive(serde::Deserialize)]
struct IdOnly {
    #[allow(dead_code)]
    id: i64,
}

/// Runs `read` on one document per iteration, the next one each time. Its
/// answer is dropped inside the timed part, as the hand-timed loop did.
fn each_document<O>(bencher: Bencher, mut read: impl FnMut(&[u8]) -> O) {
    let docs = &*DOCS;
    let mut next = 0;
    bencher.bench_local(move || {
        let doc = &docs[next];
        next = (next + 1) % docs.len();
        drop(black_box(read(black_box(doc))));
    });
}

/// `JsonPointer::scan_all(/id)`: what the sinks run.
#[divan::bench]
fn scan_all_id(bencher: Bencher) {
    let id = JsonPointer::parse("/id").expect("a pointer");
    each_document(bencher, |d| JsonPointer::scan_all(&[&id], d).expect("valid"));
}

/// `JsonPointer::scan_all(/missing)`.
#[divan::bench]
fn scan_all_missing(bencher: Bencher) {
    let missing = JsonPointer::parse("/missing").expect("a pointer");
    each_document(bencher, |d| JsonPointer::scan_all(&[&missing], d).expect("valid"));
}

/// `exactly_core::validate_json`: the check alone.
#[divan::bench]
fn validate_json(bencher: Bencher) {
    each_document(bencher, |d| exactly_core::validate_json(d).expect("valid"));
}

/// serde_json, a struct with only `id` (the minimal loop; checks less).
#[divan::bench]
fn serde_json_struct_id(bencher: Bencher) {
    each_document(bencher, |d| serde_json::from_slice::<IdOnly>(d).expect("valid"));
}

/// serde_json `Value` + `Value::pointer`.
#[divan::bench]
fn serde_json_value_pointer(bencher: Bencher) {
    each_document(bencher, |d| {
        let v: Value = serde_json::from_slice(d).expect("valid");
        v.pointer("/id").cloned()
    });
}
