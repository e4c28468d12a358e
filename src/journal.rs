//! The [`Journal`] handle: opening, the group committer, and the public API.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use redb::{Database, ReadableDatabase, ReadableTableMetadata};

use crate::clock::Timestamp;
use crate::codec::FORMAT_VERSION;
use crate::compact::{CompactionReport, CompactorHandle};
use crate::config::{Config, JournalBuilder, Sharing};
use crate::engine::{self, Ctx};
use crate::error::{Error, ErrorKind, Result};
use crate::record::{Event, EventKind, FormatRecord, ReceiptRecord, StateRecord};
use crate::store::{ReadTables, TimerKind, View, WriteTables};
use crate::types::{Admission, Claim, OpResult, Operation, Outcome, Receipt, Replay, Resolution};

/// The first nine bytes of every redb file.
pub(crate) const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

/// An open operation journal: one redb file.
///
/// `Journal` is `Send + Sync`; share one handle between threads with an `Arc`. Calls are
/// synchronous (async embedders use `spawn_blocking`). Every call that changes execution
/// state is durable (synced) before it returns `Ok`; concurrent callers share commits.
///
/// # Example
///
/// ```
/// use opjournal::{Admission, Intent, Journal, Operation, Outcome};
/// use serde_json::json;
///
/// let dir = tempfile::tempdir()?;
/// let journal = Journal::open(dir.path().join("project.opj"))?;
/// let intent = Intent::from_json("scene.add_light", &json!({"near": "door"}))?;
/// let op = Operation::new("op_7f3", intent).scope("scene/main").base_revision(183);
///
/// let Admission::Fresh(claim) = journal.submit(op.clone())? else { unreachable!() };
/// // ... apply the change to the project, producing revision 184 ...
/// journal.complete(&claim, Outcome::applied(184, b"light-1".to_vec()))?;
///
/// // The client reconnects and asks again: the outcome is replayed, not re-applied.
/// match journal.submit(op)? {
///     Admission::Replay(replay) => assert_eq!(replay.result.bytes, b"light-1"),
///     other => panic!("expected a replay, got {other:?}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Journal {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// `None` only while `Inner` is dropped (see its `Drop`).
    db: Option<Database>,
    pub(crate) cfg: Config,
    path: PathBuf,
    high_water: AtomicU64,
    /// The high-water mark of the last commit (the persisted one).
    persisted_high_water: AtomicU64,
    poisoned: AtomicBool,
    /// Foreground calls queued for the writer: a compaction batch in progress ends early
    /// when one arrives, so foreground calls wait behind as little compaction as possible.
    pub(crate) foreground_waiting: Arc<AtomicUsize>,
    /// The read transaction on the latest commit, shared by reads until the next commit.
    snapshot: Mutex<Option<Arc<ReadTables>>>,
    /// Deliveries and acknowledgements not committed yet (see [`LazyBuffer`]).
    lazy: RwLock<LazyBuffer>,
    committer: Committer,
    /// Held by a background compactor during a pass; `true` once the journal is dropped,
    /// so no pass starts after that and the file closes as soon as `Journal` drops.
    pub(crate) gate: Arc<Mutex<bool>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.inner.path)
            .field("config", &self.inner.cfg)
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------------------
// Group commit.
//
// Callers enqueue jobs. Whoever finds no leader becomes the leader: it takes every queued
// job, runs them in one write transaction, commits once (one sync), and hands each caller
// its own answer. Jobs queued meanwhile form the next batch. A lone caller leads its own
// batch at once, so it waits for nothing but its own commit.
// ---------------------------------------------------------------------------------------

struct Committer {
    queue: Mutex<Queue>,
    cv: Condvar,
}

#[derive(Default)]
struct Queue {
    jobs: Vec<Box<dyn Job>>,
    leader: bool,
}

/// A queued call. `run` may be called more than once (a batch is retried without a job
/// that hit a corrupt record), so jobs keep their inputs.
trait Job: Send {
    /// Compaction: batched alone, so foreground calls never wait behind its work.
    fn background(&self) -> bool;
    fn run(&mut self, ctx: &mut Ctx<'_, '_>) -> std::result::Result<(), RunFailure>;
    fn finish(&mut self, commit: std::result::Result<(), &Error>);
    fn fail(&mut self, err: Error);
}

/// Why a job aborted its batch.
enum RunFailure {
    /// A corrupt record: only this job fails; the batch is retried without it.
    Isolated,
    /// Storage failure: the whole batch fails and the handle is poisoned.
    Fatal(Error),
}

