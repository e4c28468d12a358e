//! Reads through layers: changes not yet in redb (a batch being written, the memtable of
//! everything logged since the last checkpoint) over a redb read snapshot. A key's top
//! layer wins; a deletion hides what lies below. Range reads merge the layers in key
//! order, lazily on the redb side.

use std::any::Any;
use std::cmp::Ordering;
use std::ops::Bound;
use std::sync::OnceLock;

use redb::{ReadOnlyTable, ReadTransaction, ReadableTableMetadata};

use super::tables::{Memtable, Table, TableKey, TableValue};
use crate::error::Result;

/// Entries of a table in key order.
pub(crate) type Entries<'a, T> =
    Box<dyn Iterator<Item = Result<(<T as Table>::K, <T as Table>::V)>> + 'a>;

type RedbTable<T> =
    ReadOnlyTable<<<T as Table>::K as TableKey>::Redb, <<T as Table>::V as TableValue>::Redb>;

/// A redb read snapshot, with each table opened on first use (a lookup that needs two
/// tables does not pay for opening twelve). A table the file lacks reads as empty.
pub(crate) struct Base {
    txn: ReadTransaction,
    tables: [OnceLock<Option<Box<dyn Any + Send + Sync>>>; 16],
}

impl Base {
    pub(crate) fn new(txn: ReadTransaction) -> Base {
        Base {
            txn,
            tables: Default::default(),
        }
    }

    fn table<T: Table>(&self) -> Result<Option<&RedbTable<T>>> {
        let cell = &self.tables[usize::from(T::ID)];
        if let Some(t) = cell.get() {
            return Ok(t.as_ref().and_then(|b| b.downcast_ref()));
        }
        let opened: Option<Box<dyn Any + Send + Sync>> = match self.txn.open_table(T::def()) {
            Ok(t) => Some(Box::new(t)),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let t = cell.get_or_init(|| opened);
        Ok(t.as_ref().and_then(|b| b.downcast_ref()))
    }

    pub(crate) fn get<T: Table>(&self, key: &T::K) -> Result<Option<T::V>> {
        let Some(t) = self.table::<T>()? else {
            return Ok(None);
        };
        Ok(t.get(key.borrow())?.map(|v| T::V::own(v.value())))
    }

    pub(crate) fn range<'s, T: Table>(
        &'s self,
        lo: Bound<&T::K>,
        hi: Bound<&T::K>,
    ) -> Result<Entries<'s, T>> {
        let Some(t) = self.table::<T>()? else {
            return Ok(Box::new(std::iter::empty()));
        };
        let lo = lo.map(TableKey::borrow);
        let hi = hi.map(TableKey::borrow);
        let iter = t.range((lo, hi))?;
        Ok(Box::new(iter.map(|entry| {
            let (k, v) = entry?;
            Ok((T::K::own(k.value()), T::V::own(v.value())))
        })))
    }

    pub(crate) fn len<T: Table>(&self) -> Result<u64> {
        match self.table::<T>()? {
            Some(t) => Ok(t.len()?),
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
    fn base(&self) -> Option<&Base>;
    /// Calls `f` with each layer over the base, top first.
    fn layers(&self) -> Layers<'_>;

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

    /// The entries with keys in `(lo, hi)`, in key order.
    fn range<'s, T: Table>(&'s self, lo: Bound<&T::K>, hi: Bound<&T::K>) -> Result<Entries<'s, T>> {
        let layers = self.layers();
        let mut over: Vec<(T::K, Option<T::V>)> = Vec::new();
        if nonempty(lo, hi) {
            let mut non_empty = layers
                .iter()
                .filter(|m| T::map(m).range::<T::K, _>((lo, hi)).next().is_some());
            match (non_empty.next(), non_empty.next()) {
                (None, _) => {}
                (Some(only), None) => {
                    over = T::map(only)
                        .range::<T::K, _>((lo, hi))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                }
                _ => {
                    let mut merged = std::collections::BTreeMap::new();
                    for m in layers.iter().rev() {
                        for (k, v) in T::map(m).range::<T::K, _>((lo, hi)) {
                            merged.insert(k.clone(), v.clone());
                        }
                    }
                    over = merged.into_iter().collect();
                }
            }
        }
        let base: Entries<'s, T> = match self.base() {
            Some(b) => b.range::<T>(lo, hi)?,
            None => Box::new(std::iter::empty()),
        };
        Ok(Box::new(Merge {
            base: base.peekable(),
            over: over.into_iter().peekable(),
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
    pub base: Option<&'a Base>,
    pub layers: Layers<'a>,
}

impl Layered for Snapshot<'_> {
    fn base(&self) -> Option<&Base> {
        self.base
    }
    fn layers(&self) -> Layers<'_> {
        self.layers
    }
}

/// Entries of a table as a boxed iterator.
type EntryIter<'a, K, V> = Box<dyn Iterator<Item = Result<(K, V)>> + 'a>;

/// Merges the base's entries with the layers' (already merged, in key order).
struct Merge<'a, K, V> {
    base: std::iter::Peekable<EntryIter<'a, K, V>>,
    over: std::iter::Peekable<std::vec::IntoIter<(K, Option<V>)>>,
}

enum Next {
    Base,
    Over,
    OverShadowing,
}

impl<K: Ord, V> Iterator for Merge<'_, K, V> {
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
