//! Reads through layers: changes not yet in redb (a batch being written, the memtable of
//! everything logged since the last checkpoint) over a redb read snapshot. A key's top
//! layer wins; a deletion hides what lies below. Range reads merge the layers in key
//! order, lazily on the redb side.

use std::any::Any;
use std::cmp::Ordering;
use std::ops::Bound;
use std::sync::OnceLock;

use redb::{ReadOnlyTable, ReadTransaction, ReadableTableMetadata};
use smol_str::SmolStr;

use super::purged::Purged;
use super::store::{self, Store};
use super::tables::{Events, Memtable, Meta, Results, Table, TableKey, TableValue};
use super::write::ReceiptMemo;
use crate::error::Result;

/// Entries of a table in key order.
pub(crate) type Entries<'a, T> =
    Box<dyn Iterator<Item = Result<(<T as Table>::K, <T as Table>::V)>> + 'a>;

type RedbTable<T> =
    ReadOnlyTable<<<T as Table>::K as TableKey>::Redb, <<T as Table>::V as TableValue>::Redb>;

/// What the layers lie over: a redb read snapshot, or a consistent read of another store
/// (see [`Store`]).
pub(crate) struct Base<'s>(BaseKind<'s>);

// One per snapshot; the redb variant is the common one, and boxing it would add an
// allocation to every read.
#[allow(clippy::large_enum_variant)]
enum BaseKind<'s> {
    /// A redb read snapshot, with each table opened on first use (a lookup that needs two
    /// tables does not pay for opening twelve). A table the file lacks reads as empty.
    Redb {
        txn: ReadTransaction,
        tables: [OnceLock<Option<Box<dyn Any + Send + Sync>>>; 16],
        /// The deferred purges the snapshot holds (see `purged`), read on first use by a
        /// read of `events` or `results`; `None` when there are none.
        purged: OnceLock<std::result::Result<Option<Purged>, String>>,
    },
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Store(std::sync::Arc<dyn Store + 's>),
}

