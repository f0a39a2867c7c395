//! The registry of running operations: registration (with the second,
//! atomic latch check and the permit and approval it takes), removal, and
//! cancellation by device.
//!
//! **Fail-closed rule:** an operation table that cannot be locked refuses
//! the command; a cancel delivered before registration refuses it, one after
//! reaches the running operation.

use crate::check::latch::latched_refusal;
use crate::driver::CancelToken;
use crate::kernel::{Kernel, RunningOp};
use crate::loader::BindingSpec;
use crate::order::Ctx;
use serde_json::json;
use std::sync::atomic::Ordering;
use tether_core::{Code, Refusal};

impl Kernel {
    pub(crate) fn register_op(
        &self,
        ctx: &Ctx,
        b: &BindingSpec,
        op_id: &str,
        cancel: &CancelToken,
    ) -> Result<(), Refusal> {
        let dev = &self.inner.devices[ctx.device];
        let mut ops =
            self.inner.ops.lock().map_err(|_| {
                Refusal::bare(Code::ProtocolInternal, "operation table unavailable")
            })?;
        // The latch is checked again atomically with registration, so a command
        // that passed step 5 before an e-stop never runs after it.
        if Kernel::is_effectful(b) && dev.latched.load(Ordering::SeqCst) {
            match &ctx.safe_place_grant {
                Some(g) => self.check_grant_for(g, ctx.device, ctx.binding, &ctx.digest, true)?,
                None => return Err(latched_refusal(dev)),
            }
        }
        // Checked under the operation table's lock: a cancel delivered before
        // this point refuses the command, one delivered after reaches the
        // running operation.
        if cancel.is_cancelled() {
            return Err(Refusal::new(
                Code::OutcomeCancelled,
                "cancelled before dispatch; nothing was dispatched",
                json!({"reason": "cancelled_before_dispatch"}),
            ));
        }
        if let Some(id) = &ctx.permit_id {
            self.check_permit(id, ctx, true)?;
        }
        if let Some(id) = ctx.approval.get() {
            if let Err(r) = self.reserve_approval(id, &ctx.command_id) {
                if let Some(pid) = &ctx.permit_id {
                    self.give_back_permit(pid);
                }
                return Err(r);
            }
        }
        ops.insert(
            op_id.to_owned(),
            RunningOp {
                device: ctx.device,
                capability_id: b.capability_id.clone(),
                cancel: cancel.clone(),
                stop_class: !Kernel::is_effectful(b),
                abortable: b.abortable,
                session_id: ctx.session_id.clone(),
                principal_id: ctx.principal.id.clone(),
                command_id: ctx.command_id.clone(),
            },
        );
        Ok(())
    }

    pub(crate) fn unregister_op(&self, op_id: &str) {
        if let Ok(mut ops) = self.inner.ops.lock() {
            ops.remove(op_id);
        }
    }

    /// Cancels the device's running operations, stops and non-abortable
    /// ones excepted (a non-abortable call ends within its lease or
    /// duration; the latch already refuses the next), and answers the ids
    /// cancelled.
    pub(crate) fn cancel_device_ops(&self, device: usize, _why: &str) -> Vec<String> {
        let Ok(ops) = self.inner.ops.lock() else {
            return Vec::new();
        };
        ops.iter()
            .filter(|(_, op)| op.device == device && !op.stop_class && op.abortable)
            .map(|(id, op)| {
                op.cancel.cancel();
                id.clone()
            })
            .collect()
    }
}
