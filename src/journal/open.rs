//! Opening and creating a journal: the redb file made ready (created, or upgraded from
//! format 1), then the log read back into the memtable.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, RwLock};

use redb::{Database, ReadableDatabase};

use crate::codec::FORMAT_VERSION;
use crate::config::{Config, Sharing};
use crate::error::{Error, Result};
use crate::fsutil::{TempFile, parent_dir, sync_dir};
use crate::index::{self, Base, Layers, View, WriteTables};
use crate::log::{self, Cursor, FileLog, LogStorage};
use crate::machine::{self, Ctx};
use crate::preflight::file::{check_format, check_redb_magic, open_error};
use crate::record::{CheckpointRecord, EventKind, FormatRecord};

use super::committer::Committer;
use super::reads::{Committed, LazyBuffer};
use super::{Inner, Journal};

/// Whether `backend` takes byte-range locks, which redb's `SingleWriter` mode needs: a
/// query of one byte's lock, which changes nothing, is answered rather than refused.
fn supports_range_locks(backend: &impl redb::StorageBackend) -> bool {
    use std::ops::Bound::Included;
    match backend.query_lock_range(Included(0), Included(0)) {
        Err(redb::BackendError::Unsupported) => false,
        Err(redb::BackendError::Io(e)) => e.kind() != std::io::ErrorKind::Unsupported,
        _ => true,
    }
}

impl Journal {
    pub(crate) fn redb_builder(cfg: &Config) -> redb::Builder {
        let mut builder = redb::Builder::new();
        builder.set_cache_size(cfg.cache_bytes);
        builder.set_concurrency_mode(match cfg.sharing {
            Sharing::LiveReaders => redb::ConcurrencyMode::SingleWriter,
            Sharing::Exclusive => redb::ConcurrencyMode::ExclusiveWriter,
        });
        builder
    }

