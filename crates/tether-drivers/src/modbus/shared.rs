//! What the driver's tasks share: the register map and the device's
//! mirror (readings, link, watchdog feed, stop epoch — `crate::mirror`),
//! keyed by register table and address.
//!
//! **Owns:** how a Modbus point names its mirrored reading.
//! **Never here:** I/O (see `tasks`).

use super::codec::{Native, Point, Table};
use super::map::Map;
use crate::mirror::{Enabled, Mirror};

/// A mirrored point: its table and first address.
pub type Key = (Table, u16);

/// One mirrored reading.
pub type Sample = crate::mirror::Sample<Native>;

/// State shared by the driver and its tasks.
#[derive(Debug)]
pub struct Shared {
    /// The checked map.
    pub map: Map,
    mirror: Mirror<Key, Native>,
}

impl std::ops::Deref for Shared {
    type Target = Mirror<Key, Native>;
    fn deref(&self) -> &Self::Target {
        &self.mirror
    }
}

/// The mirror key of a point.
pub fn key(p: &Point) -> Key {
    (p.table, p.address)
}

impl Shared {
    /// Fresh state (see [`Mirror::new`]).
    pub fn new(map: Map) -> Self {
        let enabled = map.watchdog.as_ref().and_then(|wd| {
            let field = map
                .resources
                .values()
                .flatten()
                .find(|f| f.name == wd.enabled_field)?;
            Some(Enabled {
                key: key(&field.point),
                disabled: Native::Bit(false),
            })
        });
        Self {
            mirror: Mirror::new(map.stale, enabled),
            map,
        }
    }
}
