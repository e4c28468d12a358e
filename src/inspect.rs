//! Read-only inspection of a journal file, also while an editor has it open.
//!
//! [`Inspector::open`] never modifies the file, and never copies it:
//! - no writer has it open → the file is opened read-only, and writers are excluded while
//!   the inspector lives ([`Access::Idle`]);
//! - a writer opened it with [`Sharing::LiveReaders`](crate::Sharing::LiveReaders) → it is
//!   opened read-only beside the writer, and each call sees the latest commit
//!   ([`Access::Live`]);
//! - it was not closed cleanly and redb needs to recover it before reading
//!   (a file of format 1, whose checkpoints did not save the allocator state) → the recovery
//!   runs in memory, its writes kept there (at most [`RECOVERY_SCRATCH_BYTES`]), and the
//!   file is read in place ([`Access::Recovered`]); the next writer recovers the file itself;
//! - a writer opened it with [`Sharing::Exclusive`](crate::Sharing::Exclusive) → `Locked`.
//!
//! Anything that is not a regular file (a directory, a FIFO, a device) is refused before it
//! is opened. Bytes after the journal's data (redb's header says where it ends) are not part
//! of it: the journal is read as it is, and [`Inspector::trailing_bytes`] says how many follow.
//!
//! The file is input: redb trusts its pages and may panic on a damaged file. Every
//! method turns such a panic into
//! [`ErrorKind::Corrupt`] (in builds that unwind on panic), so a damaged file never brings
//! down the tool that inspects it.
//!
//! With the feature `postgres`, `Inspector::open_postgres` inspects a journal in
//! PostgreSQL the same way (`inspect/postgres.rs`): every method reads one `REPEATABLE
//! READ, READ ONLY` snapshot of the database, beside any writers, and nothing is created
//! or written ([`Access::Database`]).

use std::ops::Bound;
use std::path::{Path, PathBuf};

use redb::{Database, ReadOnlyDatabase, ReadTransaction, ReadableDatabase, StorageBackend};

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::error::{Error, ErrorKind, Result};
use crate::index::{self, Base, Layered, Layers, Memtable, View};
use crate::log::FileLog;
use crate::machine;
use crate::machine::stats::{self, Stats};
use crate::preflight::file::{check_format, check_redb_magic};
use crate::preflight::guarded;
use crate::preflight::reading::{Extent, InPlace, Locks, Scratch, existing_journal_file};
use crate::types::Event;
use crate::types::{OpResult, Receipt};

/// The most memory redb's recovery may write to when a file that was not
/// closed cleanly is read in place (its writes are kept in memory, never in the file).
pub const RECOVERY_SCRATCH_BYTES: u64 = 64 << 20;

#[cfg(feature = "postgres")]
mod postgres;

/// How an [`Inspector`] reached the file.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// No writer had the file open; writers are excluded while the inspector lives.
    Idle,
    /// A writer has the file open; reads follow its commits.
    Live,
    /// The file was not closed cleanly: redb recovered it in memory, and the
    /// file is read in place, unchanged. Writers are excluded while the inspector lives.
    Recovered,
    /// The journal is in a database (`Inspector::open_postgres`, feature `postgres`):
    /// each read is one snapshot of it, taken beside any writers, which are never waited
    /// for or excluded.
    Database,
}

impl Access {
    /// A sentence for diagnostics.
    pub fn describe(self) -> &'static str {
        match self {
            Access::Idle => "no writer has the journal open",
            Access::Live => "a writer has the journal open; showing its latest commit",
            Access::Recovered => {
                "the journal was not closed cleanly; it was recovered in memory and read in place (the file is unchanged until a writer opens it)"
            }
            Access::Database => {
                "the journal is in a database; each read is one snapshot of it, beside any writers"
            }
        }
    }
}

