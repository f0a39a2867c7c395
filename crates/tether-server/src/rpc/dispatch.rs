//! Method dispatch: a short router from a method name to its group
//! (commands, devices, sessions, safety, approvals, operations), and one
//! function per group that parses the params and makes the kernel call.
//!
//! **Never belongs here:** envelope checks or e-stop recognition (in
//! `envelope` and `estop`), the params' shapes (in `params`), and any
//! decision about a device: every method is one kernel call.

use super::estop;
use super::params::{
    parse, ApprovalDecideParams, ApprovalGetParams, ApprovalListParams, ArmParams, CommandParams,
    DeviceParams, GrantParams, HelloParams, OpenParams, OperationParams, PermitParams, ReadParams,
    ResetParams, SessionParams, StatusParams, WriteParams,
};
use serde_json::{json, Value};
use tether_core::{echo, Code};
use tether_kernel::{Answer, ApiError, CommandOptions, Kernel, Principal};

/// Routes one method. Commands and writes answer with the kernel's
/// [`Answer`] (a receipt's canonical text spliced into the response); every
/// other method answers a value.
pub(super) async fn dispatch(
    kernel: &Kernel,
    p: &Principal,
    method: &str,
    params: Value,
) -> Result<Answer, ApiError> {
    match method {
        // The command form of the e-stop shares the e-stop path: it needs no
        // session, grant or valid command_id, and is never refused by them.
        "mhs.command" if estop::is_estop_command(Some(&params)) => {
            estop::serve_estop_command(kernel, p, &params)
                .await
                .map(Answer::from)
        }
        "mhs.command" | "mhs.resource.write" => commands(kernel, p, method, params).await,
        "mhs.hello" | "mhs.devices.list" | "mhs.devices.get" | "mhs.resource.read" => {
            devices(kernel, p, method, params).await.map(Answer::from)
        }
        _ if method.starts_with("mhs.session.") => {
            sessions(kernel, p, method, params).await.map(Answer::from)
        }
        _ if method.starts_with("mhs.safety.") => {
            safety(kernel, p, method, params).await.map(Answer::from)
        }
        _ if method.starts_with("mhs.approvals.") => {
            approvals(kernel, p, method, params).await.map(Answer::from)
        }
        _ if method.starts_with("mhs.operations.") => {
            operations(kernel, p, method, params).map(Answer::from)
        }
        other => Err(method_not_found(kernel, p, other)),
    }
}

/// `MHS.PROTOCOL.METHOD_NOT_FOUND`, listing the methods served.
fn method_not_found(kernel: &Kernel, p: &Principal, method: &str) -> ApiError {
    ApiError::new(
        Code::ProtocolMethodNotFound,
        format!("no method `{}`", echo::id(method)),
        json!({"method": echo::id(method), "methods": kernel.hello(p)["methods"].clone()}),
    )
}

/// `mhs.command` (but the e-stop's) and `mhs.resource.write`: governed
/// commands, answered with their receipt.
async fn commands(
    kernel: &Kernel,
    p: &Principal,
    method: &str,
    params: Value,
) -> Result<Answer, ApiError> {
    let req = match method {
        "mhs.resource.write" => parse::<WriteParams>(params)?.into_request()?,
        "mhs.command" => parse::<CommandParams>(params)?.into_request()?,
        other => return Err(method_not_found(kernel, p, other)),
    };
    kernel.command(p, req, CommandOptions::plain()).await
}

/// `mhs.hello`, `mhs.devices.*` and `mhs.resource.read`: what is served and
/// its state.
async fn devices(
    kernel: &Kernel,
    p: &Principal,
    method: &str,
    params: Value,
) -> Result<Value, ApiError> {
    match method {
        "mhs.hello" => {
            let _: HelloParams = parse(params)?;
            Ok(kernel.hello(p))
        }
        "mhs.devices.list" => {
            let _: HelloParams = parse(params)?;
            Ok(kernel.devices_list())
        }
        "mhs.devices.get" => {
            let q: DeviceParams = parse(params)?;
            kernel.device_get(&q.device_id)
        }
        "mhs.resource.read" => {
            let q: ReadParams = parse(params)?;
            kernel.read(p, q.into_request()).await
        }
        other => Err(method_not_found(kernel, p, other)),
    }
}

