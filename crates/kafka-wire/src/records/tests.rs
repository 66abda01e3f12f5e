use bytes::{BufMut, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};

use super::*;

const PLAIN: i64 = -1;

/// A data batch of `producer_id` whose records, starting at `offset`, have
/// the values `values`.
fn data(offset: i64, producer_id: i64, transactional: bool, values: &[&str]) -> DecodedBatch {
    let records = values
        .iter()
        .zip(offset..)
        .map(|(value, offset)| BatchRecord {
            offset,
            timestamp: 1_000 + offset,
            key: Some(format!("k{offset}").into_bytes()),
            value: Some(value.as_bytes().to_vec()),
            headers: vec![RecordHeader {
                key: "h".into(),
                value: Some(value.as_bytes().to_vec()),
            }],
        })
        .collect::<Vec<_>>();
    DecodedBatch {
        base_offset: offset,
        last_offset: offset + records.len() as i64 - 1,
        producer_id,
        producer_epoch: if producer_id == PLAIN { -1 } else { 0 },
        transactional,
        control: None,
        records,
    }
}

fn txn(offset: i64, producer_id: i64, values: &[&str]) -> DecodedBatch {
    data(offset, producer_id, true, values)
}

fn marker(offset: i64, producer_id: i64, marker: ControlMarker) -> DecodedBatch {
    DecodedBatch {
        base_offset: offset,
        last_offset: offset,
        producer_id,
        producer_epoch: 0,
        transactional: true,
        control: Some(marker),
        records: Vec::new(),
    }
}

