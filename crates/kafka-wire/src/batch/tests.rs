use bytes::{BufMut, BytesMut};

use super::*;

/// Zigzag varint, as the record format writes it.
fn put_varint(buf: &mut BytesMut, value: i64) {
    let mut raw = ((value << 1) ^ (value >> 63)) as u64;
    while raw >= 0x80 {
        buf.put_u8((raw as u8 & 0x7f) | 0x80);
        raw >>= 7;
    }
    buf.put_u8(raw as u8);
}

fn put_bytes(buf: &mut BytesMut, bytes: Option<&[u8]>) {
    match bytes {
        None => put_varint(buf, -1),
        Some(bytes) => {
            put_varint(buf, bytes.len() as i64);
            buf.put_slice(bytes);
        }
    }
}

/// One uncompressed v2 batch written by hand (not by kafka-protocol's
/// encoder, so the decoder is checked against the format itself):
/// records `(offset delta, timestamp delta, key, value, headers)`.
#[allow(clippy::type_complexity)]
fn batch(
    base_offset: i64,
    attributes: i16,
    base_timestamp: i64,
    max_timestamp: i64,
    records: &[(i32, i64, Option<&[u8]>, Option<&[u8]>, &[(&str, Option<&[u8]>)])],
) -> Bytes {
    let mut body = BytesMut::new();
    for (offset_delta, timestamp_delta, key, value, headers) in records {
        let mut record = BytesMut::new();
        record.put_i8(0);
        put_varint(&mut record, *timestamp_delta);
        put_varint(&mut record, i64::from(*offset_delta));
        put_bytes(&mut record, *key);
        put_bytes(&mut record, *value);
        put_varint(&mut record, headers.len() as i64);
        for (name, value) in *headers {
            put_bytes(&mut record, Some(name.as_bytes()));
            put_bytes(&mut record, *value);
        }
        put_varint(&mut body, record.len() as i64);
        body.put_slice(&record);
    }
    let last_delta = records.iter().map(|r| r.0).max().unwrap_or(0);
    let mut after_crc = BytesMut::new();
    after_crc.put_i16(attributes);
    after_crc.put_i32(last_delta);
    after_crc.put_i64(base_timestamp);
    after_crc.put_i64(max_timestamp);
    after_crc.put_i64(-1); // producer id
    after_crc.put_i16(-1); // producer epoch
    after_crc.put_i32(-1); // base sequence
    after_crc.put_i32(records.len() as i32);
    after_crc.put_slice(&body);
    let mut out = BytesMut::new();
    out.put_i64(base_offset);
    out.put_i32((4 + 1 + 4 + after_crc.len()) as i32);
    out.put_i32(0); // partition leader epoch
    out.put_i8(2);
    out.put_u32(crc32c::crc32c(&after_crc));
    out.put_slice(&after_crc);
    out.freeze()
}

#[test]
fn records_are_read_as_written_with_repeated_header_keys() {
    let headers: &[(&str, Option<&[u8]>)] = &[("trace", Some(b"a")), ("trace", Some(b"b")), ("gone", None)];
    let raw = batch(
        100,
        0,
        1_000,
        1_010,
        &[
            (0, 0, Some(b"k0"), Some(b"v0"), &[]),
            (1, 10, None, None, headers),
            (3, 5, Some(b""), Some(b"v3"), &[]),
        ],
    );
    let header = BatchHeader::read(&raw).unwrap();
    assert_eq!((header.base_offset, header.last_offset), (100, 103));
    assert!(!header.transactional && !header.control);
    let records = decode_records(raw.clone()).unwrap();
    let summary: Vec<_> = records
        .iter()
        .map(|r| (r.offset, r.timestamp, r.key.as_deref(), r.value.as_deref()))
        .collect();
    assert_eq!(
        summary,
        [
            (100, 1_000, Some(&b"k0"[..]), Some(&b"v0"[..])),
            (101, 1_010, None, None),
            (103, 1_005, Some(&b""[..]), Some(&b"v3"[..])),
        ]
    );
    let names: Vec<_> = records[1]
        .headers
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_deref()))
        .collect();
    assert_eq!(
        names,
        [("trace", Some(&b"a"[..])), ("trace", Some(&b"b"[..])), ("gone", None)]
    );
    // Values are slices of the batch, not copies.
    let value = records[0].value.as_ref().unwrap();
    let inside = raw.as_ptr() as usize..raw.as_ptr() as usize + raw.len();
    assert!(inside.contains(&(value.as_ptr() as usize)));
}

