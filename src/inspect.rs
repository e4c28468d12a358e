//! Read-only inspection of a journal file, also while an editor has it open.
//!
//! [`Inspector::open`] never modifies the file:
//! - no writer has it open → the file is opened read-only, and writers are excluded while
//!   the inspector lives ([`Access::Idle`]);
//! - a writer opened it with [`Sharing::LiveReaders`](crate::Sharing::LiveReaders) → it is
//!   opened read-only beside the writer, and each call sees the latest commit
//!   ([`Access::Live`]);
//! - it was not closed cleanly (a crash) → a copy is recovered in a temporary directory and
//!   inspected ([`Access::RecoveredCopy`]); the file itself is recovered by the next writer;
//! - a writer opened it with [`Sharing::Exclusive`](crate::Sharing::Exclusive) → `Locked`.
//!
//! The file is input: the storage engine trusts its pages and may panic on a damaged file
//! (fuzzing found such files). Every method turns such a panic into
//! [`ErrorKind::Corrupt`] (in builds that unwind on panic), so a damaged file never brings
//! down the tool that inspects it.

use std::ops::Bound;
use std::path::{Path, PathBuf};

use redb::{Database, ReadOnlyDatabase, ReadTransaction, ReadableDatabase};

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::engine;
use crate::engine::stats::{self, Stats};
use crate::error::{Error, ErrorKind, Result};
use crate::index::file::{check_format, check_redb_magic};
use crate::index::guarded;
use crate::index::{self, Base, Layered, Layers, Memtable, View};
use crate::log::FileLog;
use crate::types::Event;
use crate::types::{OpResult, Receipt};

/// How an [`Inspector`] reached the file.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// No writer had the file open; writers are excluded while the inspector lives.
    Idle,
    /// A writer has the file open; reads follow its commits.
    Live,
    /// The file was not closed cleanly: a recovered copy is inspected; the file is unchanged.
    RecoveredCopy,
}

impl Access {
    /// A sentence for diagnostics.
    pub fn describe(self) -> &'static str {
        match self {
            Access::Idle => "no writer has the journal open",
            Access::Live => "a writer has the journal open; showing its latest commit",
            Access::RecoveredCopy => {
                "the journal was not closed cleanly; inspecting a recovered copy (the file is unchanged until a writer opens it)"
            }
        }
    }
}

pub(crate) enum Handle {
    ReadOnly(ReadOnlyDatabase),
    /// A recovered copy; the directory is deleted when the handle drops.
    Copy(Database, #[allow(dead_code)] tempfile::TempDir),
}

impl Handle {
    pub(crate) fn begin_read(&self) -> Result<ReadTransaction> {
        Ok(match self {
            Handle::ReadOnly(db) => db.begin_read()?,
            Handle::Copy(db, _) => db.begin_read()?,
        })
    }
}

/// A read-only view of a journal file, for tools such as the `opjournal` CLI.
pub struct Inspector {
    pub(crate) handle: Handle,
    path: PathBuf,
    access: Access,
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

fn open_ro(
    path: &Path,
    mode: redb::ConcurrencyMode,
) -> std::result::Result<ReadOnlyDatabase, redb::DatabaseError> {
    redb::Builder::new()
        .set_cache_size(crate::config::INSPECT_CACHE_BYTES)
        .set_concurrency_mode(mode)
        .open_read_only(path)
}

/// Copies `path` into a new temporary directory and opens the copy read-write, which runs
/// redb's crash recovery on the copy.
pub(crate) fn recovered_copy(path: &Path) -> Result<(Database, tempfile::TempDir, PathBuf)> {
    let dir = tempfile::Builder::new()
        .prefix("opjournal-inspect-")
        .tempdir()
        .map_err(Error::io)?;
    let copy = dir.path().join("journal.opj");
    std::fs::copy(path, &copy).map_err(Error::io)?;
    let db = redb::Builder::new()
        .set_cache_size(crate::config::INSPECT_CACHE_BYTES)
        .create(&copy)
        .map_err(|e| not_openable(path, e))?;
    Ok((db, dir, copy))
}

fn not_openable(path: &Path, e: redb::DatabaseError) -> Error {
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen | redb::DatabaseError::LockProtocolMismatch => {
            Error::new(ErrorKind::Locked {
                path: path.to_path_buf(),
            })
        }
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(detail)) => Error::corrupt(
            "(redb)",
            "(file)",
            format!("the storage engine refuses the file: {detail}"),
        ),
        redb::DatabaseError::UpgradeRequired(v) => Error::new(ErrorKind::NotAJournal {
            path: path.to_path_buf(),
            detail: format!("it is a redb file of an older file format ({v})"),
        }),
        other => Error::from(other),
    }
}

/// A panic caught from the caller's closure, to be resumed outside the storage guard.
type CallerPanic = Option<Box<dyn std::any::Any + Send>>;

