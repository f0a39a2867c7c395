//! `tether probe` for OPC UA: every mapped field, interlock and the watchdog
//! node read once from the live device, in declared units beside the raw
//! values. Opens one session of its own and writes nothing.

use super::config::Map;
use super::node::Node;
use super::tasks::Lane;
use crate::mapping::Point as _;
use crate::ProbeRow;
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_core::manifest::DeviceManifest;

/// Reads every mapped node once, in one request bounded by `timeout` (and
/// as long again to open the session).
///
/// # Errors
/// The map's defects, or a device that cannot be reached at all.
pub async fn probe(manifest: &DeviceManifest, timeout: Duration) -> Result<Vec<ProbeRow>, String> {
    let mut map = Map::load(manifest)?;
    map.connect_timeout = timeout;
    map.request_timeout = timeout;
    let map = Arc::new(map);
    let mut named: Vec<(String, Node, Option<Value>)> = Vec::new();
    for (rid, fields) in &map.resources {
        for f in fields {
            named.push((format!("{rid}.{}", f.name), f.point.clone(), None));
        }
    }
    for il in &map.interlocks {
        named.push((
            format!("interlock {}", il.id),
            il.point.clone(),
            Some(il.closed.clone()),
        ));
    }
    if let Some(wd) = &map.watchdog {
        named.push(("watchdog".into(), wd.point.clone(), None));
    }
    let nodes: Vec<Node> = named.iter().map(|(_, n, _)| n.clone()).collect();
    let mut lane = Lane::new(map.clone(), &manifest.device_id)?;
    let readings = lane
        .read(&nodes, Instant::now() + timeout * 2)
        .await
        .map_err(|e| format!("{}: {e}", map.endpoint))?;
    Ok(named
        .into_iter()
        .zip(readings)
        .map(|((name, node, closed), reading)| row(name, &node, closed.as_ref(), reading))
        .collect())
}

fn row(
    name: String,
    n: &Node,
    closed: Option<&Value>,
    reading: Result<super::node::UaValue, String>,
) -> ProbeRow {
    let (declared, raw, error) = match reading {
        Ok(v) => match n.decode(&v) {
            Ok(d) => {
                let d = match closed {
                    Some(c) => {
                        let is_closed = n.encode(c).is_ok_and(|cv| cv == v);
                        Value::from(if is_closed { "closed" } else { "open" })
                    }
                    None => d,
                };
                (d, v.to_json(), None)
            }
            Err(e) => (Value::Null, v.to_json(), Some(e)),
        },
        Err(e) => (Value::Null, Value::Null, Some(e)),
    };
    ProbeRow {
        name,
        point: n.label(),
        unit: n.field_unit.clone(),
        native_unit: n.native_unit.clone(),
        declared,
        raw,
        error,
    }
}
