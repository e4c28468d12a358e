//! `backup`: a consistent copy of a journal into a new, closed journal file, also while a
//! writer in another process has the journal open; and [`NewJournal`], the new file that
//! `backup` and `import_dump` build.
//!
//! # How
//!
//! The source is read through an [`Inspector`]: one redb read transaction with the log's
//! records of the same cycle laid over it (what its writer committed a moment ago is
//! there), so every table is read from the same instant. Every table's entries are copied,
//! in key order and in batches of a few MiB, into a new redb file created under a
//! temporary name beside the destination; the `meta/checkpoint` record is replaced with one
//! for a journal without a log (a new journal id, generation 1). The copy is committed
//! durably, closed, then linked into place (refused if the destination exists by then) and
//! the directory synced. On any error the temporary file is removed: nothing is left at
//! the destination.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase};

use crate::codec::{self, RecordKind};
use crate::error::{Error, Result};
use crate::fsutil::{TempFile, parent_dir, sync_dir};
use crate::index::{self, Base, Layered, Layers, Memtable, Table, View, WriteTables};
use crate::inspect::{Access, Inspector};
use crate::log;
use crate::record::CheckpointRecord;

/// Bytes of changes held before they are written into the new file.
const BATCH_BYTES: usize = 8 << 20;

/// What [`backup`] copied.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackupReport {
    /// The copy.
    pub dest: PathBuf,
    /// How the source was reached ([`Access::Live`]: a writer had it open; the copy is its
    /// latest commit when the copy began).
    pub access: Access,
    /// Events copied.
    pub events: u64,
    /// Receipts copied.
    pub receipts: u64,
    /// Result payloads copied.
    pub results: u64,
    /// Entries copied, every table together.
    pub entries: u64,
    /// Records of the source's log that were laid over its file (committed, not yet
    /// checkpointed): the copy holds them. 0 from [`Journal::backup`](crate::Journal::backup),
    /// which copies its own memtable instead.
    pub log_records: u64,
    /// The copy's size in bytes.
    pub file_bytes: u64,
}

/// Copies the journal at `src` into a new journal file at `dest`: a consistent snapshot
/// (the source's latest commit, including what its log holds), also while an editor has
/// the source open (with `Sharing::LiveReaders`). The copy is one closed file, without a
/// log, that `Journal::open` and `verify` accept; the source is never written.
///
/// # Errors
///
/// - [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) if `dest` exists (nothing
///   is written: choose another path or remove it);
/// - the errors of [`Inspector::open`] for the source ([`ErrorKind::Locked`](crate::ErrorKind::Locked)
///   when a writer holds it with `Sharing::Exclusive`);
/// - [`ErrorKind::Corrupt`](crate::ErrorKind::Corrupt) if the source's log holds a record
///   whose changes do not decode;
/// - [`ErrorKind::Io`](crate::ErrorKind::Io), [`ErrorKind::Storage`](crate::ErrorKind::Storage)
///   writing the copy. Whatever the error, nothing is left at `dest`.
pub fn backup(src: impl AsRef<Path>, dest: impl AsRef<Path>) -> Result<BackupReport> {
    let dest = dest.as_ref();
    refuse_existing(dest)?;
    Inspector::open(src)?.backup(dest)
}

impl Inspector {
    /// Copies the inspected journal into a new journal file at `dest`, as [`backup`] does.
    ///
    /// # Errors
    ///
    /// As [`backup`].
    pub fn backup(&self, dest: impl AsRef<Path>) -> Result<BackupReport> {
        let dest = dest.as_ref();
        crate::preflight::guarded("backup", || {
            let mut log_records = 0;
            let mut report = self.with_snapshot_and_log(true, |snap, _, read| {
                if let crate::inspect::LogRead::Read { records, .. } = read {
                    log_records = *records;
                }
                backup_snapshot(snap, dest)
            })?;
            report.access = self.access();
            report.log_records = log_records;
            Ok(report)
        })
    }
}

/// Copies `snap` into a new journal file at `dest` (see [`backup`]).
pub(crate) fn backup_snapshot(snap: &index::Snapshot<'_>, dest: &Path) -> Result<BackupReport> {
    let mut out = NewJournal::create(dest)?;
    let mut report = copy_tables(snap, &mut out)?;
    report.file_bytes = out.install()?;
    Ok(report)
}

fn copy_tables(snap: &index::Snapshot<'_>, out: &mut NewJournal) -> Result<BackupReport> {
    let mut report = BackupReport {
        dest: out.dest.clone(),
        access: Access::Idle,
        events: 0,
        receipts: 0,
        results: 0,
        entries: 0,
        log_records: 0,
        file_bytes: 0,
    };
    // The copy has no log: its checkpoint starts a new one, under a new journal id (a
    // stray log beside it is not its log).
    let has_checkpoint = snap.checkpoint()?.is_some();
    for entry in snap.all::<index::Meta>()? {
        let (k, v) = entry?;
        if k != "checkpoint" {
            out.put::<index::Meta>(k, v)?;
            report.entries += 1;
        }
    }
    if has_checkpoint {
        let cp = CheckpointRecord {
            journal_id: log::new_journal_id(),
            generation: 1,
            next_lsn: 1,
        };
        out.put::<index::Meta>("checkpoint".into(), codec::encode(RecordKind::Meta, &cp))?;
        report.entries += 1;
    }
    report.events = out.copy::<index::Events>(snap)?;
    report.receipts = out.copy::<index::Receipts>(snap)?;
    let in_table = out.copy::<index::Results>(snap)?;
    report.entries += report.events + report.receipts + in_table;
    // Results inline in their receipts (format 3) were copied with them.
    let mut inline = 0;
    for entry in snap.all::<index::Receipts>()? {
        if index::split_receipt_value(&entry?.1).1.is_some() {
            inline += 1;
        }
    }
    report.results = in_table + inline;
    macro_rules! rest {
        ($($t:ident),*) => { $( report.entries += out.copy::<index::$t>(snap)?; )* };
    }
    rest!(
        Scopes,
        OpEvents,
        Timers,
        ScopeTimers,
        Windows,
        Holds,
        InDoubt,
        Quarantine
    );
    Ok(report)
}

