//! [`TopicId`]: the id Kafka gives a topic when it is created (KIP-516),
//! which tells a topic from another created later under the same name.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

/// A topic's id, as Metadata v10+ and Fetch v13+ carry it. Shown as Kafka's
/// tools show it (`kafka-topics.sh --describe`: URL-safe base64 of the 16
/// bytes, no padding), and read back from that form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicId(pub [u8; 16]);

impl TopicId {
    /// The id of a Metadata answer: `None` for the zero id, which brokers
    /// send when they know none (or before Metadata v10).
    pub(crate) fn from_wire(id: uuid::Uuid) -> Option<TopicId> {
        (!id.is_nil()).then(|| TopicId(*id.as_bytes()))
    }

    /// The id as the protocol's UUID.
    pub(crate) fn to_wire(self) -> uuid::Uuid {
        uuid::Uuid::from_bytes(self.0)
    }
}

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&URL_SAFE_NO_PAD.encode(self.0))
    }
}

impl FromStr for TopicId {
    type Err = String;

    fn from_str(text: &str) -> Result<TopicId, String> {
        let bytes = URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|e| format!("`{text}` is not a Kafka topic id (22 characters of URL-safe base64): {e}"))?;
        let bytes: [u8; 16] = bytes
            .try_into()
            .map_err(|_| format!("`{text}` is not a Kafka topic id: it does not hold 16 bytes"))?;
        Ok(TopicId(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_as_kafka_tools_do_and_read_back() {
        let id = TopicId([0xfb; 16]);
        let text = id.to_string();
        assert_eq!(text.len(), 22);
        assert_eq!(text.parse::<TopicId>(), Ok(id));
        assert!("not-an-id".parse::<TopicId>().is_err());
        assert_eq!(TopicId::from_wire(uuid::Uuid::nil()), None);
        assert_eq!(TopicId::from_wire(id.to_wire()), Some(id));
    }
}
