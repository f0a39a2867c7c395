//! Step 5: the e-stop latch.
//!
//! **Owns:** the refusal of an effectful command while its device is
//! latched (an operator's safe-place grant lets its one exact command
//! through), checked here and again atomically when the operation registers.
//! **Never belongs here:** setting or releasing the latch (`safety/`).
//! **Fail-closed rule:** latched means refused, whatever else the command
//! carries.

use crate::kernel::DeviceRt;
use serde_json::json;
use tether_core::{Code, Refusal};

pub(crate) fn latched_refusal(dev: &DeviceRt) -> Refusal {
    let info = dev.latch.lock().map(|l| l.clone()).unwrap_or_default();
    Refusal::new(
        Code::SafetyEstopEngaged,
        format!(
            "device `{}` is latched by an e-stop; an operator must reset it",
            dev.id()
        ),
        json!({"device_id": dev.id(), "latched_since_ms": info.since_ms, "latch_reason": info.reason}),
    )
}
