//! The cross-checks of a clean journal without point lookups.
//!
//! Three checks match two tables entry for entry: every event of an operation has its
//! `op_events` entry and every entry names such an event; every result a receipt keeps
//! out of line is in `results` with the length, CRC and asset count its completion
//! recorded, and every result is kept by its receipt; every index entry a receipt implies
//! is in `timers`, `windows`, `scope_holds` or `in_doubt`, and every entry there is
//! implied. Checked by point lookups, each is a random read per entry: most of `verify`'s
//! time on a journal larger than the inspector's page cache.
//!
//! Each check holds exactly when the two sides are the same set. So the first run of the
//! passes adds a keyed hash of each side's entries to a sum, one side added and the other
//! taken away, and reads both tables in their own order: when every sum is zero and nothing
//! else was found, both sides are equal and the checks hold. Two sides that differ leave a
//! sum of zero with a chance of about 2⁻¹²⁸ (two lanes of 64 bits, each keyed at random
//! for this run, so no file can be made to collide). Any finding, or a sum that is not
//! zero, runs the passes again with the point lookups, which name what is wrong: a
//! damaged journal gets the same report as without this run.

use std::hash::{BuildHasher, Hash, RandomState};

/// The pairs of sides that must hold the same entries.
#[derive(Clone, Copy)]
pub(super) enum Cross {
    /// Events of an operation (`(operation id, seq)`) and `op_events`.
    OpEvents = 0,
    /// Results kept out of line (`(seq, operation id, length, CRC, assets)`) and `results`.
    Results = 1,
    /// Index entries implied by receipts (`(table, key)`) and the four index tables.
    Index = 2,
}

/// One sum per [`Cross`], each two lanes of keyed 64-bit hashes.
pub(super) struct Digests {
    keys: [RandomState; 2],
    sums: [[u64; 2]; 3],
}

impl Digests {
    pub(super) fn new() -> Digests {
        Digests {
            keys: [RandomState::new(), RandomState::new()],
            sums: [[0; 2]; 3],
        }
    }

    /// Counts `entry` on the side that implies it.
    pub(super) fn implied(&mut self, cross: Cross, entry: impl Hash) {
        let sum = &mut self.sums[cross as usize];
        for (lane, key) in sum.iter_mut().zip(&self.keys) {
            *lane = lane.wrapping_add(key.hash_one(&entry));
        }
    }

    /// Counts `entry` on the side that stores it.
    pub(super) fn stored(&mut self, cross: Cross, entry: impl Hash) {
        let sum = &mut self.sums[cross as usize];
        for (lane, key) in sum.iter_mut().zip(&self.keys) {
            *lane = lane.wrapping_sub(key.hash_one(&entry));
        }
    }

    /// Whether every pair of sides held the same entries.
    pub(super) fn balanced(&self) -> bool {
        self.sums.iter().all(|s| *s == [0, 0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sums_balance_for_equal_sets_in_any_order_and_not_for_a_missing_or_changed_entry() {
        let entries: Vec<(String, u64)> = (0..1000).map(|i| (format!("op-{i}"), i * 3)).collect();
        let fill = |skip: Option<usize>, change: Option<usize>| {
            let mut d = Digests::new();
            for e in &entries {
                d.implied(Cross::OpEvents, (e.0.as_str(), e.1));
            }
            for (i, e) in entries.iter().enumerate().rev() {
                if Some(i) == skip {
                    continue;
                }
                let seq = if Some(i) == change { e.1 + 1 } else { e.1 };
                d.stored(Cross::OpEvents, (e.0.as_str(), seq));
            }
            d
        };
        assert!(
            fill(None, None).balanced(),
            "the same set, stored in reverse"
        );
        assert!(!fill(Some(500), None).balanced(), "an entry missing");
        assert!(!fill(None, Some(7)).balanced(), "an entry changed");
        let mut d = fill(None, None);
        d.stored(Cross::Index, ("in_doubt", "op-1"));
        assert!(
            !d.balanced(),
            "an entry only one side holds, in another pair"
        );
        d.implied(Cross::Results, ("in_doubt", "op-1"));
        assert!(!d.balanced(), "pairs do not cancel one another");
    }
}
