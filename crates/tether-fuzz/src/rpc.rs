//! The JSON-RPC decoder and dispatcher (`tether_server::rpc::handle_text`)
//! with a kernel on the memory store and the built-in simulated cell.
//!
//! An input is up to [`LINES_MAX`] requests, one a line; `$S` in a line
//! stands for the id of a session the harness opened on every device first.
//! After each request the target asserts:
//! - every answer is one JSON-RPC 2.0 response (a result or an error), and
//!   no answer at all only for an e-stop;
//! - an e-stop request — by what it asks: the permissive parse's `method` is
//!   `mhs.safety.estop`, or `mhs.command` of the e-stop class — latched the
//!   devices it names (every device when it names none or its params are
//!   defective), however malformed the rest of the request;
//! - a refused command or write (a JSON-RPC error, or a `rejected` or held
//!   receipt) left no side effect: no revision moved (judged while no
//!   operation runs), and what the store holds as its `command_id`'s outcome
//!   did not change.

use crate::cell::{self, Snapshot, LINES_MAX};
use serde_json::Value;
use tether_kernel::{Kernel, Principal};

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let rt = cell::runtime();
    assert!(rt.is_some(), "no runtime");
    let Some(rt) = rt else { return };
    rt.block_on(async {
        let kernel = cell::kernel();
        assert!(kernel.is_some(), "the built-in cell did not start");
        let Some(kernel) = kernel else { return };
        let session = cell::open_session(&kernel).await;
        assert!(session.is_some(), "no session on a fresh kernel");
        let session = session.unwrap_or_default();
        for line in data.split(|b| *b == b'\n').take(LINES_MAX) {
            let text = cell::with_session(line, &session);
            one(&kernel, &text).await;
        }
        kernel.cancel_all_operations("fuzz input done");
    });
}

/// One request and the invariants after it.
async fn one(kernel: &Kernel, text: &[u8]) {
    let asked = Asked::of(text);
    let before = cell::snapshot(kernel).await;
    let stored_before = cell::stored(kernel, asked.command_id.as_deref());
    let p = Principal::local_agent();
    let reply = tether_server::rpc::handle_text(kernel, &p, text).await;
    let answer = reply.map(|r| serde_json::from_slice::<Value>(&r.to_bytes()));
    assert!(
        answer.is_some() || asked.estop,
        "no answer to a request that is not an e-stop"
    );
    let answer = match answer {
        Some(Ok(v)) => Some(v),
        Some(Err(e)) => {
            let e: Result<Value, _> = Err(e);
            assert!(e.is_ok(), "the answer is not JSON: {e:?}");
            None
        }
        None => None,
    };
    if let Some(v) = &answer {
        assert_response(v);
    }
    if asked.estop {
        judge_estop(kernel, &asked, answer.as_ref());
    } else if asked.effectful && answer.as_ref().is_some_and(refused) {
        let after = cell::snapshot(kernel).await;
        judge_refusal(&before, &after);
        let stored_after = cell::stored(kernel, asked.command_id.as_deref());
        assert_eq!(
            stored_before, stored_after,
            "a refused command changed what the store holds as its command_id's outcome"
        );
    }
}

/// What a request asks, by the permissive reading (the last duplicate key
/// wins; a non-finite number read as null), independent of how well it is
/// written.
pub(crate) struct Asked {
    pub estop: bool,
    pub effectful: bool,
    pub params: Option<Value>,
    pub command_id: Option<String>,
}

impl Asked {
    pub(crate) fn of(text: &[u8]) -> Self {
        let v = cell::read_permissively(text);
        // In a batch (refused), the first e-stop is still served.
        let obj = match &v {
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(Value::as_object)
                .find(|o| Self::of_object(o).0)
                .or_else(|| items.iter().find_map(Value::as_object)),
            other => other.as_ref().and_then(Value::as_object),
        };
        let batch = matches!(v, Some(Value::Array(_)));
        let (estop, method) = obj.map_or((false, None), Self::of_object);
        let params = obj.and_then(|o| o.get("params")).cloned();
        // A batch is refused whole: none of its commands runs.
        let effectful = batch || matches!(method, Some("mhs.command" | "mhs.resource.write"));
        let command_id = params
            .as_ref()
            .and_then(|p| p.get("command_id"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        Self {
            estop,
            effectful,
            params,
            command_id,
        }
    }
}

impl Asked {
    /// Whether an object asks for an e-stop, and its method.
    fn of_object(o: &serde_json::Map<String, Value>) -> (bool, Option<&str>) {
        let method = o.get("method").and_then(Value::as_str);
        let estop_class = o
            .get("params")
            .and_then(|p| p.get("capability_id"))
            .and_then(Value::as_str)
            == Some(tether_core::catalogue::ESTOP);
        let estop =
            method == Some("mhs.safety.estop") || (method == Some("mhs.command") && estop_class);
        (estop, method)
    }
}

/// One JSON-RPC 2.0 response: `jsonrpc`, `id`, and exactly one of `result`
/// and `error` (with a numeric `code` and a `message`).
fn assert_response(v: &Value) {
    assert_eq!(v.get("jsonrpc"), Some(&Value::from("2.0")), "{v}");
    assert!(v.get("id").is_some(), "an answer without id: {v}");
    let result = v.get("result").is_some();
    let error = v.get("error");
    assert!(
        result != error.is_some(),
        "not one of result and error: {v}"
    );
    if let Some(e) = error {
        assert!(e.get("code").is_some_and(Value::is_i64), "{v}");
        assert!(e.get("message").is_some_and(Value::is_string), "{v}");
    }
}

/// Whether the answer refuses the command: an error, or a receipt that
/// says it did not run.
fn refused(v: &Value) -> bool {
    if v.get("error").is_some() {
        return true;
    }
    let status = v.pointer("/result/status").and_then(Value::as_str);
    matches!(status, Some("rejected" | "held" | "pending_approval"))
}

/// The devices the e-stop named (or every device) are latched.
pub(crate) fn judge_estop(kernel: &Kernel, asked: &Asked, answer: Option<&Value>) {
    let unknown = answer
        .and_then(|a| a.pointer("/error/data/mhs_code"))
        .and_then(Value::as_str)
        == Some(tether_core::Code::DeviceUnknown.as_str());
    // An mhs.command e-stop carries its device in `params.device_id` too.
    let Some(must) = cell::estop_must_latch(kernel, asked.params.as_ref(), !unknown) else {
        return;
    };
    for d in must {
        assert!(
            cell::latched(kernel, &d),
            "an e-stop request left `{d}` unlatched; answer: {answer:?}"
        );
    }
}

/// A refusal moved no revision (judged only when no operation ran before or
/// after, since a motion admitted earlier may end meanwhile).
pub(crate) fn judge_refusal(before: &Snapshot, after: &Snapshot) {
    if before.running == 0 && after.running == 0 {
        assert_eq!(
            before.revisions, after.revisions,
            "a refused command moved a revision"
        );
    }
}
