//! Reads: the snapshot of the latest commit, and deliveries and acknowledgements that
//! are checked and visible at once but committed with the next batch.
//! The [`Journal`] handle: opening, the group committer, and the public API.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redb::ReadableDatabase;

use crate::clock::Timestamp;
use crate::engine::{self};
use crate::error::{Error, ErrorKind, Result};
use crate::index::ReadTables;
use crate::record::{Event, EventKind, ReceiptRecord};
use crate::types::Receipt;

use super::Inner;
use super::committer::lock;

impl Inner {
    /// A read snapshot and the time to judge it by.
    pub(crate) fn read(&self) -> Result<(Snapshot, Timestamp)> {
        self.read_pending(None)
    }

    /// A read snapshot with the pending lazy writes of `id` (or of every id for `None`).
    /// The snapshot is taken while the buffer is locked, so an entry is either still
    /// pending or already in the snapshot (it leaves the buffer only after its commit).
    pub(crate) fn read_pending(&self, id: Option<&str>) -> Result<(Snapshot, Timestamp)> {
        let lazy = read_lock(&self.lazy);
        let tables = self.latest_snapshot()?;
        let pending = lazy
            .entries
            .iter()
            .filter(|e| id.is_none_or(|id| e.id == id))
            .cloned()
            .collect();
        drop(lazy);
        Ok((Snapshot { tables, pending }, self.now()))
    }

    /// A read transaction on the latest commit. This process is the only writer, so the
    /// snapshot taken after the last commit stays the latest until the next one: it is
    /// shared by every read until a commit drops it (reads then pay neither for beginning
    /// a transaction nor for opening tables again).
    pub(crate) fn latest_snapshot(&self) -> Result<Arc<ReadTables>> {
        let mut cached = lock(&self.snapshot);
        if let Some(t) = cached.as_ref() {
            return Ok(t.clone());
        }
        let tables = Arc::new(ReadTables::new(self.db()?.begin_read()?));
        *cached = Some(tables.clone());
        Ok(tables)
    }

    /// Forgets the cached snapshot: called when a commit makes it stale, and before redb
    /// compaction (which needs no live read transaction).
    pub(crate) fn drop_snapshot(&self) {
        lock(&self.snapshot).take();
    }

    /// Records a delivery or an acknowledgement lazily: it is validated and visible to
    /// reads at once, and committed with the next batch.
    pub(crate) fn lazy_write(&self, id: &str, kind: engine::LazyKind) -> Result<Receipt> {
        self.check_writable()?;
        let now = self.now();
        let mut lazy = write_lock(&self.lazy);
        let rec = {
            let tables = self.latest_snapshot()?;
            let rec = engine::known_or_unknown(&*tables, id, now)?;
            let pending: Vec<(Timestamp, EventKind)> = lazy
                .entries
                .iter()
                .filter(|e| e.id == id)
                .map(|e| (e.at, e.kind.clone()))
                .collect();
            // The clocks apply to the pending writes too: a last delivery still pending
            // may have spent the retry budget by now, as reads show.
            engine::effective(&engine::overlay(rec, &pending), now).ok_or_else(|| {
                Error::new(ErrorKind::UnknownOperation {
                    operation_id: id.to_string(),
                })
            })?
        };
        let after = match engine::lazy_event(&rec, kind, now, &self.cfg)? {
            None => rec,
            Some(event) => {
                let ev = Event {
                    seq: 0,
                    at: now,
                    operation_id: Some(id.to_string()),
                    kind: event.clone(),
                };
                let next = engine::transition(Some(&rec), &ev)
                    .map_err(|m| Error::corrupt("receipts", id, m))?;
                lazy.entries.push(LazyEntry {
                    id: id.to_string(),
                    at: now,
                    kind: event,
                });
                lazy.first_at.get_or_insert_with(Instant::now);
                next
            }
        };
        let due = lazy.entries.len() >= LAZY_MAX_ENTRIES
            || lazy.first_at.is_some_and(|t| t.elapsed() >= LAZY_MAX_DELAY);
        drop(lazy);
        if due {
            self.flush()?;
        }
        engine::view(&after).ok_or_else(|| Error::corrupt("receipts", id, "vacant after a check"))
    }
}

/// A read transaction, its tables, and the lazy writes pending for what it reads.
pub(crate) struct Snapshot {
    pub(crate) tables: Arc<ReadTables>,
    pub(crate) pending: Vec<LazyEntry>,
}

impl Snapshot {
    /// The effective record of `id` at `now`, with pending lazy writes applied.
    pub(crate) fn effective(&self, id: &str, now: Timestamp) -> Result<Option<ReceiptRecord>> {
        let Some(rec) = engine::effective_of(&*self.tables, id, now)? else {
            return Ok(None);
        };
        if self.pending.is_empty() {
            return Ok(Some(rec));
        }
        let mine: Vec<(Timestamp, EventKind)> = self
            .pending
            .iter()
            .filter(|e| e.id == id)
            .map(|e| (e.at, e.kind.clone()))
            .collect();
        // The clocks apply to the pending writes too (a last delivery exhausts the budget).
        Ok(engine::effective(&engine::overlay(rec, &mine), now))
    }

    /// The public receipt of `id` at `now`.
    pub(crate) fn lookup(&self, id: &str, now: Timestamp) -> Result<Option<Receipt>> {
        Ok(self.effective(id, now)?.as_ref().and_then(engine::view))
    }
}

/// The most deliveries and acknowledgements kept pending before a batch commits them.
const LAZY_MAX_ENTRIES: usize = 256;
/// The longest a pending entry waits when further lazy writes arrive.
const LAZY_MAX_DELAY: Duration = Duration::from_millis(200);

/// A delivery or acknowledgement validated and visible to reads, not committed yet.
#[derive(Clone, Debug)]
pub(crate) struct LazyEntry {
    pub(crate) id: String,
    pub(crate) at: Timestamp,
    pub(crate) kind: EventKind,
}

/// Deliveries and acknowledgements are durable lazily: they wait here and
/// ride along with the next commit (any state change, a compactor pass, `flush`, closing,
/// or 256 entries / 200 ms of further lazy writes). A crash loses at most these, which
/// only causes a recognizable redelivery. Reads apply them, so callers see their own.
#[derive(Default, Debug)]
pub(crate) struct LazyBuffer {
    pub(crate) entries: Vec<LazyEntry>,
    pub(crate) first_at: Option<Instant>,
}

pub(crate) fn read_lock<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn write_lock<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}
