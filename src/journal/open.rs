//! Opening and creating a journal.
//! The [`Journal`] handle: opening, the group committer, and the public API.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use redb::Database;

use crate::codec::FORMAT_VERSION;
use crate::config::{Config, Sharing};
use crate::engine::{self, Ctx};
use crate::error::{Error, Result};
use crate::index::{View, WriteTables};
use crate::record::{FormatRecord, StateRecord};

use super::committer::Committer;
use super::reads::LazyBuffer;
use super::{Inner, Journal};
use crate::index::file::{check_format, check_redb_magic, open_error};

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
        if !path.exists() {
            Self::create_atomically(path, &cfg)?;
        }
        // The file is input: the storage engine may panic on damaged pages while opening
        // (fuzzing found such files). Answer `Corrupt` instead.
        crate::index::guarded("open", || {
            let db = Self::redb_builder(&cfg)
                .create(path)
                .map_err(|e| open_error(path, e))?;
            Self::init(db, path, cfg)
        })
    }

    /// Creates a new journal at `path` without ever exposing a half-made file there: the
    /// storage engine initializes a file in place over several writes and syncs, and a crash
    /// in between leaves a file it (rightly) refuses to open ever again. So the journal is
    /// built under a temporary name in the same directory, closed (synced), then linked into
    /// place, which fails if another process created `path` first (then its journal is
    /// used). A crash leaves no journal or a complete one, and at worst a stray temporary
    /// file named `.<name>.creating-*`.
    fn create_atomically(path: &Path, cfg: &Config) -> Result<()> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
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
            drop(Self::init(db, tmp, cfg.clone())?);
        }
        match std::fs::hard_link(tmp, path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
            // No hard links on this file system: rename, unless someone created it meanwhile.
            Err(_) if !path.exists() => std::fs::rename(tmp, path).map_err(Error::io)?,
            Err(e) => return Err(Error::io(e)),
        }
        // Make the new name durable.
        #[cfg(unix)]
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(Error::io)?;
        Ok(())
    }

    pub(crate) fn open_backend_with(
        backend: impl redb::StorageBackend,
        label: &str,
        mut cfg: Config,
    ) -> Result<Journal> {
        // Custom backends implement no cross-process locks: open them exclusively.
        cfg.sharing = Sharing::Exclusive;
        let path = Path::new(label);
        let db = Self::redb_builder(&cfg)
            .create_with_backend(backend)
            .map_err(|e| open_error(path, e))?;
        Self::init(db, path, cfg)
    }

    pub(crate) fn init(db: Database, path: &Path, cfg: Config) -> Result<Journal> {
        let now_clock = cfg.clock.now();
        let mut txn = db.begin_write()?;
        txn.set_quick_repair(cfg.quick_repair);
        let high_water;
        {
            let names: Vec<String> = {
                use redb::TableHandle;
                txn.list_tables()?.map(|h| h.name().to_string()).collect()
            };
            let has_meta = names.iter().any(|n| n == "meta");
            let mut t = WriteTables::open(&txn)?;
            let format = if has_meta { t.format()? } else { None };
            let exists = check_format(path, format, !names.is_empty())?;
            let mut state = if exists {
                t.state()?
            } else {
                t.put_format(&FormatRecord {
                    format_version: u32::from(FORMAT_VERSION),
                    created_at: now_clock,
                    created_by: format!("opjournal {}", env!("CARGO_PKG_VERSION")),
                })?;
                StateRecord {
                    clock_high_water: now_clock,
                    next_seq: 1,
                }
            };
            let now = state.clock_high_water.max(now_clock);
            state.clock_high_water = now;
            let mut ctx = Ctx {
                t: &mut t,
                now,
                cfg: &cfg,
                state: &mut state,
                fired: Default::default(),
            };
            engine::mark_running_in_doubt(&mut ctx)?;
            let state = ctx.state.clone();
            t.put_state(&state)?;
            high_water = state.clock_high_water;
        }
        txn.commit()?;
        Ok(Journal {
            inner: Arc::new(Inner {
                db: Some(db),
                cfg,
                path: path.to_path_buf(),
                high_water: AtomicU64::new(high_water.0),
                persisted_high_water: AtomicU64::new(high_water.0),
                poisoned: AtomicBool::new(false),
                lazy: RwLock::new(LazyBuffer::default()),
                snapshot: Mutex::new(None),
                foreground_waiting: Arc::new(AtomicUsize::new(0)),
                committer: Committer::new(),
                gate: Arc::new(Mutex::new(false)),
            }),
        })
    }
}

/// A new, empty file with a unique name beside the journal, removed when dropped (after a
/// successful link the journal keeps its own name for the same file).
struct TempFile {
    path: PathBuf,
}

impl TempFile {
    /// Creates `.<name>.creating-<pid>-<counter>-<nanos>` in `dir`; the name is new (the file
    /// is created with `create_new`), retried with the next counter if it is taken.
    fn create(dir: &Path, name: &str) -> Result<TempFile> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let mut last = None;
        for _ in 0..100 {
            let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = dir.join(format!(
                ".{name}.creating-{}-{n}-{nanos}",
                std::process::id()
            ));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(_) => return Ok(TempFile { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(Error::io(e)),
            }
        }
        Err(Error::io(last.unwrap_or_else(|| {
            std::io::Error::other("no unused temporary name beside the journal")
        })))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