    pub(crate) fn open_with(path: &Path, cfg: Config) -> Result<Journal> {
        check_redb_magic(path)?;
        if path.exists() {
            // Before redb follows any page number of the file: one outside
            // it would be read as a page of up to 4 GiB (see `preflight::check_file`).
            let limit = cfg.page_check_bytes;
            crate::preflight::check_file(path, |len| {
                crate::preflight::Depth::for_writer(len, limit)
            })?;
            crate::preflight::guarded("open", || refuse_before_writing(path))?;
        } else {
            Self::create_atomically(path, &cfg)?;
        }
        // The file is input: redb may panic on damaged pages while opening. Answer
        // `Corrupt` instead.
        crate::preflight::guarded("open", || {
            // redb's own `create(path)`, with the writes of a checkpoint beside the log
            // paced (see `pacing`).
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|e| open_error(path, e.into()))?;
            let file = redb::backends::FileBackend::new(file).map_err(|e| open_error(path, e))?;
            let pace = Arc::new(super::pacing::Pace::default());
            let db = Self::redb_builder(&cfg)
                .create_with_backend(super::pacing::PacedBackend::new(file, Arc::clone(&pace)))
                .map_err(|e| open_error(path, e))?;
            // Before anything commits to it (redb holds its lock now, so no other writer
            // changes it while it is read): a damaged system tree would abort the process
            // on the first commit.
            if let Err(e) = crate::preflight::check_before_first_commit(path) {
                // Closing normally would commit (and abort the same way): leave the file as
                // it was, for `repair`.
                crate::preflight::close_unwritten(db);
                return Err(e);
            }
            // The log is opened once redb's lock is held: no other writer can be using it.
            let log: Arc<dyn LogStorage> = Arc::new(
                FileLog::open(&FileLog::path_for(path))
                    .map_err(|e| Error::io_during("open the journal's log", e))?,
            );
            // Its name is made durable by its first sync, on the checkpoint thread.
            let spare: Arc<dyn LogStorage> = Arc::new(
                FileLog::open_lazily(&FileLog::spare_path_for(path))
                    .map_err(|e| Error::io_during("open the journal's second log file", e))?,
            );
            Self::init(db, vec![log, spare], path, cfg, pace)
        })
    }

    /// Creates a new journal at `path` without ever exposing a half-made file there: the
    /// redb initializes a file in place over several writes and syncs, and a crash
    /// in between leaves a file it (rightly) refuses to open ever again. So the journal is
    /// built under a temporary name in the same directory, closed (synced), then linked into
    /// place, which fails if another process created `path` first (then its journal is
    /// used). A crash leaves no journal or a complete one, and at worst a stray temporary
    /// file named `.<name>.creating-*`.
    fn create_atomically(path: &Path, cfg: &Config) -> Result<()> {
        let dir = parent_dir(path);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| {
                Error::invalid(
                    "journal path",
                    &path.display().to_string(),
                    "it does not name a file",
                )
            })?;
        let tmp = TempFile::create(dir, &name)?;
        let tmp = &tmp.path;
        {
            let db = Self::redb_builder(cfg)
                .create(tmp)
                .map_err(|e| open_error(tmp, e))?;
            prepare(&db, tmp, cfg)?;
        }
        match std::fs::hard_link(tmp, path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
            // No hard links on this file system: rename, unless someone created it meanwhile.
            Err(_) if !path.exists() => std::fs::rename(tmp, path).map_err(Error::io)?,
            Err(e) => return Err(Error::io(e)),
        }
        // Make the new name durable.
        sync_dir(dir)?;
        Ok(())
    }

    pub(crate) fn open_backends_with(
        backend: impl redb::StorageBackend,
        logs: Vec<Arc<dyn LogStorage>>,
        label: &str,
        mut cfg: Config,
    ) -> Result<Journal> {
        // The sharing mode is redb's commit protocol, not only its locks (with live
        // readers, a commit's header marks the new primary unflushed until its flush), so
        // storage with byte-range locks runs the one a file of the same configuration
        // runs. redb refuses its `SingleWriter` mode on a backend without them (such as
        // `InMemoryBackend`), which is opened exclusively.
        if !supports_range_locks(&backend) {
            cfg.sharing = Sharing::Exclusive;
        }
        let path = Path::new(label);
        // The storage is input, as a file is: the engine may panic on damaged pages.
        crate::preflight::guarded("open", || {
            // A damaged system tree would abort the process on the first commit, and a
            // page number outside the storage would be read as a page of up to 4 GiB.
            let limit = cfg.page_check_bytes;
            crate::preflight::check_backend(&backend, |len| {
                crate::preflight::Depth::for_writer(len, limit)
            })?;
            let db = Self::redb_builder(&cfg)
                .create_with_backend(backend)
                .map_err(|e| open_error(path, e))?;
            Self::init(db, logs, path, cfg, Arc::default())
        })
    }

    /// Makes the redb file ready, reads the log's records of the current cycle into the
    /// memtable, and marks what was running in doubt.
    pub(crate) fn init(
        db: Database,
        logs: Vec<Arc<dyn LogStorage>>,
        path: &Path,
        cfg: Config,
        pace: Arc<super::pacing::Pace>,
    ) -> Result<Journal> {
        prepare(&db, path, &cfg)?;
        let base = Base::new(db.begin_read()?);
        let (cursor, state) = {
            let view = index::Snapshot {
                base: Some(&base),
                layers: Layers::default(),
            };
            let checkpoint = view.checkpoint()?.ok_or_else(|| {
                Error::corrupt("meta", "checkpoint", "the checkpoint entry is missing")
            })?;
            let cursor = Cursor {
                journal_id: checkpoint.journal_id,
                generation: checkpoint.generation,
                first_lsn: checkpoint.next_lsn,
            };
            (cursor, view.state()?)
        };
        // Read as far as the records go (the log is preallocated with zeros past them).
        let mut staged = index::Staged::default();
        let files: Vec<&dyn LogStorage> = logs.iter().map(|l| &**l).collect();
        let mut cycles = log::scan_cycles(&files, cursor, |record| {
            replay_record(&mut staged, record.lsn, record.kind, record.payload)
                .map_err(ReadLog::Record)
        })
        .map_err(|e| match e {
            ReadLog::Io(e) => Error::io_during("read the journal's log", e),
            ReadLog::Record(e) => e,
        })?;
        let mem = staged.build();
        // The writer continues the last cycle, in its file; the other file is the spare:
        // live if it holds the cycle before (not in redb yet), else to be zeroed.
        let two = cycles.len() == 2;
        let last = cycles.pop().ok_or_else(|| {
            Error::io_during(
                "read the journal's log",
                std::io::Error::other("no cycle was read"),
            )
        })?;
        let mut logs = logs;
        let current = logs.swap_remove(last.file);
        let mut writer = log::Writer::resume(current, last.cursor, &last.scan)
            .map_err(|e| Error::io_during("prepare the journal's log", e))?;
        if let Some(spare) = logs.pop() {
            writer.set_spare(
                log::Spare::found(spare, two)
                    .map_err(|e| Error::io_during("prepare the journal's second log file", e))?,
            );
        }
        // The memtable's state record is the latest, if the log holds one.
        let latest = index::Snapshot {
            base: Some(&base),
            layers: Layers::new(&[&mem]),
        };
        let state = match latest.state() {
            Ok(s) => s,
            Err(_) => state,
        };
        let high_water = state.clock_high_water.max(cfg.clock.now());
        let cache_bytes = cfg.replay_cache_bytes;
        let journal = Journal {
            inner: Arc::new(Inner {
                storage: super::Storage::File,
                db: Some(Arc::new(db)),
                cfg,
                path: path.to_path_buf(),
                high_water: AtomicU64::new(high_water.0),
                persisted_high_water: AtomicU64::new(state.clock_high_water.0),
                poisoned: Arc::new(AtomicBool::new(false)),
                lazy: RwLock::new(LazyBuffer::default()),
                committed: Arc::new(RwLock::new(Committed::new(Some(base), mem))),
                log: Mutex::new(Some(writer)),
                cache: Mutex::new(super::cache::ReplayCache::new(cache_bytes)),
                foreground_waiting: Arc::new(AtomicUsize::new(0)),
                compacting: AtomicUsize::new(0),
                committer: Committer::new(),
                checkpointer: super::checkpointer::Checkpointer::with_pace(pace),
                gate: Arc::new(Mutex::new(false)),
                reclaimed: AtomicBool::new(false),
                handles: AtomicUsize::new(1),
            }),
            released: false,
        };
        // Every operation still running lost its claim holder with the process that held
        // it: it is in doubt now (one log record, and only if there is any).
        journal
            .inner
            .write(|ctx| machine::mark_running_in_doubt(ctx).map(drop))?;
        // That write may have been followed by a checkpoint (the log read back can be past
        // the checkpoint size), whose failure poisons the handle without failing the write:
        // a journal that can neither write nor read redb is not open, so say so now.
        journal.inner.check_writable()?;
        journal.inner.upgrade_logged(path)?;
        Ok(journal)
    }
}

