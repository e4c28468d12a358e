//! The damaged journal as `repair` reads it: opened in place without writing it, each table
//! read as far as redb can, around damaged pages, and the log's records laid
//! over it.
//!
//! # Opening
//!
//! redb is tried on the file in turn, every try read-only or on a scratch in
//! memory (the file is never written):
//!
//! 1. read-only, seen with the journal's length (bytes appended after it ignored);
//! 2. as a writer on a scratch: the engine's recovery (a writer did not close the file, or its
//!    allocator state is damaged) runs in memory;
//! 3. a truncated file, seen at the length its header gives, the missing pages zero (what
//!    they held is reported as unreadable);
//! 4. the first 64 bytes of the header (magic, flags, geometry) rewritten on the scratch, and
//!    the engine's recovery run, when they are what is damaged.
//!
//! When none works, the records are salvaged from the raw bytes alone.
//!
//! # Reading around damage
//!
//! A table is read in key order until the engine fails (a damaged page: an error, a panic it
//! was not written to avoid, keys out of order). Reading resumes at the first key it can
//! read after the damage: for a table keyed by sequence number, found by probing starts
//! after the damaged range; for any table, found by reading backwards from its end. What
//! lies between is a gap, reported by table and key range; `repair` looks for the records of
//! an event or result gap in the raw bytes.

use std::fs::File;
use std::ops::Bound;
use std::path::{Path, PathBuf};

use redb::{Database, ReadOnlyDatabase, ReadTransaction, ReadableDatabase, TableHandle};

use crate::error::{Error, ErrorKind, Result};
use crate::index::{self, Base, Layers, Memtable, Table, TableKey, TableValue};
use crate::inspect::{RECOVERY_SCRATCH_BYTES, not_openable, open_on};
use crate::preflight::guarded;
use crate::preflight::reading::{Extent, InPlace, Locks, Scratch};

/// The most memory redb may write to while repair reads the file in place.
const SCRATCH_BYTES: u64 = 4 * RECOVERY_SCRATCH_BYTES;

/// How redb reached the file.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rung {
    /// Read-only, in place.
    InPlace,
    /// Recovered in memory.
    Recovered,
    /// Truncated: seen at its header's length, missing pages zero.
    Padded,
    /// Its header's first bytes rewritten in memory.
    Patched,
    /// As `Patched`, with the region geometry every journal is created with.
    PatchedDefaults,
}

pub(crate) enum Db {
    ReadOnly(ReadOnlyDatabase),
    Scratch(Database),
}

impl Db {
    /// Closes the database; a scratch one without the engine's closing commit.
    fn close(self) {
        match self {
            Db::ReadOnly(db) => drop(db),
            Db::Scratch(db) => crate::preflight::close_unwritten(db),
        }
    }

    fn begin_read(&self) -> std::result::Result<ReadTransaction, redb::TransactionError> {
        match self {
            Db::ReadOnly(db) => db.begin_read(),
            Db::Scratch(db) => db.begin_read(),
        }
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        // Closing a database of a damaged file may panic: contain that. A recovered one is
        // closed without the commit the engine would make to the scratch.
        if let Some(db) = self.db.take() {
            let _ = guarded("close", || {
                db.close();
                Ok(())
            });
        }
    }
}

/// Padded with zeros to the length its header claims (a truncated file), a journal costs
/// redb memory in proportion to that length (its allocator keeps a few bits
/// per page of every region): about 1 MiB per 16 GiB. A damaged header may claim
/// petabytes (fuzzing found one that made `repair` allocate 4 GiB), so the padded rung is
/// tried only for a claim of at most 64 GiB or 16 times the file's length: at most 4 MiB,
/// or a 1,024th of the file.
fn padding_is_bounded(extent: &Extent) -> bool {
    const ABSOLUTE: u64 = 64 << 30;
    extent
        .stored_len
        .is_some_and(|len| len <= ABSOLUTE || len <= extent.file_len.saturating_mul(16))
}

/// A range of keys of a table that could not be read: everything after `after` (or from
/// the start) and before `before` (or to the end).
#[derive(Clone, Debug)]
pub(crate) struct Gap<K> {
    pub after: Option<K>,
    pub before: Option<K>,
    pub why: String,
}

impl<K: TableKey> Gap<K> {
    /// Whether `k` lies in the gap.
    pub(crate) fn contains(&self, k: &K) -> bool {
        self.after.as_ref().is_none_or(|a| k > a) && self.before.as_ref().is_none_or(|b| k < b)
    }

