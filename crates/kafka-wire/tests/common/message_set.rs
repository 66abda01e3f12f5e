//! Writes message sets of formats v0 and v1 (magic 0 and 1) as brokers
//! before Kafka 0.11 stored them, byte by byte from the format (not by the
//! reader's code): for the reader's unit tests (the crate includes this
//! file) and for a log segment a real broker serves.
#![allow(dead_code)] // each user takes its own part

use bytes::{BufMut, BytesMut};
use kafka_protocol::compression::{Compressor, Gzip, Lz4, Snappy};
use twox_hash::XxHash32;

/// Attribute bit of a v1 message whose timestamp is the broker's.
pub(crate) const LOG_APPEND_TIME: u8 = 1 << 3;

/// How a wrapper's inner message set is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codec {
    /// gzip.
    Gzip,
    /// snappy in xerial's framing, as Kafka's Java producer wrote it.
    SnappyXerial,
    /// raw snappy, as other clients wrote it.
    SnappyRaw,
    /// An LZ4 frame; for magic 0 with the descriptor checksum Kafka before
    /// 0.10 wrote (over the frame's magic number too, KAFKA-3160).
    Lz4,
}

impl Codec {
    /// Every codec.
    pub(crate) const ALL: [Codec; 4] = [Codec::Gzip, Codec::SnappyXerial, Codec::SnappyRaw, Codec::Lz4];

    /// Its number in a message's attributes.
    pub(crate) fn attribute(self) -> u8 {
        match self {
            Codec::Gzip => 1,
            Codec::SnappyXerial | Codec::SnappyRaw => 2,
            Codec::Lz4 => 3,
        }
    }
}

/// One entry: `offset | size | crc | magic | attributes | timestamp (v1) |
/// key | value`, the CRC32 over magic to the end.
pub(crate) fn message(
    offset: i64,
    magic: u8,
    attributes: u8,
    timestamp: i64,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
) -> Vec<u8> {
    let mut body = BytesMut::new();
    body.put_u8(magic);
    body.put_u8(attributes);
    if magic == 1 {
        body.put_i64(timestamp);
    }
    for field in [key, value] {
        match field {
            None => body.put_i32(-1),
            Some(bytes) => {
                body.put_i32(bytes.len() as i32);
                body.put_slice(bytes);
            }
        }
    }
    let mut entry = BytesMut::new();
    entry.put_i64(offset);
    entry.put_i32(4 + body.len() as i32);
    entry.put_u32(crc32fast::hash(&body));
    entry.put_slice(&body);
    entry.to_vec()
}

/// A plain message with a key and a value (v1: `timestamp` too).
pub(crate) fn plain(offset: i64, magic: u8, timestamp: i64, key: &str, value: &str) -> Vec<u8> {
    message(
        offset,
        magic,
        0,
        timestamp,
        Some(key.as_bytes()),
        Some(value.as_bytes()),
    )
}

/// A compressed wrapper at `offset` whose value is `inner` (a message set)
/// compressed with `codec`; a v1 wrapper carries `timestamp`, and
/// LogAppendTime when `log_append_time`.
pub(crate) fn wrapper(
    offset: i64,
    magic: u8,
    codec: Codec,
    log_append_time: bool,
    timestamp: i64,
    inner: &[u8],
) -> Vec<u8> {
    let attributes = codec.attribute() | if log_append_time { LOG_APPEND_TIME } else { 0 };
    message(
        offset,
        magic,
        attributes,
        timestamp,
        None,
        Some(&compress(codec, magic, inner)),
    )
}

/// `data` compressed with `codec` as a writer of message format `magic`
/// did.
pub(crate) fn compress(codec: Codec, magic: u8, data: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    let write = |buf: &mut BytesMut| {
        buf.put_slice(data);
        Ok(())
    };
    match codec {
        Codec::Gzip => Gzip::compress(&mut out, write).unwrap(),
        Codec::SnappyXerial | Codec::SnappyRaw => Snappy::compress(&mut out, write).unwrap(),
        Codec::Lz4 => Lz4::compress(&mut out, write).unwrap(),
    }
    match codec {
        // xerial: a 16-byte header, then (length, block) pairs of 32 KiB
        // of input each: one block is a raw snappy stream.
        Codec::SnappyRaw => {
            assert!(data.len() <= 32 * 1024, "one xerial block holds the whole set");
            out[20..].to_vec()
        }
        Codec::Lz4 if magic == 0 => kafka_3160(out.to_vec()),
        _ => out.to_vec(),
    }
}

/// An LZ4 frame (magic number, flags, block descriptor, checksum; no
/// content size) with the checksum magic-0 writers computed: over the
/// magic number too.
pub(crate) fn kafka_3160(mut frame: Vec<u8>) -> Vec<u8> {
    assert_eq!(frame[4] & 0x09, 0, "no content size, no dictionary id");
    frame[6] = (XxHash32::oneshot(0, &frame[..6]) >> 8) as u8;
    frame
}
