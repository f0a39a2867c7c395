//! What the layer in front of the SDK (the stdio reader, the HTTP guard)
//! recognises in a message before `rmcp` sees it.
//!
//! Two things. First, the e-stop: a request is an e-stop by what it asks for
//! (DESIGN §5), so a `tools/call` naming the `estop` tool latches even when
//! its JSON, envelope or params are defective, or when it arrives before the
//! SDK would serve it (before `initialize`). `rmcp` would answer such a
//! message with a protocol error and never reach the handler, so the layer
//! stops the devices itself, through the same kernel entry the `estop` tool
//! uses, and answers the protocol error with `details.estop_served: true` and
//! the receipt, as the JSON-RPC and REST surfaces do.
//!
//! Second, `tools/call` params of the wrong shape: `rmcp` falls back to a
//! custom request for them and answers "method not found" with a bare
//! message. They are `-32602` `MHS.PROTOCOL.INVALID_PARAMS` here, with
//! details saying what is wrong.

use super::estop_receipt;
use crate::rpc::error_response;
use crate::tools::ESTOP_TOOL;
use rmcp::model::CallToolRequestParams;
use serde_json::{json, Map, Value};
use tether_core::Code;
use tether_kernel::{Kernel, Principal};

/// The MCP method of a tool call.
const TOOLS_CALL: &str = "tools/call";

/// Items of a batch looked at for an e-stop, at most (a batch is refused
/// anyway; the bound keeps the look cheap).
const BATCH_ITEMS_MAX: usize = 1024;

/// A `tools/call` of the e-stop tool that the SDK would not serve.
#[derive(Debug)]
pub(super) struct DefectiveEstop {
    /// The id to answer, `None` for a notification (never answered).
    pub(super) id: Option<Value>,
    /// The protocol error answered once the stop was served.
    pub(super) code: Code,
    /// Stable reason in `details.reason`.
    pub(super) reason: &'static str,
    /// What is wrong, for the answer and the latch reason.
    pub(super) message: String,
    /// The call's arguments when they are an object (a device named there
    /// is stopped alone; otherwise every device is).
    pub(super) arguments: Option<Map<String, Value>>,
}

impl DefectiveEstop {
    /// Latches (the named device when it is served and the arguments are
    /// usable, every device otherwise) and answers the protocol error saying
    /// the stop was served; `None` for a notification.
    pub(super) async fn serve(
        self,
        kernel: &Kernel,
        principal: Option<Principal>,
    ) -> Option<Value> {
        let (receipt, _unknown) = estop_receipt(
            kernel,
            self.arguments.as_ref(),
            principal,
            Some(&self.message),
        )
        .await;
        let id = self.id?;
        Some(error_response(
            id,
            self.code,
            &self.message,
            json!({"reason": self.reason, "estop_served": true, "receipt": receipt}),
        ))
    }
}

/// What the layer does with one parsed message.
#[derive(Debug)]
pub(super) enum Screened {
    /// Nothing Tether checks here is wrong: on to the usual checks and the SDK.
    Pass(Value),
    /// Answer this error (`None`: a notification, never answered).
    Refuse(Option<Value>),
    /// An e-stop to serve here.
    Estop(DefectiveEstop),
}

/// Screens text that failed the strict parse (`parse_message` says why).
/// It is an e-stop when it still reads as a `tools/call` naming `estop`:
/// what it names cannot be trusted, so every device is stopped.
pub(super) fn unparsable(text: &str, parse_message: &str) -> Option<DefectiveEstop> {
    loosely_names_estop(text).then(|| DefectiveEstop {
        id: Some(Value::Null),
        code: Code::ProtocolParseError,
        reason: "invalid_json",
        message: format!("parse error: {parse_message}"),
        arguments: None,
    })
}

/// Whether defective text reads as a `tools/call` of the `estop` tool: it
/// holds the method and a `"name"` member whose value is `"estop"`. A
/// textual look (the text is not JSON); a false positive stops devices,
/// which for a request that mentions the e-stop is the safe mistake.
///
/// Text a permissive parser still reads (a duplicate key, nesting beyond the
/// strict bound) is also judged by what that parse names, so a name written
/// with escapes (`"\u0065stop"`, `"tools\/call"`), which the textual look
/// cannot see, still stops (found by the `mcp` fuzz target).
fn loosely_names_estop(text: &str) -> bool {
    let textual =
        text.contains("\"tools/call\"") && crate::text_member_is(text, "name", "\"estop\"");
    textual
        || crate::permissive_parse(text).is_some_and(|v| match v {
            Value::Object(o) => names_estop(&o),
            Value::Array(items) => items.iter().filter_map(Value::as_object).any(names_estop),
            _ => false,
        })
}