/// Calls the caller's closure inside a [`guarded`] section, keeping a panic of its own
/// apart from the storage engine's (it is resumed, not turned into `Corrupt`). A caught
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
        let meta = std::fs::metadata(path).map_err(Error::io)?;
        if meta.len() == 0 {
            return Err(Error::new(ErrorKind::NotAJournal {
                path: path.to_path_buf(),
                detail: "the file is empty".into(),
            }));
        }
        check_redb_magic(path)?;
        let (handle, access) = match open_ro(path, redb::ConcurrencyMode::ExclusiveWriter) {
            Ok(db) => (Handle::ReadOnly(db), Access::Idle),
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                match open_ro(path, redb::ConcurrencyMode::SingleWriter) {
                    Ok(db) => (Handle::ReadOnly(db), Access::Live),
                    Err(redb::DatabaseError::RepairAborted) => {
                        // The writer that had it is gone mid-way; inspect a recovered copy.
                        let (db, dir, _) = recovered_copy(path)?;
                        (Handle::Copy(db, dir), Access::RecoveredCopy)
                    }
                    Err(e) => return Err(not_openable(path, e)),
                }
            }
            Err(redb::DatabaseError::RepairAborted) => {
                let (db, dir, _) = recovered_copy(path)?;
                (Handle::Copy(db, dir), Access::RecoveredCopy)
            }
            Err(e) => return Err(not_openable(path, e)),
        };
        let inspector = Inspector {
            handle,
            path: path.to_path_buf(),
            access,
            clock: Box::new(SystemClock),
        };
        inspector.check_journal()?;
        Ok(inspector)
    }

    fn check_journal(&self) -> Result<()> {
        let txn = self.handle.begin_read()?;
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

    /// The file inspected.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How the file was reached.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Runs `f` on the journal as its writer last committed it: redb as of the last
    /// checkpoint, with the log's records of the same cycle over it (what a writer logged
    /// a moment ago is there). Reads only: the log is read whole (it is bounded by the
    /// writer's checkpoint size), and nothing is written anywhere.
    pub(crate) fn with_snapshot<R>(
        &self,
        f: impl FnOnce(&index::Snapshot<'_>, Timestamp) -> Result<R>,
    ) -> Result<R> {
        let log_path = FileLog::path_for(&self.path);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let base = Base::new(self.handle.begin_read()?);
            let first = index::Snapshot {
                base: Some(&base),
                layers: Layers::default(),
            };
            let mut mem = Memtable::default();
            if let Some(cp) = first.checkpoint()?
                && let Some(log) = FileLog::open_read_only(&log_path)
                    .map_err(|e| Error::io_during("open the journal's log", e))?
            {
                let bytes = crate::log::read_all(&log)
                    .map_err(|e| Error::io_during("read the journal's log", e))?;
                let cursor = crate::log::Cursor {
                    journal_id: cp.journal_id,
                    generation: cp.generation,
                    first_lsn: cp.next_lsn,
                };
                crate::log::scan(&bytes, cursor, |r| {
                    if r.kind != crate::log::KIND_BATCH {
                        return Err(Error::corrupt(
                            "log",
                            format!("record {}", r.lsn),
                            format!("record kind {} is not one this build reads", r.kind),
                        ));
                    }
                    mem.apply_encoded(r.payload).map_err(|detail| {
                        Error::corrupt("log", format!("record {}", r.lsn), detail)
                    })
                })?;
                // A checkpoint since the snapshot began may have started the log over (its
                // records are in redb now, past this snapshot): read both again.
                let latest = Base::new(self.handle.begin_read()?);
                let moved = index::Snapshot {
                    base: Some(&latest),
                    layers: Layers::default(),
                }
                .checkpoint()?
                .is_none_or(|now| now.generation != cp.generation);
                if moved && attempts < 100 {
                    continue;
                }
            }
            let snap = index::Snapshot {
                base: Some(&base),
                layers: Layers::new(&[&mem]),
            };
            let now = self.clock.now().max(snap.state()?.clock_high_water);
            return f(&snap, now);
        }
    }

    /// The time clocks are judged by: the system clock, never below the journal's
    /// high-water mark.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn now(&self) -> Result<Timestamp> {
        guarded("now", || self.with_snapshot(|_, now| Ok(now)))
    }

    /// Counts by status and delivery state, and file facts.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn stats(&self) -> Result<Stats> {
        guarded("stats", || {
            let mut s = self.with_snapshot(|t, now| stats::collect(t, now, Some))?;
            let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
            s.file_bytes = size(&self.path);
            s.log_bytes = size(&FileLog::path_for(&self.path));
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
            self.with_snapshot(|t, now| engine::lookup(t, operation_id, now))
        })
    }

    /// The recorded result of a terminal, unretired operation.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn result(&self, operation_id: &str) -> Result<Option<OpResult>> {
        guarded("result", || {
            self.with_snapshot(|t, now| match engine::effective_of(t, operation_id, now)? {
                Some(rec) => engine::result_of(t, &rec),
                None => Ok(None),
            })
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
        let mut caller_panic = None;
        let r = guarded("receipts", || {
            self.with_snapshot(|t, now| {
                for entry in t.all::<index::Receipts>()? {
                    let (k, v) = entry?;
                    let rec = index::decode_receipt(&k, &v)?;
                    if let Some(r) = engine::effective(rec, now).as_ref().and_then(engine::view)
                        && !call_caller(&mut caller_panic, || f(r))?
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
