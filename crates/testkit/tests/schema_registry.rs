//! The schema registry of the test kit: Apicurio Registry's
//! Confluent-compatible API answers, schemas registered through the REST
//! API read back by id, and the basic-auth front lets only its user through.
//! Plain HTTP requests on `ureq`, no registry client.

use std::time::Duration;

use exactly_testkit::{port_accepts, SchemaRegistry};

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// A subject nobody else uses in this registry.
fn subject(name: &str) -> String {
    format!("testkit-{name}-{}-{:08x}", std::process::id(), rand_u32())
}

fn rand_u32() -> u32 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now()) as u32
}

fn record_schema(fields: &[(&str, &str)]) -> String {
    let fields: Vec<serde_json::Value> = fields
        .iter()
        .map(|(name, kind)| serde_json::json!({ "name": name, "type": kind, "default": default_of(kind) }))
        .collect();
    serde_json::json!({ "type": "record", "name": "Order", "namespace": "exactly.test", "fields": fields }).to_string()
}

fn default_of(kind: &str) -> serde_json::Value {
    match kind {
        "string" => serde_json::json!(""),
        _ => serde_json::json!(0),
    }
}

#[test]
fn a_schema_registered_through_the_rest_api_reads_back_by_id() {
    let registry = SchemaRegistry::shared().expect("the shared schema registry");
    assert!(
        registry.url().ends_with("/apis/ccompat/v7") || registry.is_external(),
        "{}",
        registry.url()
    );
    let subject = subject("orders-value");
    let v1 = record_schema(&[("id", "long")]);
    let v2 = record_schema(&[("id", "long"), ("note", "string")]);

    // Registered through the raw REST API, as a producer's serializer does.
    let mut response = agent()
        .post(&format!("{}/subjects/{subject}/versions", registry.url()))
        .header("Content-Type", "application/vnd.schemaregistry.v1+json")
        .send(serde_json::json!({ "schema": v1 }).to_string().as_str())
        .expect("POST /subjects/{subject}/versions");
    let text = response.body_mut().read_to_string().unwrap();
    assert_eq!(response.status(), 200, "{text}");
    let id1 = serde_json::from_str::<serde_json::Value>(&text).unwrap()["id"]
        .as_u64()
        .expect("an id") as u32;
    let id2 = registry.register_avro(&subject, &v2).expect("the second version");
    assert_ne!(id1, id2, "two versions, two ids");
    assert_eq!(
        registry.register_avro(&subject, &v1).expect("the first version again"),
        id1,
        "registering a schema again gives its id again"
    );

    for (id, text) in [(id1, &v1), (id2, &v2)] {
        let answer = registry.schema_by_id(id).expect("the schema by id");
        let read: serde_json::Value = serde_json::from_str(answer["schema"].as_str().expect("schema text")).unwrap();
        let written: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(read, written, "schema {id} reads back as registered");
        // Confluent's answer leaves schemaType out for Avro, the default.
        assert!(answer.get("schemaType").is_none_or(|t| t == "AVRO"), "{answer}");
    }
    let mut versions = agent()
        .get(&format!("{}/subjects/{subject}/versions", registry.url()))
        .call()
        .unwrap();
    let versions: serde_json::Value = serde_json::from_str(&versions.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(versions, serde_json::json!([1, 2]));

    // An unknown id: 404 with Confluent's error code 40403.
    let mut missing = agent()
        .get(&format!("{}/schemas/ids/{}", registry.url(), u32::MAX - 7))
        .call()
        .unwrap();
    assert_eq!(missing.status(), 404);
    let body: serde_json::Value = serde_json::from_str(&missing.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(body["error_code"], 40403, "{body}");
    let err = registry.schema_by_id(u32::MAX - 7).unwrap_err().to_string();
    assert!(err.contains("404") && err.contains("Fix:"), "{err}");
}

#[test]
fn the_basic_auth_front_lets_only_its_user_through() {
    let registry = SchemaRegistry::shared().expect("the shared schema registry");
    let subject = subject("front");
    let id = registry
        .register_avro(&subject, &record_schema(&[("id", "long")]))
        .unwrap();
    let front = registry.front().start().expect("a front");
    assert!(front.url().starts_with("http://127.0.0.1:") && front.url().ends_with("/apis/ccompat/v7"));
    assert!(!format!("{front:?}").contains(front.password()), "{front:?}");
    let path = format!("/apis/ccompat/v7/schemas/ids/{id}");
    let url = format!("{}/schemas/ids/{id}", front.url());

    let anonymous = agent().get(&url).call().unwrap();
    assert_eq!(anonymous.status(), 401);
    assert!(anonymous.headers().get("www-authenticate").is_some());
    let wrong = basic(front.username(), "not-the-password");
    assert_eq!(
        agent()
            .get(&url)
            .header("Authorization", &wrong)
            .call()
            .unwrap()
            .status(),
        401
    );
    assert_eq!(front.refused(), 2);
    assert_eq!(front.forwarded(&path), 0);

    let right = basic(front.username(), front.password());
    let mut answer = agent().get(&url).header("Authorization", &right).call().unwrap();
    assert_eq!(answer.status(), 200);
    let body: serde_json::Value = serde_json::from_str(&answer.body_mut().read_to_string().unwrap()).unwrap();
    assert!(body["schema"].as_str().unwrap().contains("exactly.test"), "{body}");
    assert_eq!(front.forwarded(&path), 1);

    let port: u16 = front.url()["http://127.0.0.1:".len()..]
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    drop(front);
    assert!(!port_accepts(port), "the front's port closes when it drops");
}

#[test]
fn a_registry_of_its_own_stops_and_restarts_empty() {
    let mut registry = SchemaRegistry::start_own().expect("a registry of the test's own");
    let id = registry
        .register_avro("own-subject", &record_schema(&[("id", "long")]))
        .unwrap();
    assert_eq!(id, 1, "a fresh registry numbers from 1");
    let port = registry.port();
    registry.stop().unwrap();
    assert!(!registry.is_running() && !port_accepts(port));
    registry.restart().unwrap();
    assert_eq!(registry.port(), port, "same port after a restart");
    assert!(
        registry.schema_by_id(id).is_err(),
        "in-memory storage: empty after a restart"
    );
    drop(registry);
    assert!(!port_accepts(port), "killed on drop");
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}
