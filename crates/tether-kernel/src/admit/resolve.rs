//! Step 3: which binding a command names, and the key its `command_id` is
//! bound to.
//!
//! **Owns:** binding resolution (capability and resource → one binding),
//! the write route (`mhs.resource.write` → the resource's configure
//! binding) and the idempotency key.
//! **Never belongs here:** grants (`sessions.rs`), checks on the input.
//! **Fail-closed rule:** a name that matches no binding, or several when
//! no resource is named, never falls back to a default binding.

use crate::admit::arrival::Arrival;
use crate::dispatch::answer::Answer;
use crate::dispatch::rider::Rider;
use crate::kernel::{DeviceRt, Kernel, Principal};
use crate::loader::BindingSpec;
use crate::order::Ctx;
use crate::{ApiError, CommandRequest};
use serde_json::json;
use tether_core::catalogue::{self};
use tether_core::Refusal;
use tether_core::{echo, Code};

pub(crate) enum Resolve {
    Found(usize),
    Unknown,
    NotBound(Vec<String>),
    ResourceRequired(Vec<String>),
}

/// What a `command_id` is bound to: the principal, the binding and the
/// input (its digest). The same id with the same key replays; with another
/// key — other input, another binding, or another principal — it is a reuse:
/// one principal never receives another's receipt by guessing its id.
pub(crate) fn idempotency_key(
    principal_id: &str,
    device_id: &str,
    capability_id: &str,
    resource: &str,
    digest: &str,
) -> String {
    format!("{device_id}/{capability_id}/{resource}/{digest}@{principal_id}")
}

pub(crate) fn resolve(dev: &DeviceRt, capability_id: &str, resource: Option<&str>) -> Resolve {
    let matches: Vec<(usize, &BindingSpec)> = dev
        .spec
        .bindings
        .iter()
        .enumerate()
        .filter(|(_, b)| b.capability_id == capability_id)
        .collect();
    if matches.is_empty() {
        return Resolve::Unknown;
    }
    match resource {
        Some(r) => matches.iter().find(|(_, b)| b.resource == r).map_or_else(
            || Resolve::NotBound(matches.iter().map(|(_, b)| b.resource.clone()).collect()),
            |(i, _)| Resolve::Found(*i),
        ),
        None if matches.len() == 1 => Resolve::Found(matches[0].0),
        None => {
            Resolve::ResourceRequired(matches.iter().map(|(_, b)| b.resource.clone()).collect())
        }
    }
}

impl Kernel {
    /// A write (`Route::Write`) is a command of the resource's configure
    /// binding: checks the resource has one and names it.
    ///
    /// # Errors
    /// `RESOURCE.UNKNOWN`; `NOT_WRITABLE` when the resource has no configure
    /// binding or another class is named.
    pub(crate) fn write_route(&self, req: &mut CommandRequest) -> Result<(), ApiError> {
        let dev = self.device(&req.device_id)?;
        let resource = req
            .resource
            .clone()
            .ok_or_else(|| ApiError::invalid_params("resource_required", "resource is required"))?;
        if !dev.spec.manifest.resources.iter().any(|r| r.id == resource) {
            return Err(ApiError::new(
                Code::ResourceUnknown,
                format!(
                    "device `{}` has no resource `{}`",
                    dev.id(),
                    echo::id(&resource)
                ),
                json!({"resource": echo::id(&resource)}),
            ));
        }
        if !req.capability_id.is_empty() && req.capability_id != catalogue::CONFIGURE {
            return Err(ApiError::new(
                Code::ResourceNotWritable,
                "mhs.resource.write always uses cap.device.configure.v1",
                json!({"reason": "write_class_not_configure", "capability_id": echo::id(&req.capability_id)}),
            ));
        }
        let bound = dev
            .spec
            .bindings
            .iter()
            .any(|b| b.capability_id == catalogue::CONFIGURE && b.resource == resource);
        if !bound {
            return Err(ApiError::new(
                Code::ResourceNotWritable,
                format!(
                    "resource `{}` has no cap.device.configure.v1 binding",
                    echo::id(&resource)
                ),
                json!({"reason": "configure_unbound", "resource": echo::id(&resource)}),
            ));
        }
        req.capability_id = catalogue::CONFIGURE.to_owned();
        Ok(())
    }

    /// Step 3: the binding `req` names on device `d`. A name that matches
    /// no binding is refused with a rejected receipt (`Ok(Err(refusal))`);
    /// a class bound to several resources without one named is a protocol
    /// error.
    ///
    /// # Errors
    /// `resource_required`.
    pub(crate) fn resolve_step(
        &self,
        req: &CommandRequest,
        d: usize,
    ) -> Result<Result<usize, Refusal>, ApiError> {
        let dev = &self.inner.devices[d];
        match resolve(dev, &req.capability_id, req.resource.as_deref()) {
            Resolve::Found(bi) => Ok(Ok(bi)),
            Resolve::Unknown => Ok(Err(Refusal::new(
                Code::CapabilityUnknown,
                format!(
                    "`{}` is not bound on device `{}`",
                    echo::id(&req.capability_id),
                    dev.id()
                ),
                json!({"capability_id": echo::id(&req.capability_id), "bound": dev.spec.bindings.iter().map(|b| b.capability_id.clone()).collect::<Vec<_>>()}),
            ))),
            Resolve::NotBound(bound) => Ok(Err(Refusal::new(
                Code::CapabilityNotBound,
                format!(
                    "`{}` is not bound to resource `{}`",
                    echo::id(&req.capability_id),
                    echo::id(req.resource.as_deref().unwrap_or_default())
                ),
                json!({"bound_resources": bound}),
            ))),
            Resolve::ResourceRequired(resources) => Err(ApiError::new(
                Code::ProtocolInvalidParams,
                format!(
                    "`{}` is bound to several resources; name one",
                    echo::id(&req.capability_id)
                ),
                json!({"reason": "resource_required", "resources": resources}),
            )),
        }
    }

    /// The rejected receipt of a command whose binding step 3 did not find:
    /// it names the capability and resource as asked.
    pub(crate) async fn reject_unresolved(
        &self,
        p: &Principal,
        req: &CommandRequest,
        arrival: &Arrival,
        rider: Option<Rider>,
        refusal: Refusal,
    ) -> Answer {
        let ctx = Ctx {
            digest: arrival.digest.clone(),
            session_id: req.session_id.clone(),
            deadline: arrival.deadline,
            rider,
            ..Ctx::bare(
                arrival.device,
                arrival.command_id.clone(),
                p.clone(),
                (arrival.t0, arrival.accepted_at_ms),
            )
        };
        // The receipt names what was asked as an error would echo it: a
        // name no binding has is the caller's text, of any length.
        let resource = req.resource.as_deref().map(echo::id);
        self.reject(
            &ctx,
            &echo::id(&req.capability_id),
            resource.as_deref(),
            refusal,
        )
        .await
        .into()
    }
}
