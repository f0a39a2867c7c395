//! The e-stop in a JSON-RPC request the edge refused (its Host, Origin or
//! content type): the request is an e-stop by what it asks for, so it is
//! recognised as `handle_text` would recognise it — strict JSON naming the
//! e-stop, a batch holding one, text that is not strict JSON but reads as
//! one, the first MiB of a body too large — and then served by the very
//! path that serves it when nothing is wrong (`handle_text`, `too_large`).
//! Only an e-stop ever reaches that path from here: any other request is
//! left unread past recognition and never runs.
//!
//! **Never belongs here:** deciding to refuse (`crate::edge`), and how the
//! refusal is answered (`crate::edge::guard`).

use super::envelope::{handle_text, too_large};
use super::estop::{estop_target, names_estop_loosely};
use crate::edge::EstopOutcome;
use crate::BodyBytes;
use serde_json::{json, Value};
use tether_core::json::{nonfinite_as_null, parse_strict};
use tether_kernel::{Kernel, Principal};

/// Whether `text` is an e-stop as `handle_text` reads it: then handing it
/// to `handle_text` serves that e-stop and nothing else.
fn asks_for_estop(text: &str) -> bool {
    match parse_strict(text) {
        Ok(Value::Object(obj)) => estop_target(&obj),
        Ok(Value::Array(items)) => items.iter().filter_map(Value::as_object).any(estop_target),
        Ok(_) => false,
        Err(_) => {
            let repaired = nonfinite_as_null(text);
            let repaired_is_estop = matches!(
                repaired.as_deref().map(parse_strict),
                Some(Ok(Value::Object(obj))) if estop_target(&obj)
            );
            repaired_is_estop || names_estop_loosely(text)
        }
    }
}

/// What the JSON-RPC answer of an e-stop says became of it.
fn outcome(answer: Option<Value>) -> EstopOutcome {
    // A notification is served and never answered.
    let Some(v) = answer else {
        return EstopOutcome {
            id: Value::Null,
            served: true,
            receipt: None,
            error: None,
        };
    };
    let id = v.get("id").cloned().unwrap_or(Value::Null);
    if let Some(result) = v.get("result") {
        return EstopOutcome {
            id,
            served: true,
            receipt: Some(result.clone()),
            error: None,
        };
    }
    let data = &v["error"]["data"];
    let details = &data["details"];
    EstopOutcome {
        id,
        served: details["estop_served"] == true,
        receipt: details.get("receipt").cloned(),
        error: Some(json!({"code": data["mhs_code"], "message": v["error"]["message"]})),
    }
}

/// Serves the e-stop a refused request's body asks for, if it asks for one.
pub(crate) async fn refused_estop(
    kernel: &Kernel,
    principal: &Principal,
    body: BodyBytes,
) -> Option<EstopOutcome> {
    match body {
        BodyBytes::Whole(bytes) => {
            let text = std::str::from_utf8(&bytes).ok()?;
            if !asks_for_estop(text) {
                return None;
            }
            let reply = handle_text(kernel, principal, &bytes).await;
            Some(outcome(reply.map(super::Reply::into_value)))
        }
        BodyBytes::TooLarge(prefix) => {
            if !names_estop_loosely(&String::from_utf8_lossy(&prefix)) {
                return None;
            }
            let reply = too_large(kernel, principal, &prefix, None).await;
            Some(outcome(Some(reply.into_value())))
        }
        BodyBytes::Broken => None,
    }
}

#[cfg(test)]
mod tests {
    use super::asks_for_estop;

    #[test]
    fn only_what_handle_text_serves_as_an_estop_is_one() {
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"method":"mhs.safety.estop","params":{}}"#,
            r#"{"method":"mhs.safety.estop"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"mhs.command","params":{"capability_id":"cap.motion.estop.v1"}}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"mhs.hello"},{"method":"mhs.safety.estop"}]"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"mhs.safety.estop","params":{"deadline_ms":NaN}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"mhs.safety.estop","method":"mhs.hello"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"mhs.safety.estop","params":{"#,
        ] {
            assert!(asks_for_estop(text), "{text}");
        }
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"method":"mhs.session.open","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"mhs.session.open","params":{"note":{"method":"mhs.safety.estop"}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"mhs.command","params":{"capability_id":"cap.thermal.setpoint.v1"}}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"mhs.hello"}]"#,
            r#""mhs.safety.estop""#,
            "not json",
        ] {
            assert!(!asks_for_estop(text), "{text}");
        }
    }
}
