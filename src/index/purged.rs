//! Deferred purges: events and results a compaction pass deleted that are still in redb's
//! tables, hidden from every read until a checkpoint removes them.
//!
//! A compaction pass over a journal whose retention passed for most of its history visits
//! the operations in id order (one read of each receipt page), so their events and results,
//! keyed by sequence number, are anywhere in their tables: each checkpoint of such a pass
//! rewrote nearly every leaf of `events` and `results`, once per checkpoint (17 times over
//! for 100,000 purged operations with random ids). While a pass runs, a checkpoint instead
//! adds the sequence numbers of the events and results it deletes to these sets, stored in
//! the `meta` table's `purged` entry in the same transaction, and the checkpoint after the
//! pass removes them all in one pass over each table.
//!
//! Invariants: each set holds only keys its table holds (a checkpoint adds a key only after
//! finding it), so a table's entry count is its length less its set's; a key is never put
//! again once deleted (sequence numbers only grow), and a put of a key in a set takes it
//! out anyway. While a set is not empty the file's format record says
//! [`FORMAT_PENDING_PURGES`], which a build that does not know the sets refuses.

use redb::{ReadableTable as _, WriteTransaction};
use roaring::RoaringTreemap;
use serde::{Deserialize, Serialize};

use crate::codec::{self, RecordKind};
use crate::error::{Error, Result};

/// The `meta` key of the sets.
pub(crate) const KEY: &str = "purged";

/// The format version a file says while it holds deferred purges: format 3 plus the
/// `purged` entry, which a reader must apply to `events` and `results`.
pub(crate) const FORMAT_PENDING_PURGES: u32 = 4;

/// The format version a file says while a writer may keep records in its second log file
/// (`<journal>-log2`), which a build that knows one log file would not read: format 3,
/// deferred purges or not (a reader tells them by the `purged` entry).
pub(crate) const FORMAT_TWO_LOGS: u32 = 5;

/// The format version the file's state calls for: [`FORMAT_TWO_LOGS`] while `two_logs`,
/// else [`FORMAT_PENDING_PURGES`] while purges are pending, else format 3.
fn marked_version(two_logs: bool, pending: bool) -> u32 {
    if two_logs {
        FORMAT_TWO_LOGS
    } else if pending {
        FORMAT_PENDING_PURGES
    } else {
        u32::from(codec::FORMAT_VERSION)
    }
}

/// Makes the file's format record say whether a writer may keep records in a second log
/// file (see [`FORMAT_TWO_LOGS`]): called by every checkpoint of a file journal, with
/// `two_logs` false at a clean close (which removes both logs). Writes only when the
/// version changes.
///
/// Returns whether the file says [`FORMAT_TWO_LOGS`] with the transaction, and whether the
/// record changed: a file of a format before 3 (upgraded by the writer's open, after the
/// checkpoints that may come first) is left as it is.
///
/// # Errors
///
/// redb's errors; a format record that does not decode.
pub(crate) fn mark_two_logs(txn: &WriteTransaction, two_logs: bool) -> Result<Marked> {
    let mut meta = txn.open_table(<super::Meta as super::Table>::def())?;
    let pending = meta.get(KEY)?.is_some();
    let unmarked = Marked {
        two_logs: false,
        changed: false,
    };
    let Some(stored) = meta.get("format")?.map(|v| v.value().to_vec()) else {
        return Ok(unmarked);
    };
    let mut format = super::decode_format_raw(&stored)?;
    if format.format_version < u32::from(codec::FORMAT_VERSION) {
        return Ok(unmarked);
    }
    let want = marked_version(two_logs, pending);
    let changed = format.format_version != want;
    if changed {
        format.format_version = want;
        meta.insert(
            "format",
            codec::encode(RecordKind::Meta, &format).as_slice(),
        )?;
    }
    Ok(Marked {
        two_logs: want == FORMAT_TWO_LOGS,
        changed,
    })
}

/// What [`mark_two_logs`] left.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Marked {
    /// The file says [`FORMAT_TWO_LOGS`].
    pub(crate) two_logs: bool,
    /// The format record was rewritten.
    pub(crate) changed: bool,
}