impl Inner {
    /// Upgrades a journal of format 2 (a file with a log) to this build's format, once its
    /// log is read back: one batch records the `format_upgraded` event and the new format
    /// record, and a checkpoint then writes it into the file before the journal is used, so
    /// the file says format 3 before any value only format 3 reads (a result inline in its
    /// receipt) exists. Format 3 reads every format-2 value as it is.
    fn upgrade_logged(&self, path: &Path) -> Result<()> {
        // The file's own format, and the latest (a crash may have come between the logged
        // upgrade and its checkpoint: then only the checkpoint is still to be made).
        let (in_file, latest) = self.read_with(None, |snap, _| {
            let in_file = index::Snapshot {
                base: snap.tables.base,
                layers: Layers::default(),
            }
            .format()?;
            Ok((in_file, snap.tables.format()?))
        })?;
        let old_version = |f: &Option<FormatRecord>| {
            f.as_ref()
                .is_some_and(|f| f.format_version < u32::from(FORMAT_VERSION))
        };
        if !old_version(&in_file) {
            return Ok(());
        }
        let Some(old) = latest.filter(|f| f.format_version < u32::from(FORMAT_VERSION)) else {
            return self.exclusive(|| self.checkpoint());
        };
        if std::fs::metadata(path).is_ok_and(|m| m.permissions().readonly()) {
            return Err(Error::invalid(
                "journal file",
                &path.display().to_string(),
                format!(
                    "it is format version {}, which the first writer upgrades to version \
                     {FORMAT_VERSION} in place, but the file is read-only: make it writable to \
                     open it for writing (read-only commands such as `opjournal ls` read it as \
                     it is)",
                    old.format_version
                ),
            ));
        }
        self.write(move |ctx| {
            let from = old.format_version;
            ctx.append(
                None,
                EventKind::FormatUpgraded {
                    from,
                    to: u32::from(FORMAT_VERSION),
                },
            )?;
            ctx.t.put_format(&FormatRecord {
                format_version: u32::from(FORMAT_VERSION),
                upgraded: Some(crate::record::Upgrade { from, at: ctx.now }),
                ..old.clone()
            })?;
            Ok(())
        })?;
        self.exclusive(|| self.checkpoint())
    }
}

/// Refuses, before the file is opened for writing (which writes to it), a journal of a
/// newer format (named with both versions: it is never rewritten as this one) and a
/// read-only file. Reads the format with a read-only open; if that is not possible here (a
/// live reader holds the file, or it needs the recovery that only a writer runs), the
/// writer's open decides.
fn refuse_before_writing(path: &Path) -> Result<()> {
    let read_only = std::fs::metadata(path)
        .map_err(Error::io)?
        .permissions()
        .readonly();
    let db = match redb::Builder::new()
        .set_concurrency_mode(redb::ConcurrencyMode::ExclusiveWriter)
        .open_read_only(path)
    {
        Ok(db) => db,
        Err(_) if !read_only => return Ok(()),
        // Not closed cleanly (it needs the recovery only a writer runs), and read-only: no
        // writer can open it either.
        Err(redb::DatabaseError::RepairAborted | redb::DatabaseError::Storage(_)) => {
            return Err(Error::invalid(
                "journal file",
                &path.display().to_string(),
                "the file is read-only and was not closed cleanly: make it writable to open \
                 it for writing (read-only commands such as `opjournal ls` read it as it is)",
            ));
        }
        Err(e) => return Err(open_error(path, e)),
    };
    let format = index::Snapshot {
        base: Some(&Base::new(db.begin_read()?)),
        layers: Layers::default(),
    }
    .format()?;
    if !read_only {
        return Ok(());
    }
    let version = format.map_or(u32::from(FORMAT_VERSION), |f| f.format_version);
    let why = if version < u32::from(FORMAT_VERSION) {
        format!(
            "it is format version {version}, which the first writer upgrades to version \
             {FORMAT_VERSION} in place, but the file is read-only"
        )
    } else {
        "the file is read-only".to_string()
    };
    Err(Error::invalid(
        "journal file",
        &path.display().to_string(),
        format!(
            "{why}: make it writable to open it for writing (read-only commands such as \
             `opjournal ls` read it as it is)"
        ),
    ))
}