pub(crate) enum Handle {
    /// `None` only while the handle drops.
    ReadOnly(Option<ReadOnlyDatabase>),
    /// Recovered in memory: redb's writes are kept in a [`Scratch`] (`None`
    /// only while the handle drops).
    Recovered(Option<Database>),
}

impl Handle {
    pub(crate) fn begin_read(&self) -> Result<ReadTransaction> {
        let closed = || Error::new(ErrorKind::Closed);
        Ok(match self {
            Handle::ReadOnly(db) => db.as_ref().ok_or_else(closed)?.begin_read()?,
            Handle::Recovered(db) => db.as_ref().ok_or_else(closed)?.begin_read()?,
        })
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // Closing redb's handle may panic on a damaged file: contain that, so
        // dropping an inspector never panics. A recovered one is closed without the commit
        // the engine would make to the scratch (see `close_unwritten`). The file is closed
        // either way.
        let _ = guarded("close", || {
            match self {
                Handle::ReadOnly(db) => drop(db.take()),
                Handle::Recovered(db) => {
                    if let Some(db) = db.take() {
                        crate::preflight::close_unwritten(db);
                    }
                }
            }
            Ok(())
        });
    }
}

/// Where an [`Inspector`] reads the journal.
enum Source {
    /// A journal file, through redb.
    File(Handle),
    /// A journal in PostgreSQL, one snapshot per read (the pool only reads).
    #[cfg(feature = "postgres")]
    Postgres(crate::postgres::Pg),
}

/// A read-only view of a journal file (or, with the feature `postgres`, of a journal in
/// PostgreSQL), for tools such as the `opjournal` CLI.
pub struct Inspector {
    source: Source,
    path: PathBuf,
    access: Access,
    extent: Extent,
    clock: Box<dyn Clock>,
}

impl std::fmt::Debug for Inspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inspector")
            .field("path", &self.path)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

/// Opens `path` for reading with redb, in place: read-only, seen with the
/// journal's length.
fn open_ro(
    path: &Path,
    extent: &Extent,
    mode: redb::ConcurrencyMode,
) -> std::result::Result<ReadOnlyDatabase, redb::DatabaseError> {
    let cap = (extent.trailing() > 0).then(|| extent.journal_len());
    let file = std::fs::File::open(path)?;
    redb::Builder::new()
        .set_cache_size(crate::config::INSPECT_CACHE_BYTES)
        .set_concurrency_mode(mode)
        .open_read_only_with_backend(InPlace::new(file, cap)?)
}

/// Opens `path` with redb as a writer would, on a [`Scratch`]: its recovery
/// runs, and everything it writes stays in memory (at most `limit` bytes). `len` is the
/// length the engine sees (past the end of the file, zeros).
pub(crate) fn open_scratch(
    path: &Path,
    len: u64,
    limit: u64,
    locks: Locks,
) -> std::result::Result<Database, redb::DatabaseError> {
    let file = std::fs::File::open(path)?;
    let scratch = Scratch::new(file, len, limit, locks)?;
    open_on(scratch)
}

/// Opens a database on `backend` as a writer would. Its system tree and every page number
/// of its trees are checked first (see `crate::preflight::check_backend`): redb loads the
/// allocator state recorded there without checking it, and a damaged page number is read
/// as a page of up to 4 GiB, allocated before the read fails. A damaged file is refused as
/// the engine refuses one.
pub(crate) fn open_on(
    backend: impl StorageBackend,
) -> std::result::Result<Database, redb::DatabaseError> {
    let checked = crate::preflight::check_backend(&backend, |_| crate::preflight::Depth::Full);
    if let Err(e) = checked {
        return Err(redb::DatabaseError::Storage(match e.kind() {
            ErrorKind::Io => redb::StorageError::Io(std::io::Error::other(e.to_string())),
            _ => redb::StorageError::Corrupted(e.to_string()),
        }));
    }
    redb::Builder::new()
        .set_cache_size(crate::config::INSPECT_CACHE_BYTES)
        .set_concurrency_mode(redb::ConcurrencyMode::ExclusiveWriter)
        .create_with_backend(backend)
}

