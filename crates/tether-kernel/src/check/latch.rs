//! Step 5: the e-stop latch.
//!
//! **Owns:** the refusal of an effectful command while its device is
//! latched (an operator's safe-place grant lets its one exact command
//! through), checked here and again atomically when the operation registers.
//! **Never belongs here:** setting or releasing the latch (`safety/`).
//! **Fail-closed rule:** latched means refused, whatever else the command
//! carries.

use crate::kernel::{DeviceRt, Kernel};
use crate::loader::BindingSpec;
use crate::order::Ctx;
use serde_json::json;
use std::sync::atomic::Ordering;
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

impl Kernel {
    /// Step 5: an effectful command on a latched device is refused, unless
    /// it carries an operator's safe-place grant for exactly this command
    /// (checked here, consumed when the operation registers).
    pub(crate) fn latch_step(
        &self,
        ctx: &Ctx,
        dev: &DeviceRt,
        b: &BindingSpec,
    ) -> Result<(), Refusal> {
        if !Kernel::is_effectful(b) || !dev.latched.load(Ordering::SeqCst) {
            return Ok(());
        }
        match &ctx.safe_place_grant {
            Some(g) => self.check_grant_for(g, ctx.device, ctx.binding, &ctx.digest, false),
            None => Err(latched_refusal(dev)),
        }
    }
}
