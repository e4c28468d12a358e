//! A new journal file written in batches: [`BatchWriter`] (what backup, import and
//! `repair` write through) and [`NewJournal`] (a new file under a temporary name beside its
//! destination, linked into place once complete).
//!
//! Changes gather in a memtable laid over what the file holds so far, so a batch reads its
//! own writes; once they pass a few MiB they are written into the file in one redb
//! transaction that is not synced (a file that is not installed yet need not survive a
//! power loss). Only the last write is durable. Memory holds one batch, whatever the size
//! of the journal being written.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase};

use crate::error::{Error, ErrorKind, Result};
use crate::fsutil::{TempFile, parent_dir, sync_dir};
use crate::index::{self, Base, Layered, Layers, Memtable, Table, WriteTables};

/// Bytes of changes held before they are written into the new file.
const BATCH_BYTES: usize = 8 << 20;

/// What the writer was doing when redb failed: writing (a transaction, a table) or
/// committing a batch.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Write,
    Commit,
}

/// How a caller's errors read: each caller says what it was doing (backup passes redb's
/// errors on; repair says that the journal was left unchanged).
pub(crate) type ErrorContext = fn(Error, Step) -> Error;

/// Passes the error on as it is.
pub(crate) fn as_is(e: Error, _: Step) -> Error {
    e
}

/// A new redb file with every journal table, written in batches.
pub(crate) struct BatchWriter {
    /// A read snapshot of what was written so far (dropped before each write, and before
    /// `db`). `None` only while a batch is being written, or after that failed.
    base: Option<Base<'static>>,
    /// Changes not yet written into the file.
    pending: Memtable,
    db: Option<Database>,
    /// Whether the last write was durable and nothing changed since (then
    /// [`BatchWriter::finish`] commits nothing more).
    synced: bool,
    context: ErrorContext,
}

impl BatchWriter {
    /// Creates every table in `db` (a new, empty database).
    ///
    /// # Errors
    ///
    /// redb's, through `context`.
    pub(crate) fn new(db: Database, context: ErrorContext) -> Result<BatchWriter> {
        let write = |e: Error| context(e, Step::Write);
        {
            let txn = db.begin_write().map_err(|e| write(e.into()))?;
            index::create_tables(&txn).map_err(write)?;
            txn.commit().map_err(|e| write(e.into()))?;
        }
        let base = Base::new(db.begin_read().map_err(|e| write(e.into()))?);
        Ok(BatchWriter {
            base: Some(base),
            pending: Memtable::default(),
            db: Some(db),
            synced: false,
            context,
        })
    }

    fn db(&self) -> Result<&Database> {
        self.db
            .as_ref()
            .ok_or_else(|| Error::new(ErrorKind::Closed))
    }

    /// Sets one entry in the pending batch (written with it).
    pub(crate) fn set<T: Table>(&mut self, key: T::K, value: T::V) {
        self.pending.set::<T>(key, Some(value));
    }

    /// Puts one entry, then writes the batch if it has grown.
    ///
    /// # Errors
    ///
    /// As [`BatchWriter::flush`].
    pub(crate) fn put<T: Table>(&mut self, key: T::K, value: T::V) -> Result<()> {
        self.set::<T>(key, value);
        self.maybe_flush()
    }

    /// Copies every entry of table `T` of `snap`; returns how many.
    ///
    /// # Errors
    ///
    /// Reading `snap`, or as [`BatchWriter::flush`].
    pub(crate) fn copy<T: Table>(&mut self, snap: &index::Snapshot<'_>) -> Result<u64> {
        let mut n = 0;
        for entry in snap.all::<T>()? {
            let (k, v) = entry?;
            self.put::<T>(k, v)?;
            n += 1;
        }
        Ok(n)
    }

    /// Runs `f` on a batch over everything written so far; its changes are kept if it
    /// returns `Ok`, and dropped otherwise. Nothing is written to the file (see
    /// [`BatchWriter::maybe_flush`]).
    ///
    /// # Errors
    ///
    /// `f`'s, as it returned it.
    pub(crate) fn batch<R, E>(
        &mut self,
        f: impl FnOnce(&mut WriteTables<'_>) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        let (r, changes) = {
            let mut t = WriteTables::over(self.base.as_ref(), Layers::new(&[&self.pending]));
            let r = f(&mut t)?;
            (r, t.into_changes())
        };
        self.pending.absorb(changes);
        Ok(r)
    }

