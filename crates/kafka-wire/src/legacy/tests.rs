use bytes::Bytes;

use super::*;
use crate::message_set::{compress, message, plain, wrapper, Codec, LOG_APPEND_TIME};

fn decode(entry: Vec<u8>) -> Result<Vec<FetchedRecord>, String> {
    let mut out = Vec::new();
    decode_into(Bytes::from(entry), &mut out)?;
    Ok(out)
}

/// `(offset, timestamp, key, value)` of each record.
fn summary(records: &[FetchedRecord]) -> Vec<(i64, i64, Option<String>, Option<String>)> {
    let text = |bytes: &Option<Bytes>| bytes.as_ref().map(|b| String::from_utf8(b.to_vec()).unwrap());
    records
        .iter()
        .map(|r| (r.offset, r.timestamp, text(&r.key), text(&r.value)))
        .collect()
}

fn row(offset: i64, timestamp: i64, key: &str, value: &str) -> (i64, i64, Option<String>, Option<String>) {
    (offset, timestamp, Some(key.into()), Some(value.into()))
}

#[test]
fn a_v0_message_has_no_timestamp_and_keeps_nulls() {
    let records = decode(message(7, 0, 0, 0, None, None)).unwrap();
    assert_eq!(summary(&records), [(7, -1, None, None)]);
    assert!(records[0].headers.is_empty());

    let records = decode(message(8, 0, 0, 0, Some(b""), Some(b"value"))).unwrap();
    assert_eq!(summary(&records), [(8, -1, Some(String::new()), Some("value".into()))]);
}

#[test]
fn a_v1_message_has_its_timestamp_and_its_value_is_a_slice_of_the_answer() {
    let entry = Bytes::from(message(3, 1, 0, 1_234, Some(b"k"), None));
    let mut records = Vec::new();
    decode_into(entry.clone(), &mut records).unwrap();
    assert_eq!(summary(&records), [(3, 1_234, Some("k".into()), None)]);
    let key = records[0].key.as_ref().unwrap();
    let inside = entry.as_ptr() as usize..entry.as_ptr() as usize + entry.len();
    assert!(inside.contains(&(key.as_ptr() as usize)), "not copied");

    // LogAppendTime on a plain message: the broker wrote its time there.
    let records = decode(message(4, 1, LOG_APPEND_TIME, 5_000, None, Some(b"v"))).unwrap();
    assert_eq!(records[0].timestamp, 5_000);
}

#[test]
fn compressed_v0_messages_hold_absolute_offsets_with_every_codec() {
    let inner = [
        plain(100, 0, 0, "k0", "v0"),
        message(101, 0, 0, 0, None, None),
        plain(102, 0, 0, "k2", "v2"),
    ]
    .concat();
    for codec in Codec::ALL {
        let records = decode(wrapper(102, 0, codec, false, 0, &inner)).unwrap_or_else(|e| panic!("{codec:?}: {e}"));
        assert_eq!(
            summary(&records),
            [
                row(100, -1, "k0", "v0"),
                (101, -1, None, None),
                row(102, -1, "k2", "v2")
            ],
            "{codec:?}"
        );
    }
}

#[test]
fn compressed_v1_messages_hold_relative_offsets_with_every_codec() {
    // Relative 0, 2, 5 (compaction removed the others): the wrapper's
    // offset is the last one's, 20.
    let inner = [
        plain(0, 1, 1_000, "a", "va"),
        plain(2, 1, 1_002, "b", "vb"),
        message(5, 1, 0, 1_005, None, Some(b"vc")),
    ]
    .concat();
    for codec in Codec::ALL {
        let records = decode(wrapper(20, 1, codec, false, 1_005, &inner)).unwrap_or_else(|e| panic!("{codec:?}: {e}"));
        assert_eq!(
            summary(&records),
            [
                row(15, 1_000, "a", "va"),
                row(17, 1_002, "b", "vb"),
                (20, 1_005, None, Some("vc".into()))
            ],
            "{codec:?}"
        );
    }
}

#[test]
fn log_append_time_gives_inner_messages_the_wrappers_timestamp() {
    let inner = [plain(0, 1, 1_000, "a", "va"), plain(1, 1, 1_001, "b", "vb")].concat();
    let records = decode(wrapper(11, 1, Codec::Gzip, true, 9_999, &inner)).unwrap();
    assert_eq!(
        summary(&records),
        [row(10, 9_999, "a", "va"), row(11, 9_999, "b", "vb")]
    );
    let records = decode(wrapper(11, 1, Codec::Gzip, false, 9_999, &inner)).unwrap();
    assert_eq!(
        summary(&records),
        [row(10, 1_000, "a", "va"), row(11, 1_001, "b", "vb")]
    );
}

