//! A bounded map of the most recently inserted entries, kept in two
//! generations.
//!
//! Tether keeps several memories of "what happened lately" under a lock that
//! every command takes: the idempotency index of completed command ids, the
//! summaries of finished operations, the gateway's finished invocations.
//! Each must be bounded, so for each entry added an old one goes.
//!
//! Why not one hash map with a FIFO of evictions (what these were before): a
//! map that has one entry removed for each one added fills with tombstones
//! and, every so often, rehashes all of its slots in one call, under the
//! caller's lock. At 50,000 ids that call took 15–37 ms and every command
//! waited for it (the 21 s stall of the load soak, docs/PERFORMANCE.md).
//!
//! Here entries are added to `young` only. When `young` holds half the bound,
//! or both generations together hold all of it, `old` is retired and `young`
//! becomes `old`. A generation is sized for its share once and never grows,
//! so it never rehashes; a retired generation is dropped a few entries per
//! later insert, so no single call pays for all of it. Memory keeps at most
//! `capacity` entries and always the newest `ceil(capacity / 2)`.
//!
//! **Owns:** the bound and the order of forgetting. **Never belongs here:**
//! what a miss means (the owner asks its store, or answers unknown).

use std::borrow::Borrow;
use std::collections::hash_map::{HashMap, IntoIter};
use std::hash::Hash;

/// How many retired entries each insert drops. A generation holds at most
/// `ceil(capacity / 2)` entries and the next rotation comes at least
/// `max(1, capacity / 2)` inserts later, so four per insert always empty it
/// in time (what is left at a rotation is dropped then, still bounded by
/// one generation).
const RETIRE_PER_INSERT: usize = 4;

/// A bounded map of recent entries (see the module's text).
#[derive(Debug)]
pub struct RecentMap<K, V> {
    young: HashMap<K, V>,
    old: HashMap<K, V>,
    /// The generation retired last, being dropped a few entries at a time.
    retiring: Option<IntoIter<K, V>>,
    capacity: usize,
    /// Whether any entry has ever been forgotten.
    forgot: bool,
}

impl<K: Hash + Eq, V> RecentMap<K, V> {
    /// A map keeping at most `capacity` entries (at least one).
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            young: Self::generation(capacity),
            old: HashMap::new(),
            retiring: None,
            capacity,
            forgot: false,
        }
    }

    /// The most entries one generation takes.
    fn generation_max(capacity: usize) -> usize {
        capacity.div_ceil(2)
    }

    /// A generation sized for its share once: never rehashed while entries
    /// arrive, and its untouched slots cost no resident memory.
    fn generation(capacity: usize) -> HashMap<K, V> {
        HashMap::with_capacity(Self::generation_max(capacity).saturating_add(1))
    }

    /// The bound.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries held (an entry inserted again while its older copy is in
    /// `old` counts twice until that generation retires).
    #[must_use]
    pub fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }

    /// Whether nothing is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.young.is_empty() && self.old.is_empty()
    }

    /// Whether any entry has been forgotten since this map was made: then a
    /// miss proves nothing.
    #[must_use]
    pub fn has_forgotten(&self) -> bool {
        self.forgot
    }

    /// The newest value kept for `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.young.get(key).or_else(|| self.old.get(key))
    }

    /// The newest value kept for `key`, to change in place (its age stays).
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.young.get_mut(key) {
            Some(v) => Some(v),
            None => self.old.get_mut(key),
        }
    }

    /// Whether `key` is kept.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key).is_some()
    }

    /// Adds `key` as the newest entry (replacing a young one in place),
    /// forgetting the oldest ones beyond the bound.
    pub fn insert(&mut self, key: K, value: V) {
        self.retire_some();
        if let Some(slot) = self.young.get_mut(&key) {
            *slot = value;
            return;
        }
        // At most two rotations: after one `young` is empty, and after a
        // second `old` is too.
        for _ in 0..2 {
            let full = self.len() >= self.capacity
                || self.young.len() >= Self::generation_max(self.capacity);
            if !full {
                break;
            }
            self.rotate();
        }
        debug_assert!(self.len() < self.capacity);
        self.young.insert(key, value);
    }

    /// Retires `old` and makes `young` the old generation.
    fn rotate(&mut self) {
        let young = std::mem::replace(&mut self.young, Self::generation(self.capacity));
        let old = std::mem::replace(&mut self.old, young);
        if !old.is_empty() {
            self.forgot = true;
            self.retiring = Some(old.into_iter());
        }
    }

    fn retire_some(&mut self) {
        let Some(retiring) = self.retiring.as_mut() else {
            return;
        };
        if retiring.by_ref().take(RETIRE_PER_INSERT).count() < RETIRE_PER_INSERT {
            // Empty: its table goes now, in one free.
            self.retiring = None;
        }
    }

    /// Slots the young generation has room for (tests: it never grows).
    #[doc(hidden)]
    #[must_use]
    pub fn young_slots(&self) -> usize {
        self.young.capacity()
    }

    /// Slots of the old generation (tests: never more than a young one's).
    #[doc(hidden)]
    #[must_use]
    pub fn old_slots(&self) -> usize {
        self.old.capacity()
    }

    /// Retired entries not yet dropped (tests: it drains in time).
    #[doc(hidden)]
    #[must_use]
    pub fn retiring_len(&self) -> usize {
        self.retiring.as_ref().map_or(0, ExactSizeIterator::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_the_bound_and_always_the_newest_half() {
        for capacity in [1, 2, 3, 5, 64, 1000] {
            let mut m = RecentMap::new(capacity);
            for i in 0..capacity * 7 + 3 {
                m.insert(i, i * 10);
                assert!(m.len() <= capacity, "capacity {capacity}, entry {i}");
                for back in 0..capacity.div_ceil(2).min(i + 1) {
                    assert_eq!(m.get(&(i - back)), Some(&((i - back) * 10)));
                }
            }
            assert!(m.has_forgotten(), "capacity {capacity}");
            assert_eq!(m.get(&0), None);
        }
    }

    #[test]
    fn churn_never_grows_a_generation_and_the_retired_one_drains() {
        let capacity = 1000;
        let mut m = RecentMap::new(capacity);
        let sized = m.young_slots();
        let mut retired_seen = false;
        for i in 0..capacity * 20 {
            m.insert(format!("k{i}"), ());
            assert_eq!(m.young_slots(), sized, "after k{i}");
            assert!(m.old_slots() <= sized, "after k{i}");
            retired_seen |= m.retiring_len() > 0;
            if i % capacity == capacity - 1 {
                assert!(m.retiring_len() <= capacity / 2);
            }
        }
        assert!(retired_seen);
    }

    #[test]
    fn an_entry_inserted_again_reads_as_its_newest_value_and_changes_in_place() {
        let mut m = RecentMap::new(4);
        m.insert("a", 1);
        m.insert("b", 2);
        m.insert("c", 3); // `a` and `b` are old now.
        m.insert("a", 4);
        assert_eq!(m.get("a"), Some(&4));
        if let Some(v) = m.get_mut("b") {
            *v = 20;
        }
        assert_eq!(m.get("b"), Some(&20));
        assert!(!m.has_forgotten());
        assert!(m.len() <= 4);
    }

    #[test]
    fn a_bound_of_zero_keeps_one() {
        let mut m = RecentMap::new(0);
        m.insert(1, ());
        assert!(m.contains_key(&1));
        m.insert(2, ());
        assert!(m.contains_key(&2) && !m.contains_key(&1));
    }
}
