//! A surface's records of the calls it answers before their outcome (the
//! REST gateway's invocations), written and read back only through the
//! kernel.
//!
//! **Owns:** the evidence entries `invocation.accepted` (riding in the
//! command's first commit, see [`Rider`]) and `invocation.finished`, the
//! store's invocation rows, and the reads a surface needs after a restart.
//! **Never belongs here:** what an invocation record says (the surface
//! writes it as canonical text; the kernel stores it as given) or any
//! decision about the command.
//! **Fail-closed rule:** a read the store cannot answer is an
//! [`EvidenceFault`], never an empty answer.

use crate::dispatch::rider::{Rider, RiderOutcome};
use crate::kernel::Kernel;
use crate::EvidenceFault;
use serde_json::Value;
use tether_core::canonical::CanonicalText;
use tether_store::{CanonicalBody, Commit, EventBody, EventDraft, InvocationRef, InvocationRow};
use tokio::sync::oneshot;

/// An evidence body written from canonical text.
fn canonical_body(text: CanonicalText) -> EventBody {
    EventBody::Canonical(CanonicalBody::new(text, None))
}

impl Kernel {
    /// A rider carrying the accepted record of invocation `invocation_id`
    /// (`record`, canonical text of an object): the `invocation.accepted`
    /// entry, which the store's invocation row indexes. Hand it to the
    /// command in [`crate::CommandOptions::rider`]; the receiver learns
    /// when the record is durable.
    pub fn invocation_rider(
        &self,
        invocation_id: &str,
        record: CanonicalText,
    ) -> (Rider, oneshot::Receiver<RiderOutcome>) {
        Rider::new(
            self.inner.store.clone(),
            Commit {
                events: vec![EventDraft {
                    kind: "invocation.accepted".into(),
                    body: canonical_body(record),
                }],
                invocation_refs: vec![InvocationRef {
                    invocation_id: invocation_id.to_owned(),
                    event: 0,
                }],
                ..Commit::default()
            },
        )
    }

    /// Records how invocation `invocation_id` ended: the
    /// `invocation.finished` entry (`event`) and its row (`row`, the record
    /// a restart reads back). Queued, not awaited: the surface's answer does
    /// not depend on it; a failure is logged.
    pub fn record_invocation_finished(
        &self,
        invocation_id: &str,
        event: CanonicalText,
        row: CanonicalText,
    ) {
        self.inner.store.submit(
            Commit {
                events: vec![EventDraft {
                    kind: "invocation.finished".into(),
                    body: canonical_body(event),
                }],
                invocations: vec![InvocationRow {
                    invocation_id: invocation_id.to_owned(),
                    info: canonical_body(row),
                }],
                ..Commit::default()
            },
            Box::new(|r| {
                if let Err(e) = r {
                    tracing::warn!(error = %e, "invocation finish record failed");
                }
            }),
        );
    }

    /// The stored record of invocation `invocation_id` (the newest: its
    /// finish, else its acceptance), or `None` when the store has none.
    ///
    /// # Errors
    /// The store cannot be read.
    pub fn invocation_record(&self, invocation_id: &str) -> Result<Option<Value>, EvidenceFault> {
        self.inner
            .store
            .invocation(invocation_id)
            .map(|row| row.map(|r| r.info.into_value()))
            .map_err(|e| EvidenceFault(e.to_string()))
    }

    /// The durable receipt of `command_id`, or `None` when it has none.
    ///
    /// # Errors
    /// The store cannot be read.
    pub fn stored_receipt(&self, command_id: &str) -> Result<Option<Value>, EvidenceFault> {
        self.inner
            .store
            .receipt(command_id)
            .map(|row| row.map(|r| r.receipt))
            .map_err(|e| EvidenceFault(e.to_string()))
    }
}