/// Screens one strictly parsed message.
pub(super) fn message(value: Value) -> Screened {
    match &value {
        Value::Array(items) => {
            // A batch is not MCP and is refused later, but an e-stop inside
            // it still latches.
            let stop = items
                .iter()
                .take(BATCH_ITEMS_MAX)
                .filter_map(Value::as_object)
                .find(|o| names_estop(o));
            match stop {
                Some(o) => Screened::Estop(DefectiveEstop {
                    id: Some(Value::Null),
                    code: Code::ProtocolInvalidRequest,
                    reason: "batch_unsupported",
                    message: "batches are not part of MCP; send one message at a time".into(),
                    arguments: arguments_of(o),
                }),
                None => Screened::Pass(value),
            }
        }
        Value::Object(obj) if obj.get("method").and_then(Value::as_str) == Some(TOOLS_CALL) => {
            tools_call(obj).map_or(Screened::Pass(value), |s| s)
        }
        _ => Screened::Pass(value),
    }
}

/// A `tools/call` whose params name the e-stop tool (whatever else is wrong).
pub(super) fn names_estop(obj: &Map<String, Value>) -> bool {
    obj.get("method").and_then(Value::as_str) == Some(TOOLS_CALL)
        && obj
            .get("params")
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            == Some(ESTOP_TOOL)
}

fn arguments_of(obj: &Map<String, Value>) -> Option<Map<String, Value>> {
    obj.get("params")
        .and_then(|p| p.get("arguments"))
        .and_then(Value::as_object)
        .cloned()
}

fn answer_id(obj: &Map<String, Value>) -> Option<Value> {
    match obj.get("id") {
        None => None,
        Some(id @ (Value::String(_) | Value::Number(_))) => Some(id.clone()),
        Some(_) => Some(Value::Null),
    }
}

/// The defect of a `tools/call`'s envelope the SDK would refuse before the
/// handler: `(reason, message)`.
fn envelope_defect(obj: &Map<String, Value>) -> Option<(&'static str, String)> {
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Some(("jsonrpc_version", "\"jsonrpc\" must be \"2.0\"".into()));
    }
    match obj.get("id") {
        None => Some((
            "notification",
            "a tools/call must be a request with an id".into(),
        )),
        Some(Value::String(_)) => None,
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => None,
        Some(_) => Some(("id_invalid", "id must be a string or an integer".into())),
    }
}

/// The defect of a `tools/call`'s params: `(reason, message)`.
fn params_defect(obj: &Map<String, Value>) -> Option<(&'static str, String)> {
    let Some(params) = obj.get("params") else {
        return Some(("params_missing", "tools/call needs params".into()));
    };
    let Some(p) = params.as_object() else {
        return Some(("params_not_object", "params must be an object".into()));
    };
    if !p.get("name").is_some_and(Value::is_string) {
        return Some(("name_not_string", "params.name must be a string".into()));
    }
    if p.get("arguments")
        .is_some_and(|a| !a.is_object() && !a.is_null())
    {
        return Some((
            "arguments_not_object",
            "params.arguments must be an object".into(),
        ));
    }
    // Whatever else the SDK's own type refuses (`_meta` of the wrong shape...).
    serde_json::from_value::<CallToolRequestParams>(params.clone())
        .err()
        .map(|e| {
            let message = e.to_string();
            (
                "params_invalid",
                format!(
                    "invalid tools/call params: {}",
                    tether_core::echo::text(&message)
                ),
            )
        })
}