impl<'b> Base<'b> {
    pub(crate) fn new(txn: ReadTransaction) -> Base<'b> {
        Base(BaseKind::Redb {
            txn,
            tables: Default::default(),
            purged: OnceLock::new(),
        })
    }

    /// The deferred purges of this snapshot (see `purged`), if it holds any.
    ///
    /// # Errors
    ///
    /// `Corrupt` for `meta`/`purged` when the entry is damaged: then no read of `events`
    /// or `results` can tell a purged key from a live one.
    pub(crate) fn purged(&self) -> Result<Option<&Purged>> {
        let BaseKind::Redb { purged, .. } = &self.0 else {
            return Ok(None);
        };
        let loaded = purged.get_or_init(|| {
            let read = || -> Result<Option<Purged>> {
                let Some(meta) = self.table::<Meta>()? else {
                    return Ok(None);
                };
                match meta.get(super::purged::KEY)? {
                    Some(v) => Ok(Some(Purged::decode(v.value())?).filter(|p| !p.is_empty())),
                    None => Ok(None),
                }
            };
            read().map_err(|e| e.to_string())
        });
        match loaded {
            Ok(p) => Ok(p.as_ref()),
            Err(why) => Err(crate::error::Error::corrupt(
                "meta",
                super::purged::KEY,
                why.clone(),
            )),
        }
    }

    /// The keys of `T` that deferred purges hide, if any.
    fn hidden<T: Table>(&self) -> Result<Option<&roaring::RoaringTreemap>> {
        if T::ID != <Events as Table>::ID && T::ID != <Results as Table>::ID {
            return Ok(None);
        }
        Ok(self.purged()?.and_then(|p| p.of(T::ID)))
    }

    /// Whether deferred purges hide `key` of `T`.
    fn is_hidden<T: Table>(&self, key: &T::K) -> Result<bool> {
        Ok(match (self.hidden::<T>()?, key.seq()) {
            (Some(set), Some(seq)) => set.contains(seq),
            _ => false,
        })
    }

    /// A base read from `store`.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn store(store: std::sync::Arc<dyn Store + 'b>) -> Base<'b> {
        Base(BaseKind::Store(store))
    }

    /// The store under this base, if it is not redb.
    pub(crate) fn as_store(&self) -> Option<&(dyn Store + 'b)> {
        match &self.0 {
            BaseKind::Store(s) => Some(s.as_ref()),
            BaseKind::Redb { .. } => None,
        }
    }

    fn table<T: Table>(&self) -> Result<Option<&RedbTable<T>>> {
        let BaseKind::Redb { txn, tables, .. } = &self.0 else {
            return Ok(None);
        };
        let cell = &tables[usize::from(T::ID)];
        if let Some(t) = cell.get() {
            return Ok(t.as_ref().and_then(|b| b.downcast_ref()));
        }
        let opened: Option<Box<dyn Any + Send + Sync>> = match txn.open_table(T::def()) {
            Ok(t) => Some(Box::new(t)),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let t = cell.get_or_init(|| opened);
        Ok(t.as_ref().and_then(|b| b.downcast_ref()))
    }

    /// Whether the table holds `key` (without copying its value).
    pub(crate) fn contains<T: Table>(&self, key: &T::K) -> Result<bool> {
        if let Some(s) = self.as_store() {
            return Ok(store::get_raw::<T>(s, key)?.is_some());
        }
        let Some(t) = self.table::<T>()? else {
            return Ok(false);
        };
        Ok(t.get(key.borrow())?.is_some() && !self.is_hidden::<T>(key)?)
    }

    pub(crate) fn get<T: Table>(&self, key: &T::K) -> Result<Option<T::V>> {
        if let Some(s) = self.as_store() {
            return store::get::<T>(s, key);
        }
        let Some(t) = self.table::<T>()? else {
            return Ok(None);
        };
        if self.is_hidden::<T>(key)? {
            return Ok(None);
        }
        Ok(t.get(key.borrow())?.map(|v| T::V::own(v.value())))
    }

    pub(crate) fn range<'s, T: Table>(
        &'s self,
        lo: Bound<&T::K>,
        hi: Bound<&T::K>,
    ) -> Result<Entries<'s, T>> {
        if let Some(s) = self.as_store() {
            return Ok(store::range::<T>(s, lo, hi));
        }
        let Some(t) = self.table::<T>()? else {
            return Ok(Box::new(std::iter::empty()));
        };
        let lo = lo.map(TableKey::borrow);
        let hi = hi.map(TableKey::borrow);
        let iter = t.range((lo, hi))?;
        let entries = iter.map(|entry| {
            let (k, v) = entry?;
            Ok((T::K::own(k.value()), T::V::own(v.value())))
        });
        match self.hidden::<T>()? {
            None => Ok(Box::new(entries)),
            Some(set) => Ok(Box::new(entries.filter(move |entry| match entry {
                Ok((k, _)) => !k.seq().is_some_and(|seq| set.contains(seq)),
                Err(_) => true,
            }))),
        }
    }

    /// Calls `f` with the bytes stored under `key`, without copying them out of redb.
    pub(crate) fn with_str<T: Table<K = SmolStr, V = Vec<u8>>, R>(
        &self,
        key: &str,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        if let Some(s) = self.as_store() {
            return Ok(store::get_raw::<T>(s, &SmolStr::new(key))?.map(|v| f(&v)));
        }
        let Some(t) = self.table::<T>()? else {
            return Ok(None);
        };
        Ok(t.get(key)?.map(|v| f(v.value())))
    }

    /// As [`Base::with_str`], for a table keyed by sequence number.
    pub(crate) fn with_seq<T: Table<K = u64, V = Vec<u8>>, R>(
        &self,
        key: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        if let Some(s) = self.as_store() {
            return Ok(store::get_raw::<T>(s, &key)?.map(|v| f(&v)));
        }
        let Some(t) = self.table::<T>()? else {
            return Ok(None);
        };
        if self.is_hidden::<T>(&key)? {
            return Ok(None);
        }
        Ok(t.get(key)?.map(|v| f(v.value())))
    }

    pub(crate) fn len<T: Table>(&self) -> Result<u64> {
        if let Some(s) = self.as_store() {
            return s.count(T::ID);
        }
        match self.table::<T>()? {
            // Every hidden key is in the table (see `purged`).
            Some(t) => Ok(t
                .len()?
                .saturating_sub(self.hidden::<T>()?.map_or(0, |set| set.len()))),
            None => Ok(0),
        }
    }
}

