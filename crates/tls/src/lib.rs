//! TLS pieces shared by exactly's connectors.
//!
//! [`PartialVerifier`] checks a server's certificate short of the full
//! check rustls does by default (trusted chain *and* host name): a trusted
//! chain under any name (libpq's `sslmode=verify-ca`, librdkafka's
//! `ssl.endpoint.identification.algorithm=none`), or nothing at all
//! (libpq's `sslmode=require`/`prefer` without a root certificate). The
//! handshake's signatures are verified either way: the peer must hold the
//! key of the certificate it shows.
//!
//! [`libpq`] reads libpq's TLS settings (`sslmode`, `sslrootcert`, …) out of
//! a PostgreSQL connection string and builds the rustls settings for them.

pub mod libpq;

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

/// A server-certificate check without the host-name check; see the crate
/// documentation.
#[derive(Debug)]
pub struct PartialVerifier {
    /// `Some`: the chain must lead to one of these roots.
    roots: Option<Arc<RootCertStore>>,
    provider: Arc<CryptoProvider>,
}

impl PartialVerifier {
    /// The chain must lead to one of `roots`; the name is not checked.
    pub fn trusted_chain(roots: Arc<RootCertStore>, provider: Arc<CryptoProvider>) -> PartialVerifier {
        PartialVerifier {
            roots: Some(roots),
            provider,
        }
    }

    /// Neither chain nor name is checked (encryption without
    /// authentication of the server).
    pub fn no_certificate_check(provider: Arc<CryptoProvider>) -> PartialVerifier {
        PartialVerifier { roots: None, provider }
    }
}

impl ServerCertVerifier for PartialVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let certificate = ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &certificate,
                roots,
                intermediates,
                now,
                self.provider.signature_verification_algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}
