//! The replay cache: terminal answers (the stored receipt and its result) kept in memory,
//! so that a client re-asking an operation it already got (the reconnect storms of the
//! failure window) is answered without reading the index. Bounded by bytes (a builder
//! setting), evicting with the CLOCK policy (a second chance for entries read since the
//! last sweep). An answer is kept only when its id is asked a second time (a small table
//! of recently missed ids is the doorkeeper), so lookups spread over many ids, which the
//! cache cannot help, do not pay for filling it.
//!
//! Coherence: an entry is inserted only while the reader holds the committed state's read
//! lock, and every commit removes the entries of the receipts it changes while it holds the
//! write lock, before any caller sees the commit. So an entry is always the committed
//! receipt; the clocks and the pending deliveries and acknowledgements are applied on top
//! at each read, as for a receipt read from the index.

use std::collections::{HashMap, VecDeque};

use crate::record::ReceiptRecord;
use crate::types::OpResult;

/// Bytes an entry costs besides its strings and result, roughly.
const ENTRY_OVERHEAD: usize = 256;

#[derive(Debug)]
struct Entry {
    rec: ReceiptRecord,
    result: OpResult,
    size: usize,
    referenced: bool,
}

/// A byte-bounded cache of terminal receipts and their results, by operation id.
#[derive(Debug, Default)]
pub(crate) struct ReplayCache {
    capacity: usize,
    bytes: usize,
    map: HashMap<String, Entry>,
    /// Ids in insertion order for the CLOCK sweep; may hold ids already removed.
    ring: VecDeque<String>,
    hits: u64,
    misses: u64,
    /// Hashes of ids missed recently, by slot: an id missed twice is admitted.
    doorkeeper: Vec<u64>,
}

/// Slots of the doorkeeper.
const DOORKEEPER_SLOTS: usize = 4096;

fn id_hash(id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    h.finish() | 1
}

impl ReplayCache {
    pub(crate) fn new(capacity: usize) -> ReplayCache {
        ReplayCache {
            capacity,
            ..ReplayCache::default()
        }
    }

