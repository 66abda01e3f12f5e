//! The few calls of the registry's Confluent-compatible REST API the kit
//! and tests make: readiness, registering a schema under a subject, and
//! reading a schema back by id (blocking, on `ureq`).

use std::time::Duration;

use crate::error::{Result, TestkitError};

use super::install::SERVICE;

/// The media type of the Confluent schema registry API.
pub(crate) const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";
const TIMEOUT: Duration = Duration::from_secs(30);
const FIX: &str = "read the registry's log (SchemaRegistry::log_path); check the subject and the schema";

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

/// Whether `GET /health/ready` on `127.0.0.1:port` answers 200.
pub(crate) fn ready(port: u16) -> bool {
    agent(Duration::from_secs(2))
        .get(&format!("http://127.0.0.1:{port}/health/ready"))
        .call()
        .is_ok_and(|response| response.status() == 200)
}

/// `POST {url}/subjects/{subject}/versions`: registers `schema` of
/// `schema_type` (`AVRO`, `JSON`, `PROTOBUF`) and returns its id (the same
/// id again for a schema already registered).
pub(crate) fn register(url: &str, subject: &str, schema_type: &str, schema: &str) -> Result<u32> {
    let body = serde_json::json!({ "schema": schema, "schemaType": schema_type }).to_string();
    let action = format!("registering a {schema_type} schema under subject {subject} at {url}");
    let answer = call(
        &action,
        agent(TIMEOUT)
            .post(&format!("{url}/subjects/{subject}/versions"))
            .header("Content-Type", CONTENT_TYPE)
            .send(body.as_str()),
    )?;
    answer
        .get("id")
        .and_then(serde_json::Value::as_u64)
        .and_then(|id| u32::try_from(id).ok())
        .ok_or_else(|| http_error(action, format!("no id in the answer {answer}")))
}

/// `GET {url}/schemas/ids/{id}`: the registry's answer (`schema`,
/// `schemaType`, `references`).
pub(crate) fn schema_by_id(url: &str, id: u32) -> Result<serde_json::Value> {
    call(
        &format!("reading schema {id} from {url}"),
        agent(TIMEOUT).get(&format!("{url}/schemas/ids/{id}")).call(),
    )
}

/// The JSON body of a 2xx answer, or an error with the status and body.
fn call(
    action: &str,
    response: std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> Result<serde_json::Value> {
    let mut response = response.map_err(|err| http_error(action.to_string(), err.to_string()))?;
    let status = response.status();
    let text = response
        .body_mut()
        .read_to_string()
        .map_err(|err| http_error(action.to_string(), format!("HTTP {status}, unreadable body: {err}")))?;
    if !status.is_success() {
        return Err(http_error(action.to_string(), format!("HTTP {status}: {text}")));
    }
    serde_json::from_str(&text).map_err(|err| http_error(action.to_string(), format!("not JSON ({err}): {text}")))
}

fn http_error(action: String, detail: String) -> TestkitError {
    TestkitError::Http {
        service: SERVICE,
        action,
        detail,
        fix: FIX,
    }
}
