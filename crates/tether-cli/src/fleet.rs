//! `tether fleet status`: the fleet as its store holds it — the endpoints
//! alive (their leases), the devices each serves and who owns each physical
//! one, the last heartbeat, latches, arming and open operations. Read
//! straight from the store, so it answers with no endpoint running.

use crate::cli::FleetAction;
use crate::store::{open_for_shell, StoreChoice};
use serde_json::{json, Value};
use std::process::ExitCode;
use tether_store::{LatchRow, LeaseRow, Leases, OpenOp};

/// Runs one `tether fleet` action.
pub fn fleet(action: FleetAction) -> anyhow::Result<ExitCode> {
    match action {
        FleetAction::Status {
            state_dir,
            store,
            json,
        } => status(
            &StoreChoice {
                state_dir,
                store,
                ..Default::default()
            },
            json,
        ),
    }
}

fn status(choice: &StoreChoice, as_json: bool) -> anyhow::Result<ExitCode> {
    let opened = open_for_shell(choice)?;
    let store = opened.store.as_ref();
    let leases = store.leases()?;
    let latches = store.latches()?;
    let open_ops = store.open_ops()?;
    let doc = document(&leases, &latches, &open_ops, &opened.shown);
    if as_json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print_text(&doc);
    }
    Ok(ExitCode::SUCCESS)
}

/// The whole status as one document (what `--json` prints).
fn document(leases: &Leases, latches: &[LatchRow], open_ops: &[OpenOp], shown: &str) -> Value {
    let endpoints: Vec<Value> = leases
        .rows
        .iter()
        .filter(|r| r.key.starts_with("endpoint/"))
        .map(|r| endpoint_entry(r, leases, open_ops))
        .collect();
    let owners: Vec<Value> = leases
        .rows
        .iter()
        .filter_map(|r| r.key.strip_prefix("device/").map(|d| (d, r)))
        .map(|(device, r)| {
            json!({
                "device_id": device,
                "owner": r.info.get("endpoint_id"),
                "instance": r.holder,
                "live": r.live_at(leases.now_ms),
                "lease_until_ms": r.until_ms,
            })
        })
        .collect();
    let latch_rows: Vec<Value> = latches
        .iter()
        .filter(|l| !l.device_id.starts_with('#'))
        .map(|l| json!({"device_id": l.device_id, "latched": l.latched, "info": l.info}))
        .collect();
    let arming: Vec<Value> = latches
        .iter()
        .filter_map(|l| l.device_id.strip_prefix("#arming/").map(|d| (d, l)))
        .map(|(d, l)| json!({"device_id": d, "armed": l.latched, "info": l.info}))
        .collect();
    let ops: Vec<Value> = open_ops
        .iter()
        .map(|op| json!({"command_id": op.command_id, "device_id": op.info.get("device_id"), "capability_id": op.info.get("capability_id"), "instance": op.info.get("instance"), "started_at_ms": op.info.get("started_at_ms")}))
        .collect();
    json!({
        "store": shown,
        "store_now_ms": leases.now_ms,
        "endpoints": endpoints,
        "device_owners": owners,
        "latches": latch_rows,
        "arming": arming,
        "open_operations": ops,
    })
}

/// One endpoint: what its lease says, whether it is live, its heartbeat's age.
fn endpoint_entry(r: &LeaseRow, leases: &Leases, open_ops: &[OpenOp]) -> Value {
    // A process of this host that is gone is dead whatever its lease says.
    let gone = tether_kernel::holder_gone(&r.info, &tether_kernel::this_host());
    let mine = open_ops
        .iter()
        .filter(|op| op.info.get("instance").and_then(Value::as_str) == Some(r.holder.as_str()))
        .count();
    json!({
        "endpoint_id": r.info.get("endpoint_id"),
        "instance": r.holder,
        "host": r.info.get("host"),
        "pid": r.info.get("pid"),
        "version": r.info.get("version"),
        "devices": r.info.get("devices"),
        "live": r.live_at(leases.now_ms) && !gone,
        "process_gone": gone,
        "last_heartbeat_ms": r.renewed_ms,
        "heartbeat_age_ms": leases.now_ms.saturating_sub(r.renewed_ms),
        "lease_until_ms": r.until_ms,
        "open_operations": mine,
    })
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn print_text(doc: &Value) {
    println!("fleet on {}", text(&doc["store"]));
    let list = |k: &str| doc[k].as_array().cloned().unwrap_or_default();
    let endpoints = list("endpoints");
    println!("endpoints: {}", endpoints.len());
    for e in &endpoints {
        let devices: Vec<String> = e["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| format!("{} ({})", text(&d["device_id"]), text(&d["mode"])))
            .collect();
        println!(
            "  {} [{}] host {} pid {}: {}, last heartbeat {} ms ago, {} open operation(s); devices: {}",
            text(&e["endpoint_id"]),
            text(&e["instance"]),
            text(&e["host"]),
            text(&e["pid"]),
            if e["live"] == json!(true) { "live" } else { "LAPSED" },
            text(&e["heartbeat_age_ms"]),
            text(&e["open_operations"]),
            devices.join(", ")
        );
    }
    println!("device owners:");
    for o in list("device_owners") {
        println!(
            "  {} owned by {} ({})",
            text(&o["device_id"]),
            text(&o["owner"]),
            if o["live"] == json!(true) {
                "live"
            } else {
                "lease lapsed"
            }
        );
    }
    println!("latches:");
    for l in list("latches") {
        let state = if l["latched"] == json!(true) {
            "LATCHED"
        } else {
            "released"
        };
        println!(
            "  {} {state} ({})",
            text(&l["device_id"]),
            text(&l["info"]["reason"])
        );
    }
    for a in list("arming") {
        let state = if a["armed"] == json!(true) {
            "armed"
        } else {
            "DISARMED"
        };
        println!("  {} {state}", text(&a["device_id"]));
    }
    let ops = list("open_operations");
    println!("open operations: {}", ops.len());
    for op in ops {
        println!(
            "  {} on {} ({}), instance {}",
            text(&op["command_id"]),
            text(&op["device_id"]),
            text(&op["capability_id"]),
            text(&op["instance"])
        );
    }
}