type Slot<T> = Arc<Mutex<Option<Result<T>>>>;

struct TypedJob<T, F> {
    background: bool,
    f: F,
    result: Option<Result<T>>,
    slot: Slot<T>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves consistent data (plain fields), so the
    // poison flag is ignored rather than propagated as a second panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh copy of an error for every caller of a failed batch.
fn copy_error(e: &Error) -> Error {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    Error::with_source(e.kind().clone(), message)
}

impl<T, F> Job for TypedJob<T, F>
where
    T: Send + 'static,
    F: FnMut(&mut Ctx<'_, '_>) -> Result<T> + Send,
{
    fn background(&self) -> bool {
        self.background
    }

    fn run(&mut self, ctx: &mut Ctx<'_, '_>) -> std::result::Result<(), RunFailure> {
        let r = (self.f)(ctx);
        let failure = match &r {
            Err(e) if matches!(e.kind(), ErrorKind::Corrupt { .. }) => Some(RunFailure::Isolated),
            Err(e) if !e.is_refusal() => Some(RunFailure::Fatal(copy_error(e))),
            _ => None,
        };
        self.result = Some(r);
        match failure {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    fn finish(&mut self, commit: std::result::Result<(), &Error>) {
        let out = match commit {
            Ok(()) => self
                .result
                .take()
                .unwrap_or_else(|| Err(Error::new(ErrorKind::Storage))),
            Err(e) => Err(copy_error(e)),
        };
        *lock(&self.slot) = Some(out);
    }

    fn fail(&mut self, err: Error) {
        let out = match self.result.take() {
            Some(Err(own)) => Err(own),
            _ => Err(err),
        };
        *lock(&self.slot) = Some(out);
    }
}

impl Committer {
    fn new() -> Self {
        Committer {
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
        }
    }
}

/// The next batch: every queued foreground job, or else one background job.
fn next_batch(queue: &mut Vec<Box<dyn Job>>, waiting: &AtomicUsize) -> Vec<Box<dyn Job>> {
    if queue.iter().any(|j| !j.background()) {
        let (fg, bg): (Vec<_>, Vec<_>) = std::mem::take(queue)
            .into_iter()
            .partition(|j| !j.background());
        *queue = bg;
        waiting.fetch_sub(fg.len(), Ordering::SeqCst);
        fg
    } else {
        vec![queue.remove(0)]
    }
}

/// Fills every job's slot with an error if the leader unwinds, so no caller waits forever.
struct BatchGuard<'a> {
    jobs: Vec<Box<dyn Job>>,
    inner: &'a Inner,
}

impl Drop for BatchGuard<'_> {
    fn drop(&mut self) {
        if !self.jobs.is_empty() {
            self.inner.poisoned.store(true, Ordering::SeqCst);
            for mut job in self.jobs.drain(..) {
                job.fail(Error::new(ErrorKind::Poisoned));
            }
        }
        let mut q = lock(&self.inner.committer.queue);
        q.leader = false;
        self.inner.committer.cv.notify_all();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing redb writes its allocator state. After the engine panicked on damaged
        // data (caught, and the handle poisoned) its internal locks may be poisoned and
        // closing panics too: contain that here, so dropping a journal never panics. The
        // file is closed either way (the unwinding drops the engine's fields).
        if let Some(db) = self.db.take() {
            let _ = crate::check::guarded("close", || {
                drop(db);
                Ok(())
            });
        }
    }
}

impl Inner {
    /// The storage engine; gone only while the journal is being dropped.
    fn db(&self) -> Result<&Database> {
        self.db
            .as_ref()
            .ok_or_else(|| Error::new(ErrorKind::Closed))
    }

