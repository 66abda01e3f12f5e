use bytes::BytesMut;
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};

use super::*;

/// Appends one batch of `producer` (-1: plain) holding records at
/// `offsets`; a control batch when `marker` is given (0 abort, 1 commit).
fn put(buf: &mut BytesMut, producer: i64, offsets: std::ops::Range<i64>, marker: Option<u8>, compression: Compression) {
    let records: Vec<Record> = offsets
        .map(|offset| Record {
            transactional: producer >= 0,
            control: marker.is_some(),
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: producer,
            producer_epoch: if producer < 0 { -1 } else { 0 },
            timestamp_type: TimestampType::Creation,
            offset,
            sequence: if producer < 0 { -1 } else { offset as i32 },
            timestamp: 1_000 + offset,
            key: Some(match marker {
                Some(kind) => Bytes::from(vec![0, 0, 0, kind]),
                None => Bytes::from(format!("k{offset}")),
            }),
            value: Some(Bytes::from(format!("v{offset}"))),
            headers: IndexMap::new(),
        })
        .collect();
    RecordBatchEncoder::encode(
        buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .unwrap();
}

fn offsets(read: &PartitionRead) -> Vec<i64> {
    read.records.iter().map(|r| r.offset).collect()
}

/// 0-2 plain, 3-4 of producer 7 (committed at 5), 6-7 of producer 8
/// (aborted at 8), 9 plain.
fn log() -> Bytes {
    let mut buf = BytesMut::new();
    put(&mut buf, -1, 0..3, None, Compression::None);
    put(&mut buf, 7, 3..5, None, Compression::Gzip);
    put(&mut buf, 7, 5..6, Some(1), Compression::None);
    put(&mut buf, 8, 6..8, None, Compression::Lz4);
    put(&mut buf, 8, 8..9, Some(0), Compression::None);
    put(&mut buf, -1, 9..10, None, Compression::Zstd);
    buf.freeze()
}

#[test]
fn delivers_committed_and_plain_records_and_moves_past_markers() {
    let read = read_partition(0, log(), [(8, 6)]).unwrap();
    assert_eq!(offsets(&read), [0, 1, 2, 3, 4, 9]);
    assert_eq!(read.next, 10);
    assert!(!read.cut);
    assert_eq!(read.records[3].value.as_deref(), Some(&b"v3"[..]));
}

#[test]
fn records_before_the_position_are_not_delivered_again() {
    // An answer starts at the batch holding the position.
    let read = read_partition(1, log(), [(8, 6)]).unwrap();
    assert_eq!(offsets(&read), [1, 2, 3, 4, 9]);
    let read = read_partition(4, log(), [(8, 6)]).unwrap();
    assert_eq!(offsets(&read), [4, 9]);
}

#[test]
fn an_answer_of_markers_and_aborted_records_moves_the_position_with_nothing_to_deliver() {
    let mut buf = BytesMut::new();
    put(&mut buf, 8, 6..8, None, Compression::None);
    put(&mut buf, 8, 8..9, Some(0), Compression::None);
    let read = read_partition(6, buf.freeze(), [(8, 6)]).unwrap();
    assert!(read.records.is_empty());
    assert_eq!(read.next, 9);
    assert!(!read.cut);
}

#[test]
fn a_cut_batch_is_left_for_the_next_fetch_and_reported_when_nothing_else_came() {
    let whole = log();
    let mut first = BytesMut::new();
    put(&mut first, -1, 0..3, None, Compression::None);
    let first_len = first.len();
    // The first batch and part of the second.
    let read = read_partition(0, whole.slice(..first_len + 10), []).unwrap();
    assert_eq!((offsets(&read), read.next, read.cut), (vec![0, 1, 2], 3, false));
    // Only part of the batch at the position: no progress, more bytes needed.
    let read = read_partition(3, whole.slice(first_len..first_len + 10), []).unwrap();
    assert_eq!((read.records.len(), read.next, read.cut), (0, 3, true));
    // Nothing at all: caught up, not cut.
    let read = read_partition(10, Bytes::new(), []).unwrap();
    assert_eq!((read.next, read.cut), (10, false));
}

#[test]
fn a_corrupt_batch_is_an_error() {
    let mut buf = BytesMut::from(&log()[..]);
    buf[70] ^= 0xff;
    assert!(read_partition(0, buf.freeze(), []).is_err());
}

/// v1 entries at 0-4 (plain at 0 and 1, a gzip wrapper of 2-4), a v0 one
/// at 5, then v2 batches: plain 6-7, producer 8 aborted at 8-9.
fn legacy_then_v2() -> Bytes {
    use crate::message_set::{message, plain, wrapper, Codec};
    let inner = [
        plain(0, 1, 1_002, "k2", "v2"),
        plain(1, 1, 1_003, "k3", "v3"),
        plain(2, 1, 1_004, "k4", "v4"),
    ]
    .concat();
    let mut buf = BytesMut::new();
    for entry in [
        plain(0, 1, 1_000, "k0", "v0"),
        message(1, 1, 0, 1_001, None, None),
        wrapper(4, 1, Codec::Gzip, false, 1_004, &inner),
        plain(5, 0, 0, "k5", "v5"),
    ] {
        buf.extend_from_slice(&entry);
    }
    put(&mut buf, -1, 6..8, None, Compression::None);
    put(&mut buf, 8, 8..9, None, Compression::None);
    put(&mut buf, 8, 9..10, Some(0), Compression::None);
    buf.freeze()
}

#[test]
fn v0_and_v1_messages_then_v2_batches_are_read_in_order() {
    let read = read_partition(0, legacy_then_v2(), [(8, 8)]).unwrap();
    assert_eq!(offsets(&read), [0, 1, 2, 3, 4, 5, 6, 7]);
    let stamps: Vec<i64> = read.records.iter().map(|r| r.timestamp).collect();
    assert_eq!(stamps, [1_000, 1_001, 1_002, 1_003, 1_004, -1, 1_006, 1_007]);
    assert_eq!(read.records[1].value, None, "a null value stays null");
    assert_eq!((read.next, read.cut), (10, false));
}

#[test]
fn a_compressed_v1_message_holding_the_position_delivers_from_the_position() {
    // The broker answers from the entry holding offset 3: the wrapper.
    let read = read_partition(3, legacy_then_v2(), []).unwrap();
    assert_eq!(offsets(&read), [3, 4, 5, 6, 7, 8]);
    assert_eq!(read.next, 10);
}

#[test]
fn a_cut_v1_message_is_left_for_the_next_fetch() {
    use crate::message_set::plain;
    let whole = [plain(0, 1, 0, "k0", "v0"), plain(1, 1, 0, "k1", "v1")].concat();
    let first_len = whole.len() / 2;
    let read = read_partition(0, Bytes::from(whole[..whole.len() - 3].to_vec()), []).unwrap();
    assert_eq!((offsets(&read), read.next, read.cut), (vec![0], 1, false));
    let read = read_partition(1, Bytes::from(whole[first_len..whole.len() - 3].to_vec()), []).unwrap();
    assert_eq!((read.records.len(), read.next, read.cut), (0, 1, true));
}

#[test]
fn a_corrupt_v1_message_is_an_error_naming_its_offset() {
    use crate::message_set::plain;
    let mut entry = plain(17, 1, 0, "key", "value");
    let last = entry.len() - 1;
    entry[last] ^= 0xff;
    let error = read_partition(17, Bytes::from(entry), []).unwrap_err();
    assert!(error.contains("offset 17") && error.contains("CRC"), "{error}");
}