pub(crate) fn not_openable(path: &Path, e: redb::DatabaseError) -> Error {
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen | redb::DatabaseError::LockProtocolMismatch => {
            Error::new(ErrorKind::Locked {
                path: path.to_path_buf(),
            })
        }
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(detail)) => Error::with_source(
            ErrorKind::Corrupt {
                table: "(redb)".into(),
                key: "(file)".into(),
                detail: "the storage engine refuses the file: its header or its structures \
                             are damaged"
                    .into(),
            },
            redb::StorageError::Corrupted(detail),
        ),
        redb::DatabaseError::UpgradeRequired(v) => Error::new(ErrorKind::NotAJournal {
            path: path.to_path_buf(),
            detail: format!("it is a redb file of an older file format ({v})"),
        }),
        redb::DatabaseError::Storage(redb::StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::OutOfMemory =>
        {
            Error::with_source(
                ErrorKind::Corrupt {
                    table: "(redb)".into(),
                    key: "(file)".into(),
                    detail: format!(
                        "the journal was not closed cleanly, and recovering it in memory to read \
                         it in place needs more than {} MiB: open it with a writer (any \
                         `opjournal` write command, or the editor) to recover it, or run \
                         `opjournal repair`",
                        RECOVERY_SCRATCH_BYTES >> 20
                    ),
                },
                io,
            )
        }
        other => Error::from(other).while_doing(
            "read the journal file",
            "the journal is unchanged: check the disk and try again",
        ),
    }
}

/// What [`Inspector::with_snapshot_and_log`] found beside the file.
#[derive(Debug)]
pub(crate) enum LogRead {
    /// No log: the journal was closed cleanly.
    Absent,
    /// A log, beside a journal of format 1, which has no log cycle.
    NoCycle,
    /// The log was read for the cycle `cursor`.
    Read {
        /// The cycles read: which log file (0 for `<journal>-log`, 1 for `<journal>-log2`)
        /// and the cycle read from it; two when the writer had started the next cycle
        /// before redb committed the one named by the file.
        cycles: Vec<(usize, crate::log::Cursor)>,
        /// Records laid over the file.
        records: u64,
        /// Why the header was not used (another journal's, another format's, none).
        header_problem: Option<String>,
        /// A record whose changes do not decode (its lsn, what is wrong): it and the
        /// records after it are not laid over the file.
        undecodable: Option<(u64, String)>,
        /// The log's length in bytes.
        len: u64,
    },
}

/// A panic caught from the caller's closure, to be resumed outside the storage guard.
type CallerPanic = Option<Box<dyn std::any::Any + Send>>;

/// Calls the caller's closure inside a [`guarded`] section, keeping a panic of its own
/// apart from redb's (it is resumed, not turned into `Corrupt`). A caught
/// panic stops the iteration.
fn call_caller(slot: &mut CallerPanic, f: impl FnOnce() -> Result<bool>) -> Result<bool> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            *slot = Some(p);
            Ok(false)
        }
    }
}

fn resume_caller_panic(slot: CallerPanic) {
    if let Some(p) = slot {
        std::panic::resume_unwind(p);
    }
}

impl Inspector {
    /// Opens `path` for inspection without modifying it.
    ///
    /// # Errors
    ///
    /// - [`ErrorKind::Io`] if the file is missing or unreadable (the source says which);
    /// - [`ErrorKind::NotAJournal`] for an empty file, a non-redb file, or a redb file
    ///   without the journal's tables;
    /// - [`ErrorKind::Locked`] if a writer has it open with `Sharing::Exclusive`;
    /// - [`ErrorKind::UnsupportedFormat`], [`ErrorKind::Corrupt`].
    pub fn open(path: impl AsRef<Path>) -> Result<Inspector> {
        let path = path.as_ref();
        guarded("open", || Inspector::open_unguarded(path))
    }

