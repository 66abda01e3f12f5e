//! The client side of SCRAM (RFC 5802), as Kafka speaks it for
//! SCRAM-SHA-256 and SCRAM-SHA-512: no channel binding (`n,,`), no
//! authorization identity, the user name escaped (`=` → `=3D`, `,` →
//! `=2C`) and the password taken as its UTF-8 bytes (Kafka's own client
//! applies no SASLprep either).
//!
//! [`ScramClient`] is a pure state machine — messages in, messages out —
//! generic over the hash, so the RFC's SHA-1 and SHA-256 examples check it
//! (see the tests).

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::digest::block_api::BlockSizeUser;
use hmac::digest::{Digest, FixedOutputReset};
use hmac::{KeyInit, Mac, SimpleHmac};

/// Kafka refuses fewer iterations (`ScramMechanism.minIterations`); a
/// server asking for fewer is not a Kafka broker or is misconfigured.
pub(crate) const MIN_ITERATIONS: u32 = 4096;
/// A bound on the work a server can ask for (Kafka's maximum is 16384).
const MAX_ITERATIONS: u32 = 1 << 20;

/// What went wrong in a SCRAM exchange. The texts never contain the
/// password or anything derived from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScramError(pub String);

/// One SCRAM authentication, from the client-first message to the check of
/// the server's signature.
pub(crate) struct ScramClient<D> {
    password: Vec<u8>,
    client_nonce: String,
    client_first_bare: String,
    /// The server signature expected in the server-final message.
    expected_server_signature: Option<Vec<u8>>,
    _digest: std::marker::PhantomData<D>,
}

impl<D> std::fmt::Debug for ScramClient<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramClient")
            .field("client_first_bare", &self.client_first_bare)
            .field("password", &"***")
            .finish()
    }
}

impl<D> Drop for ScramClient<D> {
    fn drop(&mut self) {
        self.password.iter_mut().for_each(|b| *b = 0);
    }
}

