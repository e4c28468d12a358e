//! After the rebuild: each index table of the file compared with the rebuilt one, in key
//! order, streaming (a chunk of the file's entries at a time). An entry the events imply
//! that the file lacked is `added`, one the file held that they do not imply `removed`,
//! one whose value differs `changed`; counted per table, so that a dry run reports the
//! index entries a repair changes even when every operation answers as before (a lost
//! timer, a stale window), as `verify` reports them.
//!
//! Values are compared as records (a receipt or scope stored by an older format is not a
//! change); entries in a range of the file that could not be read are not counted (the
//! range is reported as unreadable).

use std::ops::Bound;

use crate::check::source::Gap;
use crate::error::Result;
use crate::index::{self, Layered, Table};

use super::IndexChanges;
use super::rebuild::Build;

/// The file's entries read at a time.
const CHUNK: usize = 4096;

impl Build<'_> {
    /// Compares every index table of the file with the rebuilt one (written out: call it
    /// after the last batch), and puts the tables that differ in the report.
    pub(super) fn compare_indexes(&mut self) -> Result<()> {
        self.compare_index::<index::Receipts>(|k, old, new| {
            matches!(
                (index::decode_receipt(k, old), index::decode_receipt(k, new)),
                (Ok(a), Ok(b)) if a == b
            )
        })?;
        self.compare_index::<index::Scopes>(|k, old, new| {
            matches!(
                (index::decode_scope(k, old), index::decode_scope(k, new)),
                (Ok(a), Ok(b)) if a == b
            )
        })?;
        // The other index tables are sets: a key is the whole entry.
        self.compare_index::<index::OpEvents>(|_, (), ()| true)?;
        self.compare_index::<index::Timers>(|_, (), ()| true)?;
        self.compare_index::<index::ScopeTimers>(|_, (), ()| true)?;
        self.compare_index::<index::Windows>(|_, (), ()| true)?;
        self.compare_index::<index::Holds>(|_, (), ()| true)?;
        self.compare_index::<index::InDoubt>(|_, (), ()| true)?;
        Ok(())
    }

    /// Merges table `T` of the file (as its writer left it, the log laid over it) with the
    /// rebuilt one, both in key order; `same` tells whether two values under one key are the
    /// same entry.
    fn compare_index<T: Table>(
        &mut self,
        same: impl Fn(&T::K, &T::V, &T::V) -> bool,
    ) -> Result<()> {
        let mut c = IndexChanges {
            table: T::NAME.to_string(),
            added: 0,
            removed: 0,
            changed: 0,
        };
        let mut gaps: Vec<Gap<T::K>> = Vec::new();
        let mut after: Option<T::K> = None;
        let mut old: Vec<(T::K, T::V)> = Vec::new();
        loop {
            let chunk = self.src.read_range::<T>(after.as_ref(), CHUNK, &mut old)?;
            gaps.extend(chunk.gaps);
            // The rebuilt entries in the key range this chunk of the file covers.
            let lo = after.as_ref().map_or(Bound::Unbounded, Bound::Excluded);
            let hi = chunk
                .resume
                .as_ref()
                .map_or(Bound::Unbounded, Bound::Included);
            let mut old_entries = old.drain(..).peekable();
            self.out.view(|snap| -> Result<()> {
                for entry in snap.range::<T>(lo, hi)? {
                    let (k, v) = entry?;
                    while old_entries.next_if(|(ok, _)| *ok < k).is_some() {
                        c.removed += 1;
                    }
                    match old_entries.next_if(|(ok, _)| *ok == k) {
                        Some((_, ov)) if !same(&k, &ov, &v) => c.changed += 1,
                        Some(_) => {}
                        None if gaps.iter().any(|g| g.contains(&k)) => {}
                        None => c.added += 1,
                    }
                }
                Ok(())
            })?;
            c.removed += old_entries.count() as u64;
            match chunk.resume {
                Some(k) => after = Some(k),
                None => break,
            }
        }
        if c.added + c.removed + c.changed > 0 {
            self.report.index_changes.push(c);
        }
        Ok(())
    }
}