    /// The journal's time: the clock, never below the high-water mark.
    pub(crate) fn now(&self) -> Timestamp {
        let t = self.cfg.clock.now().0;
        let prev = self.high_water.fetch_max(t, Ordering::SeqCst);
        Timestamp(prev.max(t))
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Poisoned));
        }
        Ok(())
    }

    /// Runs `f` in a (possibly shared) write transaction and returns once its change is
    /// committed and synced.
    pub(crate) fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Ctx<'_, '_>) -> Result<T> + Send + 'static,
    {
        self.enqueue(false, f)
    }

    /// Runs a compaction batch `f` in a write transaction of its own: foreground calls
    /// are never batched with it, so they wait behind at most one such batch.
    pub(crate) fn write_background<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Ctx<'_, '_>) -> Result<T> + Send + 'static,
    {
        self.enqueue(true, f)
    }

    fn enqueue<T, F>(&self, background: bool, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Ctx<'_, '_>) -> Result<T> + Send + 'static,
    {
        self.check_writable()?;
        let slot: Slot<T> = Arc::new(Mutex::new(None));
        let job = TypedJob {
            background,
            f,
            result: None,
            slot: slot.clone(),
        };
        let c = &self.committer;
        let mut q = lock(&c.queue);
        if !background {
            self.foreground_waiting.fetch_add(1, Ordering::SeqCst);
        }
        q.jobs.push(Box::new(job));
        loop {
            if let Some(r) = lock(&slot).take() {
                return r;
            }
            if !q.leader && !q.jobs.is_empty() {
                q.leader = true;
                let jobs = next_batch(&mut q.jobs, &self.foreground_waiting);
                drop(q);
                let guard = BatchGuard { jobs, inner: self };
                self.execute(guard);
                q = lock(&c.queue);
                continue;
            }
            q = c.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn execute(&self, mut guard: BatchGuard<'_>) {
        loop {
            if self.poisoned.load(Ordering::SeqCst) {
                for mut job in guard.jobs.drain(..) {
                    job.fail(Error::new(ErrorKind::Poisoned));
                }
                return;
            }
            match self.try_batch(&mut guard.jobs) {
                BatchOutcome::Done => return,
                BatchOutcome::Retry(index) => {
                    // The job hit a corrupt record: it fails alone (with its own error),
                    // the rest run again in a fresh transaction.
                    let mut job = guard.jobs.remove(index);
                    job.fail(Error::new(ErrorKind::Storage));
                    if guard.jobs.is_empty() {
                        return;
                    }
                }
            }
        }
    }

    fn try_batch(&self, jobs: &mut Vec<Box<dyn Job>>) -> BatchOutcome {
        let fail_all = |jobs: &mut Vec<Box<dyn Job>>, e: Error, poison: bool| {
            if poison {
                self.poisoned.store(true, Ordering::SeqCst);
            }
            for mut job in jobs.drain(..) {
                job.finish(Err(&e));
            }
            BatchOutcome::Done
        };
        let now = self.now();
        let mut txn = match self.db().and_then(|db| Ok(db.begin_write()?)) {
            Ok(t) => t,
            Err(e) => return fail_all(jobs, e, true),
        };
        txn.set_quick_repair(self.cfg.quick_repair);
        // Pending deliveries and acknowledges ride along, first, so this batch's checks
        // (the session window, the hold-until-ack lock) see them.
        let pending: Vec<LazyEntry> = read_lock(&self.lazy).entries.clone();
        let run = (|| -> std::result::Result<bool, (Option<usize>, Error)> {
            let mut t = WriteTables::open(&txn).map_err(|e| (None, e))?;
            let mut state = t.state().map_err(|e| (None, e))?;
            // No event in the journal is later than the last committed batch's time.
            let mut floor = state.clock_high_water;
            state.clock_high_water = state.clock_high_water.max(now);
            let mut ctx = Ctx {
                t: &mut t,
                now,
                cfg: &self.cfg,
                state: &mut state,
                fired: Default::default(),
            };
            for entry in &pending {
                // Recorded as of the call that made it (what its caller was told), kept in
                // order after the events already in the journal.
                let at = entry.at.max(floor).min(now);
                floor = at;
                engine::record_lazy(&mut ctx, &entry.id, &entry.kind, at).map_err(|e| (None, e))?;
            }
            let mut ran = 0;
            loop {
                for (i, job) in jobs.iter_mut().enumerate().skip(ran) {
                    match job.run(&mut ctx) {
                        Ok(()) => {}
                        Err(RunFailure::Isolated) => {
                            return Err((Some(i), Error::new(ErrorKind::Storage)));
                        }
                        Err(RunFailure::Fatal(e)) => return Err((None, e)),
                    }
                }
                ran = jobs.len();
                // A compaction batch ends early when foreground calls queue up; they join
                // its transaction and share its commit instead of waiting for it.
                if !jobs.first().is_some_and(|j| j.background()) {
                    break;
                }
                let joining = {
                    let mut q = lock(&self.committer.queue);
                    if q.jobs.iter().any(|j| !j.background()) {
                        next_batch(&mut q.jobs, &self.foreground_waiting)
                    } else {
                        Vec::new()
                    }
                };
                if joining.is_empty() {
                    break;
                }
                jobs.extend(joining);
            }
            let state = ctx.state.clone();
            // A compaction batch applies the deletions it held back itself; this only
            // guarantees that no commit ever leaves one behind.
            t.apply_held_deletes().map_err(|e| (None, e))?;
            if !t.dirty {
                // Nothing changed (refusals, answers, no-ops): no commit, no sync.
                return Ok(false);
            }
            t.put_state(&state).map_err(|e| (None, e))?;
            Ok(true)
        })();
        match run {
            Ok(true) => {}
            Ok(false) => {
                let _ = txn.abort();
                self.lazy_committed(pending.len());
                for mut job in jobs.drain(..) {
                    job.finish(Ok(()));
                }
                return BatchOutcome::Done;
            }
            Err((isolated, e)) => {
                let _ = txn.abort();
                return match isolated {
                    Some(i) => BatchOutcome::Retry(i),
                    None => fail_all(jobs, e, true),
                };
            }
        }
        let committed = txn.commit();
        // The cached snapshot is stale now (or, after a failure, of unknown standing). It
        // goes before the pending entries leave the buffer and before any caller returns.
        self.drop_snapshot();
        match committed {
            Ok(()) => {
                self.persisted_high_water.fetch_max(now.0, Ordering::SeqCst);
                self.lazy_committed(pending.len());
                for mut job in jobs.drain(..) {
                    job.finish(Ok(()));
                }
                BatchOutcome::Done
            }
            // Never retry a commit on this handle after an I/O error (the fsyncgate
            // lesson): poison it; reopening recovers the last durable state.
            Err(e) => fail_all(jobs, Error::from(e), true),
        }
    }

    /// Commits pending deliveries and acknowledgements (an empty batch drains them).
    pub(crate) fn flush(&self) -> Result<()> {
        if read_lock(&self.lazy).entries.is_empty() {
            return Ok(());
        }
        self.write(|_ctx| Ok(()))
    }

    /// Persists the clock's high-water mark if reads have seen a later time than the last
    /// commit, so that time does not run backwards across a clean close and reopen.
    pub(crate) fn persist_clock(&self) -> Result<()> {
        if self.high_water.load(Ordering::SeqCst)
            <= self.persisted_high_water.load(Ordering::SeqCst)
        {
            return Ok(());
        }
        self.write(|ctx| {
            ctx.t.dirty = true;
            Ok(())
        })
    }

    /// Drops the first `n` pending entries: a batch committed them.
    fn lazy_committed(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut lazy = write_lock(&self.lazy);
        let n = n.min(lazy.entries.len());
        lazy.entries.drain(..n);
        if lazy.entries.is_empty() {
            lazy.first_at = None;
        }
    }

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
    fn latest_snapshot(&self) -> Result<Arc<ReadTables>> {
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
    fn lazy_write(&self, id: &str, kind: engine::LazyKind) -> Result<Receipt> {
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

enum BatchOutcome {
    Done,
    Retry(usize),
}

/// A read transaction, its tables, and the lazy writes pending for what it reads.
pub(crate) struct Snapshot {
    pub(crate) tables: Arc<ReadTables>,
    pending: Vec<LazyEntry>,
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
struct LazyEntry {
    id: String,
    at: Timestamp,
    kind: EventKind,
}

/// Deliveries and acknowledgements are durable lazily (DESIGN.md §7): they wait here and
/// ride along with the next commit (any state change, a compactor pass, `flush`, closing,
/// or 256 entries / 200 ms of further lazy writes). A crash loses at most these, which
/// only causes a recognizable redelivery. Reads apply them, so callers see their own.
#[derive(Default, Debug)]
struct LazyBuffer {
    entries: Vec<LazyEntry>,
    first_at: Option<Instant>,
}

fn read_lock<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write_lock<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

fn open_error(path: &Path, err: redb::DatabaseError) -> Error {
    match err {
        redb::DatabaseError::DatabaseAlreadyOpen | redb::DatabaseError::LockProtocolMismatch => {
            Error::new(ErrorKind::Locked {
                path: path.to_path_buf(),
            })
        }
        redb::DatabaseError::UpgradeRequired(v) => Error::new(ErrorKind::NotAJournal {
            path: path.to_path_buf(),
            detail: format!(
                "it is a redb file of an older file format ({v}) that this build does not read"
            ),
        }),
        other => Error::from(other),
    }
}

/// Refuses a file that exists, is not empty and is not a redb file, before redb sees it.
pub(crate) fn check_redb_magic(path: &Path) -> Result<()> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(e)),
    };
    let mut head = [0u8; 9];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io(e)),
        }
    }
    if n == 0 {
        return Ok(());
    }
    if n < head.len() || head != REDB_MAGIC {
        return Err(Error::new(ErrorKind::NotAJournal {
            path: path.to_path_buf(),
            detail: "it does not start with the redb file signature".into(),
        }));
    }
    Ok(())
}