#[test]
fn a_v1_wrapper_at_offset_zero_counts_from_zero() {
    // Some librdkafka versions sent wrappers at offset 0; Java's consumer
    // reads their inner offsets as they are.
    let inner = [plain(0, 1, 1, "a", "va"), plain(1, 1, 2, "b", "vb")].concat();
    let records = decode(wrapper(0, 1, Codec::Lz4, false, 2, &inner)).unwrap();
    assert_eq!(summary(&records), [row(0, 1, "a", "va"), row(1, 2, "b", "vb")]);
}

#[test]
fn the_magic_0_lz4_checksum_quirk_is_accepted_in_v0_only() {
    let inner = plain(5, 0, 0, "k", "v");
    let quirky = compress(Codec::Lz4, 0, &inner);
    let proper = compress(Codec::Lz4, 1, &inner);
    assert_ne!(quirky, proper, "the quirk changes the descriptor checksum");
    let v0 = message(5, 0, Codec::Lz4.attribute(), 0, None, Some(&quirky));
    assert_eq!(summary(&decode(v0).unwrap()), [row(5, -1, "k", "v")]);
    // A proper checksum is fine in v0 too.
    let v0 = message(5, 0, Codec::Lz4.attribute(), 0, None, Some(&proper));
    assert_eq!(summary(&decode(v0).unwrap()), [row(5, -1, "k", "v")]);
    // v1 writers wrote it right: a wrong one is corrupt, as in Java.
    let inner = plain(0, 1, 0, "k", "v");
    let v1 = message(
        5,
        1,
        Codec::Lz4.attribute(),
        0,
        None,
        Some(&compress(Codec::Lz4, 0, &inner)),
    );
    let error = decode(v1).unwrap_err();
    assert!(error.contains("offset 5") && error.contains("lz4"), "{error}");
}

#[test]
fn a_bad_crc_is_an_error_naming_the_offset() {
    let mut entry = plain(42, 1, 0, "key", "value");
    let last = entry.len() - 1;
    entry[last] ^= 1;
    let error = decode(entry).unwrap_err();
    assert!(error.contains("offset 42") && error.contains("CRC"), "{error}");

    // Inside a compressed set too.
    let mut inner = plain(0, 1, 0, "key", "value");
    let last = inner.len() - 1;
    inner[last] ^= 1;
    let error = decode(wrapper(9, 1, Codec::Gzip, false, 0, &inner)).unwrap_err();
    assert!(error.contains("offset 9") && error.contains("CRC"), "{error}");
}

#[test]
fn malformed_wrappers_are_errors() {
    let inner = plain(0, 1, 0, "k", "v");
    let nested = wrapper(0, 1, Codec::Gzip, false, 0, &inner);
    let cases = [
        ("nested", wrapper(3, 1, Codec::Gzip, false, 0, &nested)),
        ("empty", wrapper(3, 1, Codec::Gzip, false, 0, &[])),
        ("null value", message(3, 1, Codec::Gzip.attribute(), 0, None, None)),
        ("zstd", message(3, 1, 4, 0, None, Some(b"whatever"))),
        (
            "below its last relative offset",
            wrapper(3, 1, Codec::Gzip, false, 0, &plain(7, 1, 0, "k", "v")),
        ),
        (
            "not gzip",
            message(3, 1, Codec::Gzip.attribute(), 0, None, Some(b"not gzip")),
        ),
    ];
    for (what, entry) in cases {
        let mut out = vec![];
        let error = decode_into(Bytes::from(entry), &mut out).expect_err(what);
        assert!(error.contains("offset 3"), "{what}: {error}");
        assert!(out.is_empty(), "{what}: nothing decoded on an error");
    }
    let mut short = message(3, 1, 0, 0, None, None);
    short.truncate(short.len() - 1);
    let size = (short.len() - 12) as i32;
    short[8..12].copy_from_slice(&size.to_be_bytes());
    assert!(decode(short).unwrap_err().contains("offset 3"));
}

#[test]
fn a_partial_message_at_the_end_of_an_inner_set_ends_it() {
    let second = plain(1, 1, 0, "b", "vb");
    let inner = [plain(0, 1, 0, "a", "va"), second[..second.len() - 2].to_vec()].concat();
    let records = decode(wrapper(0, 1, Codec::SnappyXerial, false, 0, &inner)).unwrap();
    assert_eq!(summary(&records), [row(0, 0, "a", "va")]);
}

#[test]
fn the_descriptor_checksum_is_set_only_in_lz4_frames() {
    let mut not_lz4 = b"not an lz4 frame".to_vec();
    set_descriptor_checksum(&mut not_lz4);
    assert_eq!(not_lz4, b"not an lz4 frame");
    let proper = compress(Codec::Lz4, 1, b"data");
    let mut fixed = compress(Codec::Lz4, 0, b"data");
    set_descriptor_checksum(&mut fixed);
    assert_eq!(fixed, proper);
}