fn tools_call(obj: &Map<String, Value>) -> Option<Screened> {
    let estop = names_estop(obj);
    let envelope = envelope_defect(obj);
    let params = params_defect(obj);
    if estop {
        let (code, (reason, message)) = match (envelope, params) {
            (Some(d), _) => (Code::ProtocolInvalidRequest, d),
            (None, Some(d)) => (Code::ProtocolInvalidParams, d),
            (None, None) => return None,
        };
        return Some(Screened::Estop(DefectiveEstop {
            id: answer_id(obj),
            code,
            reason,
            message,
            arguments: arguments_of(obj),
        }));
    }
    // An envelope defect is the SDK's (or the reader's) to answer.
    if envelope.is_some() {
        return None;
    }
    let (reason, message) = params?;
    Some(Screened::Refuse(answer_id(obj).map(|id| {
        error_response(
            id,
            Code::ProtocolInvalidParams,
            &message,
            json!({"reason": reason}),
        )
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_core::json::parse_strict;

    fn screen(text: &str) -> Screened {
        message(parse_strict(text).expect("strict JSON"))
    }

    #[test]
    fn malformed_estop_arguments_are_an_estop_of_every_device() {
        for args in [r#"["arm-1"]"#, r#""arm-1""#, "5"] {
            let text = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"estop","arguments":{args}}}}}"#
            );
            let Screened::Estop(e) = screen(&text) else {
                panic!("not an e-stop: {text}");
            };
            assert_eq!(e.code, Code::ProtocolInvalidParams, "{text}");
            assert_eq!(e.reason, "arguments_not_object");
            assert_eq!(e.id, Some(json!(1)));
            assert!(e.arguments.is_none(), "nothing usable is named");
        }
    }

    #[test]
    fn an_estop_with_a_bad_envelope_latches_and_a_notification_is_not_answered() {
        let Screened::Estop(e) = screen(
            r#"{"jsonrpc":"1.0","id":2,"method":"tools/call","params":{"name":"estop","arguments":{"device_id":"arm-1"}}}"#,
        ) else {
            panic!("not an e-stop");
        };
        assert_eq!(e.code, Code::ProtocolInvalidRequest);
        assert_eq!(
            e.arguments.and_then(|a| a.get("device_id").cloned()),
            Some(json!("arm-1"))
        );
        let Screened::Estop(n) =
            screen(r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"estop"}}"#)
        else {
            panic!("not an e-stop");
        };
        assert_eq!(n.id, None);
    }

    #[test]
    fn a_well_formed_estop_passes_to_the_sdk() {
        assert!(matches!(
            screen(
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"estop","arguments":{}}}"#
            ),
            Screened::Pass(_)
        ));
        assert!(matches!(
            screen(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"estop"}}"#),
            Screened::Pass(_)
        ));
    }

    #[test]
    fn malformed_tool_call_params_are_invalid_params_with_a_code() {
        for (params, reason) in [
            (
                r#","params":{"name":"arm-1__stop","arguments":[]}"#,
                "arguments_not_object",
            ),
            (
                r#","params":{"name":"arm-1__stop","arguments":"x"}"#,
                "arguments_not_object",
            ),
            (r#","params":{"name":5}"#, "name_not_string"),
            ("", "params_missing"),
            (r#","params":[1]"#, "params_not_object"),
        ] {
            let text = format!(r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call"{params}}}"#);
            let Screened::Refuse(Some(answer)) = screen(&text) else {
                panic!("not refused: {text}");
            };
            assert_eq!(answer["id"], 9);
            assert_eq!(answer["error"]["code"], -32602, "{text}");
            assert_eq!(
                answer["error"]["data"]["mhs_code"],
                "MHS.PROTOCOL.INVALID_PARAMS"
            );
            assert_eq!(answer["error"]["data"]["retryable"], false);
            assert_eq!(answer["error"]["data"]["details"]["reason"], reason);
        }
    }

    #[test]
    fn an_estop_inside_a_batch_latches() {
        let Screened::Estop(e) = screen(
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"estop"}}]"#,
        ) else {
            panic!("not an e-stop");
        };
        assert_eq!(e.code, Code::ProtocolInvalidRequest);
        assert!(matches!(
            screen(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#),
            Screened::Pass(_)
        ));
    }

    #[test]
    fn unparsable_text_naming_the_estop_tool_is_an_estop() {
        let dup = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"estop","arguments":{"reason":"a","reason":"b"}}}"#;
        let why = parse_strict(dup).expect_err("duplicate keys");
        let e = unparsable(dup, &why).expect("an e-stop");
        assert_eq!(e.code, Code::ProtocolParseError);
        assert!(e.message.contains("duplicate key"), "{}", e.message);
        // Truncated, and spaced out.
        assert!(unparsable(
            r#"{"method" : "tools/call", "params": {"name" :  "estop""#,
            "eof"
        )
        .is_some());
        // Other tools, or no tools/call at all, are plain parse errors.
        assert!(unparsable(
            r#"{"method":"tools/call","params":{"name":"arm-1__stop""#,
            "eof"
        )
        .is_none());
        assert!(unparsable(r#"{"name":"estop","name":"x"}"#, "dup").is_none());
    }

    /// Regression (the `mcp` fuzz target): a tool name or method written
    /// with JSON escapes in text the strict parser refuses still stops.
    #[test]
    fn unparsable_text_with_an_escaped_estop_name_is_an_estop() {
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\u0065stop","name":"\u0065stop","arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools\/call","params":{"name":"estop"}}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\u0065stop","x":1,"x":2}}]"#,
        ] {
            let why = parse_strict(text).expect_err("duplicate keys");
            assert!(unparsable(text, &why).is_some(), "{text}");
        }
        let hello = r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list","params":{"name":"\u0065stop"}}"#;
        assert!(unparsable(hello, "dup").is_none());
    }

    #[test]
    fn unparsable_text_with_an_escaped_estop_name_beside_a_non_finite_number_is_an_estop() {
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\u0065stop","arguments":{"reason":NaN}}}"#,
            r#"{"jsonrpc":"2.0","id":1e999,"method":"tools\/call","params":{"name":"estop"}}"#,
        ] {
            let why = parse_strict(text).expect_err("not strict JSON");
            assert!(unparsable(text, &why).is_some(), "{text}");
        }
        let list =
            r#"{"jsonrpc":"2.0","id":NaN,"method":"tools/list","params":{"name":"\u0065stop"}}"#;
        assert!(unparsable(list, "nan").is_none());
    }
}