/// Whether `(lo, hi)` contains any key (BTreeMap::range panics on an inverted range).
fn nonempty<K: Ord>(lo: Bound<&K>, hi: Bound<&K>) -> bool {
    match (lo, hi) {
        (Bound::Included(a), Bound::Included(b)) => a <= b,
        (Bound::Included(a), Bound::Excluded(b))
        | (Bound::Excluded(a), Bound::Included(b))
        | (Bound::Excluded(a), Bound::Excluded(b)) => a < b,
        _ => true,
    }
}

/// Read access to the journal's tables, whatever holds them. The semantic reads of the
/// journal (receipts, timers, windows...) are built on these two in `View`.
pub(crate) trait Layered {
    /// The redb snapshot under the layers, if any.
    fn base(&self) -> Option<&Base<'_>>;
    /// Calls `f` with each layer over the base, top first.
    fn layers(&self) -> Layers<'_>;
    /// A batch's memo of the receipt it last read or wrote; none for a snapshot.
    fn receipt_memo(&self) -> Option<&ReceiptMemo> {
        None
    }

    /// The value of `key`.
    fn get<T: Table>(&self, key: &T::K) -> Result<Option<T::V>> {
        for m in self.layers().iter() {
            if let Some(v) = T::map(m).get(key) {
                return Ok(v.clone());
            }
        }
        match self.base() {
            Some(b) => b.get::<T>(key),
            None => Ok(None),
        }
    }

    /// Calls `f` with the bytes stored under the string `key` (the top layer's, or redb's
    /// without copying them): the read path of every lookup by operation id.
    fn with_str<T: Table<K = SmolStr, V = Vec<u8>>, R>(
        &self,
        key: &str,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        for m in self.layers().iter() {
            if let Some(v) = T::map(m).get(key) {
                return Ok(v.as_deref().map(f));
            }
        }
        match self.base() {
            Some(b) => b.with_str::<T, R>(key, f),
            None => Ok(None),
        }
    }

    /// As [`Layered::with_str`], for a table keyed by sequence number.
    fn with_seq<T: Table<K = u64, V = Vec<u8>>, R>(
        &self,
        key: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        for m in self.layers().iter() {
            if let Some(v) = T::map(m).get(&key) {
                return Ok(v.as_deref().map(f));
            }
        }
        match self.base() {
            Some(b) => b.with_seq::<T, R>(key, f),
            None => Ok(None),
        }
    }

    /// The entries with keys in `(lo, hi)`, in key order. Lazy: the layers' entries are
    /// merged as they are read (a range over a large memtable whose caller takes a few
    /// entries costs a few entries, not the whole range).
    fn range<'s, T: Table>(&'s self, lo: Bound<&T::K>, hi: Bound<&T::K>) -> Result<Entries<'s, T>> {
        // An empty or inverted range (a resumed scan past its upper bound) holds nothing,
        // in the layers (whose `BTreeMap::range` would panic) and in the base alike.
        if !nonempty(lo, hi) {
            return Ok(Box::new(std::iter::empty()));
        }
        let layers = self.layers();
        let mut over: Vec<LayerRange<'s, T::K, T::V>> = Vec::new();
        for m in layers.iter() {
            let mut r = T::map(m).range::<T::K, _>((lo, hi)).peekable();
            if r.peek().is_some() {
                over.push(r);
            }
        }
        let base: Entries<'s, T> = match self.base() {
            Some(b) => b.range::<T>(lo, hi)?,
            None => Box::new(std::iter::empty()),
        };
        Ok(Box::new(Merge {
            base: base.peekable(),
            over: LayerMerge { layers: over }.peekable(),
        }))
    }

    /// Every entry of a table, in key order.
    fn all<'s, T: Table>(&'s self) -> Result<Entries<'s, T>> {
        self.range::<T>(Bound::Unbounded, Bound::Unbounded)
    }

    /// The number of entries in a table.
    fn count<T: Table>(&self) -> Result<u64> {
        let base = self.base();
        let mut n = match base {
            Some(b) => b.len::<T>()?,
            None => 0,
        };
        let mut seen = std::collections::BTreeSet::new();
        for m in self.layers().iter() {
            for (k, v) in T::map(m) {
                if !seen.insert(k) {
                    continue;
                }
                let below = match base {
                    Some(b) => b.get::<T>(k)?.is_some(),
                    None => false,
                };
                match (v.is_some(), below) {
                    (true, false) => n += 1,
                    (false, true) => n = n.saturating_sub(1),
                    _ => {}
                }
            }
        }
        Ok(n)
    }
}

