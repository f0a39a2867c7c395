//! Step 3: which binding a command names, and the key its `command_id` is
//! bound to.
//!
//! **Owns:** binding resolution (capability and resource → one binding),
//! the write route (`mhs.resource.write` → the resource's configure
//! binding) and the idempotency key.
//! **Never belongs here:** grants (`sessions.rs`), checks on the input.
//! **Fail-closed rule:** a name that matches no binding, or several when
//! no resource is named, never falls back to a default binding.

use crate::kernel::{DeviceRt, Kernel};
use crate::loader::BindingSpec;
use crate::{ApiError, CommandRequest};
use serde_json::json;
use tether_core::catalogue::{self};
use tether_core::Code;

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
                format!("device `{}` has no resource `{resource}`", req.device_id),
                json!({"resource": resource}),
            ));
        }
        if !req.capability_id.is_empty() && req.capability_id != catalogue::CONFIGURE {
            return Err(ApiError::new(
                Code::ResourceNotWritable,
                "mhs.resource.write always uses cap.device.configure.v1",
                json!({"reason": "write_class_not_configure", "capability_id": req.capability_id}),
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
                format!("resource `{resource}` has no cap.device.configure.v1 binding"),
                json!({"reason": "configure_unbound", "resource": resource}),
            ));
        }
        req.capability_id = catalogue::CONFIGURE.to_owned();
        Ok(())
    }
}