/// Why reading the log back stopped: its storage failed, or a record did not apply.
enum ReadLog {
    Io(std::io::Error),
    Record(Error),
}

impl From<std::io::Error> for ReadLog {
    fn from(e: std::io::Error) -> Self {
        ReadLog::Io(e)
    }
}

/// Adds one log record's changes to those read so far.
fn replay_record(staged: &mut index::Staged, lsn: u64, kind: u8, payload: &[u8]) -> Result<()> {
    if kind != log::KIND_BATCH {
        return Err(Error::corrupt(
            "log",
            format!("record {lsn}"),
            format!("record kind {kind} is not one this build writes"),
        ));
    }
    staged
        .apply_encoded(payload)
        .map_err(|detail| Error::corrupt("log", format!("record {lsn}"), detail))
}

/// Makes the redb file a journal of this build's format, in one durable transaction when
/// anything is to be written: a new file gets its tables and meta records; a format 1
/// file is upgraded (a `format_upgraded` event records it). A journal of this format is
/// left as it is.
pub(crate) fn prepare(db: &Database, path: &Path, cfg: &Config) -> Result<()> {
    let (format, has_tables) = {
        let txn = db.begin_read()?;
        let names: Vec<String> = {
            use redb::TableHandle;
            txn.list_tables()?.map(|h| h.name().to_string()).collect()
        };
        let base = Base::new(txn);
        let format = if names.iter().any(|n| n == "meta") {
            index::Snapshot {
                base: Some(&base),
                layers: Layers::default(),
            }
            .format()?
        } else {
            None
        };
        (format, !names.is_empty())
    };
    let format = check_format(path, format, has_tables)?;
    if format
        .as_ref()
        .is_some_and(|f| f.format_version == u32::from(FORMAT_VERSION))
    {
        return Ok(());
    }
    // A file of format 2 has a log, which may hold committed batches the file lacks: it is
    // upgraded after the log is read back (see `upgrade_logged`), never before (a new
    // checkpoint record here would disown the log, and an event here would take a seq the
    // log may already use). Read-only files are refused there too.
    if format.as_ref().is_some_and(|f| f.format_version >= 2) {
        return Ok(());
    }
    if let Some(old) = &format
        && std::fs::metadata(path).is_ok_and(|m| m.permissions().readonly())
    {
        return Err(Error::invalid(
            "journal file",
            &path.display().to_string(),
            format!(
                "it is format version {}, which the first writer upgrades to version \
                 {FORMAT_VERSION} in place, but the file is read-only: make it writable to open \
                 it for writing (read-only commands such as `opjournal ls` read it as it is)",
                old.format_version
            ),
        ));
    }
    let now = cfg.clock.now();
    let txn = db.begin_write()?;
    let changes = match format {
        None => super::memory::new_journal_records(cfg)?,
        Some(old) => {
            let base = Base::new(db.begin_read()?);
            let mut t = WriteTables::over(Some(&base), Layers::default());
            let mut state = t.state()?;
            let at = state.clock_high_water.max(now);
            state.clock_high_water = at;
            let mut ctx = Ctx {
                t: &mut t,
                now: at,
                cfg,
                state: &mut state,
                fired: Default::default(),
            };
            ctx.append(
                None,
                EventKind::FormatUpgraded {
                    from: old.format_version,
                    to: u32::from(FORMAT_VERSION),
                },
            )?;
            let state = ctx.state.clone();
            t.put_state(&state)?;
            t.put_format(&FormatRecord {
                format_version: u32::from(FORMAT_VERSION),
                upgraded: Some(crate::record::Upgrade {
                    from: old.format_version,
                    at,
                }),
                ..old
            })?;
            t.put_checkpoint(&CheckpointRecord {
                journal_id: log::new_journal_id(),
                generation: 1,
                next_lsn: 1,
            })?;
            t.into_changes()
        }
    };
    index::checkpoint(&txn, &changes, false)?;
    // Every table exists from the start, so readers never meet a missing one.
    index::create_tables(&txn)?;
    txn.commit()?;
    Ok(())
}