/// Checks the format record of an existing journal.
pub(crate) fn check_format(
    path: &Path,
    format: Option<FormatRecord>,
    has_other_tables: bool,
) -> Result<bool> {
    match format {
        Some(f) if f.format_version == u32::from(FORMAT_VERSION) => Ok(true),
        Some(f) => Err(Error::new(ErrorKind::UnsupportedFormat {
            found: f.format_version,
            supported: u32::from(FORMAT_VERSION),
        })),
        None if has_other_tables => Err(Error::new(ErrorKind::NotAJournal {
            path: path.to_path_buf(),
            detail: "it is a redb database without the journal's `meta` table".into(),
        })),
        None => Ok(false),
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // Wait for a background compaction pass in flight, and keep new ones from starting,
        // so the file is closed when this returns.
        // Pending deliveries and acknowledgements are committed now (best effort: a
        // failure here loses only those, which is a harmless redelivery).
        let _ = self.inner.flush();
        let _ = self.inner.persist_clock();
        *lock(&self.inner.gate) = true;
        self.inner.drop_snapshot();
    }
}

impl Journal {
    /// Runs `f`, turning a panic of the storage engine into [`ErrorKind::Corrupt`]: redb
    /// trusts its pages and may panic on a damaged file (fuzzing found such files). The
    /// handle is then poisoned, as after a failed commit: the engine's own state may be
    /// inconsistent, so writes are refused until the journal is reopened (or repaired).
    fn guard<T>(&self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let mut finished = false;
        let r = crate::check::guarded(what, || {
            let r = f();
            finished = true;
            r
        });
        if !finished {
            self.inner.poisoned.store(true, Ordering::SeqCst);
        }
        r
    }