/// The layers over a base, top first (at most three: a batch, the memtable, and a
/// memtable being checkpointed).
#[derive(Clone, Copy, Default)]
pub(crate) struct Layers<'a>([Option<&'a Memtable>; 3]);

impl<'a> Layers<'a> {
    pub(crate) fn new(layers: &[&'a Memtable]) -> Layers<'a> {
        let mut out = Layers::default();
        for (slot, m) in out.0.iter_mut().zip(layers) {
            *slot = Some(*m);
        }
        out
    }

    /// These layers with `top` over them.
    pub(crate) fn under(self, top: &'a Memtable) -> Layers<'a> {
        let mut out = Layers::default();
        out.0[0] = Some(top);
        out.0[1] = self.0[0];
        out.0[2] = self.0[1];
        debug_assert!(self.0[2].is_none(), "at most three layers");
        out
    }

    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &'a Memtable> + '_ {
        self.0.iter().flatten().copied()
    }
}

/// A snapshot: a redb read transaction with memtables over it.
pub(crate) struct Snapshot<'a> {
    pub base: Option<&'a Base<'a>>,
    pub layers: Layers<'a>,
}

impl Layered for Snapshot<'_> {
    fn base(&self) -> Option<&Base<'_>> {
        self.base
    }
    fn layers(&self) -> Layers<'_> {
        self.layers
    }
}

/// Owned entries in key order, from redb.
type BaseEntries<'a, K, V> = Box<dyn Iterator<Item = Result<(K, V)>> + 'a>;

/// One layer's entries of a range.
type LayerRange<'a, K, V> =
    std::iter::Peekable<std::collections::btree_map::Range<'a, K, Option<V>>>;

/// The layers' entries of a range merged in key order, the topmost layer's entry winning
/// for a key that several hold (tombstones included: `None` hides the base's entry).
struct LayerMerge<'a, K, V> {
    /// Top first; each non-empty when made.
    layers: Vec<LayerRange<'a, K, V>>,
}

impl<K: Ord + Clone, V: Clone> Iterator for LayerMerge<'_, K, V> {
    type Item = (K, Option<V>);

    fn next(&mut self) -> Option<Self::Item> {
        // The smallest key among the layers' heads; the first (topmost) layer holding it
        // wins, and the others holding it skip theirs.
        let mut best: Option<(usize, &K)> = None;
        for (i, l) in self.layers.iter_mut().enumerate() {
            if let Some((k, _)) = l.peek()
                && best.is_none_or(|(_, b)| *k < b)
            {
                best = Some((i, k));
            }
        }
        let (winner, key) = best?;
        let key = key.clone();
        let mut out = None;
        for (i, l) in self.layers.iter_mut().enumerate() {
            if l.peek().is_some_and(|(k, _)| **k == key)
                && let Some((k, v)) = l.next()
                && i == winner
            {
                out = Some((k.clone(), v.clone()));
            }
        }
        out
    }
}

/// Merges the base's entries with the layers' (merged lazily, in key order).
struct Merge<'a, K: Ord + Clone, V: Clone> {
    base: std::iter::Peekable<BaseEntries<'a, K, V>>,
    over: std::iter::Peekable<LayerMerge<'a, K, V>>,
}

