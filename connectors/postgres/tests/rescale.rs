//! Rescaling against a real PostgreSQL: after a lowering of the parallelism
//! the heirs commit what the checkpoint lists for the old subtasks and roll
//! back the rest they owned; orphans above the parallelism are rolled back;
//! mode `fenced` keeps its positions per split, whichever subtask writes it.

mod common;

use std::sync::Arc;

use common::*;
use exactly_core::{CheckpointId, FencedSink, Metrics, Record, SinkContext, TwoPhaseCommitSink};
use exactly_postgres::{PostgresCommittable, PostgresSink, PostgresSinkConfig, PostgresSinkFactory};

const ID_NAME: &str = r#"
create_table = true
[sink.postgres.columns]
id = { from = "/id", type = "bigint" }
name = { from = "/name", type = "text" }
"#;

fn people(partition: i32, from: i64, n: i64) -> Vec<Record> {
    (from..from + n)
        .map(|i| record(partition, i, &format!(r#"{{"id":{i},"name":"n{i}"}}"#)))
        .collect()
}

/// Subtask `subtask` of `parallelism`, adopting `adopted`.
fn at(pipeline: &str, subtask: usize, parallelism: usize, adopted: &[usize]) -> SinkContext {
    SinkContext::new(pipeline, subtask, parallelism, Arc::new(Metrics::default())).with_adopted(adopted.to_vec())
}

fn sink(config: &PostgresSinkConfig, context: SinkContext) -> PostgresSink {
    PostgresSinkFactory::new(config.clone()).unwrap().create_sink(context)
}

/// Gids of the pipeline's prepared transactions.
async fn pipeline_prepared(f: &Fixture) -> Vec<String> {
    prepared(&f.db, &format!("exactly:{}:", f.pipeline)).await
}

async fn ids(f: &Fixture) -> Vec<i64> {
    column(&f.db, &format!("SELECT id FROM \"{}\" ORDER BY id", f.table)).await
}

/// Three old subtasks, each with a transaction the checkpoint lists and one
/// it does not (prepared after the checkpoint's acknowledgement).
async fn three_subtasks_crashed(f: &Fixture) -> Vec<(PostgresCommittable, PostgresCommittable)> {
    let mut out = Vec::new();
    for subtask in 0..3 {
        let mut old = sink(&f.config, at(&f.pipeline, subtask, 3, &[]));
        old.recover(&[]).await.unwrap();
        let base = 100 * subtask as i64;
        let listed = prepare(&mut old, 5, &[people(subtask as i32, base, 2)]).await;
        let unlisted = prepare(&mut old, 6, &[people(subtask as i32, base + 50, 2)]).await;
        out.push((listed, unlisted));
    }
    assert_eq!(pipeline_prepared(f).await.len(), 6);
    out
}

#[tokio::test]
async fn a_lowered_parallelism_commits_the_listed_transactions_of_adopted_subtasks_and_rolls_back_the_rest() {
    let f = Fixture::new("lowered", ID_NAME).await;
    let old = three_subtasks_crashed(&f).await;
    // Resumed at 2: subtask 0 adopts old subtask 2.
    let mut s0 = sink(&f.config, at(&f.pipeline, 0, 2, &[2]));
    s0.recover(&[old[0].0.clone(), old[2].0.clone()]).await.unwrap();
    let mut s1 = sink(&f.config, at(&f.pipeline, 1, 2, &[]));
    s1.recover(std::slice::from_ref(&old[1].0)).await.unwrap();
    assert!(
        pipeline_prepared(&f).await.is_empty(),
        "every unlisted transaction of subtasks 0, 1 and 2 is rolled back"
    );
    assert_eq!(
        ids(&f).await,
        [0, 1, 100, 101, 200, 201],
        "only the listed ones are committed"
    );
    // The heir writes on.
    let next = prepare(&mut s0, 7, &[people(0, 10, 1)]).await;
    s0.commit(&next).await.unwrap();
    assert_eq!(ids(&f).await.len(), 7);
}

/// An attempt at a higher parallelism that crashed before its first
/// checkpoint completed leaves prepared transactions of subtasks that the
/// restored checkpoint (at a lower parallelism) does not know; the subtask
/// `j % parallelism` rolls them back.
#[tokio::test]
async fn orphans_above_the_parallelism_are_rolled_back_by_their_subtask_modulo_the_parallelism() {
    let f = Fixture::new("orphans", ID_NAME).await;
    for subtask in [2, 3] {
        let mut raised = sink(&f.config, at(&f.pipeline, subtask, 4, &[]));
        raised.recover(&[]).await.unwrap();
        prepare(&mut raised, 9, &[people(subtask as i32, 0, 1)]).await;
    }
    // Back at 2 from a checkpoint taken at 2: nothing is adopted.
    let mut s1 = sink(&f.config, at(&f.pipeline, 1, 2, &[]));
    s1.recover(&[]).await.unwrap();
    let left = pipeline_prepared(&f).await;
    assert_eq!(
        left.len(),
        1,
        "subtask 1 rolled back subtask 3's, not subtask 2's: {left:?}"
    );
    assert!(left[0].contains(":2:9"), "{left:?}");
    let mut s0 = sink(&f.config, at(&f.pipeline, 0, 2, &[]));
    s0.recover(&[]).await.unwrap();
    assert!(pipeline_prepared(&f).await.is_empty());
    assert_eq!(f.count().await, 0);
}

/// Upsert mode: rows of a committed transaction that a crash left in the
/// staging table (between COMMIT PREPARED and the merge) are merged by the
/// heir of their old subtask, also when the checkpoint does not list it (the
/// recovery's safety net for every committed staged row).
#[tokio::test]
async fn the_heir_merges_staged_rows_an_adopted_subtask_left() {
    let f = Fixture::new("kv_heir", KV_UPSERT).await;
    let mut old = sink(&f.config, at(&f.pipeline, 2, 3, &[]));
    old.recover(&[]).await.unwrap();
    let c = prepare(&mut old, 4, &[vec![kv(2, 0, 1, "a"), kv(2, 1, 2, "b")]]).await;
    drop(old);
    f.db.batch_execute(&format!("COMMIT PREPARED '{}'", c.gid))
        .await
        .unwrap();
    assert!(pairs(&f.db, &f.table).await.is_empty(), "committed, not merged yet");
    let mut heir = sink(&f.config, at(&f.pipeline, 0, 2, &[2]));
    heir.recover(&[]).await.unwrap();
    assert_eq!(pairs(&f.db, &f.table).await, expect_pairs(&[(1, "a"), (2, "b")]));
    assert_eq!(count(&f.db, &format!("{}_exactly_staging", f.table)).await, 0);
}

/// Mode `fenced` keeps positions per split, not per subtask: a split that
/// moves to another subtask when the parallelism changes is fenced there by
/// the position its old subtask committed.
#[tokio::test]
async fn fenced_positions_follow_the_split_to_its_new_subtask() {
    let f = Fixture::new("moved", "mode = \"fenced\"\ncreate_table = true\n[sink.postgres.columns]\nid = { from = \"/id\", type = \"bigint\" }\nname = { from = \"/name\", type = \"text\" }\n").await;
    let factory = PostgresSinkFactory::new(f.config.clone()).unwrap();
    let scope = factory.fence_scope(&f.pipeline);
    let mut old = factory.create_fenced_sink(&at(&f.pipeline, 2, 3, &[])).unwrap();
    old.open().await.unwrap();
    old.write_fenced(&scope, &people(5, 0, 10)).await.unwrap();
    old.flush().await.unwrap();
    drop(old);
    // Resumed at 2: split orders-5 now goes to subtask 1, which gets the
    // replay from the restored checkpoint's offset (0 here) onwards.
    let mut new = factory.create_fenced_sink(&at(&f.pipeline, 1, 2, &[])).unwrap();
    new.open().await.unwrap();
    let outcome = new.write_fenced(&scope, &people(5, 0, 15)).await.unwrap();
    assert_eq!((outcome.applied, outcome.skipped), (5, 10));
    new.flush().await.unwrap();
    assert_eq!(ids(&f).await, (0..15).collect::<Vec<i64>>());
}

#[tokio::test]
async fn a_raised_parallelism_keeps_the_old_subtasks_and_starts_new_ones_clean() {
    let f = Fixture::new("raised", ID_NAME).await;
    let mut listed = Vec::new();
    for subtask in 0..2 {
        let mut old = sink(&f.config, at(&f.pipeline, subtask, 2, &[]));
        old.recover(&[]).await.unwrap();
        listed.push(prepare(&mut old, 3, &[people(subtask as i32, 10 * subtask as i64, 2)]).await);
    }
    for subtask in 0..4 {
        let mut new = sink(&f.config, at(&f.pipeline, subtask, 4, &[]));
        let pending: Vec<PostgresCommittable> = listed.iter().filter(|c| c.subtask == subtask).cloned().collect();
        new.recover(&pending).await.unwrap();
        let c = prepare(&mut new, 4, &[people(subtask as i32, 100 + subtask as i64, 1)]).await;
        new.commit(&c).await.unwrap();
        assert_eq!(c.checkpoint, CheckpointId(4));
    }
    assert!(pipeline_prepared(&f).await.is_empty());
    assert_eq!(ids(&f).await, [0, 1, 10, 11, 100, 101, 102, 103]);
}
