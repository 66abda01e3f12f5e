//! The registry client against the test kit's real registry (Apicurio's
//! Confluent-compatible API), behind a front that requires basic auth and
//! TLS: schemas fetched by id and cached, wrong credentials and an
//! untrusted certificate refused with the fix, and no password in any
//! message.

use exactly_formats::registry::{RegistryClient, RegistrySettings};
use exactly_testkit::SchemaRegistry;

fn subject(name: &str) -> String {
    format!("formats-{name}-{}-{}", std::process::id(), rand_suffix())
}

fn rand_suffix() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now())
}

const V1: &str = r#"{"type": "record", "name": "Order", "namespace": "formats.test", "fields": [
    {"name": "id", "type": "long"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_come_by_id_over_tls_and_basic_auth_once() {
    let registry = SchemaRegistry::shared().expect("registry");
    let id = registry.register_avro(&subject("tls"), V1).expect("register");
    let front = registry.front().tls().start().expect("front");
    let settings = RegistrySettings {
        url: front.url().to_string(),
        username: Some(front.username().to_string()),
        password: Some(front.password().to_string()),
        ca_file: front.ca_file().map(|p| p.to_path_buf()),
    };
    let client = RegistryClient::new(&settings).expect("client");
    let path = format!("/apis/ccompat/v7/schemas/ids/{id}");
    for _ in 0..3 {
        let schema = client.avro_schema(id).await.expect("schema");
        assert_eq!(schema.connect().fields[0].name, "id");
    }
    assert_eq!(front.forwarded(&path), 1, "fetched once, then cached");

    let unknown = client.avro_schema(999_999).await.unwrap_err();
    assert!(!unknown.is_transient());
    assert!(unknown.to_string().contains("999999"), "{unknown}");

    let wrong = RegistryClient::new(&RegistrySettings {
        password: Some("not-the-password".into()),
        ..settings.clone()
    })
    .unwrap();
    let refused = wrong.avro_schema(id).await.unwrap_err();
    assert!(!refused.is_transient());
    let text = format!("{refused} {refused:?}");
    assert!(text.contains("registry.password"), "{text}");
    assert!(
        !text.contains("not-the-password") && !text.contains(front.password()),
        "{text}"
    );

    let untrusted = RegistryClient::new(&RegistrySettings {
        ca_file: None,
        ..settings.clone()
    })
    .unwrap();
    let error = untrusted.avro_schema(id).await.unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(error.to_string().contains("registry.ca_file"), "{error}");
}