    /// The key range, for reports.
    pub(crate) fn describe(&self) -> String {
        match (&self.after, &self.before) {
            (None, None) => "every key".into(),
            (Some(a), None) => format!("after `{}`", a.show()),
            (None, Some(b)) => format!("before `{}`", b.show()),
            (Some(a), Some(b)) => format!("between `{}` and `{}`", a.show(), b.show()),
        }
    }
}

/// Part of a table, read.
pub(crate) struct Chunk<K> {
    /// Ranges that could not be read.
    pub gaps: Vec<Gap<K>>,
    /// Where to go on: after this key (`None`: the table is done).
    pub resume: Option<K>,
}

/// How a forward read ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Forward {
    Done,
    Full,
    Failed,
}

/// The journal being repaired.
pub(crate) struct Source {
    pub(crate) path: PathBuf,
    pub(crate) extent: Extent,
    pub(crate) rung: Option<Rung>,
    db: Option<Db>,
    /// Why redb refused the file as it is (the first try's error), if it did.
    pub(crate) refused: Option<Error>,
    /// The log's records of the current cycle.
    pub(crate) mem: Memtable,
    /// The file's deferred purges (see `index::purged`), read on first use; empty when the
    /// entry is missing or damaged (a damaged one leaves the purged events and results
    /// readable, and repair keeps their operations: nothing the journal still held is lost).
    purged: Option<index::purged::Purged>,
}

fn is_io(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Io | ErrorKind::Poisoned)
        && !std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|io| {
                // The engine reports a file that is not a database, or ends early, as
                // I/O errors of these kinds: damage, not a failing disk.
                matches!(
                    io.kind(),
                    std::io::ErrorKind::UnexpectedEof
                        | std::io::ErrorKind::OutOfMemory
                        | std::io::ErrorKind::InvalidData
                )
            })
}

/// The redb header with its first 64 bytes made sane: the magic, the recovery flag (so the
/// engine recomputes the layout from the length and rebuilds its allocator state), a 4 KiB
/// page and the region geometry (the file's own, when it is plausible). The commit slots,
/// which carry their own checksums, are kept.
fn patched_header(head: &[u8], len: u64, defaults: bool) -> Vec<u8> {
    let mut h = head.to_vec();
    h[..9].copy_from_slice(&crate::preflight::file::REDB_MAGIC);
    // Keep which slot is primary and whether it was written with two-phase commit.
    h[9] = (h[9] & (1 | 4)) | 2;
    h[10] = 0;
    h[11] = 0;
    h[12..16].copy_from_slice(&4096u32.to_le_bytes());
    let at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let (mut hdr, mut max) = (at(16), at(20));
    if defaults || max == 0 || max > 1 << 20 || hdr > 1 << 20 {
        (hdr, max) = (0, 4096);
    }
    h[16..20].copy_from_slice(&hdr.to_le_bytes());
    h[20..24].copy_from_slice(&max.to_le_bytes());
    // The region counts follow from the length (the recovery recomputes them anyway).
    let region = (u64::from(hdr) + u64::from(max)) * 4096;
    let data = len.saturating_sub(4096);
    let full = data / region;
    let trailing = (data % region / 4096).saturating_sub(u64::from(hdr));
    h[24..28].copy_from_slice(&u32::try_from(full).unwrap_or(0).to_le_bytes());
    h[28..32].copy_from_slice(&u32::try_from(trailing).unwrap_or(0).to_le_bytes());
    h
}

impl Source {
    /// Opens the journal at `path` for repair, trying redb as the module docs
    /// say. `Ok` with no database when the engine refuses the file every way.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Locked`] when a writer has it open; [`ErrorKind::Io`] for an I/O error
    /// (which is not damage: repair stops).
    pub(crate) fn open(path: &Path, extent: Extent) -> Result<Source> {
        let mut src = Source {
            path: path.to_path_buf(),
            extent,
            rung: None,
            db: None,
            refused: None,
            mem: Memtable::default(),
            purged: None,
        };
        let mut rungs = vec![Rung::InPlace, Rung::Recovered];
        if extent.missing() > 0 && padding_is_bounded(&extent) {
            rungs.push(Rung::Padded);
        }
        rungs.push(Rung::Patched);
        rungs.push(Rung::PatchedDefaults);
        for rung in rungs {
            match src.open_rung(rung) {
                Ok(db) => {
                    src.db = Some(db);
                    src.rung = Some(rung);
                    break;
                }
                Err(e) if matches!(e.kind(), ErrorKind::Locked { .. }) => return Err(e),
                Err(e) if is_io(&e) => return Err(e),
                Err(e) => {
                    if src.refused.is_none() {
                        src.refused = Some(e);
                    }
                }
            }
        }
        if src.rung == Some(Rung::InPlace) {
            src.refused = None;
        }
        Ok(src)
    }