fn values(records: &[CommittedRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
        .collect()
}

fn read(batches: Vec<DecodedBatch>) -> CommittedRead {
    let mut filter = CommittedFilter::new("t", 3);
    batches.into_iter().for_each(|batch| filter.push(batch));
    filter.finish()
}

#[test]
fn committed_transaction_is_visible() {
    let batches = vec![
        txn(0, 7, &["a", "b"]),
        txn(2, 7, &["c"]),
        marker(3, 7, ControlMarker::Commit),
    ];
    let records = committed_records("t", 3, batches);
    assert_eq!(values(&records), ["a", "b", "c"]);
    let first = &records[0];
    assert_eq!(
        (first.topic.as_str(), first.partition, first.offset, first.producer_id),
        ("t", 3, 0, 7)
    );
    assert_eq!(first.key.as_deref(), Some(&b"k0"[..]));
    assert_eq!(first.timestamp, 1_000);
    assert_eq!(
        first.headers,
        [RecordHeader {
            key: "h".into(),
            value: Some(b"a".to_vec())
        }]
    );
}

#[test]
fn aborted_transaction_is_discarded() {
    let read = read(vec![txn(0, 7, &["a", "b"]), marker(2, 7, ControlMarker::Abort)]);
    assert!(read.records.is_empty());
    assert_eq!(read.aborted_records, 2);
    assert!(read.open_transactions.is_empty());
}

#[test]
fn open_transaction_is_held_back() {
    let read = read(vec![
        data(0, PLAIN, false, &["p"]),
        txn(1, 7, &["a"]),
        txn(2, 7, &["b"]),
    ]);
    assert_eq!(values(&read.records), ["p"]);
    let open = OpenTransaction {
        topic: "t".into(),
        partition: 3,
        producer_id: 7,
        producer_epoch: 0,
        first_offset: 1,
        records: 2,
    };
    assert_eq!(read.open_transactions, [open]);
}

#[test]
fn interleaved_producers_commit_and_abort_independently() {
    let batches = vec![
        txn(0, 7, &["a1"]),
        txn(1, 8, &["b1"]),
        txn(2, 7, &["a2"]),
        txn(3, 8, &["b2"]),
        marker(4, 8, ControlMarker::Commit),
        txn(5, 7, &["a3"]),
        marker(6, 7, ControlMarker::Abort),
    ];
    let read = read(batches);
    assert_eq!(values(&read.records), ["b1", "b2"]);
    assert_eq!(read.records.iter().map(|r| r.offset).collect::<Vec<_>>(), [1, 3]);
    assert!(read.records.iter().all(|r| r.producer_id == 8));
    assert_eq!(read.aborted_records, 3);
    let ended: Vec<_> = read
        .ended_transactions
        .iter()
        .map(|e| (e.producer_id, e.committed, e.first_offset, e.records, e.marker_offset))
        .collect();
    assert_eq!(ended, [(8, true, Some(1), 2, 4), (7, false, Some(0), 3, 6)]);
}

#[test]
fn commit_releases_in_offset_order_among_plain_records() {
    let batches = vec![
        data(0, PLAIN, false, &["p0"]),
        txn(1, 7, &["t1"]),
        data(2, PLAIN, false, &["p2"]),
        data(3, 42, false, &["idempotent3"]),
        txn(4, 7, &["t4"]),
        marker(5, 7, ControlMarker::Commit),
        data(6, PLAIN, false, &["p6"]),
    ];
    let records = committed_records("t", 3, batches);
    assert_eq!(values(&records), ["p0", "t1", "p2", "idempotent3", "t4", "p6"]);
    assert_eq!(
        records.iter().map(|r| r.producer_id).collect::<Vec<_>>(),
        [-1, 7, -1, 42, 7, -1]
    );
}

#[test]
fn control_batches_are_never_returned() {
    let batches = vec![
        marker(0, 7, ControlMarker::Commit), // stray: nothing held
        marker(1, 7, ControlMarker::Abort),
        txn(2, 7, &["a"]),
        marker(3, 7, ControlMarker::Other(2)), // not a transaction marker
        marker(4, 9, ControlMarker::Commit),   // another producer's
    ];
    let read = read(batches);
    assert!(read.records.is_empty());
    assert_eq!(read.aborted_records, 0);
    assert_eq!(read.open_transactions.len(), 1);
    assert_eq!(read.open_transactions[0].producer_id, 7);
    let ended: Vec<_> = read
        .ended_transactions
        .iter()
        .map(|e| (e.producer_id, e.committed, e.first_offset, e.records))
        .collect();
    assert_eq!(
        ended,
        [(7, true, None, 0), (7, false, None, 0), (9, true, None, 0)],
        "Other(_) ends nothing"
    );
}

#[test]
fn a_producer_runs_transactions_one_after_another() {
    let batches = vec![
        txn(0, 7, &["first"]),
        marker(1, 7, ControlMarker::Commit),
        txn(2, 7, &["second"]),
        marker(3, 7, ControlMarker::Abort),
        txn(4, 7, &["third"]),
        marker(5, 7, ControlMarker::Commit),
        txn(6, 7, &["fourth"]),
    ];
    let read = read(batches);
    assert_eq!(values(&read.records), ["first", "third"]);
    assert_eq!(read.open_transactions[0].first_offset, 6);
}

#[test]
fn control_keys() {
    assert_eq!(ControlMarker::from_key(&[0, 0, 0, 0]), Some(ControlMarker::Abort));
    assert_eq!(ControlMarker::from_key(&[0, 0, 0, 1]), Some(ControlMarker::Commit));
    assert_eq!(ControlMarker::from_key(&[0, 0, 0, 2]), Some(ControlMarker::Other(2)));
    assert_eq!(ControlMarker::from_key(&[0, 0, 0]), None);
}

/// A record for the encoder, in a batch of `producer_id`.
fn wire_record(offset: i64, producer_id: i64, transactional: bool, key: &[u8], value: Option<&[u8]>) -> Record {
    Record {
        transactional,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id,
        producer_epoch: if producer_id < 0 { -1 } else { 3 },
        timestamp_type: TimestampType::Creation,
        offset,
        sequence: if producer_id < 0 { -1 } else { offset as i32 },
        timestamp: 5_000 + offset,
        key: Some(Bytes::copy_from_slice(key)),
        value: value.map(Bytes::copy_from_slice),
        headers: IndexMap::new(),
    }
}

fn encode(buf: &mut BytesMut, records: &[Record], compression: Compression) {
    RecordBatchEncoder::encode(
        buf,
        records,
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .unwrap();
}

#[test]
fn decodes_fetched_batches() {
    let mut plain = wire_record(0, -1, false, b"k0", Some(b"plain"));
    plain
        .headers
        .insert(StrBytes::from_static_str("trace"), Some(Bytes::from_static(b"x")));
    plain.headers.insert(StrBytes::from_static_str("null"), None);
    let txn1 = wire_record(1, 7, true, b"k1", Some(b"t1"));
    let txn2 = wire_record(2, 7, true, b"k2", None);
    let mut commit = wire_record(3, 7, true, &[0, 0, 0, 1], Some(&[0, 0, 0, 0, 0, 5]));
    commit.control = true;
    let aborted = wire_record(4, 8, true, b"k4", Some(b"gone"));
    let mut abort = wire_record(5, 8, true, &[0, 0, 0, 0], Some(&[0, 0, 0, 0, 0, 5]));
    abort.control = true;

    let mut buf = BytesMut::new();
    encode(&mut buf, &[plain], Compression::None);
    encode(&mut buf, &[txn1, txn2], Compression::Gzip);
    encode(&mut buf, &[commit], Compression::None);
    encode(&mut buf, &[aborted], Compression::Lz4);
    encode(&mut buf, &[abort], Compression::None);
    let complete = buf.len();
    let partial = wire_record(6, -1, false, b"k6", Some(b"cut off"));
    encode(&mut buf, &[partial], Compression::None);
    buf.truncate(complete + 20);

    let mut raw = buf.freeze();
    let batches = decode_batches(&mut raw).unwrap();
    assert_eq!(raw.len(), 20, "the partial batch stays in the buffer");
    let summary: Vec<_> = batches
        .iter()
        .map(|b| (b.base_offset, b.last_offset, b.producer_id, b.transactional, b.control))
        .collect();
    assert_eq!(
        summary,
        [
            (0, 0, -1, false, None),
            (1, 2, 7, true, None),
            (3, 3, 7, true, Some(ControlMarker::Commit)),
            (4, 4, 8, true, None),
            (5, 5, 8, true, Some(ControlMarker::Abort)),
        ]
    );
    assert_eq!(batches[1].producer_epoch, 3);
    assert_eq!(batches[1].records[1].value, None);
    assert_eq!(batches[0].records[0].timestamp, 5_000);
    assert_eq!(
        batches[0].records[0].headers,
        [
            RecordHeader {
                key: "trace".into(),
                value: Some(b"x".to_vec())
            },
            RecordHeader {
                key: "null".into(),
                value: None
            },
        ]
    );
    assert!(batches[2].records.is_empty(), "control records are not data");

    let records = committed_records("t", 0, batches);
    let offsets: Vec<_> = records.iter().map(|r| (r.offset, r.key.clone().unwrap())).collect();
    assert_eq!(offsets, [(0, b"k0".to_vec()), (1, b"k1".to_vec()), (2, b"k2".to_vec())]);
}

#[test]
fn decodes_messages_of_formats_v0_and_v1_as_plain_batches() {
    use crate::message_set::{message, plain, wrapper, Codec};
    let mut buf = BytesMut::new();
    buf.put_slice(&plain(0, 0, 0, "k0", "v0"));
    buf.put_slice(&message(1, 1, 0, 1_001, None, None));
    let inner = [plain(0, 1, 1_002, "k2", "v2"), plain(1, 1, 1_003, "k3", "v3")].concat();
    buf.put_slice(&wrapper(3, 1, Codec::Lz4, false, 1_003, &inner));
    encode(
        &mut buf,
        &[wire_record(4, -1, false, b"k4", Some(b"v4"))],
        Compression::Snappy,
    );
    let batches = decode_batches(&mut buf.freeze()).unwrap();
    let shape: Vec<_> = batches
        .iter()
        .map(|b| {
            (
                b.base_offset,
                b.last_offset,
                b.producer_id,
                b.transactional,
                b.records.len(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (0, 0, -1, false, 1),
            (1, 1, -1, false, 1),
            (2, 3, -1, false, 2),
            (4, 4, -1, false, 1)
        ]
    );
    let records = committed_records("t", 0, batches);
    let seen: Vec<_> = records
        .iter()
        .map(|r| (r.offset, r.timestamp, r.value.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (0, -1, Some(b"v0".to_vec())),
            (1, 1_001, None),
            (2, 1_002, Some(b"v2".to_vec())),
            (3, 1_003, Some(b"v3".to_vec())),
            (4, 5_004, Some(b"v4".to_vec())),
        ]
    );
}