#[test]
fn log_append_time_replaces_every_records_timestamp() {
    let raw = batch(
        0,
        LOG_APPEND_TIME,
        1_000,
        9_999,
        &[(0, 0, None, Some(b"a"), &[]), (1, 3, None, Some(b"b"), &[])],
    );
    let stamps: Vec<i64> = decode_records(raw).unwrap().iter().map(|r| r.timestamp).collect();
    assert_eq!(stamps, [9_999, 9_999]);
}

#[test]
fn corrupt_and_truncated_batches_are_errors_naming_the_offset() {
    let raw = batch(42, 0, 0, 0, &[(0, 0, None, Some(b"value"), &[])]);
    let mut flipped = BytesMut::from(&raw[..]);
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    let error = decode_records(flipped.freeze()).unwrap_err();
    assert!(error.contains("offset 42") && error.contains("CRC"), "{error}");

    let mut wrong_count = BytesMut::from(&raw[..]);
    wrong_count[RECORD_COUNT_AT..RECORD_COUNT_AT + 4].copy_from_slice(&2i32.to_be_bytes());
    let crc = crc32c::crc32c(&wrong_count[ATTRIBUTES_AT..]);
    wrong_count[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    let error = decode_records(wrong_count.freeze()).unwrap_err();
    assert!(error.contains("offset 42"), "{error}");
}

#[test]
fn take_batch_leaves_a_cut_batch_in_place() {
    let one = batch(0, 0, 0, 0, &[(0, 0, None, Some(b"a"), &[])]);
    let two = batch(1, 0, 0, 0, &[(0, 0, None, Some(b"b"), &[])]);
    let mut raw = BytesMut::new();
    raw.put_slice(&one);
    raw.put_slice(&two[..two.len() - 1]);
    let mut raw = raw.freeze();
    assert_eq!(take_batch(&mut raw).unwrap(), Some(one));
    assert_eq!(take_batch(&mut raw).unwrap(), None);
    assert_eq!(raw.len(), two.len() - 1);
}

#[test]
fn varints_round_trip_and_overlong_ones_are_refused() {
    for value in [
        0i64,
        1,
        -1,
        63,
        -64,
        64,
        300,
        -300,
        i64::from(i32::MAX),
        i64::MIN,
        i64::MAX,
    ] {
        let mut buf = BytesMut::new();
        put_varint(&mut buf, value);
        let bytes = buf.freeze();
        let mut cursor = Cursor::new(&bytes, 0, bytes.len());
        assert_eq!(cursor.varlong().unwrap(), value);
        assert_eq!(cursor.at, bytes.len());
    }
    let overlong = Bytes::from_static(&[0xff; 11]);
    assert!(Cursor::new(&overlong, 0, 11).varlong().is_err());
    let truncated = Bytes::from_static(&[0x80, 0x80]);
    assert!(Cursor::new(&truncated, 0, 2).varlong().is_err());
}

#[test]
fn an_emptied_control_batch_marks_nothing() {
    // Compaction keeps a producer's last marker as a control batch without
    // its record.
    let raw = batch(7, CONTROL | TRANSACTIONAL, 0, 0, &[]);
    let header = BatchHeader::read(&raw).unwrap();
    assert!(header.control && header.transactional);
    assert_eq!(control_marker(&header, raw).unwrap(), ControlMarker::Emptied);
}
