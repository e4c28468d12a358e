//! Checkpoints: the memtable written into redb's tables in one transaction
//! ([`checkpoint`]), and the tables created in a new file ([`create_tables`]).
//!
//! How the writes are made is what keeps the file small and the checkpoint fast: each
//! table's changes in key order, keys past a table's end appended through one cursor (so
//! redb packs them into full leaves), and deletions of neighbouring keys (events, results
//! and timers a compaction purged) removed in one pass per run instead of one per key, as
//! are receipts and `op_events` entries when a checkpoint removes a large share of them.

use redb::WriteTransaction;
use roaring::RoaringTreemap;
use smol_str::SmolStr;

use super::purged::Purged;

use super::tables::{
    Events, Holds, InDoubt, Memtable, Meta, OpEvents, Quarantine, Receipts, Results, ScopeTimers,
    Scopes, Table, TableKey, TableValue, Timers, Windows,
};
use crate::error::Result;

/// Creates every table that does not exist yet.
pub(crate) fn create_tables(txn: &WriteTransaction) -> Result<()> {
    macro_rules! create {
        ($t:ident) => {
            txn.open_table(<$t as Table>::def())?;
        };
    }
    super::tables::each_table!(create);
    Ok(())
}

/// Writes `changes` into redb's tables in `txn`: each table's changes in key order (how
/// B-trees like them). Deleted events and results come in runs of neighbouring keys (a
/// compaction purges operations in completion order, so their events and results sit side
/// by side), and so do fired timers: each run is removed in one cursor pass, which
/// rebuilds each B-tree leaf once instead of once per key.
///
/// With `defer` (a compaction pass is running), the deletions of events and results are
/// not made: their keys join the file's deferred purges (see `purged`), and the first
/// checkpoint without `defer` removes them all, each table in one pass.
pub(crate) fn checkpoint(txn: &WriteTransaction, changes: &Memtable, defer: bool) -> Result<()> {
    let mut purged = Purged::read_in(txn)?;
    let had = !purged.is_empty();
    // Every sequence number below the file's `next_seq` (as this transaction holds it,
    // before `changes`) was written to redb before `changes` (by an earlier commit, or by
    // a memtable written earlier in this transaction), and a deletion is only made of a
    // key reads show: so such a key is in its table. Above it, a key `changes` both put
    // and deleted is not, and only those are looked up.
    let written_below = if defer { next_seq_in(txn)? } else { 0 };
    write_table::<Meta>(txn, changes, remove_each::<Meta>)?;
    let Purged { events, results } = &mut purged;
    unhide_puts::<Events>(changes, events);
    unhide_puts::<Results>(changes, results);
    write_table::<Events>(txn, changes, |t, keys| {
        purge_seqs::<Events>(t, keys, events, defer, written_below)
    })?;
    write_table::<Receipts>(txn, changes, remove_many::<Receipts>)?;
    write_table::<Results>(txn, changes, |t, keys| {
        purge_seqs::<Results>(t, keys, results, defer, written_below)
    })?;
    write_table::<Scopes>(txn, changes, remove_each::<Scopes>)?;
    write_table::<OpEvents>(txn, changes, remove_many::<OpEvents>)?;
    write_table::<Timers>(txn, changes, remove_timers)?;
    write_table::<ScopeTimers>(txn, changes, remove_each::<ScopeTimers>)?;
    write_table::<Windows>(txn, changes, remove_each::<Windows>)?;
    write_table::<Holds>(txn, changes, remove_each::<Holds>)?;
    write_table::<InDoubt>(txn, changes, remove_each::<InDoubt>)?;
    write_table::<Quarantine>(txn, changes, remove_in_runs::<Quarantine>)?;
    if !defer && had {
        write_deferred::<Events>(txn, &mut purged.events)?;
        write_deferred::<Results>(txn, &mut purged.results)?;
    }
    if had || !purged.is_empty() {
        purged.write_in(txn)?;
    }
    Ok(())
}

