//! The command kind of one binding: how its call is bounded in time, so
//! that a controller stops on its own when Tether goes silent (a crash, a
//! lost network, a hung host).
//!
//! On a `hardware` or `hybrid` device every effectful binding — anything but
//! a catalogued read or a class the catalogue trusts as a stop or as
//! risk-reducing — declares `kind = "leased"` or `kind = "time_bounded"`
//! itself: a default would let a forgotten declaration pass as a bound
//! nobody chose. A `time_bounded` one declares `max_duration_ms`, the bound
//! itself. Simulated and replay devices keep the default, since nothing
//! physical outlives their process.
//!
//! **Fail-closed rule:** a claim of `risk_reducing` is never trusted on its
//! own: on a physical device it needs a catalogued stop or risk-reducing
//! class, as an extension's declared flags exempt it from nothing.
//! **Never belongs here:** running a leased call (-> `crate::lease`, used by
//! drivers), enforcing the duration (-> `dispatch`).

use super::Ctx;
use tether_core::catalogue::Flags;
use tether_core::manifest::{BindingDecl, CommandKind, DeviceManifest};

/// The kind binding `i` runs with, reporting to `ctx` a physical device's
/// effectful binding that declares no kind, claims `risk_reducing` without a
/// class that is, or is `time_bounded` without a duration; and a duration of
/// zero anywhere (no call could run).
pub(super) fn command_kind(
    ctx: &mut Ctx<'_>,
    m: &DeviceManifest,
    i: usize,
    decl: &BindingDecl,
    is_read: bool,
    flags: Flags,
) -> CommandKind {
    let reduces_risk = flags.stop_class || flags.risk_reducing;
    let effectful = !is_read && !reduces_risk;
    if decl.max_duration_ms == Some(0) {
        ctx.defect(
            format!("bindings[{i}].max_duration_ms"),
            "max_duration_ms must be at least 1: a call bounded by 0 ms could never run",
        );
    }
    let default = if reduces_risk {
        CommandKind::RiskReducing
    } else {
        CommandKind::TimeBounded
    };
    if !(m.mode.is_physical() && effectful) {
        return decl.kind.unwrap_or(default);
    }
    let mode = m.mode.as_str();
    let cap = &decl.capability_id;
    match decl.kind {
        None => ctx.defect(
            format!("bindings[{i}].kind"),
            format!(
                "`{cap}` acts on a {mode} device, so the binding must declare kind = \"leased\" or kind = \"time_bounded\": how its controller stops on its own if Tether goes silent (no default applies on a physical device)"
            ),
        ),
        Some(CommandKind::RiskReducing) => ctx.defect(
            format!("bindings[{i}].kind"),
            format!(
                "`{cap}` is not a stop or risk-reducing class in the catalogue, and a binding's claim is not trusted; on a {mode} device declare kind = \"leased\" or kind = \"time_bounded\""
            ),
        ),
        Some(CommandKind::TimeBounded) if decl.max_duration_ms.is_none() => ctx.defect(
            format!("bindings[{i}].max_duration_ms"),
            format!(
                "`{cap}` is time_bounded on a {mode} device, so it must declare max_duration_ms: the longest its call may run, after which Tether cancels it"
            ),
        ),
        Some(_) => {}
    }
    decl.kind.unwrap_or(default)
}