enum Next {
    Base,
    Over,
    OverShadowing,
}

impl<K: Ord + Clone, V: Clone> Iterator for Merge<'_, K, V> {
    type Item = Result<(K, V)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let next = match (self.base.peek(), self.over.peek()) {
                (None, None) => return None,
                (Some(Err(_)), _) | (Some(Ok(_)), None) => Next::Base,
                (None, Some(_)) => Next::Over,
                (Some(Ok((bk, _))), Some((ok, _))) => match ok.cmp(bk) {
                    Ordering::Less => Next::Over,
                    Ordering::Equal => Next::OverShadowing,
                    Ordering::Greater => Next::Base,
                },
            };
            match next {
                Next::Base => return self.base.next(),
                Next::OverShadowing => {
                    self.base.next();
                }
                Next::Over => {}
            }
            if let Some((k, v)) = self.over.next()
                && let Some(v) = v
            {
                return Some(Ok((k, v)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::tables::{Events, InDoubt};
    use redb::ReadableDatabase as _;

    #[test]
    fn a_deletion_of_a_key_the_base_lacks_leaves_no_tombstone_in_a_range_read_index() -> Result<()>
    {
        let db = redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new())?;
        let txn = db.begin_write()?;
        txn.open_table(<InDoubt as Table>::def())?.insert("a", ())?;
        txn.open_table(<Events as Table>::def())?
            .insert(1u64, [1u8].as_slice())?;
        txn.commit()?;
        let base = Base::new(db.begin_read()?);
        let mut mem = Memtable::default();
        let mut batch = Memtable::default();
        batch.set::<InDoubt>("b".into(), Some(()));
        batch.set::<Events>(2, Some(vec![2]));
        mem.absorb_over(batch, Some(&base), None);
        let mut batch = Memtable::default();
        for k in ["a", "b", "c"] {
            batch.set::<InDoubt>(SmolStr::new(k), None);
        }
        for k in [1, 2, 3] {
            batch.set::<Events>(k, None);
        }
        mem.absorb_over(batch, Some(&base), None);
        // In the index read by range, only the base's key needs hiding; the memtable's own
        // and a never-seen key vanish.
        let held: Vec<(SmolStr, Option<()>)> = <InDoubt as Table>::map(&mem)
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        assert_eq!(held, vec![(SmolStr::new("a"), None)]);
        // Elsewhere the tombstones stay, without a lookup in the base per deletion.
        assert_eq!(<Events as Table>::map(&mem).len(), 3);
        let snap = Snapshot {
            base: Some(&base),
            layers: Layers::new(&[&mem]),
        };
        assert_eq!(snap.all::<InDoubt>()?.count(), 0, "every key is deleted");
        assert_eq!(snap.all::<Events>()?.count(), 0, "every key is deleted");
        Ok(())
    }

    #[test]
    fn a_compaction_batch_keeps_its_tombstones_without_asking_the_base_and_reads_stay_right()
    -> Result<()> {
        let db = redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new())?;
        let txn = db.begin_write()?;
        txn.open_table(<InDoubt as Table>::def())?.insert("a", ())?;
        txn.commit()?;
        let base = Base::new(db.begin_read()?);
        let mut mem = Memtable::default();
        let mut batch = Memtable::default();
        batch.set::<InDoubt>("b".into(), Some(()));
        mem.absorb_over(batch, Some(&base), None);
        let below = {
            let mut m = Memtable::default();
            m.set::<InDoubt>("d".into(), None);
            m
        };
        let mut batch = Memtable::default();
        batch.deletes_stored_keys();
        for k in ["a", "b", "c", "d"] {
            batch.set::<InDoubt>(SmolStr::new(k), None);
        }
        mem.absorb_over(batch, Some(&base), Some(&below));
        // The base's key, the memtable's own and a never-seen key keep their tombstones (no
        // lookup was made); a key `below` already deletes needs none.
        let held: Vec<(SmolStr, Option<()>)> = <InDoubt as Table>::map(&mem)
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        let tombstone = |k: &str| (SmolStr::new(k), None);
        assert_eq!(held, vec![tombstone("a"), tombstone("b"), tombstone("c")]);
        let snap = Snapshot {
            base: Some(&base),
            layers: Layers::new(&[&mem, &below]),
        };
        assert_eq!(snap.all::<InDoubt>()?.count(), 0, "every key is deleted");
        // The mark is the batch's: a later batch into the same memtable asks again.
        let mut batch = Memtable::default();
        batch.set::<InDoubt>("e".into(), Some(()));
        mem.absorb_over(batch, Some(&base), None);
        let mut batch = Memtable::default();
        batch.set::<InDoubt>("e".into(), None);
        mem.absorb_over(batch, Some(&base), None);
        assert!(!<InDoubt as Table>::map(&mem).contains_key("e"));
        // Without a base (a journal in memory, where the memtable is everything) nothing
        // lies below, so a compaction batch's tombstones go too: none piles up.
        let mut all = Memtable::default();
        let mut batch = Memtable::default();
        batch.set::<InDoubt>("f".into(), Some(()));
        all.absorb_over(batch, None, None);
        let mut batch = Memtable::default();
        batch.deletes_stored_keys();
        batch.set::<InDoubt>("f".into(), None);
        all.absorb_over(batch, None, None);
        assert!(<InDoubt as Table>::map(&all).is_empty());
        Ok(())
    }

    #[test]
    fn a_range_over_layers_and_the_base_is_what_the_top_layer_says_for_each_key() -> Result<()> {
        // A base in redb and three layers with overlapping keys and tombstones, from a
        // small generator; every range is compared with a model where the upper layer wins.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let db = redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new())?;
        let mut model: std::collections::BTreeMap<u64, Vec<u8>> = Default::default();
        let txn = db.begin_write()?;
        {
            let mut t = txn.open_table(<Events as Table>::def())?;
            for k in 0..200u64 {
                if next(2) == 0 {
                    t.insert(k, [1u8, k as u8].as_slice())?;
                    model.insert(k, vec![1, k as u8]);
                }
            }
        }
        txn.commit()?;
        let mut layers = [
            Memtable::default(),
            Memtable::default(),
            Memtable::default(),
        ];
        // Applied bottom (index 2) to top (index 0), as commits would stack them.
        for (depth, m) in layers.iter_mut().enumerate().rev() {
            for _ in 0..80 {
                let k = next(220);
                if next(3) == 0 {
                    m.set::<Events>(k, None);
                    model.remove(&k);
                } else {
                    let v = vec![10 + depth as u8, k as u8];
                    m.set::<Events>(k, Some(v.clone()));
                    model.insert(k, v);
                }
            }
        }
        let base = Base::new(db.begin_read()?);
        let snap = Snapshot {
            base: Some(&base),
            layers: Layers::new(&[&layers[0], &layers[1], &layers[2]]),
        };
        for _ in 0..200 {
            let (a, b) = (next(230), next(230));
            let (lo, hi) = (a.min(b), a.max(b));
            let got: Vec<(u64, Vec<u8>)> = snap
                .range::<Events>(Bound::Included(&lo), Bound::Excluded(&hi))?
                .collect::<Result<_>>()?;
            let want: Vec<(u64, Vec<u8>)> =
                model.range(lo..hi).map(|(k, v)| (*k, v.clone())).collect();
            assert_eq!(got, want, "range {lo}..{hi}");
        }
        // An inverted range (a scan resumed past its upper bound) is empty in the base too.
        for (lo, hi) in [(150u64, 20u64), (100, 100)] {
            let got = snap
                .range::<Events>(Bound::Excluded(&lo), Bound::Excluded(&hi))?
                .count();
            assert_eq!(got, 0, "range ({lo}, {hi})");
        }
        let all: Vec<u64> = snap
            .all::<Events>()?
            .map(|e| e.map(|(k, _)| k))
            .collect::<Result<_>>()?;
        assert_eq!(all, model.keys().copied().collect::<Vec<_>>());
        Ok(())
    }
}