    /// The cached receipt and result of `id`.
    pub(crate) fn get(&mut self, id: &str) -> Option<(ReceiptRecord, OpResult)> {
        match self.map.get_mut(id) {
            Some(e) => {
                e.referenced = true;
                self.hits += 1;
                Some((e.rec.clone(), e.result.clone()))
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Whether an answer for `id`, just read from the index, is worth keeping: the id was
    /// missed before, not long ago. Remembers the id otherwise.
    pub(crate) fn admit(&mut self, id: &str) -> bool {
        if self.capacity == 0 {
            return false;
        }
        if self.doorkeeper.is_empty() {
            self.doorkeeper = vec![0; DOORKEEPER_SLOTS];
        }
        let h = id_hash(id);
        let slot = &mut self.doorkeeper[(h as usize) % DOORKEEPER_SLOTS];
        if *slot == h {
            *slot = 0;
            true
        } else {
            *slot = h;
            false
        }
    }

    /// Keeps `rec` and its `result`, evicting as needed. An entry larger than a quarter of
    /// the cache is not kept.
    pub(crate) fn insert(&mut self, rec: &ReceiptRecord, result: &OpResult) {
        let size = ENTRY_OVERHEAD
            + 2 * rec.operation_id.len()
            + rec.intent_name.len()
            + rec.scope.as_ref().map_or(0, String::len)
            + rec.session.as_ref().map_or(0, String::len)
            + result.bytes.len()
            + result
                .changed_assets
                .iter()
                .map(|a| a.len() + 24)
                .sum::<usize>();
        if size > self.capacity / 4 {
            return;
        }
        self.remove(&rec.operation_id);
        while self.bytes + size > self.capacity {
            if !self.evict_one() {
                return;
            }
        }
        self.bytes += size;
        self.map.insert(
            rec.operation_id.clone(),
            Entry {
                rec: rec.clone(),
                result: result.clone(),
                size,
                referenced: false,
            },
        );
        self.ring.push_back(rec.operation_id.clone());
        if self.ring.len() > 2 * self.map.len() + 64 {
            // Ids removed by invalidation pile up in the ring: drop them.
            let map = &self.map;
            self.ring.retain(|id| map.contains_key(id));
        }
    }

    /// Forgets `id` (its receipt changed).
    pub(crate) fn remove(&mut self, id: &str) {
        if let Some(e) = self.map.remove(id) {
            self.bytes -= e.size;
        }
    }

    /// Evicts one entry, giving entries read since the last sweep a second chance.
    /// `false` when the cache is empty.
    fn evict_one(&mut self) -> bool {
        while let Some(id) = self.ring.pop_front() {
            let Some(e) = self.map.get_mut(&id) else {
                continue;
            };
            if e.referenced {
                e.referenced = false;
                self.ring.push_back(id);
                continue;
            }
            self.remove(&id);
            return true;
        }
        false
    }

    /// Bytes held, entries, hits and misses since the journal was opened.
    pub(crate) fn figures(&self) -> (usize, usize, u64, u64) {
        (self.bytes, self.map.len(), self.hits, self.misses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Timestamp;
    use crate::record::{ExecRecord, IntentDigest};

    fn rec(id: &str) -> ReceiptRecord {
        ReceiptRecord {
            operation_id: id.into(),
            attempt: 1,
            intent_name: "x".into(),
            intent_hash: IntentDigest::LOST,
            scope: None,
            session: None,
            base_revision: None,
            epoch: 1,
            hold_until_ack: false,
            submitted_at: Timestamp(0),
            state: ExecRecord::Running {
                lease_until: Timestamp(0),
            },
        }
    }

    fn result(n: usize) -> OpResult {
        OpResult {
            bytes: vec![7; n],
            changed_assets: Vec::new(),
        }
    }

    #[test]
    fn the_cache_never_holds_more_bytes_than_its_bound() {
        let mut c = ReplayCache::new(64 << 10);
        for i in 0..1000 {
            c.insert(&rec(&format!("op_{i}")), &result(1000));
            let (bytes, ..) = c.figures();
            assert!(bytes <= 64 << 10, "{bytes} bytes held");
        }
        let (_, entries, ..) = c.figures();
        assert!(entries > 10 && entries < 64, "{entries} entries");
    }

    #[test]
    fn an_entry_read_since_the_last_sweep_outlives_one_that_was_not() {
        let mut c = ReplayCache::new(4 * 1300 + 100);
        for id in ["a", "b", "c", "d"] {
            c.insert(&rec(id), &result(1000));
        }
        assert!(c.get("a").is_some());
        c.insert(&rec("e"), &result(1000));
        assert!(c.get("a").is_some(), "the entry read was kept");
        assert!(c.get("b").is_none(), "the oldest unread entry was evicted");
    }

    #[test]
    fn a_removed_entry_is_gone_and_its_bytes_freed() {
        let mut c = ReplayCache::new(1 << 20);
        c.insert(&rec("a"), &result(500));
        c.remove("a");
        assert!(c.get("a").is_none());
        assert_eq!(c.figures().0, 0);
        // Removing again, or an unknown id, changes nothing.
        c.remove("a");
        assert_eq!(c.figures().0, 0);
    }

    #[test]
    fn an_id_is_admitted_when_it_is_missed_a_second_time() {
        let mut c = ReplayCache::new(1 << 20);
        assert!(!c.admit("a"), "a first miss only remembers the id");
        assert!(c.admit("a"), "a second miss admits it");
        assert!(!c.admit("a"), "admission is not remembered twice");
        assert!(!ReplayCache::new(0).admit("a") && !ReplayCache::new(0).admit("a"));
    }

    #[test]
    fn an_entry_larger_than_a_quarter_of_the_cache_is_not_kept() {
        let mut c = ReplayCache::new(4096);
        c.insert(&rec("big"), &result(2000));
        assert!(c.get("big").is_none());
    }
}