impl<D> ScramClient<D>
where
    D: Digest + BlockSizeUser + FixedOutputReset + Clone + Default + Send + Sync + 'static,
{
    /// A client for `username`/`password` with `client_nonce` (printable
    /// ASCII without `,`; see [`new_nonce`]).
    pub(crate) fn new(username: &str, password: &str, client_nonce: &str) -> ScramClient<D> {
        let client_first_bare = format!("n={},r={client_nonce}", escape_name(username));
        ScramClient {
            password: password.as_bytes().to_vec(),
            client_nonce: client_nonce.to_string(),
            client_first_bare,
            expected_server_signature: None,
            _digest: std::marker::PhantomData,
        }
    }

    /// The client-first message: GS2 header `n,,` and the bare part.
    pub(crate) fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare)
    }

    /// Answers the server-first message with the client-final message.
    pub(crate) fn client_final(&mut self, server_first: &str) -> Result<String, ScramError> {
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for attribute in server_first.split(',') {
            match attribute.split_once('=') {
                Some(("r", value)) => nonce = Some(value),
                Some(("s", value)) => salt = Some(value),
                Some(("i", value)) => iterations = Some(value),
                Some(("m", _)) => {
                    return Err(ScramError(
                        "the server requires a SCRAM extension this client does not implement".into(),
                    ))
                }
                Some(("e", value)) => return Err(ScramError(format!("the server refused: {value}"))),
                _ => {}
            }
        }
        let (Some(nonce), Some(salt), Some(iterations)) = (nonce, salt, iterations) else {
            return Err(ScramError(format!(
                "the server-first message `{server_first}` lacks the nonce, salt or iteration count"
            )));
        };
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(ScramError(
                "the server's nonce does not extend the client's (not a SCRAM server, or a replayed answer)".into(),
            ));
        }
        let salt = BASE64
            .decode(salt)
            .map_err(|e| ScramError(format!("the server's salt is not base64: {e}")))?;
        let iterations: u32 = iterations
            .parse()
            .map_err(|_| ScramError(format!("the iteration count `{iterations}` is not a number")))?;
        if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
            return Err(ScramError(format!(
                "the server asks for {iterations} iterations, outside {MIN_ITERATIONS}..={MAX_ITERATIONS}"
            )));
        }
        self.finish(nonce, &salt, iterations, server_first)
    }

    /// The proof for `nonce`, `salt` and `iterations`; remembers the server
    /// signature to expect.
    fn finish(&mut self, nonce: &str, salt: &[u8], iterations: u32, server_first: &str) -> Result<String, ScramError> {
        let salted = salted_password::<D>(&self.password, salt, iterations);
        let client_key = hmac::<D>(&salted, b"Client Key");
        let stored_key = D::digest(&client_key);
        // `biws` is base64("n,,"): no channel binding, no authorization id.
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let client_signature = hmac::<D>(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&client_signature).map(|(k, s)| k ^ s).collect();
        let server_key = hmac::<D>(&salted, b"Server Key");
        self.expected_server_signature = Some(hmac::<D>(&server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", BASE64.encode(proof)))
    }

    /// Checks the server-final message: the server proves it knows the
    /// credentials too (or reports why it refused).
    pub(crate) fn verify_server_final(&self, server_final: &str) -> Result<(), ScramError> {
        if let Some(error) = server_final.strip_prefix("e=") {
            return Err(ScramError(format!("the server refused: {error}")));
        }
        let Some(signature) = server_final.split(',').find_map(|a| a.strip_prefix("v=")) else {
            return Err(ScramError(format!(
                "the server-final message `{server_final}` carries no signature"
            )));
        };
        let signature = BASE64
            .decode(signature)
            .map_err(|e| ScramError(format!("the server's signature is not base64: {e}")))?;
        let expected = self
            .expected_server_signature
            .as_deref()
            .ok_or_else(|| ScramError("server-final message before the client-final one".into()))?;
        // Constant time: the comparison must not tell how much matched.
        let differs = signature.len() != expected.len()
            || signature.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0;
        if differs {
            return Err(ScramError(
                "the server's signature is wrong: it does not know the credentials (not the broker it claims to be)"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// A fresh client nonce: 24 random bytes in base64 (printable, no `,`).
pub(crate) fn new_nonce() -> String {
    use rand::TryRng;
    let mut bytes = [0u8; 24];
    rand::rngs::SysRng
        .try_fill_bytes(&mut bytes)
        .expect("the operating system's random source answers");
    BASE64.encode(bytes)
}

/// `saslname` of RFC 5802: `=` and `,` escaped.
fn escape_name(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

fn hmac<D>(key: &[u8], message: &[u8]) -> Vec<u8>
where
    D: Digest + BlockSizeUser + FixedOutputReset + Clone + Default,
{
    let mut mac = <SimpleHmac<D> as KeyInit>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

/// `Hi(password, salt, i)`: PBKDF2 with HMAC-`D`, one block of `D`'s size.
fn salted_password<D>(password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8>
where
    D: Digest + BlockSizeUser + FixedOutputReset + Clone + Default + Send + Sync + 'static,
{
    let mut out = vec![0u8; <D as Digest>::output_size()];
    pbkdf2::pbkdf2::<SimpleHmac<D>>(password, salt, iterations, &mut out).expect("HMAC takes keys of any length");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 5802 section 5: user `user`, password `pencil`, SCRAM-SHA-1.
    #[test]
    fn rfc_5802_example() {
        let mut client = ScramClient::<sha1::Sha1>::new("user", "pencil", "fyko+d2lbbFgONRv9qkxdawL");
        assert_eq!(client.client_first(), "n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL");
        let server_first = "r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096";
        assert_eq!(
            client.client_final(server_first).unwrap(),
            "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
        );
        client.verify_server_final("v=rmF9pqV8S7suAoZWja4dJRkFsKQ=").unwrap();
        let forged = client
            .verify_server_final("v=rmF9pqV8S7suAoZWja4dJRkFsKA=")
            .unwrap_err();
        assert!(forged.0.contains("signature is wrong"), "{forged:?}");
    }

    /// RFC 7677 section 3: the same exchange with SCRAM-SHA-256.
    #[test]
    fn rfc_7677_example() {
        let mut client = ScramClient::<sha2::Sha256>::new("user", "pencil", "rOprNGfwEbeRWgbNEkqO");
        assert_eq!(client.client_first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        assert_eq!(
            client.client_final(server_first).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        client
            .verify_server_final("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
    }

    /// SHA-512 produces a 64-byte proof and signature (no RFC example; the
    /// broker tests exercise it against Kafka).
    #[test]
    fn sha_512_sizes_and_deterministic_proof() {
        let run = || {
            let mut client = ScramClient::<sha2::Sha512>::new("u", "p", "abc");
            client.client_final("r=abcdef,s=c2FsdA==,i=4096").unwrap()
        };
        let message = run();
        assert_eq!(message, run());
        let proof = message.rsplit_once(",p=").unwrap().1;
        assert_eq!(BASE64.decode(proof).unwrap().len(), 64);
    }

    #[test]
    fn names_are_escaped_and_bad_servers_refused() {
        let mut client = ScramClient::<sha2::Sha256>::new("a=b,c", "secret-pw", "nonce");
        assert_eq!(client.client_first(), "n,,n=a=3Db=2Cc,r=nonce");
        let refusals = [
            ("r=other,s=c2FsdA==,i=4096", "does not extend"),
            ("r=nonce,s=c2FsdA==,i=4096", "does not extend"),
            ("r=nonceX,s=c2FsdA==,i=10", "iterations"),
            ("r=nonceX,s=!!,i=4096", "salt"),
            ("r=nonceX,s=c2FsdA==", "lacks"),
            ("m=ext,r=nonceX,s=c2FsdA==,i=4096", "extension"),
            ("e=unknown-user", "refused: unknown-user"),
        ];
        for (server_first, expected) in refusals {
            let error = client.client_final(server_first).unwrap_err();
            assert!(error.0.contains(expected), "{server_first}: {error:?}");
            assert!(!error.0.contains("secret-pw"), "{error:?}");
        }
        assert!(client.verify_server_final("v=AAAA").is_err(), "before client-final");
        assert!(!format!("{client:?}").contains("secret-pw"));
        let nonces: std::collections::BTreeSet<String> = (0..32).map(|_| new_nonce()).collect();
        assert_eq!(nonces.len(), 32);
        assert!(nonces.iter().all(|n| !n.contains(',')));
    }
}
