//! `command_id` idempotency (evaluation step 4).
//!
//! An in-memory index of recent command ids backed by the store. While the
//! index holds every retained receipt (`complete`), a miss is authoritative;
//! once it has evicted anything, a miss falls back to the store, so a replay of
//! an old command id is still recognised after a restart.

use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// What step 4 decided.
#[derive(Debug)]
pub enum Begin {
    /// A new command: it is now in flight under this id.
    Fresh,
    /// The same input under a completed id: answer the retained receipt.
    Replay(Value),
    /// Another input under this id, or the same id still in flight.
    Reuse(&'static str),
    /// Not in the index and the index is incomplete: ask the store.
    Unknown,
}

#[derive(Debug)]
enum Entry {
    InFlight {
        digest: String,
    },
    Done {
        digest: String,
        receipt: Option<Value>,
    },
}

/// The index. Bounded: at most `capacity` completed entries stay in memory.
#[derive(Debug)]
pub struct Index {
    /// Keys are shared with `order` (one allocation per id, not two).
    entries: HashMap<Arc<str>, Entry>,
    order: VecDeque<Arc<str>>,
    capacity: usize,
    complete: bool,
    /// Whether this endpoint is the only one on its store: another one may
    /// have run an id since this index was loaded, so with company a miss
    /// asks the store (`kernel/fleet.rs` keeps this current).
    alone: bool,
}

impl Index {
    /// An index; `complete` says whether it holds every retained receipt.
    pub fn new(capacity: usize, complete: bool) -> Self {
        assert!(capacity > 0);
        // Sized for the bound once: never rehashed while commands arrive,
        // and untouched slots cost no resident memory.
        Self {
            entries: HashMap::with_capacity(capacity.saturating_add(1)),
            order: VecDeque::with_capacity(capacity.saturating_add(1)),
            capacity,
            complete,
            alone: true,
        }
    }

    /// Whether other endpoints share the store (then a miss asks it).
    pub fn set_alone(&mut self, alone: bool) {
        self.alone = alone;
    }

    /// Whether the index holds no id at all (nothing answered yet).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Warms the index with a retained id (receipt loaded lazily).
    pub fn warm(&mut self, command_id: String, digest: String) {
        self.insert_done(Arc::from(command_id), digest, None);
    }

    /// Warms the index with a stored id the index does not hold yet (an
    /// entry it holds is newer knowledge: it stays as it is).
    pub fn warm_missing(&mut self, command_id: String, digest: String) {
        if !self.entries.contains_key(command_id.as_str()) {
            self.warm(command_id, digest);
        }
    }

    /// Step 4.
    pub fn begin(&mut self, command_id: &str, digest: &str) -> Begin {
        match self.entries.get(command_id) {
            Some(Entry::InFlight { digest: d }) if d != digest => Begin::Reuse("input_differs"),
            Some(Entry::InFlight { .. }) => Begin::Reuse("in_flight"),
            Some(Entry::Done { digest: d, .. }) if d != digest => Begin::Reuse("input_differs"),
            Some(Entry::Done {
                receipt: Some(r), ..
            }) => Begin::Replay(r.clone()),
            Some(Entry::Done { receipt: None, .. }) => Begin::Unknown,
            None if !self.complete || !self.alone => Begin::Unknown,
            None => {
                self.entries.insert(
                    Arc::from(command_id),
                    Entry::InFlight {
                        digest: digest.to_owned(),
                    },
                );
                Begin::Fresh
            }
        }
    }

    /// Marks an id in flight after the store confirmed it is unknown.
    pub fn claim(&mut self, command_id: &str, digest: &str) -> bool {
        if self.entries.contains_key(command_id) {
            return false;
        }
        self.entries.insert(
            Arc::from(command_id),
            Entry::InFlight {
                digest: digest.to_owned(),
            },
        );
        true
    }

    /// A refused command never becomes the outcome of its id.
    pub fn abort(&mut self, command_id: &str) {
        if matches!(self.entries.get(command_id), Some(Entry::InFlight { .. })) {
            self.entries.remove(command_id);
        }
    }

    /// Records the retained receipt of an id.
    pub fn complete(&mut self, command_id: &str, digest: &str, receipt: Value) {
        let (key, digest) = self.take_in_flight(command_id, digest);
        self.insert_done(key, digest, Some(receipt));
    }

    /// Records that the receipt of an id is durably stored; a replay reads it
    /// back from the store (`Begin::Unknown`), so memory holds only the digest.
    pub fn complete_stored(&mut self, command_id: &str, digest: &str) {
        let (key, digest) = self.take_in_flight(command_id, digest);
        self.insert_done(key, digest, None);
    }

    /// Removes `command_id`'s entry, reusing its key and (when equal) its
    /// digest instead of allocating them again.
    fn take_in_flight(&mut self, command_id: &str, digest: &str) -> (Arc<str>, String) {
        match self.entries.remove_entry(command_id) {
            Some((key, Entry::InFlight { digest: d } | Entry::Done { digest: d, .. }))
                if d == digest =>
            {
                (key, d)
            }
            Some((key, _)) => (key, digest.to_owned()),
            None => (Arc::from(command_id), digest.to_owned()),
        }
    }

    fn insert_done(&mut self, command_id: Arc<str>, digest: String, receipt: Option<Value>) {
        self.order.push_back(Arc::clone(&command_id));
        self.entries
            .insert(command_id, Entry::Done { digest, receipt });
        let mut evictions = 0usize;
        while self.order.len() > self.capacity && evictions < 1024 {
            evictions += 1;
            if let Some(old) = self.order.pop_front() {
                if matches!(self.entries.get(&old), Some(Entry::Done { .. })) {
                    self.entries.remove(&old);
                    self.complete = false;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn replay_needs_the_same_digest_and_reuse_is_refused() {
        let mut ix = Index::new(4, true);
        assert!(matches!(ix.begin("c1", "d1"), Begin::Fresh));
        assert!(matches!(ix.begin("c1", "d1"), Begin::Reuse("in_flight")));
        ix.complete("c1", "d1", json!({"status": "completed"}));
        assert!(matches!(ix.begin("c1", "d1"), Begin::Replay(_)));
        assert!(matches!(
            ix.begin("c1", "d2"),
            Begin::Reuse("input_differs")
        ));
    }

    #[test]
    fn an_aborted_command_leaves_its_id_free() {
        let mut ix = Index::new(4, true);
        assert!(matches!(ix.begin("c1", "d1"), Begin::Fresh));
        ix.abort("c1");
        assert!(matches!(ix.begin("c1", "d2"), Begin::Fresh));
    }

    #[test]
    fn eviction_makes_misses_ask_the_store() {
        let mut ix = Index::new(2, true);
        for i in 0..3 {
            ix.complete(&format!("c{i}"), "d", json!({}));
        }
        assert!(matches!(ix.begin("c0", "d"), Begin::Unknown));
        assert!(matches!(ix.begin("zz", "d"), Begin::Unknown));
    }
}
