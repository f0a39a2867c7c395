//! `tether probe` for Modbus: every mapped field, interlock and the watchdog
//! register read once from the live device, in declared units beside the raw
//! values. Opens one connection of its own and writes nothing.

use super::codec::Point;
use super::lane::Lane;
use super::map::Map;
use crate::ProbeRow;
use serde_json::Value;
use std::time::{Duration, Instant};
use tether_core::manifest::DeviceManifest;

/// Reads every mapped point once, each bounded by `timeout`.
///
/// # Errors
/// The map's defects, or a device that cannot be reached at all.
pub async fn probe(manifest: &DeviceManifest, timeout: Duration) -> Result<Vec<ProbeRow>, String> {
    let (map, addr) = Map::load(manifest)?;
    let mut lane = Lane::new(addr, map.unit_id, timeout, timeout);
    let mut rows = Vec::new();
    for (rid, fields) in &map.resources {
        for f in fields {
            rows.push(row(&mut lane, &format!("{rid}.{}", f.name), &f.point, timeout).await);
        }
    }
    for il in &map.interlocks {
        let mut r = row(
            &mut lane,
            &format!("interlock {}", il.id),
            &il.point,
            timeout,
        )
        .await;
        if r.error.is_none() {
            let closed = il.point.encode(&il.closed).ok().map(|n| n.to_json());
            r.declared = Value::from(if Some(&r.raw) == closed.as_ref() {
                "closed"
            } else {
                "open"
            });
        }
        rows.push(r);
    }
    if let Some(wd) = &map.watchdog {
        rows.push(row(&mut lane, "watchdog", &wd.point, timeout).await);
    }
    if !rows.is_empty()
        && rows.iter().all(|r| {
            r.error
                .as_deref()
                .is_some_and(|e| e.contains("unreachable"))
        })
    {
        return Err(format!("{}: device unreachable", map.address));
    }
    Ok(rows)
}

async fn row(lane: &mut Lane, name: &str, p: &Point, timeout: Duration) -> ProbeRow {
    let read = lane.read(p, Instant::now() + timeout).await;
    let (declared, raw, error) = match read {
        Ok(n) => match p.decode(&n) {
            Ok(v) => (v, n.to_json(), None),
            Err(e) => (Value::Null, n.to_json(), Some(e)),
        },
        Err(e) => (Value::Null, Value::Null, Some(e.to_string())),
    };
    ProbeRow {
        name: name.to_owned(),
        point: p.label(),
        unit: p.field_unit.clone(),
        native_unit: p.native_unit.clone(),
        declared,
        raw,
        error,
    }
}
