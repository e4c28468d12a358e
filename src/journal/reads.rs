//! Reads: the committed state (the redb snapshot of the last checkpoint, with the
//! memtable of everything logged since), and deliveries and acknowledgements that are
//! checked and visible at once but committed with the next batch.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::clock::Timestamp;
use crate::error::{Error, ErrorKind, Result};
use crate::index::{self, Base, Layers, Memtable, View};
use crate::machine::{self};
use crate::record::{Event, EventKind, ReceiptRecord};
use crate::types::{Admission, Operation, Receipt};

use super::Inner;
use super::cache::ReplayCache;
use super::committer::lock;

/// What this process has committed: redb as of the last checkpoint, and over it the
/// memtable of every batch logged since. Replaced under the write lock by a commit (the
/// memtable grows) and by a checkpoint (a new base, an empty memtable): readers hold the
/// read lock while they read, so they see one commit or the next, never half of one.
///
/// Between the two, the memtable may be split: a checkpoint that starts the log's next cycle
/// in the other log file hands the older part (`frozen`) to the checkpoint thread, which
/// writes and commits it into redb while calls go on into a new `mem` (see
/// `Inner::switch_checkpoint`). Reads see `mem` over `frozen` over `base` until the thread
/// publishes the new base and drops `frozen`, in one step under the write lock.
pub(crate) struct Committed {
    /// `None` only while redb compacts its file (it needs no read transaction open).
    pub(crate) base: Option<Base<'static>>,
    /// Shared with a checkpoint while it writes it into redb (see `Inner::checkpoint`).
    pub(crate) mem: Arc<Memtable>,
    /// The memtable of the cycle a checkpoint is committing beside the next one: never
    /// changed again, and shared with the checkpoint thread, which writes it into redb.
    pub(crate) frozen: Option<Arc<Memtable>>,
}

impl Committed {
    pub(crate) fn new(base: Option<Base<'static>>, mem: Memtable) -> Committed {
        Committed {
            base,
            mem: Arc::new(mem),
            frozen: None,
        }
    }

    /// The memtables, top first.
    pub(crate) fn layers(&self) -> Layers<'_> {
        match &self.frozen {
            Some(frozen) => Layers::new(&[&self.mem, frozen]),
            None => Layers::new(&[&self.mem]),
        }
    }

    pub(crate) fn snapshot(&self) -> index::Snapshot<'_> {
        index::Snapshot {
            base: self.base.as_ref(),
            layers: self.layers(),
        }
    }

    /// The bytes the memtables hold, as they count them: everything logged since the last
    /// checkpoint that redb committed.
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn bytes(&self) -> usize {
        self.mem.bytes() + self.frozen.as_ref().map_or(0, |f| f.bytes())
    }

    /// Whether nothing was logged since the last checkpoint.
    pub(crate) fn is_empty(&self) -> bool {
        self.mem.is_empty() && self.frozen.as_ref().is_none_or(|f| f.is_empty())
    }
}