/// The stored form: each set in the portable serialization of 64-bit Roaring bitmaps.
#[derive(Serialize, Deserialize)]
struct PurgedRecord {
    events: Vec<u8>,
    results: Vec<u8>,
}

/// The sequence numbers deleted from `events` and `results` but still in their tables.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Purged {
    pub(crate) events: RoaringTreemap,
    pub(crate) results: RoaringTreemap,
}

impl Purged {
    pub(crate) fn is_empty(&self) -> bool {
        self.events.is_empty() && self.results.is_empty()
    }

    /// The set of the table numbered `table`, if it has one and it is not empty.
    pub(crate) fn of(&self, table: u8) -> Option<&RoaringTreemap> {
        let set = match table {
            t if t == <super::Events as super::Table>::ID => &self.events,
            t if t == <super::Results as super::Table>::ID => &self.results,
            _ => return None,
        };
        (!set.is_empty()).then_some(set)
    }

    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        let bytes = |set: &RoaringTreemap| -> Result<Vec<u8>> {
            let mut out = Vec::with_capacity(set.serialized_size());
            set.serialize_into(&mut out)
                .map_err(|e| Error::io_during("encode the deferred purges", e))?;
            Ok(out)
        };
        Ok(codec::encode(
            RecordKind::Meta,
            &PurgedRecord {
                events: bytes(&self.events)?,
                results: bytes(&self.results)?,
            },
        ))
    }

    /// Decodes the stored entry; damage is a typed `Corrupt` error for `meta`/`purged`.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Purged> {
        let rec: PurgedRecord = super::decode_meta(KEY, bytes)?;
        let set = |b: &[u8], what: &str| {
            // The checked deserialization: a damaged container is an error, not a panic.
            RoaringTreemap::deserialize_from(b).map_err(|e| {
                Error::corrupt("meta", KEY, format!("the {what} set does not decode: {e}"))
            })
        };
        Ok(Purged {
            events: set(&rec.events, "events")?,
            results: set(&rec.results, "results")?,
        })
    }

    /// The sets stored in `txn`'s `meta` table (empty when there is no entry).
    pub(crate) fn read_in(txn: &WriteTransaction) -> Result<Purged> {
        let meta = txn.open_table(<super::Meta as super::Table>::def())?;
        let stored = meta.get(KEY)?;
        match stored {
            Some(v) => Purged::decode(v.value()),
            None => Ok(Purged::default()),
        }
    }

    /// Stores the sets in `txn` (removes the entry when they are empty) and makes the format
    /// record say whether the file holds deferred purges: [`FORMAT_PENDING_PURGES`] while
    /// it does, the format it had before when it no longer does.
    pub(crate) fn write_in(&self, txn: &WriteTransaction) -> Result<()> {
        let mut meta = txn.open_table(<super::Meta as super::Table>::def())?;
        let had = meta.get(KEY)?.is_some();
        if self.is_empty() {
            if had {
                meta.remove(KEY)?;
            }
        } else {
            meta.insert(KEY, self.encode()?.as_slice())?;
        }
        if had != self.is_empty() {
            return Ok(());
        }
        // The pending format while the sets are not empty; format 3 (the only format that
        // defers purges) again once they are.
        let Some(stored) = meta.get("format")?.map(|v| v.value().to_vec()) else {
            return Ok(());
        };
        let mut format = super::decode_format_raw(&stored)?;
        if format.format_version == FORMAT_TWO_LOGS {
            // The two-log mark says more than the pending purges' (see `mark_two_logs`).
            return Ok(());
        }
        format.format_version = marked_version(false, !self.is_empty());
        meta.insert(
            "format",
            codec::encode(RecordKind::Meta, &format).as_slice(),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deferred_purges_round_trip_and_damage_is_a_typed_error() -> Result<()> {
        let mut p = Purged::default();
        p.events.extend([1u64, 2, 3, 1 << 40, u64::MAX]);
        p.results.insert(7);
        let bytes = p.encode()?;
        assert_eq!(Purged::decode(&bytes)?, p);
        // Every truncation fails with an error naming the entry, never a panic.
        for len in 0..bytes.len() {
            let e = Purged::decode(&bytes[..len]).expect_err("a truncated entry");
            assert!(e.to_string().contains("purged"), "{e}");
        }
        Ok(())
    }
}