    fn open_rung(&self, rung: Rung) -> Result<Db> {
        let path = &self.path;
        let file = || {
            File::open(path).map_err(|e| {
                Error::io_while(
                    "open the journal file",
                    "the repair stopped and nothing was changed",
                    e,
                )
            })
        };
        let scratch = |len: u64| -> Result<Scratch> {
            Scratch::new(file()?, len, SCRATCH_BYTES, Locks::Forward).map_err(|e| {
                Error::io_while(
                    "read the journal file",
                    "the repair stopped and nothing was changed",
                    e,
                )
            })
        };
        let db = guarded("open", || {
            let db = match rung {
                Rung::InPlace => {
                    let cap = (self.extent.trailing() > 0).then(|| self.extent.journal_len());
                    let backend = InPlace::new(file()?, cap).map_err(Error::io)?;
                    let len = redb::StorageBackend::len(&backend).map_err(Error::io)?;
                    crate::preflight::system_tree::check_page_numbers(
                        len,
                        &mut |at, buf| redb::StorageBackend::read(&backend, at, buf),
                        crate::preflight::system_tree::Depth::Full,
                    )?;
                    redb::Builder::new()
                        .set_cache_size(crate::config::INSPECT_CACHE_BYTES)
                        .set_concurrency_mode(redb::ConcurrencyMode::ExclusiveWriter)
                        .open_read_only_with_backend(backend)
                        .map(Db::ReadOnly)
                }
                Rung::Recovered => open_on(scratch(self.extent.journal_len())?).map(Db::Scratch),
                Rung::Padded => {
                    let len = self.extent.stored_len.unwrap_or(self.extent.file_len);
                    open_on(scratch(len)?).map(Db::Scratch)
                }
                Rung::Patched | Rung::PatchedDefaults => {
                    let len = self.extent.file_len / 4096 * 4096;
                    if len < 2 * 4096 {
                        return Err(Error::corrupt(
                            "(redb)",
                            "(header)",
                            "the file is too short to hold a journal",
                        ));
                    }
                    let s = scratch(len)?;
                    let mut head = vec![0u8; 512];
                    redb::StorageBackend::read(&s, 0, &mut head).map_err(Error::io)?;
                    let defaults = rung == Rung::PatchedDefaults;
                    redb::StorageBackend::write(&s, 0, &patched_header(&head, len, defaults))
                        .map_err(Error::io)?;
                    open_on(s).map(Db::Scratch)
                }
            };
            db.map_err(|e| not_openable(path, e))
        })?;
        // The engine opened it: its table list must read.
        guarded("open", || {
            let txn = db.begin_read()?;
            let _ = txn.list_tables()?.count();
            Ok(())
        })?;
        Ok(db)
    }

    /// Opens the database again the way it was opened (after a panic of redb,
    /// whose internal state may then be poisoned).
    fn reopen(&mut self) -> Result<()> {
        if let Some(rung) = self.rung {
            if let Some(db) = self.db.take() {
                let _ = guarded("close", || {
                    db.close();
                    Ok(())
                });
            }
            self.db = Some(self.open_rung(rung)?);
        }
        Ok(())
    }

    /// Whether redb reads the file at all.
    pub(crate) fn readable(&self) -> bool {
        self.db.is_some()
    }

    /// The names of the file's tables (empty without a database).
    pub(crate) fn table_names(&self) -> Result<Vec<String>> {
        let Some(db) = &self.db else {
            return Ok(Vec::new());
        };
        guarded("tables", || {
            let txn = db.begin_read()?;
            Ok(txn.list_tables()?.map(|h| h.name().to_string()).collect())
        })
    }