    /// Runs `f` on everything written so far (the file and the pending batch).
    pub(crate) fn view<R>(&self, f: impl FnOnce(&index::Snapshot<'_>) -> R) -> R {
        f(&index::Snapshot {
            base: self.base.as_ref(),
            layers: Layers::new(&[&self.pending]),
        })
    }

    /// Writes the pending batch into the file (not durably) once it has grown past a few
    /// MiB.
    ///
    /// # Errors
    ///
    /// As [`BatchWriter::flush`].
    pub(crate) fn maybe_flush(&mut self) -> Result<()> {
        if self.pending.bytes() >= BATCH_BYTES {
            self.flush(false)?;
        }
        Ok(())
    }

    /// Writes the pending changes into the file in one transaction; `durable`: synced.
    ///
    /// # Errors
    ///
    /// redb's, through the writer's context ([`Step::Commit`] for the commit).
    pub(crate) fn flush(&mut self, durable: bool) -> Result<()> {
        let context = self.context;
        let write = |e: Error| context(e, Step::Write);
        self.base = None;
        let db = self.db()?;
        let mut txn = db.begin_write().map_err(|e| write(e.into()))?;
        if !durable {
            txn.set_durability(redb::Durability::None)
                .map_err(|e| write(e.into()))?;
        }
        index::checkpoint(&txn, &self.pending, false).map_err(write)?;
        txn.commit().map_err(|e| context(e.into(), Step::Commit))?;
        self.pending = Memtable::default();
        self.synced = durable;
        self.base = Some(Base::new(
            self.db()?.begin_read().map_err(|e| write(e.into()))?,
        ));
        Ok(())
    }

    /// Writes what is pending durably (unless the last write was durable and nothing
    /// changed since) and hands the database back, its read snapshot dropped.
    ///
    /// # Errors
    ///
    /// As [`BatchWriter::flush`].
    pub(crate) fn finish(mut self) -> Result<Database> {
        if !(self.synced && self.pending.is_empty()) {
            self.flush(true)?;
        }
        self.base = None;
        self.db.take().ok_or_else(|| Error::new(ErrorKind::Closed))
    }
}

/// Refuses a destination that exists (a file, a directory, a link, dangling or not).
///
/// # Errors
///
/// [`ErrorKind::InvalidInput`] naming it.
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
    out: BatchWriter,
    tmp: TempFile,
    pub(crate) dest: PathBuf,
}

impl NewJournal {
    /// Creates the temporary file beside `dest`, with every table.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`] if `dest` exists or names no file; creating the file.
    pub(crate) fn create(dest: &Path) -> Result<NewJournal> {
        refuse_existing(dest)?;
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
        let tmp = TempFile::create(parent_dir(dest), &name)?;
        let db = redb::Builder::new()
            .set_cache_size(crate::config::INSPECT_CACHE_BYTES)
            .create(&tmp.path)
            .map_err(|e| crate::preflight::file::open_error(&tmp.path, e))?;
        Ok(NewJournal {
            out: BatchWriter::new(db, as_is)?,
            tmp,
            dest: dest.to_path_buf(),
        })
    }

    /// Puts one entry (written with the next batch).
    ///
    /// # Errors
    ///
    /// As [`BatchWriter::put`].
    pub(crate) fn put<T: Table>(&mut self, key: T::K, value: T::V) -> Result<()> {
        self.out.put::<T>(key, value)
    }

    /// Copies every entry of table `T` of `snap`; returns how many.
    ///
    /// # Errors
    ///
    /// As [`BatchWriter::copy`].
    pub(crate) fn copy<T: Table>(&mut self, snap: &index::Snapshot<'_>) -> Result<u64> {
        self.out.copy::<T>(snap)
    }

    /// Runs `f` on a batch over everything written so far; its changes are kept if it
    /// returns `Ok`, and dropped otherwise. The batch is written once it has grown.
    ///
    /// # Errors
    ///
    /// `f`'s, or writing the batch.
    pub(crate) fn batch<R>(
        &mut self,
        f: impl FnOnce(&mut WriteTables<'_>) -> Result<R>,
    ) -> Result<R> {
        let r = self.out.batch(f)?;
        self.out.maybe_flush()?;
        Ok(r)
    }

    /// Runs `f` on everything written so far.
    pub(crate) fn view<R>(&self, f: impl FnOnce(&index::Snapshot<'_>) -> R) -> R {
        self.out.view(f)
    }

    /// Writes what is pending, syncs and closes the file, then links it at the destination
    /// (refused if something appeared there meanwhile) and syncs the directory. Returns the
    /// file's size.
    ///
    /// # Errors
    ///
    /// Writing or closing the file; [`ErrorKind::InvalidInput`] if the destination appeared
    /// meanwhile; linking it or syncing the directory. The temporary file is removed.
    pub(crate) fn install(self) -> Result<u64> {
        let NewJournal { out, tmp, dest } = self;
        let db = out.finish()?;
        crate::preflight::guarded("close", || {
            drop(db);
            Ok(())
        })?;
        match std::fs::hard_link(&tmp.path, &dest) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(exists(&dest));
            }
            // No hard links on this file system: rename, unless something appeared there.
            Err(_) if std::fs::symlink_metadata(&dest).is_err() => {
                std::fs::rename(&tmp.path, &dest).map_err(Error::io)?
            }
            Err(e) => return Err(Error::io(e)),
        }
        sync_dir(parent_dir(&dest))?;
        std::fs::metadata(&dest).map(|m| m.len()).map_err(Error::io)
    }
}