    fn open_unguarded(path: &Path) -> Result<Inspector> {
        let meta = existing_journal_file(path)?;
        check_redb_magic(path)?;
        // Before redb follows any page number (see `preflight::check_file`).
        crate::preflight::check_file(path, |_| crate::preflight::Depth::Full)?;
        let file = std::fs::File::open(path).map_err(|e| {
            Error::io_while("open the journal file", "nothing was read or changed", e)
        })?;
        let extent = Extent::of(&file, meta.len()).map_err(|e| {
            Error::io_while(
                "read the journal file's header",
                "nothing was read or changed",
                e,
            )
        })?;
        drop(file);
        let recover = || -> Result<(Handle, Access)> {
            // The engine must recover the file before reading it (a writer did not close
            // it): recover it in memory, reading the file in place.
            let db = open_scratch(
                path,
                extent.journal_len(),
                RECOVERY_SCRATCH_BYTES,
                Locks::Forward,
            )
            .map_err(|e| not_openable(path, e))?;
            Ok((Handle::Recovered(Some(db)), Access::Recovered))
        };
        let (handle, access) = match open_ro(path, &extent, redb::ConcurrencyMode::ExclusiveWriter)
        {
            Ok(db) => (Handle::ReadOnly(Some(db)), Access::Idle),
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                match open_ro(path, &extent, redb::ConcurrencyMode::SingleWriter) {
                    Ok(db) => (Handle::ReadOnly(Some(db)), Access::Live),
                    // The writer that had it is gone mid-way.
                    Err(redb::DatabaseError::RepairAborted) => recover()?,
                    // Held in the other protocol: by a writer with `Sharing::Exclusive`, or
                    // by another inspection recovering the file in memory, whose locks are
                    // shared. The recovery tells them apart: it shares the file with the
                    // inspection and is refused (`Locked`) by the writer.
                    Err(
                        redb::DatabaseError::DatabaseAlreadyOpen
                        | redb::DatabaseError::LockProtocolMismatch,
                    ) => recover()?,
                    Err(e) => return Err(not_openable(path, e)),
                }
            }
            Err(redb::DatabaseError::RepairAborted) => recover()?,
            Err(e) => return Err(not_openable(path, e)),
        };
        let inspector = Inspector {
            source: Source::File(handle),
            path: path.to_path_buf(),
            access,
            extent,
            clock: Box::new(SystemClock),
        };
        inspector.check_journal()?;
        Ok(inspector)
    }

    fn check_journal(&self) -> Result<()> {
        let Some(handle) = self.file() else {
            return Ok(());
        };
        let txn = handle.begin_read()?;
        let names: Vec<String> = {
            use redb::TableHandle;
            txn.list_tables()?.map(|h| h.name().to_string()).collect()
        };
        if !names.iter().any(|n| n == "meta") {
            return Err(Error::new(ErrorKind::NotAJournal {
                path: self.path.clone(),
                detail: if names.is_empty() {
                    "it is an empty redb database".into()
                } else {
                    "it is a redb database without the journal's `meta` table".into()
                },
            }));
        }
        let base = Base::new(txn);
        let format = index::Snapshot {
            base: Some(&base),
            layers: Layers::default(),
        }
        .format()?;
        check_format(&self.path, format, true)?;
        for name in index::TABLE_NAMES {
            if name != "quarantine" && !names.iter().any(|n| n == name) {
                return Err(Error::new(ErrorKind::NotAJournal {
                    path: self.path.clone(),
                    detail: format!("the journal table `{name}` is missing"),
                }));
            }
        }
        Ok(())
    }

    /// redb's handle on the file; `None` for a journal in a database.
    fn file(&self) -> Option<&Handle> {
        match &self.source {
            Source::File(handle) => Some(handle),
            #[cfg(feature = "postgres")]
            Source::Postgres(_) => None,
        }
    }

    /// The file inspected; for a journal in a database, a label naming the journal and
    /// the database (``postgres:journal `orders` in database `app` at db1:5432``).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How the file was reached.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The number of bytes after the journal's data in the file (appended to it, not part
    /// of it: the journal is read without them), or 0.
    pub fn trailing_bytes(&self) -> u64 {
        self.extent.trailing()
    }

    /// Where the journal's data ends and the file's length.
    pub(crate) fn extent(&self) -> Extent {
        self.extent
    }

    /// Runs `f` on the journal as its writer last committed it: redb as of the last
    /// checkpoint, with the log's records of the same cycle over it (what a writer logged
    /// a moment ago is there). Reads only: the log is read record by record, and nothing is
    /// written anywhere. A log record whose changes do not decode is an error.
    pub(crate) fn with_snapshot<R>(
        &self,
        f: impl FnOnce(&index::Snapshot<'_>, Timestamp) -> Result<R>,
    ) -> Result<R> {
        self.with_snapshot_and_log(true, |snap, now, _| f(snap, now))
    }

    /// As [`Inspector::with_snapshot`], also saying what the log held; with `strict` off, a
    /// log record whose changes do not decode ends the records laid over the file (as a
    /// damaged one does) instead of failing, and the [`LogRead`] names it.
    pub(crate) fn with_snapshot_and_log<R>(
        &self,
        strict: bool,
        f: impl FnOnce(&index::Snapshot<'_>, Timestamp, &LogRead) -> Result<R>,
    ) -> Result<R> {
        #[cfg(feature = "postgres")]
        if let Source::Postgres(pg) = &self.source {
            return postgres::with_snapshot(pg, |snap, now| f(snap, now, &LogRead::Absent));
        }
        // Every source other than a file returned above.
        let Some(handle) = self.file() else {
            return Err(Error::new(ErrorKind::Closed));
        };
        let log_paths = FileLog::paths_for(&self.path);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let base = Base::new(handle.begin_read()?);
            let first = index::Snapshot {
                base: Some(&base),
                layers: Layers::default(),
            };
            let mut mem = Memtable::default();
            let open = |p: &Path| {
                FileLog::open_read_only(p).map_err(|e| {
                    Error::io_while("open the journal's log", "nothing was read or changed", e)
                })
            };
            let log = open(&log_paths[0])?;
            let spare = open(&log_paths[1])?;
            let mut read = LogRead::Absent;
            // The second file alone (its first is gone) is read as the first would be.
            let files: Vec<&dyn crate::log::LogStorage> = match (&log, &spare) {
                (Some(log), Some(spare)) => vec![log, spare],
                (Some(log), None) => vec![log],
                (None, Some(spare)) => vec![spare],
                (None, None) => Vec::new(),
            };
            let second_only = log.is_none();
            if !files.is_empty() {
                let Some(cp) = first.checkpoint()? else {
                    read = LogRead::NoCycle;
                    let snap = index::Snapshot {
                        base: Some(&base),
                        layers: Layers::default(),
                    };
                    let now = self.clock.now().max(snap.state()?.clock_high_water);
                    return f(&snap, now, &read);
                };
                let cursor = crate::log::Cursor {
                    journal_id: cp.journal_id,
                    generation: cp.generation,
                    first_lsn: cp.next_lsn,
                };
                let mut undecodable = None;
                let cycles = crate::log::scan_cycles(&files, cursor, |r| -> Result<()> {
                    if undecodable.is_some() {
                        return Ok(());
                    }
                    let applied = if r.kind != crate::log::KIND_BATCH {
                        Err(format!(
                            "record kind {} is not one this build reads",
                            r.kind
                        ))
                    } else {
                        // Applied to a copy: a record that fails half-way leaves nothing.
                        let mut next = Memtable::default();
                        next.apply_encoded(r.payload).map(|()| mem.absorb(next))
                    };
                    match applied {
                        Ok(()) => Ok(()),
                        Err(detail) if !strict => {
                            undecodable = Some((r.lsn, detail));
                            Ok(())
                        }
                        Err(detail) => {
                            Err(Error::corrupt("log", format!("record {}", r.lsn), detail))
                        }
                    }
                })
                .map_err(|e| {
                    e.while_doing(
                        "read the journal's log",
                        "nothing was changed: check the disk and try again",
                    )
                })?;
                // A checkpoint since the snapshot began may have started the log over (its
                // records are in redb now, past this snapshot): read both again.
                let latest = Base::new(handle.begin_read()?);
                let moved = index::Snapshot {
                    base: Some(&latest),
                    layers: Layers::default(),
                }
                .checkpoint()?
                .is_none_or(|now| now.generation != cp.generation);
                if moved && attempts < 100 {
                    continue;
                }
                let scanned: u64 = cycles.iter().map(|c| c.scan.records).sum();
                let file_index = |i: usize| if second_only { 1 } else { i };
                read = LogRead::Read {
                    cycles: cycles
                        .iter()
                        .map(|c| (file_index(c.file), c.cursor))
                        .collect(),
                    records: undecodable
                        .as_ref()
                        .map_or(scanned, |(lsn, _)| lsn - cursor.first_lsn),
                    header_problem: cycles.first().and_then(|c| c.scan.header_problem.clone()),
                    undecodable,
                    len: cycles.iter().map(|c| c.scan.len).sum(),
                };
            }
            let snap = index::Snapshot {
                base: Some(&base),
                layers: Layers::new(&[&mem]),
            };
            let now = self.clock.now().max(snap.state()?.clock_high_water);
            return f(&snap, now, &read);
        }
    }

    /// The time clocks are judged by: the system clock (the database server's, for a
    /// journal in a database), never below the journal's high-water mark.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn now(&self) -> Result<Timestamp> {
        guarded("now", || self.with_snapshot(|_, now| Ok(now)))
    }

    /// Counts by status and delivery state, and file facts (`file_bytes` and `log_bytes`
    /// are 0 for a journal in a database).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn stats(&self) -> Result<Stats> {
        guarded("stats", || {
            let mut s = self.with_snapshot(|t, now| stats::collect(t, now, Some))?;
            if self.file().is_some() {
                let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
                s.file_bytes = size(&self.path);
                s.log_bytes = FileLog::paths_for(&self.path).iter().map(|p| size(p)).sum();
            }
            Ok(s)
        })
    }

    /// The receipt of `operation_id` with every clock applied.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn lookup(&self, operation_id: &str) -> Result<Option<Receipt>> {
        guarded("lookup", || {
            self.with_snapshot(|t, now| machine::lookup(t, operation_id, now))
        })
    }

    /// The recorded result of a terminal, unretired operation.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn result(&self, operation_id: &str) -> Result<Option<OpResult>> {
        guarded("result", || {
            self.with_snapshot(
                |t, now| match machine::effective_of(t, operation_id, now)? {
                    Some(rec) => machine::result_of(t, &rec),
                    None => Ok(None),
                },
            )
        })
    }

    /// The operation's events, oldest first.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn history(&self, operation_id: &str) -> Result<Vec<Event>> {
        guarded("history", || {
            self.with_snapshot(|t, _| {
                let mut out = Vec::new();
                for seq in t.op_event_seqs(operation_id)? {
                    if let Some(ev) = t.event(seq)? {
                        out.push(Event::from(&ev));
                    }
                }
                Ok(out)
            })
        })
    }

    /// Calls `f` with every receipt (clocks applied), in operation-id order, from one
    /// snapshot, streaming. `f` returns `false` to stop.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`] (the first damaged receipt), [`ErrorKind::Io`], or `f`'s error.
    pub fn for_each_receipt(&self, mut f: impl FnMut(Receipt) -> Result<bool>) -> Result<()> {
        self.walk_receipts(false, &mut |r, _| f(r))
    }

    /// As [`Inspector::for_each_receipt`], with each operation's recorded result (what
    /// [`Inspector::result`] gives for it: `None` unless it is terminal, unretired and kept
    /// one), all from the same one snapshot. Use it to walk results: each call of `result`
    /// takes a snapshot of its own, which reads the journal's log again.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`] (the first damaged receipt or result), [`ErrorKind::Io`], or
    /// `f`'s error.
    ///
    /// # Example
    ///
    /// ```
    /// use opjournal::{Admission, Inspector, Intent, Journal, Operation, Outcome};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("project.opj");
    /// {
    ///     let j = Journal::open(&path)?;
    ///     let op = Operation::new("op_1", Intent::from_json("edit", &serde_json::json!({}))?);
    ///     if let Admission::Fresh(claim) = j.submit(op)? {
    ///         j.complete(&claim, Outcome::applied(1, b"done".to_vec()))?;
    ///     }
    /// }
    /// let mut seen = Vec::new();
    /// Inspector::open(&path)?.for_each_receipt_and_result(|r, result| {
    ///     seen.push((r.operation_id, result.map(|res| res.bytes)));
    ///     Ok(true)
    /// })?;
    /// assert_eq!(seen, [("op_1".to_string(), Some(b"done".to_vec()))]);
    /// # Ok::<(), opjournal::Error>(())
    /// ```
    pub fn for_each_receipt_and_result(
        &self,
        mut f: impl FnMut(Receipt, Option<OpResult>) -> Result<bool>,
    ) -> Result<()> {
        self.walk_receipts(true, &mut f)
    }

    /// Every receipt (clocks applied) from one snapshot, with its result when `results`.
    fn walk_receipts(
        &self,
        results: bool,
        f: &mut dyn FnMut(Receipt, Option<OpResult>) -> Result<bool>,
    ) -> Result<()> {
        let mut caller_panic = None;
        let r = guarded("receipts", || {
            self.with_snapshot(|t, now| {
                for entry in t.all::<index::Receipts>()? {
                    let (k, v) = entry?;
                    let rec = index::decode_receipt(&k, &v)?;
                    let Some(rec) = machine::effective(rec, now) else {
                        continue;
                    };
                    let result = if results {
                        machine::result_of(t, &rec)?
                    } else {
                        None
                    };
                    if let Some(r) = machine::into_view(rec)
                        && !call_caller(&mut caller_panic, || f(r, result))?
                    {
                        break;
                    }
                }
                Ok(())
            })
        });
        resume_caller_panic(caller_panic);
        r
    }

    /// Calls `f` with every event whose seq is at least `from`, in order, from one
    /// snapshot, streaming. `f` returns `false` to stop.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`] (the first damaged event), [`ErrorKind::Io`], or `f`'s error.
    pub fn for_each_event(
        &self,
        from: u64,
        mut f: impl FnMut(Event) -> Result<bool>,
    ) -> Result<()> {
        let mut caller_panic = None;
        let r = guarded("events", || {
            self.with_snapshot(|t, _| {
                for entry in t.range::<index::Events>(Bound::Included(&from), Bound::Unbounded)? {
                    let (k, v) = entry?;
                    let ev = index::decode_event(k, &v)?;
                    if !call_caller(&mut caller_panic, || f(Event::from(&ev)))? {
                        break;
                    }
                }
                Ok(())
            })
        });
        resume_caller_panic(caller_panic);
        r
    }

    /// The number of events and receipts stored (for progress bars).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Io`].
    pub fn sizes(&self) -> Result<(u64, u64)> {
        guarded("sizes", || {
            self.with_snapshot(|t, _| {
                Ok((t.count::<index::Events>()?, t.count::<index::Receipts>()?))
            })
        })
    }
}