/// Deletes `keys` (events' or results' sequence numbers) from `table`; with `defer`, the
/// keys the table holds join the deferred purges `set` instead and stay in the table
/// (without, the set is removed after every table is written: [`write_deferred`]). Leaves
/// `keys` empty.
fn purge_seqs<T: Table<K = u64>>(
    table: &mut WriteTable<'_, T>,
    keys: &mut Vec<u64>,
    set: &mut RoaringTreemap,
    defer: bool,
    written_below: u64,
) -> Result<()> {
    use redb::ReadableTable as _;
    if defer {
        for k in keys.drain(..) {
            // Only keys the table holds, so that its count is its length less the set's
            // (looked up only above `written_below`: see `checkpoint`).
            if k < written_below || table.get(k)?.is_some() {
                set.insert(k);
            }
        }
        return Ok(());
    }
    remove_in_runs::<T>(table, keys)
}

/// The `next_seq` of the state record `txn` holds (0 without one).
fn next_seq_in(txn: &WriteTransaction) -> Result<u64> {
    use redb::ReadableTable as _;
    let meta = txn.open_table(<Meta as Table>::def())?;
    let stored = meta.get("state")?;
    match stored {
        Some(v) => {
            Ok(super::decode_meta::<crate::record::StateRecord>("state", v.value())?.next_seq)
        }
        None => Ok(0),
    }
}

/// Removes the keys of a deferred purge set from `table` and empties the set: one pass from
/// its first key to its last when it is a large share of the table (see [`PASS_SHARE`]),
/// else in runs. The set is never listed beyond the table's size (a damaged one may claim
/// billions of keys in a few bytes).
fn remove_set<T: Table<K = u64>>(
    table: &mut WriteTable<'_, T>,
    set: &mut RoaringTreemap,
) -> Result<()> {
    use redb::ReadableTableMetadata as _;
    let (Some(first), Some(last)) = (set.min(), set.max()) else {
        return Ok(());
    };
    if set.len().saturating_mul(PASS_SHARE) >= table.len()? {
        table.retain_in(first..=last, |key, _| !set.contains(key))?;
    } else {
        let mut keys: Vec<u64> = set.iter().collect();
        remove_in_runs::<T>(table, &mut keys)?;
    }
    set.clear();
    Ok(())
}

/// Takes the keys `changes` puts into `T` out of its deferred purge set (sequence numbers
/// are never reused, so this finds none unless a file was edited by hand).
fn unhide_puts<T: Table<K = u64>>(changes: &Memtable, set: &mut RoaringTreemap) {
    if set.is_empty() {
        return;
    }
    for (k, v) in T::map(changes) {
        if v.is_some() {
            set.remove(*k);
        }
    }
}

/// Removes a deferred purge set from its table (a checkpoint outside a pass).
fn write_deferred<T: Table<K = u64>>(
    txn: &WriteTransaction,
    set: &mut RoaringTreemap,
) -> Result<()> {
    if set.is_empty() {
        return Ok(());
    }
    let mut table = txn.open_table(T::def())?;
    remove_set::<T>(&mut table, set)
}

/// A table of `T` open in a write transaction.
type WriteTable<'t, T> =
    redb::Table<'t, <<T as Table>::K as TableKey>::Redb, <<T as Table>::V as TableValue>::Redb>;