/// `mhs.session.*`: open, heartbeat, close.
async fn sessions(
    kernel: &Kernel,
    p: &Principal,
    method: &str,
    params: Value,
) -> Result<Value, ApiError> {
    match method {
        "mhs.session.open" => {
            let q: OpenParams = parse(params)?;
            kernel.session_open(p, q.into_request()).await
        }
        "mhs.session.heartbeat" => {
            let q: SessionParams = parse(params)?;
            kernel.session_heartbeat(p, &q.session_id)
        }
        "mhs.session.close" => {
            let q: SessionParams = parse(params)?;
            kernel.session_close(p, &q.session_id).await
        }
        other => Err(method_not_found(kernel, p, other)),
    }
}

/// `mhs.safety.*`: the e-stop, its reset, permits, safe-place grants,
/// arming and the safety status.
async fn safety(
    kernel: &Kernel,
    p: &Principal,
    method: &str,
    params: Value,
) -> Result<Value, ApiError> {
    match method {
        "mhs.safety.estop" => estop::serve_estop(kernel, p, &params).await,
        "mhs.safety.reset" => {
            let q: ResetParams = parse(params)?;
            kernel.reset(p, q.into_request()).await
        }
        "mhs.safety.permit" => {
            let (req, ttl_ms) = parse::<PermitParams>(params)?.into_request();
            kernel.permit(p, &req, ttl_ms).await
        }
        "mhs.safety.grant_safe_place" => {
            let q: GrantParams = parse(params)?;
            kernel.grant_safe_place(
                p,
                &q.device_id,
                &q.capability_id,
                q.resource.as_deref(),
                &q.input.unwrap_or_else(|| json!({})),
            )
        }
        "mhs.safety.arm" | "mhs.safety.disarm" => {
            let q: ArmParams = parse(params)?;
            let armed = method == "mhs.safety.arm";
            kernel.set_armed(p, q.into_request(armed)).await
        }
        "mhs.safety.status" => {
            let q: StatusParams = parse(params)?;
            kernel.safety_status(q.device_id.as_deref())
        }
        other => Err(method_not_found(kernel, p, other)),
    }
}

/// `mhs.approvals.*`: list, get, decide.
async fn approvals(
    kernel: &Kernel,
    p: &Principal,
    method: &str,
    params: Value,
) -> Result<Value, ApiError> {
    match method {
        "mhs.approvals.list" => {
            let q: ApprovalListParams = parse(params)?;
            kernel.approvals_list(p, q.status.as_deref(), q.limit, q.cursor.as_deref())
        }
        "mhs.approvals.get" => {
            let q: ApprovalGetParams = parse(params)?;
            kernel.approvals_get(p, &q.approval_id)
        }
        "mhs.approvals.decide" => {
            let q: ApprovalDecideParams = parse(params)?;
            let reason = q.reason.as_deref().unwrap_or("");
            kernel
                .approvals_decide(p, &q.approval_id, &q.decision, reason)
                .await
        }
        other => Err(method_not_found(kernel, p, other)),
    }
}

/// `mhs.operations.*`: get, cancel.
fn operations(
    kernel: &Kernel,
    p: &Principal,
    method: &str,
    params: Value,
) -> Result<Value, ApiError> {
    match method {
        "mhs.operations.get" => {
            let q: OperationParams = parse(params)?;
            kernel.operation_get(p, &q.operation_id)
        }
        "mhs.operations.cancel" => {
            let q: OperationParams = parse(params)?;
            kernel.operation_cancel(p, &q.operation_id)
        }
        other => Err(method_not_found(kernel, p, other)),
    }
}