    /// A builder to configure the clocks, bounds and policies before opening.
    pub fn builder() -> JournalBuilder {
        JournalBuilder::new()
    }

    /// Opens (or creates) the journal at `path` with every default.
    ///
    /// # Errors
    ///
    /// As [`JournalBuilder::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Journal> {
        JournalBuilder::new().open(path)
    }

    fn redb_builder(cfg: &Config) -> redb::Builder {
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
        crate::check::guarded("open", || {
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
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}.creating-"))
            .tempfile_in(dir)
            .map_err(Error::io)?
            .into_temp_path();
        {
            let db = Self::redb_builder(cfg)
                .create(&tmp)
                .map_err(|e| open_error(&tmp, e))?;
            drop(Self::init(db, &tmp, cfg.clone())?);
        }
        match std::fs::hard_link(&tmp, path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
            // No hard links on this file system: rename, unless someone created it meanwhile.
            Err(_) if !path.exists() => std::fs::rename(&tmp, path).map_err(Error::io)?,
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

    fn init(db: Database, path: &Path, cfg: Config) -> Result<Journal> {
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

    /// The journal file's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The journal's current time: the clock, never below the persisted high-water mark.
    pub fn now(&self) -> Timestamp {
        self.inner.now()
    }

    /// Submits an operation. Lookup by operation id comes first; checks for fresh work
    /// follow (DESIGN.md §4). A `Fresh` admission is durable before this returns.
    ///
    /// # Errors
    ///
    /// Refusals that write nothing: [`ErrorKind::InvalidInput`] (bad id, scope or session),
    /// [`ErrorKind::IntentMismatch`] (the id is recorded with another intent),
    /// [`ErrorKind::StaleBase`], [`ErrorKind::ScopeBusy`], [`ErrorKind::WindowFull`].
    /// Storage errors: [`ErrorKind::Corrupt`], [`ErrorKind::Io`], [`ErrorKind::Poisoned`].
    pub fn submit(&self, op: Operation) -> Result<Admission> {
        self.guard("submit", || {
            engine::validate_operation(&op)?;
            // Fast path: a known id is answered from a read snapshot without the writer.
            {
                let (snap, now) = self.inner.read_pending(Some(&op.id))?;
                let eff = snap.effective(&op.id, now)?;
                if let Some(answer) = engine::answer_known(&*snap.tables, eff.as_ref(), &op)? {
                    return Ok(answer);
                }
            }
            self.inner.write(move |ctx| engine::submit(ctx, &op))
        })
    }

    /// Records the outcome of a claimed operation (durable before it returns).
    ///
    /// Accepted while the claim is current, also after its lease expired as long as
    /// nothing else resolved the operation.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::StaleClaim`] (another attempt, a release or a resolution happened),
    /// [`ErrorKind::RevisionNotForward`] (an applied revision not ahead of the scope's),
    /// [`ErrorKind::ResultTooLarge`], [`ErrorKind::InvalidInput`] (asset list); all write
    /// nothing, and the claim stays usable. Storage errors as for [`Journal::submit`].
    pub fn complete(&self, claim: &Claim, outcome: Outcome) -> Result<Receipt> {
        self.guard("complete", || {
            let claim = claim.clone();
            self.inner
                .write(move |ctx| engine::complete(ctx, &claim, &outcome))
        })
    }

    /// Gives the id back: the work was rejected before any effect. The id becomes unknown
    /// (reusable); its history is kept until the audit retention passes.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::StaleClaim`]; storage errors as for [`Journal::submit`].
    pub fn release(&self, claim: &Claim) -> Result<()> {
        self.guard("release", || {
            let claim = claim.clone();
            self.inner.write(move |ctx| engine::release(ctx, &claim))
        })
    }

    /// Extends the claim's lease by the configured lease duration from now, and returns
    /// the claim with its new expiry.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LeaseExpired`] once the lease has expired (complete or release
    /// instead), [`ErrorKind::StaleClaim`]; storage errors as for [`Journal::submit`].
    pub fn extend_lease(&self, claim: &Claim) -> Result<Claim> {
        let by = self.inner.cfg.lease;
        self.extend_lease_by(claim, by)
    }

    /// Extends the claim's lease to `by` from now.
    ///
    /// # Errors
    ///
    /// As [`Journal::extend_lease`], and [`ErrorKind::InvalidInput`] for a zero duration.
    pub fn extend_lease_by(&self, claim: &Claim, by: Duration) -> Result<Claim> {
        self.guard("extend_lease_by", || {
            if by.is_zero() {
                return Err(Error::invalid(
                    "lease extension",
                    "0s",
                    "it must be positive",
                ));
            }
            let claim = claim.clone();
            self.inner
                .write(move |ctx| engine::extend_lease(ctx, &claim, by))
        })
    }

    /// Records how an `InDoubt` operation ended, after the embedder looked at the real
    /// project state. Returns the receipt, or `None` for [`Resolution::NotApplied`] (the
    /// id is unknown again; the next submit is attempt + 1).
    ///
    /// A resolved applied revision moves the scope only if it is ahead of it.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::UnknownOperation`], [`ErrorKind::InvalidState`] (not in doubt),
    /// [`ErrorKind::ResultTooLarge`]; storage errors as for [`Journal::submit`].
    pub fn resolve(&self, operation_id: &str, resolution: Resolution) -> Result<Option<Receipt>> {
        self.guard("resolve", || {
            let id = operation_id.to_string();
            self.inner
                .write(move |ctx| engine::resolve(ctx, &id, &resolution))
        })
    }

    /// Records one delivery attempt of a terminal operation's result (first send or
    /// redelivery) and schedules the next push. Durable lazily: a crash can lose it,
    /// which only causes a recognizable redelivery.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::UnknownOperation`], [`ErrorKind::InvalidState`] (not terminal, or
    /// retired); storage errors as for [`Journal::submit`].
    pub fn delivered(&self, operation_id: &str) -> Result<Receipt> {
        self.guard("delivered", || {
            self.inner
                .lazy_write(operation_id, engine::LazyKind::Delivered)
        })
    }

    /// Records the client's acknowledgement. Idempotent; an acknowledgement after expiry
    /// is accepted and recorded as late. Durable lazily, like [`Journal::delivered`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::UnknownOperation`], [`ErrorKind::InvalidState`] (not terminal);
    /// storage errors as for [`Journal::submit`].
    pub fn acknowledge(&self, operation_id: &str) -> Result<Receipt> {
        self.guard("acknowledge", || {
            self.inner
                .lazy_write(operation_id, engine::LazyKind::Acknowledged)
        })
    }

    /// Reports a change of `scope` made outside the journal (a user editing by hand).
    /// Revisions only move forward; reporting the current revision again is a no-op.
    /// Returns the scope's revision.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::RevisionNotForward`] for an older revision, [`ErrorKind::InvalidInput`]
    /// for a bad scope; storage errors as for [`Journal::submit`].
    pub fn advance_revision(&self, scope: &str, revision: u64) -> Result<u64> {
        self.guard("advance_revision", || {
            let scope = scope.to_string();
            self.inner
                .write(move |ctx| engine::advance_revision(ctx, &scope, revision))
        })
    }

    /// Makes lazily committed acknowledgements and delivery counts durable now.
    ///
    /// # Errors
    ///
    /// Storage errors; [`ErrorKind::Poisoned`].
    pub fn flush(&self) -> Result<()> {
        self.guard("flush", || self.inner.flush())
    }

    /// The receipt of `operation_id` with every clock applied, or `None` if the id is
    /// unknown (never submitted, released, resolved as not applied, or purged).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn lookup(&self, operation_id: &str) -> Result<Option<Receipt>> {
        self.guard("lookup", || {
            let (snap, now) = self.inner.read_pending(Some(operation_id))?;
            snap.lookup(operation_id, now)
        })
    }

    /// The recorded result of a terminal, unretired operation.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn result(&self, operation_id: &str) -> Result<Option<OpResult>> {
        self.guard("result", || {
            let (snap, now) = self.inner.read_pending(Some(operation_id))?;
            match snap.effective(operation_id, now)? {
                Some(rec) => engine::result_of(&*snap.tables, &rec),
                None => Ok(None),
            }
        })
    }

    /// The operation's events, oldest first (all attempts still retained).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn history(&self, operation_id: &str) -> Result<Vec<Event>> {
        self.guard("history", || {
            // Pending deliveries and acknowledgements become events when committed.
            self.inner.flush()?;
            let (snap, _) = self.inner.read()?;
            let mut out = Vec::new();
            for seq in snap.tables.op_event_seqs(operation_id)? {
                if let Some(ev) = snap.tables.event(seq)? {
                    out.push(ev);
                }
            }
            Ok(out)
        })
    }

    /// What to push to `session` after a reconnect: its terminal results that are neither
    /// acknowledged nor expired, and whose retry budget is not spent, oldest first, each
    /// with its result. (An exhausted result is not pushed again; the client can still
    /// fetch it by asking about its id.)
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn undelivered(&self, session: &str) -> Result<Vec<Replay>> {
        self.guard("undelivered", || {
            let (snap, now) = self.inner.read_pending(None)?;
            let mut out = Vec::new();
            for (_, id) in snap.tables.window_after(session, now.0, usize::MAX)? {
                if let Some(rec) = snap.effective(&id, now)?
                    && let Some(replay) = engine::replay_of(&*snap.tables, &rec)?
                    && matches!(
                        replay.receipt.delivery,
                        Some(crate::DeliveryState::Pending | crate::DeliveryState::Delivered)
                    )
                {
                    out.push(replay);
                }
            }
            Ok(out)
        })
    }

    /// Results whose next push is due, earliest first, at most `limit`. Exhausted and
    /// expired deliveries are not returned. Record each push with [`Journal::delivered`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn due_redeliveries(&self, limit: usize) -> Result<Vec<Replay>> {
        self.guard("due_redeliveries", || {
            let (snap, now) = self.inner.read_pending(None)?;
            let mut out = Vec::new();
            // Entries past their ack deadline may still be indexed until compaction runs;
            // scan past them, but not unboundedly.
            let mut ids: Vec<String> = snap
                .tables
                .timers_due(TimerKind::Redeliver, now.0, limit.saturating_mul(4).max(64))?
                .into_iter()
                .map(|(_, id)| id)
                .collect();
            // A pending (not yet committed) delivery moves its next push, which the timer index
            // does not show until the delivery is committed.
            for e in &snap.pending {
                if !ids.contains(&e.id) {
                    ids.push(e.id.clone());
                }
            }
            for id in ids {
                if let Some(rec) = snap.effective(&id, now)?
                    && let Some(replay) = engine::replay_of(&*snap.tables, &rec)?
                    && matches!(
                        replay.receipt.delivery,
                        Some(crate::DeliveryState::Pending | crate::DeliveryState::Delivered)
                    )
                    && replay.receipt.next_delivery_at.is_some_and(|t| t <= now)
                {
                    out.push(replay);
                }
            }
            out.sort_by(|a, b| {
                let key = |r: &Replay| (r.receipt.next_delivery_at, r.receipt.operation_id.clone());
                key(a).cmp(&key(b))
            });
            out.truncate(limit);
            Ok(out)
        })
    }

    /// Operations in doubt (including `Running` ones whose lease has expired), oldest
    /// lease first. Each needs [`Journal::resolve`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn in_doubt(&self) -> Result<Vec<Receipt>> {
        self.guard("in_doubt", || {
            let (snap, now) = self.inner.read()?;
            let mut ids: Vec<String> = Vec::new();
            for (_, id) in snap
                .tables
                .timers_due(TimerKind::Lease, now.0, usize::MAX)?
            {
                ids.push(id);
            }
            for entry in redb::ReadableTable::iter(snap.tables.in_doubt_t()?)? {
                let (k, _) = entry?;
                ids.push(k.value().to_string());
            }
            let mut out = Vec::new();
            for id in ids {
                if let Some(r) = engine::lookup(&*snap.tables, &id, now)?
                    && r.status == crate::ExecutionStatus::InDoubt
                {
                    out.push(r);
                }
            }
            out.sort_by_key(|r| r.lease_until);
            Ok(out)
        })
    }

    /// The scope's current revision (0 if never recorded).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn scope_revision(&self, scope: &str) -> Result<u64> {
        self.guard("scope_revision", || {
            let (snap, _) = self.inner.read()?;
            snap.tables.scope_revision(scope)
        })
    }

    /// Fires every due timer now, in bounded batches (one write transaction each).
    ///
    /// # Errors
    ///
    /// Storage errors; [`ErrorKind::Poisoned`].
    pub fn compact(&self) -> Result<CompactionReport> {
        self.guard("compact", || crate::compact::run(&self.inner))
    }

    /// Shrinks the file: the storage engine moves live pages down and truncates the free
    /// space that purges left behind (redb's `Database::compact`, run until it has nothing
    /// more to do). [`Journal::compact`] fires timers but never shrinks the file. Returns the
    /// file size in bytes before and after (0 for a custom backend).
    ///
    /// It needs the handle to itself (`&mut self`, and no running background compactor),
    /// and with [`Sharing::LiveReaders`] no read transaction open in another process (such
    /// as `opjournal ls`): retry when the reader is done. It is slow on a large file and
    /// makes lazily committed acknowledgements durable first.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`] while a background compactor shares the handle;
    /// [`ErrorKind::Storage`] when a read transaction is in progress; [`ErrorKind::Poisoned`];
    /// [`ErrorKind::Io`].
    ///
    /// # Example
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let mut journal = opjournal::Journal::open(dir.path().join("project.opj"))?;
    /// journal.compact()?;
    /// let (before, after) = journal.reclaim_space()?;
    /// assert!(after <= before);
    /// # Ok::<(), opjournal::Error>(())
    /// ```
    pub fn reclaim_space(&mut self) -> Result<(u64, u64)> {
        self.flush()?;
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        let before = size(&self.inner.path);
        let path = self.inner.path.display().to_string();
        let inner = Arc::get_mut(&mut self.inner).ok_or_else(|| {
            Error::invalid(
                "journal handle",
                &path,
                "a background compactor shares it; stop the compactor before reclaiming space",
            )
        })?;
        inner.check_writable()?;
        // redb compaction needs no live read transaction: forget the cached snapshot.
        inner.drop_snapshot();
        let db = inner
            .db
            .as_mut()
            .ok_or_else(|| Error::new(ErrorKind::Closed))?;
        while db.compact()? {}
        Ok((before, size(&inner.path)))
    }

    /// Starts a background thread that runs [`Journal::compact`] (and makes lazy writes
    /// durable) every `interval`. Dropping the handle stops and joins it.
    pub fn spawn_compactor(&self, interval: Duration) -> CompactorHandle {
        CompactorHandle::spawn(
            Arc::downgrade(&self.inner),
            self.inner.gate.clone(),
            interval,
        )
    }

    /// Counts by status and delivery state, and file facts.
    ///
    /// Reads every receipt: its cost grows with the journal.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn stats(&self) -> Result<crate::Stats> {
        self.guard("stats", || {
            // Counts come from committed receipts: commit pending acknowledgements first.
            self.inner.flush()?;
            let (snap, now) = self.inner.read()?;
            let mut stats = crate::stats::collect(&*snap.tables, now)?;
            stats.file_bytes = std::fs::metadata(&self.inner.path)
                .map(|m| m.len())
                .unwrap_or(0);
            Ok(stats)
        })
    }

    /// Whether an earlier commit failed and this handle refuses writes.
    pub fn is_poisoned(&self) -> bool {
        self.inner.poisoned.load(Ordering::SeqCst)
    }

    /// The number of events in the journal table.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Io`].
    pub fn event_count(&self) -> Result<u64> {
        self.guard("event_count", || {
            let (snap, _) = self.inner.read()?;
            Ok(snap.tables.events_t()?.len()?)
        })
    }
}
