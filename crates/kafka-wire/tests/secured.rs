//! exactly-kafka-wire against an Apache Kafka `SASL_SSL` listener
//! (exactly-testkit's secured broker: a certificate for `localhost` signed
//! by a CA made for the run, SCRAM-SHA-256 and SCRAM-SHA-512 enabled,
//! PLAIN not): authentication with both SCRAM mechanisms over TLS through
//! every call recovery makes, and the misconfigurations that must end in
//! an error naming the setting to fix, never retried.
//!
//! One broker for the whole binary, so the cases run in one test.

use std::collections::BTreeMap;
use std::time::Duration;

use exactly_kafka_wire::{EndTxnOutcome, WireClient, WireConfig, WireError};
use exactly_testkit::tls::TestCa;
use exactly_testkit::KafkaBroker;

fn client(bootstrap: &str, properties: &[(String, String)]) -> Result<WireClient, WireError> {
    let properties: BTreeMap<String, String> = properties.iter().cloned().collect();
    let mut config = WireConfig::from_properties(bootstrap, &properties)?;
    config.options.connect_timeout = Duration::from_secs(10);
    config.options.request_timeout = Duration::from_secs(10);
    config.coordinator_wait = Duration::from_secs(60);
    Ok(WireClient::with_config(config))
}

fn with(properties: &[(String, String)], key: &str, value: &str) -> Vec<(String, String)> {
    let mut changed: Vec<(String, String)> = properties.iter().filter(|(k, _)| k != key).cloned().collect();
    changed.push((key.to_string(), value.to_string()));
    changed
}

/// The error of a call that must fail, checked to be final (not retriable)
/// and free of the password.
fn refusal(result: Result<Option<String>, WireError>, password: &str, case: &str) -> WireError {
    let error = match result {
        Ok(value) => panic!("{case}: the call succeeded ({value:?}) but must be refused"),
        Err(error) => error,
    };
    assert!(!error.is_retriable(), "{case}: {error} must not be retried");
    let text = format!("{error} {error:?}");
    assert!(!text.contains(password), "{case}: the password is in the error: {text}");
    error
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_ssl_listener() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("exactly_kafka_wire=debug")
        .try_init();
    let broker = KafkaBroker::builder()
        .sasl_mechanisms(&["SCRAM-SHA-256", "SCRAM-SHA-512"])
        .start()
        .expect("starting a secured Kafka broker");
    let secured = broker.secured().expect("a SASL_SSL listener").clone();
    let password = secured.password.clone();

    // Both SCRAM mechanisms, over TLS, for what recovery asks: the
    // broker's settings (Metadata, then DescribeConfigs on the broker the
    // metadata names) and EndTxn (FindCoordinator, then the coordinator).
    for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let wire = client(&secured.bootstrap, &secured.client_properties(mechanism)).unwrap();
        let limit = wire
            .describe_broker_config("transaction.max.timeout.ms")
            .await
            .unwrap_or_else(|e| panic!("{mechanism}: DescribeConfigs over SASL_SSL: {e}"));
        assert_eq!(limit.as_deref(), Some("900000"), "{mechanism}");
        let outcome = wire
            .end_txn(&format!("never-used-{mechanism}"), 4711, 0, true)
            .await
            .unwrap_or_else(|e| panic!("{mechanism}: EndTxn over SASL_SSL: {e}"));
        assert!(
            matches!(
                outcome,
                EndTxnOutcome::InvalidProducerIdMapping | EndTxnOutcome::InvalidTxnState
            ),
            "{mechanism}: an unknown transactional id is refused by the coordinator, got {outcome}"
        );
    }
    let scram = secured.client_properties("SCRAM-SHA-512");
    let ask = |bootstrap: String, properties: Vec<(String, String)>| async move {
        client(&bootstrap, &properties)?
            .describe_broker_config("transaction.max.timeout.ms")
            .await
    };

    // A wrong password.
    let wrong = with(&scram, "sasl.password", "not-the-password");
    let error = refusal(
        ask(secured.bootstrap.clone(), wrong).await,
        "not-the-password",
        "wrong password",
    );
    assert!(matches!(error, WireError::Authentication { .. }), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("sasl.password") && text.contains("SCRAM-SHA-512") && text.contains("exactly"),
        "{text}"
    );

    // A mechanism the listener does not enable.
    let plain = secured.client_properties("PLAIN");
    let error = refusal(ask(secured.bootstrap.clone(), plain).await, &password, "PLAIN");
    assert!(matches!(error, WireError::Sasl { .. }), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("does not enable SASL mechanism PLAIN")
            && text.contains("it enables SCRAM-")
            && text.contains("SCRAM-SHA-256")
            && text.contains("SCRAM-SHA-512")
            && text.contains("sasl.mechanism"),
        "{text}"
    );

    // A CA that did not sign the broker's certificate.
    let other = tempfile::tempdir().unwrap();
    let other_ca = TestCa::generate(other.path()).unwrap();
    let untrusted = with(&scram, "ssl.ca.location", &other_ca.ca_file().display().to_string());
    let error = refusal(ask(secured.bootstrap.clone(), untrusted).await, &password, "unknown CA");
    assert!(matches!(error, WireError::Tls { .. }), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("not signed by a trusted CA") && text.contains("ssl.ca.location"),
        "{text}"
    );

    // A host name the certificate is not issued for (it names localhost).
    let port = secured.bootstrap.rsplit_once(':').unwrap().1;
    let by_address = format!("127.0.0.1:{port}");
    let error = refusal(
        ask(by_address.clone(), scram.clone()).await,
        &password,
        "wrong host name",
    );
    assert!(matches!(error, WireError::Tls { .. }), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("not issued for the host") && text.contains("ssl.endpoint.identification.algorithm=none"),
        "{text}"
    );
    // ... which the CA-only check accepts.
    let ca_only = with(&scram, "ssl.endpoint.identification.algorithm", "none");
    let limit = ask(by_address, ca_only)
        .await
        .expect("the CA-only check accepts the certificate");
    assert_eq!(limit.as_deref(), Some("900000"));

    // The TLS listener reached without TLS.
    let no_tls = with(&scram, "security.protocol", "SASL_PLAINTEXT");
    let error = refusal(ask(secured.bootstrap.clone(), no_tls).await, &password, "no TLS");
    assert!(matches!(error, WireError::TlsExpected { .. }), "{error}");
    assert!(error.to_string().contains("security.protocol=SSL"), "{error}");

    // TLS to the plaintext listener of the same broker.
    let tls_to_plaintext = with(&scram, "security.protocol", "SSL");
    let error = refusal(
        ask(broker.bootstrap().to_string(), tls_to_plaintext).await,
        &password,
        "TLS to a plaintext listener",
    );
    assert!(matches!(error, WireError::Tls { .. }), "{error}");
    assert!(error.to_string().contains("security.protocol"), "{error}");

    // SASL on a listener without SASL (the plaintext one).
    let sasl_to_plaintext = with(&scram, "security.protocol", "SASL_PLAINTEXT");
    let error = refusal(
        ask(broker.bootstrap().to_string(), sasl_to_plaintext).await,
        &password,
        "SASL on a plaintext listener",
    );
    assert!(matches!(error, WireError::Sasl { .. }), "{error}");
    assert!(error.to_string().contains("does not authenticate with SASL"), "{error}");
}
