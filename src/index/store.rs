//! The storage seam: what a store other than redb implements for the journal to read its
//! tables from it. Bytes only, no redb types: a table is its number ([`Table::ID`]), a key
//! is written in byte order ([`TableKey::to_ordered`]), a value is its record's bytes
//! ([`TableValue::raw`]). Writes need no trait: a store takes a batch's changes with
//! [`Memtable::each_raw`](super::Memtable::each_raw) and applies them in one transaction.
//!
//! The state machine never sees a store: it reads through [`Layered`](super::Layered)
//! and writes a [`WriteTables`](super::WriteTables) batch, whatever lies below.

use std::collections::VecDeque;
use std::ops::Bound;

use super::layers::Entries;
use super::tables::{Bytes, Table, TableKey, TableValue};
use crate::error::{Error, Result};

/// A consistent read of a store's tables (one snapshot: a transaction, or a lock held).
pub(crate) trait Store: Send + Sync {
    /// The value stored under `key` in `table`.
    ///
    /// # Errors
    ///
    /// The store's own errors ([`ErrorKind::Io`](crate::ErrorKind::Io) for a lost
    /// connection, ...).
    fn get(&self, table: u8, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// At most `limit` entries of `table` with keys in `(lo, hi)`, in key order.
    ///
    /// # Errors
    ///
    /// As [`Store::get`].
    fn scan(
        &self,
        table: u8,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;

    /// The number of entries in `table`.
    ///
    /// # Errors
    ///
    /// As [`Store::get`].
    fn count(&self, table: u8) -> Result<u64>;
}

/// Entries read from a store per round trip of a range read: a caller that takes a few
/// entries of a long range (the next due timers) reads one page.
const PAGE: usize = 128;

fn ordered<K: TableKey>(k: &K) -> Vec<u8> {
    let mut out = Vec::new();
    k.to_ordered(&mut out);
    out
}

fn decode_key<T: Table>(bytes: &[u8]) -> Result<T::K> {
    let mut r = Bytes::new(bytes);
    match T::K::from_ordered(&mut r) {
        Some(k) if r.is_empty() => Ok(k),
        _ => Err(Error::corrupt(
            T::NAME,
            format!("{bytes:02x?}"),
            "the store holds a key this build does not write",
        )),
    }
}

pub(crate) fn get<T: Table>(store: &dyn Store, key: &T::K) -> Result<Option<T::V>> {
    Ok(store.get(T::ID, &ordered(key))?.map(|v| T::V::from_raw(&v)))
}

pub(crate) fn get_raw<T: Table>(store: &dyn Store, key: &T::K) -> Result<Option<Vec<u8>>> {
    store.get(T::ID, &ordered(key))
}

pub(crate) fn range<'s, T: Table>(
    store: &'s dyn Store,
    lo: Bound<&T::K>,
    hi: Bound<&T::K>,
) -> Entries<'s, T> {
    let hi = match hi {
        Bound::Included(k) => Bound::Included(ordered(k)),
        Bound::Excluded(k) => Bound::Excluded(ordered(k)),
        Bound::Unbounded => Bound::Unbounded,
    };
    let lo = match lo {
        Bound::Included(k) => Bound::Included(ordered(k)),
        Bound::Excluded(k) => Bound::Excluded(ordered(k)),
        Bound::Unbounded => Bound::Unbounded,
    };
    Box::new(Pages::<T> {
        store,
        lo,
        hi,
        page: VecDeque::new(),
        done: false,
        _t: std::marker::PhantomData,
    })
}

/// A range read in pages of [`PAGE`] entries, each page after the last key read.
struct Pages<'s, T: Table> {
    store: &'s dyn Store,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    page: VecDeque<(Vec<u8>, Vec<u8>)>,
    done: bool,
    _t: std::marker::PhantomData<T>,
}

impl<T: Table> Iterator for Pages<'_, T> {
    type Item = Result<(T::K, T::V)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.page.is_empty() && !self.done {
            let read = self.store.scan(
                T::ID,
                self.lo.as_ref().map(Vec::as_slice),
                self.hi.as_ref().map(Vec::as_slice),
                PAGE,
            );
            match read {
                Ok(entries) => {
                    self.done = entries.len() < PAGE;
                    if let Some((last, _)) = entries.last() {
                        self.lo = Bound::Excluded(last.clone());
                    }
                    self.page = entries.into();
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
        let (k, v) = self.page.pop_front()?;
        Some(decode_key::<T>(&k).map(|k| (k, T::V::from_raw(&v))))
    }
}