/// Writes one table's changes: deletions, then puts among the existing keys, then the puts
/// past the table's last key (events, results, and any key that only grows) as one run
/// through a cursor at the table's end. redb packs such a run into full leaves; inserted
/// one by one, keys that only grow would leave every leaf half full (each split leaves a
/// left half that no later key falls into), doubling the file.
fn write_table<T: Table>(
    txn: &WriteTransaction,
    changes: &Memtable,
    remove: impl FnOnce(&mut WriteTable<'_, T>, &mut Vec<T::K>) -> Result<()>,
) -> Result<()> {
    use redb::ReadableTable as _;
    let map = T::map(changes);
    if map.is_empty() {
        return Ok(());
    }
    let mut table = txn.open_table(T::def())?;
    let mut deleted: Vec<T::K> = map
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k.clone())
        .collect();
    remove(&mut table, &mut deleted)?;
    let last: Option<T::K> = table.last()?.map(|(k, _)| T::K::own(k.value()));
    let puts = map.iter().filter_map(|(k, v)| v.as_ref().map(|v| (k, v)));
    let mut run = Vec::new();
    for (k, v) in puts {
        if last.as_ref().is_some_and(|last| k <= last) {
            table.insert(k.borrow(), TableValue::borrow(v))?;
        } else {
            run.push((k, v));
        }
    }
    if !run.is_empty() {
        let mut cursor = table.upper_bound_mut(
            std::ops::Bound::<<<T::K as TableKey>::Redb as redb::Value>::SelfType<'_>>::Unbounded,
        )?;
        for (k, v) in run {
            cursor
                .insert_before(k.borrow(), TableValue::borrow(v))
                .map_err(redb::Error::from)?;
        }
        cursor.close()?;
    }
    Ok(())
}

fn remove_each<T: Table>(table: &mut WriteTable<'_, T>, keys: &mut Vec<T::K>) -> Result<()> {
    for k in keys.drain(..) {
        table.remove(k.borrow())?;
    }
    Ok(())
}

/// A table keyed by operation id loses its keys in one pass over the range they span
/// when they are at least this share of it (1 in `PASS_SHARE`); fewer, one descent each.
/// Ids are in no particular order, so the pass steps over the live keys between them: a
/// step costs a small fraction of a descent that rebuilds its leaf (a compaction that
/// purges most of a journal spent 30% of its time on such descents).
const PASS_SHARE: u64 = 32;

/// Whether `n` deletions from a table of `len` keys take one pass.
fn one_pass(n: usize, len: u64) -> bool {
    n > 1 && (n as u64).saturating_mul(PASS_SHARE) >= len
}

/// Removes `keys` (receipts' or `op_events`' keys) from `table`: in one pass when they are
/// a large share of it (see [`PASS_SHARE`]), else one by one. Leaves `keys` empty.
fn remove_many<T: Table>(table: &mut WriteTable<'_, T>, keys: &mut Vec<T::K>) -> Result<()> {
    use redb::ReadableTableMetadata as _;
    if !one_pass(keys.len(), table.len()?) {
        return remove_each::<T>(table, keys);
    }
    keys.sort_unstable();
    keys.dedup();
    remove_in_one_pass::<T>(table, keys)?;
    keys.clear();
    Ok(())
}

/// Removes `keys`, sorted and without duplicates, from `table` in one `retain_in` pass from
/// the first to the last: it steps over the live keys between them and rebuilds each leaf
/// it deletes from once.
fn remove_in_one_pass<T: Table>(table: &mut WriteTable<'_, T>, keys: &[T::K]) -> Result<()> {
    let (Some(first), Some(last)) = (keys.first(), keys.last()) else {
        return Ok(());
    };
    let mut next = 0;
    table.retain_in(first.borrow()..=last.borrow(), |key, _| {
        while keys.get(next).is_some_and(|k| k.cmp_stored(&key).is_lt()) {
            next += 1;
        }
        !keys.get(next).is_some_and(|k| k.cmp_stored(&key).is_eq())
    })?;
    Ok(())
}

/// Keys at most this far apart are removed in the same pass; the pass steps over the
/// live keys between them, which costs far less than a leaf rebuild.
const RUN_GAP: u64 = 64;

/// Removes `keys` from `table`: each run of nearby keys with one `retain_in` pass, a lone
/// key with `remove`. Leaves `keys` empty.
fn remove_in_runs<T: Table<K = u64>>(
    table: &mut WriteTable<'_, T>,
    keys: &mut Vec<u64>,
) -> Result<()> {
    keys.sort_unstable();
    keys.dedup();
    let mut start = 0;
    while start < keys.len() {
        let mut end = start + 1;
        while end < keys.len() && keys[end] - keys[end - 1] <= RUN_GAP {
            end += 1;
        }
        match &keys[start..end] {
            [key] => {
                table.remove(key.borrow())?;
            }
            run => remove_in_one_pass::<T>(table, run)?,
        }
        start = end;
    }
    keys.clear();
    Ok(())
}