impl Inner {
    /// Runs `f` on the committed state with the pending lazy writes of `id` (or of every
    /// id for `None`), and the time to judge it by. The pending entries are copied before
    /// the state is locked: an entry leaves the buffer only after the commit that carries
    /// it is published, so each is either still pending or already in the state (applying
    /// it twice is harmless, see `machine::overlay`).
    pub(crate) fn read_with<R>(
        &self,
        id: Option<&str>,
        f: impl FnOnce(&ReadView<'_>, Timestamp) -> Result<R>,
    ) -> Result<R> {
        let pending: Vec<LazyEntry> = read_lock(&self.lazy)
            .entries
            .iter()
            .filter(|e| id.is_none_or(|id| e.id == id))
            .cloned()
            .collect();
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.pg() {
            return self.read_pg(pg, pending, f);
        }
        let committed = read_lock(&self.committed);
        let view = ReadView {
            tables: committed.snapshot(),
            pending,
        };
        f(&view, self.now())
    }

    /// Records a delivery or an acknowledgement lazily: it is validated and visible to
    /// reads at once, and committed with the next batch.
    pub(crate) fn lazy_write(&self, id: &str, kind: machine::LazyKind) -> Result<Receipt> {
        self.check_writable()?;
        let mut lazy = write_lock(&self.lazy);
        let (rec, now) = {
            let (rec, now) = self.stored_receipt(id)?;
            let pending: Vec<(Timestamp, EventKind)> = lazy
                .entries
                .iter()
                .filter(|e| e.id == id)
                .map(|e| (e.at, e.kind.clone()))
                .collect();
            // The clocks apply to the pending writes too: a last delivery still pending
            // may have spent the retry budget by now, as reads show.
            let rec =
                machine::effective(machine::overlay(rec, &pending), now).ok_or_else(|| {
                    Error::new(ErrorKind::UnknownOperation {
                        operation_id: id.to_string(),
                    })
                })?;
            (rec, now)
        };
        let after = match machine::lazy_event(&rec, kind, now, &self.cfg)? {
            None => rec,
            Some(event) => {
                let ev = Event {
                    seq: 0,
                    at: now,
                    operation_id: Some(id.to_string()),
                    kind: event.clone(),
                };
                let next = machine::transition(Some(&rec), &ev)
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
        machine::into_view(after)
            .ok_or_else(|| Error::corrupt("receipts", id, "vacant after a check"))
    }
}

impl Inner {
    /// The committed receipt of `id` (an unknown id is an error) and the time to judge it
    /// by.
    fn stored_receipt(&self, id: &str) -> Result<(ReceiptRecord, Timestamp)> {
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.pg() {
            return self.read_pg(pg, Vec::new(), |snap, now| {
                Ok((machine::known_or_unknown(&snap.tables, id, now)?, now))
            });
        }
        let now = self.now();
        let committed = read_lock(&self.committed);
        Ok((
            machine::known_or_unknown(&committed.snapshot(), id, now)?,
            now,
        ))
    }
}

#[cfg(any(test, feature = "internals"))]
impl crate::Journal {
    /// The bytes the memtable holds, as it counts them: the changes logged since the last
    /// checkpoint, which [`JournalBuilder::checkpoint_size`](crate::JournalBuilder::checkpoint_size)
    /// bounds. For tests of that bound (feature `internals`); not a stable API.
    #[doc(hidden)]
    pub fn memtable_bytes(&self) -> usize {
        read_lock(&self.inner.committed).bytes()
    }
}

/// The committed state, and the lazy writes pending for what it reads.
pub(crate) struct ReadView<'a> {
    pub(crate) tables: index::Snapshot<'a>,
    pub(crate) pending: Vec<LazyEntry>,
}

impl ReadView<'_> {
    /// The answer for `op` if its id is known (see `machine::answer_known`), through the
    /// replay cache: a cached terminal receipt and result are used instead of reading the
    /// index, and a terminal answer read from the index is cached. Called under the
    /// committed state's read lock (`read_with`), which keeps the cache coherent: a commit
    /// changes receipts, and forgets their entries, only under the write lock.
    pub(crate) fn answer_known(
        &self,
        op: &Operation,
        now: Timestamp,
        cache: &Mutex<ReplayCache>,
    ) -> Result<Option<Admission>> {
        let cached = lock(cache).get(&op.id);
        // A small result is read with its receipt, in the same lookup.
        let (stored, known_result, from_cache) = match cached {
            Some((rec, result)) => (rec, Some(result), true),
            None => match self.tables.receipt_and_inline_result(&op.id)? {
                Some((rec, inline)) => (rec, inline, false),
                None => return Ok(None),
            },
        };
        let to_cache = (!from_cache && machine::has_result(&stored) && lock(cache).admit(&op.id))
            .then(|| stored.clone());
        let eff = machine::effective(stored, now).and_then(|r| self.overlaid(r, now));
        machine::answer_known(eff, op, |rec| {
            if let Some(result) = known_result {
                if let Some(stored) = &to_cache {
                    lock(cache).insert(stored, &result);
                }
                return Ok(Some(result));
            }
            // Read from the index without a result inline (from the cache, the result
            // came with the receipt): it is in `results`.
            let result = machine::stored_result_of(&self.tables, rec)?;
            if let (Some(stored), Some(result)) = (&to_cache, &result) {
                lock(cache).insert(stored, result);
            }
            Ok(result)
        })
    }

    /// The effective record of `id` at `now`, with pending lazy writes applied.
    pub(crate) fn effective(&self, id: &str, now: Timestamp) -> Result<Option<ReceiptRecord>> {
        let Some(rec) = machine::effective_of(&self.tables, id, now)? else {
            return Ok(None);
        };
        Ok(self.overlaid(rec, now))
    }

    /// An effective record with the pending lazy writes of its operation applied.
    pub(crate) fn overlaid(&self, rec: ReceiptRecord, now: Timestamp) -> Option<ReceiptRecord> {
        if !self.pending.iter().any(|e| e.id == rec.operation_id) {
            return Some(rec);
        }
        let mine: Vec<(Timestamp, EventKind)> = self
            .pending
            .iter()
            .filter(|e| e.id == rec.operation_id)
            .map(|e| (e.at, e.kind.clone()))
            .collect();
        // The clocks apply to the pending writes too (a last delivery exhausts the budget).
        machine::effective(machine::overlay(rec, &mine), now)
    }

    /// The public receipt of `id` at `now`.
    pub(crate) fn lookup(&self, id: &str, now: Timestamp) -> Result<Option<Receipt>> {
        Ok(self.effective(id, now)?.and_then(machine::into_view))
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
