//! The sink's connections to a PostgreSQL that accepts TCP only over TLS
//! (exactly-testkit's `start_tls`: `ssl = on`, a certificate for
//! `localhost` from a CA made for the run, `hostssl` + scram-sha-256, and
//! `cert` authentication for one user): every sslmode, the password from
//! the URL, `PGPASSWORD` or a password file, a client certificate, and the
//! refusals that must be fatal errors naming the setting to fix.
//!
//! Connections are opened through `PostgresSinkFactory::prepared_transactions_of`
//! (its own connection, like every other the sink opens, through the same
//! function) and through a sink's `recover`. The cases change the
//! process's PGPASSWORD / PGPASSFILE, so they run in one test.

use exactly_core::{ConnectorError, Metrics, SinkContext, TwoPhaseCommitSink};
use exactly_postgres::{PostgresSinkConfig, PostgresSinkFactory};
use exactly_testkit::postgres::PostgresTls;
use exactly_testkit::tls::TestCa;
use exactly_testkit::PostgresServer;

fn config(url: &str) -> PostgresSinkConfig {
    let text = format!(
        "url = '{url}'\ntable = \"tls_orders\"\ncreate_table = true\n[columns]\nid = {{ from = \"offset\", type = \"bigint\" }}\n"
    );
    toml::from_str(&text).expect("a sink section")
}

/// Opens one connection with `url`.
async fn connect(url: &str) -> Result<(), ConnectorError> {
    let factory = PostgresSinkFactory::new(config(url))?;
    factory.prepared_transactions_of("tls-test").await.map(drop)
}

/// The fatal error of a connection that must be refused, free of `secret`.
async fn refused(url: &str, secret: &str, case: &str) -> String {
    match connect(url).await {
        Ok(()) => panic!("{case}: connected, but must be refused"),
        Err(ConnectorError::Fatal { context, message, .. }) => {
            let text = format!("{context}: {message}");
            assert!(!text.contains(secret), "{case}: the secret is in the error: {text}");
            text
        }
        Err(other) => panic!("{case}: must be a fatal error, not {other}"),
    }
}

#[tokio::test]
async fn tls_only_server() {
    let server = PostgresServer::start_tls().expect("starting a TLS-only PostgreSQL");
    let tls: PostgresTls = server.tls().expect("TLS files").clone();
    let port = server.port();
    let ca = tls.ca_file.display().to_string();
    let password = tls.password.clone();
    // SAFETY (for the env calls below): this binary's only test, and the
    // sink reads these variables only while connecting in this thread.
    unsafe {
        std::env::remove_var("PGPASSWORD");
        std::env::set_var("PGPASSFILE", "/nonexistent/exactly-pgpass");
    }
    let at = |host: &str, query: &str| format!("postgres://postgres:{password}@{host}:{port}/postgres?{query}");

    // verify-full with the password in the URL, verify-ca, require and
    // prefer (encrypted, unchecked) all get in.
    for query in [
        format!("sslmode=verify-full&sslrootcert={ca}"),
        format!("sslmode=verify-ca&sslrootcert={ca}"),
        "sslmode=require".to_string(),
        "sslmode=prefer".to_string(),
    ] {
        connect(&at("localhost", &query))
            .await
            .unwrap_or_else(|e| panic!("{query}: {e}"));
    }
    // ... and verify-ca does not care for the host name.
    connect(&at("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={ca}")))
        .await
        .expect("verify-ca by address");

    // A full sink recovers (commit log, tables) over TLS.
    let factory = PostgresSinkFactory::new(config(&at(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    )))
    .expect("a factory");
    let context = SinkContext::new("tls-test", 0, 1, std::sync::Arc::new(Metrics::default()));
    let mut sink = factory.create_sink(context);
    sink.recover(&[]).await.expect("recovering over TLS");
    drop(sink);

    // Without a password in the URL: PGPASSWORD, then the password file.
    let no_password = format!("postgres://postgres@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}");
    let text = refused(&no_password, &password, "no password anywhere").await;
    assert!(
        text.contains("asks for a password") && text.contains("PGPASSWORD") && text.contains(".pgpass"),
        "{text}"
    );
    let dir = tempfile::tempdir().unwrap();
    let passfile = dir.path().join("pgpass");
    std::fs::write(&passfile, format!("localhost:{port}:postgres:postgres:{password}\n")).unwrap();
    unsafe { std::env::set_var("PGPASSFILE", &passfile) };
    connect(&no_password).await.expect("the password from PGPASSFILE");
    unsafe {
        std::env::set_var("PGPASSFILE", "/nonexistent/exactly-pgpass");
        std::env::set_var("PGPASSWORD", &password);
    }
    connect(&no_password).await.expect("the password from PGPASSWORD");
    unsafe { std::env::remove_var("PGPASSWORD") };

    // A client certificate alone logs its user in.
    let cert_url = format!(
        "postgres://{user}@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}",
        tls.client.cert.display(),
        tls.client.key.display(),
        user = PostgresTls::CERT_USER
    );
    connect(&cert_url).await.expect("cert authentication");

    // A wrong password.
    let wrong =
        format!("postgres://postgres:not-the-password@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}");
    let text = refused(&wrong, "not-the-password", "wrong password").await;
    assert!(
        text.contains("refused the password of user `postgres`") && text.contains("PGPASSWORD"),
        "{text}"
    );

    // Without TLS, to a server that accepts TCP only over TLS.
    let text = refused(&at("localhost", "sslmode=disable"), &password, "sslmode=disable").await;
    assert!(
        text.contains("only over TLS") && text.contains("sslmode=require"),
        "{text}"
    );

    // A CA that did not sign the server's certificate.
    let other = tempfile::tempdir().unwrap();
    let other_ca = TestCa::generate(other.path()).unwrap();
    let untrusted = at(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", other_ca.ca_file().display()),
    );
    let text = refused(&untrusted, &password, "unknown CA").await;
    assert!(
        text.contains("not signed by a trusted CA") && text.contains("sslrootcert"),
        "{text}"
    );
    // `require` checks the CA too once a root certificate is given, as libpq.
    let untrusted = at(
        "localhost",
        &format!("sslmode=require&sslrootcert={}", other_ca.ca_file().display()),
    );
    let text = refused(&untrusted, &password, "require with an unknown CA").await;
    assert!(text.contains("not signed by a trusted CA"), "{text}");

    // verify-full with a host name the certificate does not name.
    let text = refused(
        &at("127.0.0.1", &format!("sslmode=verify-full&sslrootcert={ca}")),
        &password,
        "wrong host name",
    )
    .await;
    assert!(
        text.contains("not issued for the host name") && text.contains("verify-ca"),
        "{text}"
    );
}