    /// Runs `f` on the journal as its writer left it (the file, the log's records over it),
    /// for point lookups. A redb panic is answered `Corrupt`.
    /// Without a database (the engine refuses the file) every lookup is unreadable.
    pub(crate) fn view<R>(&self, f: impl FnOnce(&index::Snapshot<'_>) -> Result<R>) -> Result<R> {
        let Some(db) = &self.db else {
            return Err(Error::corrupt(
                "(redb)",
                "(file)",
                "the storage engine cannot read the file",
            ));
        };
        guarded("read", || {
            let base = Base::new(db.begin_read()?);
            let snap = index::Snapshot {
                base: Some(&base),
                layers: Layers::new(&[&self.mem]),
            };
            f(&snap)
        })
    }

    /// Calls `each` with every entry of table `T` that can be read, in key order, the log's
    /// changes laid over the file's; returns the key ranges of the file's table that could
    /// not be read. `each`'s error ends the read with it.
    ///
    /// # Errors
    ///
    /// An I/O error reading the file (not damage), or `each`'s.
    pub(crate) fn read_table<T: Table>(
        &mut self,
        mut each: impl FnMut(T::K, T::V) -> Result<()>,
    ) -> Result<Vec<Gap<T::K>>> {
        let mut gaps = Vec::new();
        let mut after: Option<T::K> = None;
        let mut buf = Vec::new();
        loop {
            let chunk = self.read_range::<T>(after.as_ref(), 4096, &mut buf)?;
            for (k, v) in buf.drain(..) {
                each(k, v)?;
            }
            gaps.extend(chunk.gaps);
            match chunk.resume {
                Some(k) => after = Some(k),
                None => break,
            }
        }
        Ok(gaps)
    }

    /// Appends to `out`, in key order, the entries of table `T` after `after` (from the
    /// start for `None`): at most `limit` of the file's, with the log's changes in the same
    /// key range laid over them. The chunk says where to resume (`None`: the table is done)
    /// and which ranges could not be read.
    ///
    /// # Errors
    ///
    /// An I/O error reading the file (not damage).
    pub(crate) fn read_range<T: Table>(
        &mut self,
        after: Option<&T::K>,
        limit: usize,
        out: &mut Vec<(T::K, T::V)>,
    ) -> Result<Chunk<T::K>> {
        let mut base: Vec<(T::K, T::V)> = Vec::new();
        let mut gaps = Vec::new();
        let resume = if self.db.is_some() {
            let resume = self.read_base::<T>(after, limit, &mut base, &mut gaps)?;
            if let Some(set) = self.purged().of(T::ID) {
                base.retain(|(k, _)| !k.seq().is_some_and(|seq| set.contains(seq)));
            }
            resume
        } else {
            if after.is_none() {
                gaps.push(Gap {
                    after: None,
                    before: None,
                    why: "the storage engine cannot read the file".into(),
                });
            }
            None
        };
        // The log's changes in (after, last read] (or to the end when the table is done).
        let lo = match after {
            Some(a) => Bound::Excluded(a.clone()),
            None => Bound::Unbounded,
        };
        let hi = match &resume {
            Some(k) => Bound::Included(k.clone()),
            None => Bound::Unbounded,
        };
        let mut over = T::map(&self.mem).range((lo, hi)).peekable();
        for (k, v) in base {
            while let Some((ok, ov)) = over.peek()
                && **ok < k
            {
                if let Some(ov) = ov {
                    out.push(((*ok).clone(), ov.clone()));
                }
                over.next();
            }
            if over.peek().is_some_and(|(ok, _)| **ok == k) {
                if let Some((ok, Some(ov))) = over.next() {
                    out.push((ok.clone(), ov.clone()));
                }
                continue;
            }
            out.push((k, v));
        }
        for (ok, ov) in over {
            if let Some(ov) = ov {
                out.push((ok.clone(), ov.clone()));
            }
        }
        Ok(Chunk { gaps, resume })
    }

    /// The file's deferred purges, read once (see [`Source::purged`]'s field).
    fn purged(&mut self) -> &index::purged::Purged {
        if self.purged.is_none() {
            let read = self.view(|snap| match snap.base {
                Some(base) => Ok(base.purged()?.cloned()),
                None => Ok(None),
            });
            self.purged = Some(read.ok().flatten().unwrap_or_default());
        }
        self.purged.get_or_insert_default()
    }

    /// Reads at most `limit` entries of the file's table after `after`, around damage;
    /// returns the last key read when the limit stopped it.
    fn read_base<T: Table>(
        &mut self,
        after: Option<&T::K>,
        limit: usize,
        out: &mut Vec<(T::K, T::V)>,
        gaps: &mut Vec<Gap<T::K>>,
    ) -> Result<Option<T::K>> {
        let mut from: Bound<T::K> = match after {
            Some(a) => Bound::Excluded(a.clone()),
            None => Bound::Unbounded,
        };
        let mut last: Option<T::K> = after.cloned();
        loop {
            let room = limit.saturating_sub(out.len());
            let (end, err) = self.forward::<T>(&from, &mut last, room, out)?;
            match end {
                Forward::Done => return Ok(None),
                Forward::Full => return Ok(last),
                Forward::Failed => {}
            }
            let why = err.map_or_else(|| "unreadable".to_string(), |e| describe(&e));
            // Resume strictly after what was read, and after where this try started.
            let search_after = match (&last, &from) {
                (_, Bound::Included(f)) => Some(f.clone()),
                (l, _) => l.clone(),
            };
            let resume = self.find_resume::<T>(search_after.as_ref())?;
            gaps.push(Gap {
                after: last.clone(),
                before: resume.clone(),
                why,
            });
            match resume {
                Some(k) => from = Bound::Included(k),
                None => return Ok(None),
            }
        }
    }

    /// Reads forward from `from`, appending at most `room` entries to `out` and updating
    /// `last`. Says whether the table ended, the room was filled, or the engine failed (and
    /// with what).
    fn forward<T: Table>(
        &mut self,
        from: &Bound<T::K>,
        last: &mut Option<T::K>,
        room: usize,
        out: &mut Vec<(T::K, T::V)>,
    ) -> Result<(Forward, Option<Error>)> {
        let Some(db) = &self.db else {
            return Ok((Forward::Failed, None));
        };
        let mut end = Forward::Done;
        let r = guarded(T::NAME, || {
            let txn = db.begin_read()?;
            let table = match txn.open_table(T::def()) {
                Ok(t) => t,
                // Every journal has its tables (but an older one may lack the quarantine): a
                // missing one is damage to the list of tables.
                Err(redb::TableError::TableDoesNotExist(_)) if T::NAME == "quarantine" => {
                    return Ok(());
                }
                Err(redb::TableError::TableDoesNotExist(_)) => {
                    return Err(Error::corrupt(
                        "(redb)",
                        T::NAME,
                        "the table is missing from the file's list of tables",
                    ));
                }
                Err(e) => return Err(e.into()),
            };
            let lo = match from {
                Bound::Included(k) => Bound::Included(k.borrow()),
                Bound::Excluded(k) => Bound::Excluded(k.borrow()),
                Bound::Unbounded => Bound::Unbounded,
            };
            for (taken, entry) in table.range((lo, Bound::Unbounded))?.enumerate() {
                if taken >= room {
                    end = Forward::Full;
                    return Ok(());
                }
                let (k, v) = entry?;
                let k = T::K::own(k.value());
                let v = T::V::own(v.value());
                let before_start = match from {
                    Bound::Included(f) => k < *f,
                    Bound::Excluded(f) => k <= *f,
                    Bound::Unbounded => false,
                };
                if last.as_ref().is_some_and(|l| *l >= k) || before_start {
                    return Err(Error::corrupt(
                        "(redb)",
                        T::NAME,
                        "the storage engine returned keys out of order",
                    ));
                }
                *last = Some(k.clone());
                out.push((k, v));
            }
            Ok(())
        });
        match r {
            Ok(()) => Ok((end, None)),
            Err(e) if is_io(&e) => Err(e),
            Err(e) => {
                self.heal()?;
                Ok((Forward::Failed, Some(e)))
            }
        }
    }

    /// After the engine failed: reopens it if it no longer answers at all.
    fn heal(&mut self) -> Result<()> {
        let alive = self.db.as_ref().is_some_and(|db| {
            guarded("check", || {
                let txn = db.begin_read()?;
                let _ = txn.list_tables()?.count();
                Ok(())
            })
            .is_ok()
        });
        if !alive {
            self.reopen()?;
        }
        Ok(())
    }

    /// Whether reading from `k` on yields an entry: `Some(first key)` if it does.
    fn probe<T: Table>(&mut self, k: &T::K) -> Result<Option<T::K>> {
        let Some(db) = &self.db else {
            return Ok(None);
        };
        let r = guarded(T::NAME, || {
            let txn = db.begin_read()?;
            let table = txn.open_table(T::def())?;
            let mut range = table.range((Bound::Included(k.borrow()), Bound::Unbounded))?;
            match range.next() {
                Some(entry) => {
                    let (key, _) = entry?;
                    let key = T::K::own(key.value());
                    if key < *k {
                        return Err(Error::corrupt("(redb)", T::NAME, "keys out of order"));
                    }
                    Ok(Some(key))
                }
                None => Ok(None),
            }
        });
        match r {
            Ok(found) => Ok(found),
            Err(e) if is_io(&e) => Err(e),
            Err(_) => {
                self.heal()?;
                Ok(None)
            }
        }
    }

    /// The first key after `after` from which the table reads again, if any.
    fn find_resume<T: Table>(&mut self, after: Option<&T::K>) -> Result<Option<T::K>> {
        // From the end backwards, as far as the engine reads.
        let mut smallest: Option<T::K> = None;
        if let Some(db) = &self.db {
            let r = guarded(T::NAME, || {
                let txn = db.begin_read()?;
                let table = txn.open_table(T::def())?;
                let lo = match after {
                    Some(a) => Bound::Excluded(a.borrow()),
                    None => Bound::Unbounded,
                };
                for entry in table.range((lo, Bound::Unbounded))?.rev() {
                    let Ok((k, _)) = entry else { break };
                    let k = T::K::own(k.value());
                    if after.is_some_and(|a| k <= *a) || smallest.as_ref().is_some_and(|s| k >= *s)
                    {
                        break;
                    }
                    smallest = Some(k);
                }
                Ok(())
            });
            if let Err(e) = r {
                if is_io(&e) {
                    return Err(e);
                }
                self.heal()?;
            }
        }
        // A table keyed by number: probe forward for the first readable start before it.
        if let Some(after) = after
            && let Some(a) = (after as &dyn std::any::Any).downcast_ref::<u64>()
        {
            let limit = smallest
                .as_ref()
                .and_then(|s| (s as &dyn std::any::Any).downcast_ref::<u64>().copied())
                .unwrap_or(u64::MAX);
            let mut failed = *a;
            let mut step = 1u64;
            while failed < limit {
                let k = failed.saturating_add(step).min(limit);
                if k >= limit {
                    break;
                }
                let key = as_key::<T::K>(k);
                match key
                    .as_ref()
                    .map(|key| self.probe::<T>(key))
                    .transpose()?
                    .flatten()
                {
                    Some(found) => {
                        // Narrow down to the first start that reads, between the failure and k.
                        let (mut lo, mut hi, mut best) = (failed, k, found);
                        while hi - lo > 1 {
                            let mid = lo + (hi - lo) / 2;
                            let probe = as_key::<T::K>(mid)
                                .map(|key| self.probe::<T>(&key))
                                .transpose()?
                                .flatten();
                            match probe {
                                Some(f) => {
                                    hi = mid;
                                    best = f;
                                }
                                None => lo = mid,
                            }
                        }
                        let best_n = (&best as &dyn std::any::Any)
                            .downcast_ref::<u64>()
                            .copied()
                            .unwrap_or(u64::MAX);
                        if best_n < limit {
                            return Ok(Some(best));
                        }
                        break;
                    }
                    None => {
                        failed = k;
                        step = step.saturating_mul(2);
                    }
                }
            }
        }
        Ok(smallest)
    }
}

/// `n` as the key type `K`, when `K` is `u64`.
fn as_key<K: TableKey>(n: u64) -> Option<K> {
    (&n as &dyn std::any::Any).downcast_ref::<K>().cloned()
}

fn describe(e: &Error) -> String {
    match e.kind() {
        ErrorKind::Corrupt { detail, .. } => {
            let mut s = detail.clone();
            let mut source = std::error::Error::source(e);
            while let Some(c) = source {
                s.push_str(&format!(" ({c})"));
                source = c.source();
            }
            s
        }
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patched_header_has_the_magic_the_recovery_flag_and_a_layout_for_the_length() {
        let mut head = vec![0xffu8; 512];
        head[9] = 1 | 4;
        let h = patched_header(&head, 139_264, false);
        assert_eq!(&h[..9], &crate::preflight::file::REDB_MAGIC);
        assert_eq!(
            h[9],
            1 | 4 | 2,
            "primary and two-phase kept, recovery required"
        );
        let e = Extent::from_header(&h[..64], 139_264);
        assert_eq!(e.stored_len, Some(139_264));
        assert_eq!(&h[64..], &head[64..], "the commit slots are kept");
    }
}
