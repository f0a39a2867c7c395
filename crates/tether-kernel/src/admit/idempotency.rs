//! `command_id` idempotency (evaluation step 4).
//!
//! An in-memory index of recent command ids backed by the store. While the
//! index holds every retained receipt (`complete`), a miss is authoritative;
//! once it has evicted anything, a miss falls back to the store, so a replay of
//! an old command id is still recognised after a restart.

use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use tether_core::recent::RecentMap;

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

/// A completed id: the digest of its input, and its receipt while memory
/// keeps it (`None`: read it back from the store).
#[derive(Debug)]
struct Done {
    digest: String,
    receipt: Option<Value>,
}

/// The index. Bounded: at most `capacity` completed entries stay in memory.
///
/// Completed ids live in a [`RecentMap`] (two generations, only ever added
/// to, so no call rehashes a whole map under the kernel's index lock; its
/// text says why); memory keeps between half and all of the newest
/// `capacity` ids. Ids in flight, which do come and go, sit in a small map
/// of their own, as large as the concurrency.
#[derive(Debug)]
pub struct Index {
    /// Ids whose command is running, with their input's digest.
    in_flight: HashMap<Arc<str>, String>,
    done: RecentMap<Arc<str>, Done>,
    /// Whether the index held every retained receipt when loaded.
    loaded_complete: bool,
    /// Whether this endpoint is the only one on its store: another one may
    /// have run an id since this index was loaded, so with company a miss
    /// asks the store (`kernel/fleet.rs` keeps this current).
    alone: bool,
}

impl Index {
    /// An index; `complete` says whether it holds every retained receipt.
    pub fn new(capacity: usize, complete: bool) -> Self {
        assert!(capacity > 0);
        Self {
            in_flight: HashMap::new(),
            done: RecentMap::new(capacity),
            loaded_complete: complete,
            alone: true,
        }
    }

    /// Whether a miss is authoritative: every retained receipt was loaded
    /// and none has been forgotten since.
    fn misses_are_authoritative(&self) -> bool {
        self.loaded_complete && !self.done.has_forgotten()
    }

    /// Whether other endpoints share the store (then a miss asks it).
    pub fn set_alone(&mut self, alone: bool) {
        self.alone = alone;
    }

    /// Whether the index holds no id at all (nothing answered yet).
    pub fn is_empty(&self) -> bool {
        self.in_flight.is_empty() && self.done.is_empty()
    }

    /// Warms the index with a retained id (receipt loaded lazily).
    pub fn warm(&mut self, command_id: String, digest: String) {
        self.insert_done(Arc::from(command_id), digest, None);
    }

    /// Warms the index with a stored id the index does not hold yet (an
    /// entry it holds is newer knowledge: it stays as it is).
    pub fn warm_missing(&mut self, command_id: String, digest: String) {
        if !self.holds(&command_id) {
            self.warm(command_id, digest);
        }
    }

    fn holds(&self, command_id: &str) -> bool {
        self.in_flight.contains_key(command_id) || self.done(command_id).is_some()
    }

    /// The newest completion of an id memory still keeps.
    fn done(&self, command_id: &str) -> Option<&Done> {
        self.done.get(command_id)
    }

    /// Step 4.
    pub fn begin(&mut self, command_id: &str, digest: &str) -> Begin {
        if let Some(d) = self.in_flight.get(command_id) {
            return Begin::Reuse(if d == digest {
                "in_flight"
            } else {
                "input_differs"
            });
        }
        match self.done(command_id) {
            Some(d) if d.digest != digest => Begin::Reuse("input_differs"),
            Some(Done {
                receipt: Some(r), ..
            }) => Begin::Replay(r.clone()),
            Some(Done { receipt: None, .. }) => Begin::Unknown,
            None if !self.misses_are_authoritative() || !self.alone => Begin::Unknown,
            None => {
                self.in_flight
                    .insert(Arc::from(command_id), digest.to_owned());
                Begin::Fresh
            }
        }
    }

