//! Journals that keep their tables somewhere other than a file: in memory (for tests and
//! fuzzers), and what every such journal shares (the first records of a new journal, the
//! handle built around a memtable).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, RwLock};

use crate::codec::FORMAT_VERSION;
use crate::config::Config;
use crate::error::Result;
use crate::index::{Layers, Memtable, WriteTables};
use crate::record::{CheckpointRecord, FormatRecord, StateRecord};

use super::committer::Committer;
use super::reads::{Committed, LazyBuffer};
use super::{Inner, Journal, Storage};

/// The path an in-memory journal reports (as SQLite names its in-memory databases).
pub(crate) const MEMORY_LABEL: &str = ":memory:";

/// The records of a new, empty journal: its format, its state (the clock's high-water
/// mark, the next event's seq) and its checkpoint record.
pub(crate) fn new_journal_records(cfg: &Config) -> Result<Memtable> {
    let now = cfg.clock.now();
    let mut t = WriteTables::over(None, Layers::default());
    t.put_format(&FormatRecord {
        format_version: u32::from(FORMAT_VERSION),
        created_at: now,
        created_by: format!("opjournal {}", env!("CARGO_PKG_VERSION")),
        upgraded: None,
    })?;
    t.put_state(&StateRecord {
        clock_high_water: now,
        next_seq: 1,
    })?;
    t.put_checkpoint(&CheckpointRecord {
        journal_id: crate::log::new_journal_id(),
        generation: 1,
        next_lsn: 1,
    })?;
    Ok(t.into_changes())
}

/// A handle around `storage`, with `mem` as the committed state (everything, for a
/// journal in memory; nothing, for a store that is read on every call).
pub(crate) fn handle(storage: Storage, label: &str, mem: Memtable, cfg: Config) -> Journal {
    let now = cfg.clock.now();
    let cache_bytes = cfg.replay_cache_bytes;
    Journal {
        inner: Arc::new(Inner {
            storage,
            db: None,
            cfg,
            path: Path::new(label).to_path_buf(),
            high_water: AtomicU64::new(now.0),
            persisted_high_water: AtomicU64::new(now.0),
            poisoned: Arc::new(AtomicBool::new(false)),
            lazy: RwLock::new(LazyBuffer::default()),
            committed: Arc::new(RwLock::new(Committed::new(None, mem))),
            log: Mutex::new(None),
            cache: Mutex::new(super::cache::ReplayCache::new(cache_bytes)),
            foreground_waiting: Arc::new(AtomicUsize::new(0)),
            compacting: AtomicUsize::new(0),
            committer: Committer::new(),
            checkpointer: Default::default(),
            gate: Arc::new(Mutex::new(false)),
            reclaimed: AtomicBool::new(false),
            handles: AtomicUsize::new(1),
        }),
        released: false,
    }
}

/// Opens a new, empty journal in memory.
pub(crate) fn open_in_memory(cfg: Config) -> Result<Journal> {
    let mem = new_journal_records(&cfg)?;
    Ok(handle(Storage::Memory, MEMORY_LABEL, mem, cfg))
}