/// Refuses a destination that exists (a file, a directory, a link, dangling or not).
pub(crate) fn refuse_existing(dest: &Path) -> Result<()> {
    if std::fs::symlink_metadata(dest).is_ok() {
        return Err(exists(dest));
    }
    Ok(())
}

fn exists(dest: &Path) -> Error {
    Error::invalid(
        "destination",
        &dest.display().to_string(),
        "it already exists: choose another path, or remove it first (nothing was written)",
    )
}

/// A new journal being built under a temporary name beside its destination, in batches;
/// [`NewJournal::install`] links it into place. Dropped before that, it removes itself.
pub(crate) struct NewJournal {
    /// A read snapshot of what was written so far (dropped before `db`).
    base: Option<Base>,
    /// Changes not yet written into the file.
    pending: Memtable,
    db: Option<Database>,
    tmp: TempFile,
    dest: PathBuf,
    dir: PathBuf,
}

impl NewJournal {
    /// Creates the temporary file beside `dest`, with every table.
    pub(crate) fn create(dest: &Path) -> Result<NewJournal> {
        refuse_existing(dest)?;
        let dir = parent_dir(dest).to_path_buf();
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| {
                Error::invalid(
                    "destination",
                    &dest.display().to_string(),
                    "it does not name a file",
                )
            })?;
        let tmp = TempFile::create(&dir, &name)?;
        let db = redb::Builder::new()
            .set_cache_size(crate::config::INSPECT_CACHE_BYTES)
            .create(&tmp.path)
            .map_err(|e| crate::preflight::file::open_error(&tmp.path, e))?;
        {
            let txn = db.begin_write()?;
            index::create_tables(&txn)?;
            txn.commit()?;
        }
        let base = Base::new(db.begin_read()?);
        Ok(NewJournal {
            base: Some(base),
            pending: Memtable::default(),
            db: Some(db),
            tmp,
            dest: dest.to_path_buf(),
            dir,
        })
    }

    fn db(&self) -> Result<&Database> {
        self.db
            .as_ref()
            .ok_or_else(|| Error::new(crate::error::ErrorKind::Closed))
    }

    /// Puts one entry (written with the next batch).
    pub(crate) fn put<T: Table>(&mut self, key: T::K, value: T::V) -> Result<()> {
        self.pending.set::<T>(key, Some(value));
        self.maybe_flush()
    }

    /// Copies every entry of table `T` of `snap`; returns how many.
    fn copy<T: Table>(&mut self, snap: &index::Snapshot<'_>) -> Result<u64> {
        let mut n = 0;
        for entry in snap.all::<T>()? {
            let (k, v) = entry?;
            self.put::<T>(k, v)?;
            n += 1;
        }
        Ok(n)
    }

    /// Runs `f` on a batch over everything written so far; its changes are kept if it
    /// returns `Ok`, and dropped otherwise.
    pub(crate) fn batch<R>(
        &mut self,
        f: impl FnOnce(&mut WriteTables<'_>) -> Result<R>,
    ) -> Result<R> {
        let (r, changes) = {
            let mut t = WriteTables::over(self.base.as_ref(), Layers::new(&[&self.pending]));
            let r = f(&mut t)?;
            (r, t.into_changes())
        };
        self.pending.absorb(changes);
        self.maybe_flush()?;
        Ok(r)
    }

    /// Runs `f` on everything written so far.
    pub(crate) fn view<R>(&self, f: impl FnOnce(&index::Snapshot<'_>) -> R) -> R {
        f(&index::Snapshot {
            base: self.base.as_ref(),
            layers: Layers::new(&[&self.pending]),
        })
    }

    fn maybe_flush(&mut self) -> Result<()> {
        if self.pending.bytes() >= BATCH_BYTES {
            self.flush(false)?;
        }
        Ok(())
    }

    /// Writes the pending changes into the file; `durable`: synced.
    fn flush(&mut self, durable: bool) -> Result<()> {
        self.base = None;
        let db = self.db()?;
        let mut txn = db.begin_write()?;
        if !durable {
            txn.set_durability(redb::Durability::None)?;
        }
        index::checkpoint(&txn, &self.pending)?;
        txn.commit()?;
        self.pending = Memtable::default();
        self.base = Some(Base::new(self.db()?.begin_read()?));
        Ok(())
    }

    /// Writes what is pending, syncs and closes the file, then links it at the destination
    /// (refused if something appeared there meanwhile) and syncs the directory. Returns the
    /// file's size.
    pub(crate) fn install(mut self) -> Result<u64> {
        self.flush(true)?;
        self.base = None;
        if let Some(db) = self.db.take() {
            crate::preflight::guarded("close", || {
                drop(db);
                Ok(())
            })?;
        }
        let tmp = &self.tmp.path;
        match std::fs::hard_link(tmp, &self.dest) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(exists(&self.dest));
            }
            // No hard links on this file system: rename, unless something appeared there.
            Err(_) if std::fs::symlink_metadata(&self.dest).is_err() => {
                std::fs::rename(tmp, &self.dest).map_err(Error::io)?
            }
            Err(e) => return Err(Error::io(e)),
        }
        sync_dir(&self.dir)?;
        std::fs::metadata(&self.dest)
            .map(|m| m.len())
            .map_err(Error::io)
    }
}