    /// Marks an id in flight after the store confirmed it is unknown.
    pub fn claim(&mut self, command_id: &str, digest: &str) -> bool {
        if self.holds(command_id) {
            return false;
        }
        self.in_flight
            .insert(Arc::from(command_id), digest.to_owned());
        true
    }

    /// A refused command never becomes the outcome of its id.
    pub fn abort(&mut self, command_id: &str) {
        self.in_flight.remove(command_id);
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

    /// Takes `command_id` out of flight, reusing its key and (when equal)
    /// its digest instead of allocating them again.
    fn take_in_flight(&mut self, command_id: &str, digest: &str) -> (Arc<str>, String) {
        match self.in_flight.remove_entry(command_id) {
            Some((key, d)) if d == digest => (key, d),
            Some((key, _)) => (key, digest.to_owned()),
            None => (Arc::from(command_id), digest.to_owned()),
        }
    }

    fn insert_done(&mut self, command_id: Arc<str>, digest: String, receipt: Option<Value>) {
        // Completed again (a warm entry, then its run): the newer knowledge
        // replaces it.
        self.done.insert(command_id, Done { digest, receipt });
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

    /// Completed ids memory holds.
    fn held(ix: &Index) -> usize {
        ix.done.len()
    }

    #[test]
    fn memory_keeps_at_most_the_bound_and_at_least_the_newest_half() {
        for capacity in [1, 2, 3, 5, 64, 1000] {
            let mut ix = Index::new(capacity, true);
            for i in 0..capacity * 7 + 3 {
                ix.complete_stored(&format!("c{i}"), "d");
                assert!(held(&ix) <= capacity, "capacity {capacity}, id {i}");
                // The newest half (rounded up) is always known.
                for back in 0..capacity.div_ceil(2).min(i + 1) {
                    let id = format!("c{}", i - back);
                    assert!(
                        ix.done(&id).is_some(),
                        "capacity {capacity}: {id} after c{i}"
                    );
                }
            }
            assert!(
                !ix.misses_are_authoritative(),
                "capacity {capacity}: something was evicted"
            );
            assert!(matches!(ix.begin("c0", "d"), Begin::Unknown));
        }
    }

    #[test]
    fn an_id_in_flight_outlives_any_number_of_rotations() {
        let mut ix = Index::new(4, true);
        assert!(matches!(ix.begin("slow", "d"), Begin::Fresh));
        for i in 0..50 {
            ix.complete(&format!("c{i}"), "d", json!({"n": i}));
        }
        assert!(matches!(ix.begin("slow", "d"), Begin::Reuse("in_flight")));
        assert!(matches!(
            ix.begin("slow", "e"),
            Begin::Reuse("input_differs")
        ));
        ix.complete("slow", "d", json!({"status": "completed"}));
        assert!(matches!(ix.begin("slow", "d"), Begin::Replay(_)));
    }

    #[test]
    fn churn_never_grows_a_generation_and_the_retired_one_drains() {
        // The point of the generations: with one id evicted for each one
        // added, no map is ever resized or rehashed (a resize would show
        // as a larger capacity), and what is retired is gone within one
        // generation's worth of completions.
        let capacity = 1000;
        let mut ix = Index::new(capacity, true);
        let sized = ix.done.young_slots();
        let mut retired_seen = false;
        for i in 0..capacity * 20 {
            assert!(matches!(
                ix.begin(&format!("c{i}"), "d"),
                Begin::Fresh | Begin::Unknown
            ));
            ix.claim(&format!("c{i}"), "d");
            ix.complete_stored(&format!("c{i}"), "d");
            assert_eq!(ix.done.young_slots(), sized, "after c{i}");
            assert!(ix.done.old_slots() <= sized, "after c{i}");
            retired_seen |= ix.done.retiring_len() > 0;
            if i % capacity == capacity - 1 {
                assert!(ix.done.retiring_len() <= capacity / 2);
            }
        }
        assert!(retired_seen);
        assert!(ix.in_flight.is_empty());
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
