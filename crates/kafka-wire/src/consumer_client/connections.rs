//! The connections a [`ConsumerClient`](super::ConsumerClient) keeps
//! between calls, one per broker address, dropped after a failure.

use std::collections::BTreeMap;
use std::fmt::Debug;

use kafka_protocol::protocol::{Request, VersionRange};
use tracing::debug;

use crate::cluster::connect_any;
use crate::config::WireConfig;
use crate::connection::{api_key, KafkaConnection};
use crate::error::WireError;

/// Open connections by the address they were opened to.
#[derive(Debug, Default)]
pub(super) struct Connections {
    open: BTreeMap<String, KafkaConnection>,
}

impl Connections {
    /// The address of an open connection: any kept one, else a new one to
    /// the first bootstrap server of `config` that answers.
    pub(super) async fn any(&mut self, config: &WireConfig) -> Result<String, WireError> {
        if let Some(address) = self.open.keys().next() {
            return Ok(address.clone());
        }
        let connection = connect_any(config).await?;
        let address = connection.addr().to_string();
        self.open.insert(address.clone(), connection);
        Ok(address)
    }

    /// The connection to `address`, opened with `config`'s options unless
    /// one is kept.
    pub(super) async fn to(&mut self, address: &str, config: &WireConfig) -> Result<&mut KafkaConnection, WireError> {
        if !self.open.contains_key(address) {
            let connection = KafkaConnection::connect_with(address, &config.options).await?;
            self.open.insert(address.to_string(), connection);
        }
        Ok(self.open.get_mut(address).expect("kept or just opened"))
    }

    /// Sends `request(version)` to `address`, in the highest version within
    /// `client` that the broker speaks; returns that version and the answer.
    pub(super) async fn request<R>(
        &mut self,
        address: &str,
        config: &WireConfig,
        client: VersionRange,
        request: impl FnOnce(i16) -> R,
    ) -> Result<(i16, R::Response), WireError>
    where
        R: Request + Debug,
    {
        let connection = self.to(address, config).await?;
        let result = match connection.version(api_key::<R>(), client) {
            Ok(version) => connection
                .request(version, &request(version))
                .await
                .map(|r| (version, r)),
            Err(error) => Err(error),
        };
        self.settle(address, result)
    }

    /// `result` of an exchange on the connection to `address`, which is
    /// dropped after an error that left it unusable: the next call opens a
    /// new one.
    pub(super) fn settle<T>(&mut self, address: &str, result: Result<T, WireError>) -> Result<T, WireError> {
        if let Err(error) = &result {
            if breaks_connection(error) && self.open.remove(address).is_some() {
                debug!(broker = %address, %error, "connection dropped; the next call reconnects");
            }
        }
        result
    }
}

/// Whether `error` left the connection it happened on unusable (a
/// [`KafkaConnection`] closes itself after any failed exchange).
pub(super) fn breaks_connection(error: &WireError) -> bool {
    matches!(
        error,
        WireError::Io { .. }
            | WireError::Closed { .. }
            | WireError::Timeout { .. }
            | WireError::Protocol { .. }
            | WireError::TlsExpected { .. }
            | WireError::Codec { .. }
    )
}