/// Removes the held timers `keys`, one `retain_in` pass per timer kind from the first to
/// the last key. A compaction batch fires a prefix of each kind's due timers, so the keys
/// between are due timers of the same batch: the pass steps over at most a batch.
fn remove_timers(
    table: &mut WriteTable<'_, Timers>,
    keys: &mut Vec<(u8, u64, SmolStr)>,
) -> Result<()> {
    keys.sort_unstable();
    keys.dedup();
    let mut start = 0;
    while start < keys.len() {
        let kind = keys[start].0;
        let end = start + keys[start..].iter().take_while(|k| k.0 == kind).count();
        match &keys[start..end] {
            [key] => {
                table.remove(key.borrow())?;
            }
            run => remove_in_one_pass::<Timers>(table, run)?,
        }
        start = end;
    }
    keys.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{ReadableDatabase as _, ReadableTable as _};

    /// A table of keys `0..n` in memory, `remove_in_runs(doomed)` applied, and the keys
    /// that are left.
    fn left_after(n: u64, doomed: &[u64]) -> Result<Vec<u64>> {
        let db = redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new())?;
        let txn = db.begin_write()?;
        {
            let mut table = txn.open_table(<Events as Table>::def())?;
            for k in 0..n {
                table.insert(k, [7u8; 100].as_slice())?;
            }
            let mut keys = doomed.to_vec();
            remove_in_runs::<Events>(&mut table, &mut keys)?;
            assert!(keys.is_empty(), "the list is consumed");
        }
        txn.commit()?;
        let read = db.begin_read()?;
        let table = read.open_table(<Events as Table>::def())?;
        let mut out = Vec::new();
        for entry in table.iter()? {
            out.push(entry?.0.value());
        }
        Ok(out)
    }

    #[test]
    fn held_deletes_remove_exactly_the_listed_keys_across_runs_gaps_and_duplicates() -> Result<()> {
        // Runs with live keys between them, a gap of exactly RUN_GAP and of RUN_GAP + 1,
        // lone keys, duplicates, unsorted input, the first and last keys.
        let mut doomed: Vec<u64> = vec![0, 999, 500, 500, 3, 5, 7, 9, 300];
        doomed.extend((100..200).step_by(2));
        doomed.extend([600, 600 + RUN_GAP, 700, 701 + RUN_GAP]);
        doomed.reverse();
        let expected: Vec<u64> = (0..1000).filter(|k| !doomed.contains(k)).collect();
        assert_eq!(left_after(1000, &doomed)?, expected);
        // Keys that are not in the table change nothing.
        assert_eq!(left_after(10, &[20, 21, 40])?, (0..10).collect::<Vec<_>>());
        assert_eq!(left_after(10, &[])?, (0..10).collect::<Vec<_>>());
        Ok(())
    }

    #[test]
    fn receipt_and_op_event_deletes_remove_exactly_the_listed_keys_in_a_pass_or_one_by_one()
    -> Result<()> {
        // 200 ids; each deletion list once small (one descent per key) and once large
        // (one pass), with duplicates, unsorted, and ids the table lacks.
        let ids: Vec<SmolStr> = (0..200u32)
            .map(|i| format!("op_{:08x}", i.wrapping_mul(2_654_435_761)).into())
            .collect();
        for doomed_count in [3usize, 120] {
            assert_eq!(one_pass(doomed_count, 200), doomed_count == 120);
            let mut doomed: Vec<SmolStr> =
                ids.iter().step_by(200 / doomed_count).cloned().collect();
            doomed.truncate(doomed_count);
            doomed.reverse();
            doomed.push(doomed[0].clone());
            doomed.push("op_absent".into());
            let db =
                redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new())?;
            let txn = db.begin_write()?;
            {
                let mut receipts = txn.open_table(<Receipts as Table>::def())?;
                let mut op_events = txn.open_table(<OpEvents as Table>::def())?;
                for id in &ids {
                    receipts.insert(id.as_str(), [1u8; 40].as_slice())?;
                    for seq in 0..3 {
                        op_events.insert((id.as_str(), seq), ())?;
                    }
                }
                let mut keys = doomed.clone();
                remove_many::<Receipts>(&mut receipts, &mut keys)?;
                assert!(keys.is_empty());
                let mut keys: Vec<(SmolStr, u64)> = doomed
                    .iter()
                    .flat_map(|id| [(id.clone(), 0), (id.clone(), 2)])
                    .collect();
                remove_many::<OpEvents>(&mut op_events, &mut keys)?;
                assert!(keys.is_empty());
            }
            txn.commit()?;
            let read = db.begin_read()?;
            let mut left = Vec::new();
            for entry in read.open_table(<Receipts as Table>::def())?.iter()? {
                left.push(SmolStr::new(entry?.0.value()));
            }
            let mut expected: Vec<SmolStr> = ids
                .iter()
                .filter(|id| !doomed.contains(id))
                .cloned()
                .collect();
            expected.sort();
            assert_eq!(left, expected, "{doomed_count} receipts deleted");
            let mut left = Vec::new();
            for entry in read.open_table(<OpEvents as Table>::def())?.iter()? {
                let (key, ()) = entry.map(|(k, v)| (k, v.value()))?;
                let (id, seq) = key.value();
                left.push((SmolStr::new(id), seq));
            }
            let mut expected: Vec<(SmolStr, u64)> = ids
                .iter()
                .flat_map(|id| (0..3).map(move |seq| (id.clone(), seq)))
                .filter(|(id, seq)| !(doomed.contains(id) && *seq != 1))
                .collect();
            expected.sort();
            assert_eq!(left, expected, "{doomed_count} ids' op_events deleted");
        }
        Ok(())
    }

    #[test]
    fn deferred_purges_hide_events_until_a_checkpoint_outside_a_pass_removes_them() -> Result<()> {
        use crate::index::{Base, Layered as _, Layers, Snapshot, View as _};
        use redb::ReadableTableMetadata as _;
        let db = redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new())?;
        let format = crate::record::FormatRecord {
            format_version: u32::from(crate::codec::FORMAT_VERSION),
            created_at: crate::clock::Timestamp(0),
            created_by: "test".into(),
            upgraded: None,
        };
        let mut start = Memtable::default();
        start.set::<Meta>(
            "format".into(),
            Some(crate::codec::encode(
                crate::codec::RecordKind::Meta,
                &format,
            )),
        );
        // Keys below `next_seq` are known to be in the tables; a deletion above it (1,000
        // below) is looked up.
        let state = crate::record::StateRecord {
            clock_high_water: crate::clock::Timestamp(0),
            next_seq: 100,
        };
        start.set::<Meta>(
            "state".into(),
            Some(crate::codec::encode(crate::codec::RecordKind::Meta, &state)),
        );
        for k in 0..100u64 {
            start.set::<Events>(k, Some(vec![1; 30]));
            if k % 10 == 0 {
                start.set::<Results>(k, Some(vec![2; 30]));
            }
        }
        let commit = |changes: &Memtable, defer: bool| -> Result<()> {
            let txn = db.begin_write()?;
            create_tables(&txn)?;
            checkpoint(&txn, changes, defer)?;
            txn.commit()?;
            Ok(())
        };
        // What the file holds, physically and as reads see it.
        let seen = || -> Result<(u64, u64, u64, Vec<u64>, bool, u32)> {
            let read = db.begin_read()?;
            let raw = read.open_table(<Events as Table>::def())?.len()?;
            let meta = read.open_table(<Meta as Table>::def())?;
            let pending = meta.get(crate::index::purged::KEY)?.is_some();
            let stored: crate::record::FormatRecord = crate::index::decode_meta(
                "format",
                meta.get("format")?
                    .map(|v| v.value().to_vec())
                    .unwrap_or_default()
                    .as_slice(),
            )?;
            drop(meta);
            let base = Base::new(read);
            let snap = Snapshot {
                base: Some(&base),
                layers: Layers::default(),
            };
            let keys = snap
                .all::<Events>()?
                .map(|e| e.map(|(k, _)| k))
                .collect::<Result<Vec<u64>>>()?;
            let live_results = snap.count::<Results>()?;
            assert_eq!(snap.count::<Events>()?, keys.len() as u64);
            assert_eq!(snap.get::<Events>(&3)?.is_some(), keys.contains(&3));
            assert_eq!(snap.format()?.map(|f| f.format_version), Some(3));
            Ok((
                raw,
                live_results,
                keys.len() as u64,
                keys,
                pending,
                stored.format_version,
            ))
        };
        commit(&start, false)?;
        // A pass's checkpoint deletes events 0..50 and results 0, 10, 20, 30, 40: deferred.
        let mut purge = Memtable::default();
        for k in 0..50u64 {
            purge.set::<Events>(k, None);
            if k % 10 == 0 {
                purge.set::<Results>(k, None);
            }
        }
        purge.set::<Events>(1_000, None); // a key the table never held
        commit(&purge, true)?;
        let (raw, results, live, keys, pending, version) = seen()?;
        assert_eq!(
            (raw, results, live),
            (100, 5, 50),
            "still in the table, hidden"
        );
        assert_eq!(keys, (50..100).collect::<Vec<_>>());
        assert!(pending);
        assert_eq!(version, crate::index::purged::FORMAT_PENDING_PURGES);
        // A later checkpoint of the pass adds to the sets.
        let mut more = Memtable::default();
        more.set::<Events>(60, None);
        more.set::<Events>(100, Some(vec![3; 30]));
        commit(&more, true)?;
        let (raw, _, live, keys, pending, _) = seen()?;
        assert_eq!((raw, live), (101, 50));
        assert!(!keys.contains(&60) && keys.contains(&100) && pending);
        // The first checkpoint outside a pass removes them, even with nothing of its own.
        commit(&Memtable::default(), false)?;
        let (raw, results, live, keys, pending, version) = seen()?;
        assert_eq!((raw, results, live), (50, 5, 50));
        assert_eq!(keys.len(), 50);
        assert!(!pending);
        assert_eq!(version, u32::from(crate::codec::FORMAT_VERSION));
        Ok(())
    }

    #[test]
    fn held_timer_deletes_remove_exactly_the_listed_timers_of_each_kind() -> Result<()> {
        let db = redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new())?;
        let all: Vec<(u8, u64, SmolStr)> = (0..3u8)
            .flat_map(|kind| {
                (0..40u64).map(move |due| (kind, due, format!("op{}", due % 7).into()))
            })
            .collect();
        let doomed: Vec<(u8, u64, SmolStr)> = all
            .iter()
            .filter(|(kind, due, _)| (*kind == 0 && due % 3 == 0) || (*kind == 2 && *due == 5))
            .cloned()
            .collect();
        let txn = db.begin_write()?;
        {
            let mut table = txn.open_table(Timers::def())?;
            for (kind, due, op) in &all {
                table.insert((*kind, *due, op.as_str()), ())?;
            }
            let mut keys: Vec<_> = doomed.iter().rev().cloned().collect();
            keys.push(doomed[0].clone());
            remove_timers(&mut table, &mut keys)?;
            assert!(keys.is_empty());
        }
        txn.commit()?;
        let read = db.begin_read()?;
        let table = read.open_table(Timers::def())?;
        let mut left = Vec::new();
        for entry in table.iter()? {
            let (key, _) = entry?;
            let (kind, due, op) = key.value();
            left.push((kind, due, SmolStr::new(op)));
        }
        let expected: Vec<_> = all.into_iter().filter(|k| !doomed.contains(k)).collect();
        assert_eq!(left, expected);
        Ok(())
    }
}
