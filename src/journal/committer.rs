//! The group committer: callers enqueue jobs; one leader runs them in one batch, appends
//! it to the log and syncs once; and, when the log has grown enough, checkpoints.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::error::{Error, ErrorKind, Result};
use crate::machine::{self, Ctx};
use redb::ReadableDatabase;

use crate::codec::{self, RecordKind};
use crate::index::{self, Base, Memtable, View, WriteTables};
use crate::record::CheckpointRecord;

use super::Inner;
use super::reads::{LazyEntry, read_lock, write_lock};

// ---------------------------------------------------------------------------------------
// Group commit.
//
// Callers enqueue jobs. Whoever finds no leader becomes the leader: it takes every queued
// job, runs them in one write transaction, commits once (one sync), and hands each caller
// its own answer. Jobs queued meanwhile form the next batch. A lone caller leads its own
// batch at once, so it waits for nothing but its own commit.
//
// Wake-ups are targeted: a caller sleeps on its own slot, the leader wakes each caller of
// its batch as it hands over the answer, and a leader giving up its role wakes one queued
// caller to lead the next batch. (One condition variable for all, notified for every
// batch, woke every waiting thread twice per batch: with 64 callers, most of the leader's
// time went to waking threads that went back to sleep.)
// ---------------------------------------------------------------------------------------

pub(crate) struct Committer {
    queue: Mutex<Queue>,
    /// Where [`Inner::exclusive`] callers wait for the leader's role.
    cv: Condvar,
}

/// Gives up the leader's role (also when the leader's work unwinds) and wakes the next
/// leader: the first queued caller, and any caller waiting for the role to itself.
struct LeaderGuard<'a> {
    committer: &'a Committer,
}

impl Drop for LeaderGuard<'_> {
    fn drop(&mut self) {
        let mut q = lock(&self.committer.queue);
        q.leader = false;
        if let Some(job) = q.jobs.first() {
            job.wake();
        }
        if q.exclusive_waiting > 0 {
            self.committer.cv.notify_all();
        }
    }
}

#[derive(Default)]
struct Queue {
    jobs: Vec<Box<dyn Job>>,
    leader: bool,
    /// Callers of [`Inner::exclusive`] waiting for the role.
    exclusive_waiting: usize,
}

/// A queued call. `run` may be called more than once (a batch is retried without a job
/// that hit a corrupt record), so jobs keep their inputs.
pub(super) trait Job: Send {
    /// Compaction: batched alone, so foreground calls never wait behind its work.
    fn background(&self) -> bool;
    fn run(&mut self, ctx: &mut Ctx<'_, '_>) -> std::result::Result<(), RunFailure>;
    fn finish(&mut self, commit: std::result::Result<(), &Error>);
    fn fail(&mut self, err: Error);
    /// Wakes the job's caller to take the leader's role if it is free.
    fn wake(&self);
    /// Whether the batch should not wait for a writer lock another process holds (a
    /// background compaction pass leaves the work to that process or its next pass).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn skip_if_locked(&self) -> bool {
        false
    }
    /// The batch did not run: another process held the writer lock.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn skip(&mut self) {
        self.fail(skipped());
    }
}

/// What a batch that yielded the writer lock to another process answers (see
/// [`Job::skip_if_locked`]).
pub(super) const SKIPPED: &str = "another process holds the journal's writer lock";

#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn skipped() -> Error {
    Error::new(ErrorKind::Unavailable {
        detail: SKIPPED.to_string(),
        outcome_unknown: false,
    })
}

/// Whether `e` says a batch yielded the writer lock to another process.
pub(super) fn is_skipped(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Unavailable { detail, .. } if detail == SKIPPED)
}

/// Why a job aborted its batch.
pub(super) enum RunFailure {
    /// A corrupt record: only this job fails; the batch is retried without it.
    Isolated,
    /// Storage failure: the whole batch fails and the handle is poisoned.
    Fatal(Error),
}

/// Where a caller waits: for its answer, or for a wake-up to lead the next batch.
struct SlotState<T> {
    answer: Option<Result<T>>,
    woken: bool,
    /// The caller sleeps on the condition variable. A leader answering its own job (the
    /// only caller at one thread, and every leader's own job) finds it awake and makes no
    /// `futex` call: the standard condition variable makes one per notification.
    asleep: bool,
}

struct SlotInner<T> {
    state: Mutex<SlotState<T>>,
    cv: Condvar,
}

type Slot<T> = Arc<SlotInner<T>>;

impl<T> SlotInner<T> {
    fn new() -> Self {
        SlotInner {
            state: Mutex::new(SlotState {
                answer: None,
                woken: false,
                asleep: false,
            }),
            cv: Condvar::new(),
        }
    }

    fn answer(&self, out: Result<T>) {
        let asleep = {
            let mut st = lock(&self.state);
            st.answer = Some(out);
            // Read under the lock the sleeper holds until it sleeps: no wake-up is lost.
            st.asleep
        };
        // Notified after the lock is released, so that the woken caller does not wait
        // for it.
        if asleep {
            self.cv.notify_one();
        }
    }

    fn wake(&self) {
        let asleep = {
            let mut st = lock(&self.state);
            st.woken = true;
            st.asleep
        };
        if asleep {
            self.cv.notify_one();
        }
    }

    fn take(&self) -> Option<Result<T>> {
        lock(&self.state).answer.take()
    }

    /// Sleeps until the answer is in or the caller was woken (the wake-up is consumed).
    /// A wake-up given before the wait is not lost: it is a flag, not a notification.
    fn wait(&self) {
        let mut st = lock(&self.state);
        while st.answer.is_none() && !st.woken {
            st.asleep = true;
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            st.asleep = false;
        }
        st.woken = false;
    }
}

struct TypedJob<T, F> {
    background: bool,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    yield_if_locked: bool,
    f: F,
    result: Option<Result<T>>,
    slot: Slot<T>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves consistent data (plain fields), so the
    // poison flag is ignored rather than propagated as a second panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh copy of an error for every caller of a failed batch.
fn copy_error(e: &Error) -> Error {
    e.copied()
}

impl<T, F> Job for TypedJob<T, F>
where
    T: Send + 'static,
    F: FnMut(&mut Ctx<'_, '_>) -> Result<T> + Send,
{
    fn background(&self) -> bool {
        self.background
    }

    fn skip_if_locked(&self) -> bool {
        self.yield_if_locked
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
        self.slot.answer(out);
    }

    fn fail(&mut self, err: Error) {
        let out = match self.result.take() {
            Some(Err(own)) => Err(own),
            _ => Err(err),
        };
        self.slot.answer(out);
    }

    fn wake(&self) {
        self.slot.wake();
    }
}

impl Committer {
    pub(crate) fn new() -> Self {
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

/// How much of the log a checkpoint due at `limit` bytes of it lets pass: a little less
/// than the power of two that holds `limit`. The log's file grows to the next power of two
/// when a record passes its end (a length `verify` checks), and a checkpoint is seen to be
/// due only after the batch that reaches it; without the margin every log file would be
/// twice the size it needs (32 MiB for the default 16 MiB checkpoints, 64 MiB under load).
/// A batch larger than the margin (a sixteenth of `limit`) still grows the file.
fn log_limit(limit: u64) -> u64 {
    let fits = limit
        .checked_next_power_of_two()
        .unwrap_or(u64::MAX)
        .saturating_sub(crate::log::START + limit / 16);
    limit.min(fits)
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
    }
}

impl Inner {
    /// Runs `f` in a (possibly shared) batch and returns once its change is logged and
    /// synced.
    pub(crate) fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Ctx<'_, '_>) -> Result<T> + Send + 'static,
    {
        self.enqueue(false, false, f)
    }

    /// Runs a compaction batch `f` in a batch of its own: foreground calls are never
    /// batched with it, so they wait behind at most one such batch.
    pub(crate) fn write_background<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Ctx<'_, '_>) -> Result<T> + Send + 'static,
    {
        self.enqueue(true, false, f)
    }

    /// As [`Inner::write_background`], but a journal shared with other processes does not
    /// wait for a writer lock another process holds: the batch then fails with an error
    /// [`is_skipped`] recognizes, and the background compactor leaves the work to the next
    /// pass (or to the process that holds the lock).
    pub(crate) fn write_background_yielding<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Ctx<'_, '_>) -> Result<T> + Send + 'static,
    {
        self.enqueue(true, true, f)
    }

    fn enqueue<T, F>(&self, background: bool, yield_if_locked: bool, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Ctx<'_, '_>) -> Result<T> + Send + 'static,
    {
        self.check_writable()?;
        let slot: Slot<T> = Arc::new(SlotInner::new());
        let job = TypedJob {
            background,
            yield_if_locked,
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
            if let Some(r) = slot.take() {
                return r;
            }
            if !q.leader && !q.jobs.is_empty() {
                q.leader = true;
                let jobs = next_batch(&mut q.jobs, &self.foreground_waiting);
                drop(q);
                let leader = LeaderGuard { committer: c };
                self.execute(BatchGuard { jobs, inner: self });
                // The batch's callers were woken with their answers; a checkpoint, if due,
                // runs while the next batch's callers wait (they queue behind the leader).
                // It waits for a moment when no call is queued, unless the log has grown
                // to twice the checkpoint size: a burst of calls is not held up by it.
                let quiet = self.foreground_waiting.load(Ordering::SeqCst) == 0;
                match self.due(if quiet { 1 } else { 2 }) {
                    // An error poisons the handle: later calls say so. This batch is durable
                    // in the log either way.
                    Due::Checkpoint => {
                        let _ = self.checkpoint_as(Checkpoint::Switch);
                    }
                    // An error poisons the handle: later calls say so.
                    Due::ReadyTwoLogs => {
                        let _ = self.ready_two_logs();
                    }
                    Due::Nothing => {}
                }
                drop(leader);
                q = lock(&c.queue);
                continue;
            }
            // A leader is at work: it answers this job, or wakes this caller to lead
            // when it gives up the role with this job still queued.
            drop(q);
            slot.wait();
            q = lock(&c.queue);
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
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.pg() {
            return self.try_batch_pg(pg, jobs);
        }
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
        // Pending deliveries and acknowledges ride along, first, so this batch's checks
        // (the session window, the hold-until-ack lock) see them.
        let pending: Vec<LazyEntry> = read_lock(&self.lazy).entries.clone();
        let committed = read_lock(&self.committed);
        let mut t = WriteTables::over(committed.base.as_ref(), committed.layers());
        let run = self.run_jobs(&mut t, now, &pending, jobs);
        let changes = t.into_changes();
        drop(committed);
        match run {
            Ok(true) => {}
            Ok(false) => {
                self.lazy_committed(pending.len());
                for mut job in jobs.drain(..) {
                    job.finish(Ok(()));
                }
                return BatchOutcome::Done;
            }
            Err((isolated, e)) => {
                return match isolated {
                    Some(i) => BatchOutcome::Retry(i),
                    None => fail_all(jobs, e, true),
                };
            }
        }
        // The commit point: the batch is durable once its log record is synced (in memory,
        // once it is published below). Timings are read by the `tracing` feature's events only.
        let _started = std::time::Instant::now();
        let logged = match self.storage {
            super::Storage::Memory => Ok(0),
            _ => {
                let mut log = lock(&self.log);
                match log.as_mut() {
                    Some(log) => log
                        .append(crate::log::KIND_BATCH, &changes.encode())
                        .map_err(|e| Error::io_during("write or sync the journal's log", e)),
                    None => Err(Error::new(ErrorKind::Closed)),
                }
            }
        };
        match logged {
            Ok(_bytes) => {
                crate::trace_event!(
                    DEBUG,
                    batch = jobs.len(),
                    bytes = _bytes,
                    sync_us = _started.elapsed().as_micros() as u64,
                    "group commit"
                );
                // Published before the pending entries leave the buffer and before any
                // caller returns: a read after `Ok` sees the change.
                {
                    let mut committed = write_lock(&self.committed);
                    let changed = <index::Receipts as index::Table>::map(&changes);
                    if !changed.is_empty() {
                        let mut cache = lock(&self.cache);
                        for id in changed.keys() {
                            cache.remove(id);
                        }
                    }
                    let super::reads::Committed { base, mem, frozen } = &mut *committed;
                    // Unshared here (a checkpoint's job holds it only while the leader
                    // waits for it), so this changes it in place.
                    Arc::make_mut(mem).absorb_over(changes, base.as_ref(), frozen.as_deref());
                }
                self.persisted_high_water.fetch_max(now.0, Ordering::SeqCst);
                self.lazy_committed(pending.len());
                for mut job in jobs.drain(..) {
                    job.finish(Ok(()));
                }
                BatchOutcome::Done
            }
            // Never write again on this handle after an I/O error (the fsyncgate lesson:
            // a failed sync may have dropped the data it was to make durable): poison it;
            // reopening recovers the last durable state from the log.
            Err(e) => fail_all(jobs, e, true),
        }
    }

    /// Runs the batch's jobs in `t` at `now`, after the pending lazy writes: whether
    /// anything changed (the state record is then written too), or the index of a job that
    /// hit a corrupt record (it fails alone) or an error that fails the batch.
    pub(super) fn run_jobs(
        &self,
        t: &mut WriteTables<'_>,
        now: crate::clock::Timestamp,
        pending: &[LazyEntry],
        jobs: &mut Vec<Box<dyn Job>>,
    ) -> std::result::Result<bool, (Option<usize>, Error)> {
        let mut state = t.state().map_err(|e| (None, e))?;
        // Time never runs backwards: not below the last committed batch's (another
        // process's, for a journal in a database server).
        let now = now.max(state.clock_high_water);
        // No event in the journal is later than the last committed batch's time.
        let mut floor = state.clock_high_water;
        state.clock_high_water = state.clock_high_water.max(now);
        let mut ctx = Ctx {
            t,
            now,
            cfg: &self.cfg,
            state: &mut state,
            fired: Default::default(),
        };
        for entry in pending {
            // Recorded as of the call that made it (what its caller was told), kept in
            // order after the events already in the journal.
            let at = entry.at.max(floor).min(now);
            floor = at;
            machine::record_lazy(&mut ctx, &entry.id, &entry.kind, at).map_err(|e| (None, e))?;
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
            // its batch and share its commit instead of waiting for it.
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
        if !t.dirty {
            // Nothing changed (refusals, answers, no-ops): no commit, no sync.
            return Ok(false);
        }
        t.put_state(&state).map_err(|e| (None, e))?;
        Ok(true)
    }

    /// What the log's and the memtable's growth calls for after a batch: a checkpoint once
    /// either has outgrown `factor` times the checkpoint size. Read once per batch (the
    /// log's lock and the memtables' read lock, each taken once).
    fn due(&self, factor: u64) -> Due {
        if !matches!(self.storage, super::Storage::File) {
            return Due::Nothing;
        }
        let size = self.cfg.checkpoint_bytes;
        let (used, can_switch, unreadied) =
            lock(&self.log).as_ref().map_or((0, false, false), |l| {
                (
                    l.used(),
                    l.can_switch() && l.spare_marked(),
                    l.spare_unreadied(),
                )
            });
        if unreadied && used >= size / 2 {
            return Due::ReadyTwoLogs;
        }
        let committed = read_lock(&self.committed);
        // A checkpoint that switches log files costs the leader microseconds: it is due at
        // the checkpoint size whether or not calls are queued. One that must wait (for the
        // one in flight, or for redb's commit) waits for a quiet moment, up to `factor`.
        let factor = if can_switch && committed.frozen.is_none() {
            1
        } else {
            factor
        };
        if used >= size && committed.frozen.is_some() {
            // The next checkpoint is due and the one before still commits: it must not
            // pause any more (see `pacing`).
            self.checkpointer.pace().hurry();
        }
        let limit = size.saturating_mul(factor);
        if used >= log_limit(limit) || committed.mem.bytes() as u64 >= limit {
            return Due::Checkpoint;
        }
        Due::Nothing
    }

    /// Writes the memtable into redb in one transaction (durable, two-phase), then starts
    /// the log's next cycle and empties the memtable: on return, redb holds every change
    /// committed before the call. Called by the leader only (or under
    /// [`Inner::exclusive`]). On error the handle is poisoned: the log still holds
    /// everything, and reopening replays it.
    pub(crate) fn checkpoint(&self) -> Result<()> {
        self.checkpoint_as(Checkpoint::Durable)
    }

    /// A checkpoint that commits beside the log where it can (see
    /// [`Inner::switch_checkpoint`]): for work that wants redb to catch up without holding
    /// the calls (the removal of a compaction pass's deferred purges). It waits first,
    /// outside the committer, for a checkpoint still committing, so that the leader does not
    /// wait for it with calls queued behind; where the log cannot switch files (one log
    /// storage, an empty cycle), it commits in the callers' path as
    /// [`Inner::checkpoint`] does. On return every change is durable (in the log, or in
    /// redb); an error poisons the handle.
    pub(crate) fn checkpoint_beside(&self) -> Result<()> {
        self.checkpointer.wait_idle();
        self.exclusive(|| self.checkpoint_as(Checkpoint::Switch))
    }

    fn checkpoint_as(&self, kind: Checkpoint) -> Result<()> {
        self.check_writable()?;
        if !matches!(self.storage, super::Storage::File) {
            // Only a file journal has a log to write into its index.
            return Ok(());
        }
        let r = self.checkpoint_inner(kind);
        if r.is_err() {
            self.poisoned.store(true, Ordering::SeqCst);
        }
        r
    }

    fn checkpoint_inner(&self, kind: Checkpoint) -> Result<()> {
        let _started = std::time::Instant::now();
        let mut log_guard = lock(&self.log);
        let log = log_guard
            .as_mut()
            .ok_or_else(|| Error::new(ErrorKind::Closed))?;
        if matches!(kind, Checkpoint::Switch) && log.used() > 0 && log.spare_marked() {
            let can = |log: &crate::log::Writer| {
                log.can_switch() && read_lock(&self.committed).frozen.is_none()
            };
            if !can(log) {
                // The checkpoint before is still committing, or zeroing the other file:
                // wait for it (the log has outgrown twice the checkpoint size meanwhile).
                self.checkpointer.wait_idle();
                self.check_writable()?;
            }
            if can(log) {
                return self.switch_checkpoint(log);
            }
        }
        // A checkpoint in flight commits first (jobs run in order on the thread): this
        // one then writes only what came after it, and no job holds redb on return.
        self.checkpointer.wait_idle();
        self.check_writable()?;
        let cursor = log.cursor();
        let closing = matches!(kind, Checkpoint::Close);
        // The file says format 5 while a second log file may hold records that an older
        // build would not read; a clean close leaves one file any build of format 3 reads.
        let two_logs = log.has_spare() && !closing;
        if log.used() == 0
            && read_lock(&self.committed).is_empty()
            && !self.purges_deferred()?
            && log.spare_marked() == two_logs
        {
            return Ok(());
        }
        let next = CheckpointRecord {
            journal_id: cursor.journal_id,
            generation: cursor.generation + 1,
            next_lsn: log.next_lsn(),
        };
        // The redb transaction runs on the journal's checkpoint thread (see
        // `checkpointer`), with the memtable as it is now: no batch commits while the leader
        // holds the log. The job owns its `Arc`s and drops them before answering.
        let db = self.db_shared()?;
        let mem = Arc::clone(&read_lock(&self.committed).mem);
        let quick_repair = self.cfg.quick_repair;
        let defer = self.compacting.load(Ordering::SeqCst) > 0;
        let record = codec::encode(RecordKind::Meta, &next);
        let marked = Arc::new(AtomicBool::new(false));
        let says_two_logs = Arc::clone(&marked);
        self.checkpointer.run(move || {
            let mut txn = db.begin_write()?;
            // Quick repair: the allocator state is saved with the commit, so that
            // reopening after a crash, and read-only opens of a crashed file, need no full
            // scan.
            txn.set_quick_repair(quick_repair);
            index::checkpoint(&txn, &mem, defer)?;
            {
                let mut meta = txn.open_table(<index::Meta as index::Table>::def())?;
                meta.insert("checkpoint", record.as_slice())?;
            }
            says_two_logs.store(
                index::mark_two_logs(&txn, two_logs)?.two_logs,
                Ordering::SeqCst,
            );
            txn.commit()?;
            Ok(())
        })?;
        crate::trace_event!(
            DEBUG,
            log_bytes = log.used(),
            generation = next.generation,
            elapsed_us = _started.elapsed().as_micros() as u64,
            "checkpoint"
        );
        log.restart(next.generation);
        log.spare_committed();
        log.set_spare_marked(marked.load(Ordering::SeqCst));
        let base = Base::new(self.db()?.begin_read()?);
        let written = {
            let mut committed = write_lock(&self.committed);
            committed.base = Some(base);
            std::mem::replace(&mut committed.mem, Arc::new(Memtable::default()))
        };
        // Freed after the lock: after a compaction's batches they hold hundreds of
        // thousands of keys, and readers on other threads wait for the lock, not for this.
        drop(written);
        if !closing {
            self.prepare_spare(log);
        }
        Ok(())
    }

    /// Waits, without taking the committer, while a checkpoint commits beside the log and
    /// the log has grown to the checkpoint size again (the next checkpoint would have to
    /// wait for it): for background work (a compaction pass), which fills the log faster
    /// than the checkpoint thread commits it, so that the wait is the pass's and not that
    /// of the foreground calls queued behind a leader.
    pub(super) fn wait_for_checkpoint_room(&self) {
        let full = lock(&self.log)
            .as_ref()
            .is_some_and(|l| l.used() >= self.cfg.checkpoint_bytes);
        if full && read_lock(&self.committed).frozen.is_some() {
            self.checkpointer.wait_idle();
        }
    }

    /// Readies a writer's second log file once, when the log is half way to the handle's
    /// first checkpoint, on the checkpoint thread: the file's format record says 5 (a
    /// commit of that alone, unless it says so already, as after a crash), and the second
    /// file is zeroed. The first checkpoint then commits beside the log as the others do.
    /// A session too short to checkpoint never writes either. Without background
    /// checkpoints the call waits for it. An error poisons the handle.
    pub(super) fn ready_two_logs(&self) -> Result<()> {
        let mut guard = lock(&self.log);
        let Some(log) = guard.as_mut() else {
            return Ok(());
        };
        let Some(mark) = log.spare_mark() else {
            return Ok(());
        };
        let db = self.db_shared()?;
        let quick_repair = self.cfg.quick_repair;
        let poisoned = Arc::clone(&self.poisoned);
        let work = move || {
            let done = crate::preflight::guarded("marking the journal as keeping two logs", || {
                let mut txn = db.begin_write()?;
                txn.set_quick_repair(quick_repair);
                let marked = index::mark_two_logs(&txn, true)?;
                if marked.changed {
                    txn.commit()?;
                } else {
                    txn.abort()?;
                }
                mark.store(marked.two_logs, Ordering::SeqCst);
                Ok(())
            });
            if done.is_err() {
                poisoned.store(true, Ordering::SeqCst);
            }
            done
        };
        if self.cfg.background_checkpoints {
            self.checkpointer.start(work);
        } else if let Err(e) = self.checkpointer.run(work) {
            self.poisoned.store(true, Ordering::SeqCst);
            return Err(e);
        }
        self.prepare_spare(log);
        Ok(())
    }

    /// Hands the second log file to the checkpoint thread to be zeroed, if it needs it and
    /// nobody has it yet (found dirty at open, or freed by a checkpoint). A failure poisons
    /// the handle, as a failed checkpoint does.
    pub(super) fn prepare_spare(&self, log: &mut crate::log::Writer) {
        let Some(job) = log.spare_to_prepare() else {
            return;
        };
        let poisoned = Arc::clone(&self.poisoned);
        let work = move || {
            let r = job
                .prepare()
                .map_err(|e| Error::io_during("zero the journal's second log file", e));
            if r.is_err() {
                poisoned.store(true, Ordering::SeqCst);
            }
            r
        };
        if self.cfg.background_checkpoints {
            self.checkpointer.start(work);
        } else {
            // An error has poisoned the handle.
            let _ = self.checkpointer.run(work);
        }
    }

    /// A checkpoint off the callers' path: the next cycle starts in the second log file
    /// (zeroed since its last cycle), the memtable is frozen (reads go on through it, and
    /// new commits go into a new memtable over it), and the checkpoint thread writes it into
    /// redb and commits, while calls go on logging into the new cycle. Then the thread
    /// publishes the new redb snapshot with the frozen memtable dropped (in one step, so a
    /// read never misses a change), and zeroes the old cycle's file for the checkpoint after
    /// next. A crash before the commit leaves both cycles in the logs: recovery reads the
    /// cycle redb names and follows into the other file. A failure poisons the handle
    /// (redb refuses writes after an I/O error; the next open replays both logs). Without
    /// background checkpoints (the builder's choice) the leader waits for the thread, so
    /// its writes happen at a point the calls determine. Called by the leader only, with
    /// the log held.
    fn switch_checkpoint(&self, log: &mut crate::log::Writer) -> Result<()> {
        let db = self.db_shared()?;
        let cursor = log.cursor();
        let next = CheckpointRecord {
            journal_id: cursor.journal_id,
            generation: cursor
                .generation
                .checked_add(1)
                .ok_or_else(|| Error::corrupt("meta", "checkpoint", "the last generation"))?,
            next_lsn: log.next_lsn(),
        };
        // Nothing changes if the switch fails; no batch commits while the leader holds the
        // log, so the memtable frozen below holds exactly the ended cycle's changes.
        let ended = log
            .switch(next.generation)
            .map_err(|e| Error::io_during("start the log's next cycle", e))?;
        let frozen = {
            let mut committed = write_lock(&self.committed);
            let frozen = std::mem::take(&mut committed.mem);
            committed.frozen = Some(Arc::clone(&frozen));
            frozen
        };
        let committed = Arc::clone(&self.committed);
        let quick_repair = self.cfg.quick_repair;
        let defer = self.compacting.load(Ordering::SeqCst) > 0;
        let record = codec::encode(RecordKind::Meta, &next);
        let poisoned = Arc::clone(&self.poisoned);
        // Beside the calls, the commit's writes are paced (see `pacing`). Not where a
        // leader waits for it, nor during a compaction pass, whose batches fill the log
        // faster than a paced commit ends (the calls then waited behind the pass's leader
        // for the commit: the calls' p99 beside a pass tripled when they were paced).
        let pace = (self.cfg.background_checkpoints && !defer)
            .then(|| Arc::clone(self.checkpointer.pace()));
        let work = move || {
            // A panic (redb's, on damaged data) is an error here: nobody else may see it.
            let done = crate::preflight::guarded("a checkpoint", || {
                let paced = pace.as_ref().map(|p| p.begin());
                let mut txn = db.begin_write()?;
                txn.set_quick_repair(quick_repair);
                index::checkpoint(&txn, &frozen, defer)?;
                {
                    let mut meta = txn.open_table(<index::Meta as index::Table>::def())?;
                    meta.insert("checkpoint", record.as_slice())?;
                }
                // The file says format 5 already: a switch waits for that mark, and
                // deferred purges leave it as it is (`Purged::write_in`).
                txn.commit()?;
                drop(paced);
                let base = Base::new(db.begin_read()?);
                let unfrozen = {
                    let mut committed = write_lock(&committed);
                    committed.base = Some(base);
                    committed.frozen.take()
                };
                // Freed outside the lock (see `checkpoint_inner`).
                drop(unfrozen);
                drop(frozen);
                ended
                    .prepare()
                    .map_err(|e| Error::io_during("zero the journal's previous log file", e))
            });
            if done.is_err() {
                poisoned.store(true, Ordering::SeqCst);
            }
            done
        };
        crate::trace_event!(
            DEBUG,
            generation = next.generation,
            "checkpoint started beside the next cycle"
        );
        if self.cfg.background_checkpoints {
            self.checkpointer.start(work);
            Ok(())
        } else {
            self.checkpointer.run(work)
        }
    }

    /// Closes cleanly: commits the pending deliveries and acknowledgements and the clock,
    /// checkpoints everything into redb and removes the log, so that the journal is one
    /// file again. Later writes fail with [`ErrorKind::Closed`]. A poisoned handle closes
    /// without writing: the log stays for the next open to read back.
    pub(crate) fn close(&self) -> Result<()> {
        self.flush()?;
        self.persist_clock()?;
        self.exclusive(|| {
            self.checkpoint_as(Checkpoint::Close).map_err(|e| {
                e.while_doing(
                    "write the log's records into the journal file at close",
                    "everything committed is durable in the log, which stays for the next open \
                     to read back",
                )
            })?;
            if let Some(log) = lock(&self.log).take() {
                log.discard()
                    .map_err(|e| Error::io_during("remove the journal's log", e))?;
            }
            Ok(())
        })
    }

    /// Whether the committed base holds deferred purges (see `index::purged`) that a
    /// checkpoint outside a compaction pass removes.
    pub(crate) fn purges_deferred(&self) -> Result<bool> {
        let committed = read_lock(&self.committed);
        match committed.base.as_ref() {
            Some(base) => Ok(base.purged()?.is_some()),
            None => Ok(false),
        }
    }

    /// Runs `f` as the leader, with no batch in progress: for work that needs the log and
    /// the state to itself (a checkpoint, closing).
    pub(crate) fn exclusive<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let c = &self.committer;
        let mut q = lock(&c.queue);
        while q.leader {
            q.exclusive_waiting += 1;
            q = c.cv.wait(q).unwrap_or_else(|e| e.into_inner());
            q.exclusive_waiting -= 1;
        }
        q.leader = true;
        drop(q);
        let _release = LeaderGuard { committer: c };
        f()
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
    pub(super) fn lazy_committed(&self, n: usize) {
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
}

/// What a batch's growth calls for ([`Inner::due`]).
enum Due {
    Checkpoint,
    /// The log is half way to its first checkpoint: ready the second log file
    /// ([`Inner::ready_two_logs`]) so that the checkpoint can start the next cycle there.
    ReadyTwoLogs,
    Nothing,
}

/// What a checkpoint must achieve.
#[derive(Clone, Copy)]
enum Checkpoint {
    /// The leader's, when the log is full (or [`Inner::checkpoint_beside`]'s): it may
    /// switch log files and leave the commit to the checkpoint thread.
    Switch,
    /// Everything committed so far is in redb on return.
    Durable,
    /// As `Durable`, at a clean close: the file is left readable without its logs.
    Close,
}

pub(super) enum BatchOutcome {
    Done,
    Retry(usize),
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use redb::ReadableDatabase;

    use crate::index::{Receipts, Table};
    use crate::{Admission, Intent, Journal, Operation, Outcome, ScopeLock};

    fn intent() -> Intent {
        Intent::from_json("edit", &serde_json::json!({"kind": "add"}))
            .unwrap_or_else(|e| panic!("a valid intent: {e}"))
    }

    /// Whether the caller of `slot` sleeps on its condition variable now.
    fn asleep<T>(slot: &super::SlotInner<T>) -> bool {
        super::lock(&slot.state).asleep
    }

    /// Waits on `slot` on another thread; the receiver gets a message when the wait ends.
    fn waiter(slot: &super::Slot<u32>) -> std::sync::mpsc::Receiver<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        let slot = std::sync::Arc::clone(slot);
        std::thread::spawn(move || {
            slot.wait();
            let _ = tx.send(());
        });
        rx
    }

    fn until_asleep<T>(slot: &super::SlotInner<T>) {
        let start = Instant::now();
        while !asleep(slot) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the waiter went to sleep"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_slot_wakes_a_sleeping_caller_and_an_answer_given_before_the_wait_is_not_lost() {
        // Answered while the caller sleeps: the notification wakes it.
        let slot = std::sync::Arc::new(super::SlotInner::<u32>::new());
        let done = waiter(&slot);
        until_asleep(&slot);
        slot.answer(Ok(7));
        done.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("the sleeping caller woke for its answer: {e}"));
        assert_eq!(slot.take().map(|r| r.ok()), Some(Some(7)));
        assert!(!asleep(&slot), "the caller is awake again");

        // Woken to lead while it sleeps.
        let done = waiter(&slot);
        until_asleep(&slot);
        slot.wake();
        done.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("the sleeping caller woke to lead: {e}"));

        // Answered, or woken, while nobody sleeps (no notification is made): the next wait
        // returns at once.
        slot.answer(Ok(8));
        waiter(&slot)
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("an answer given before the wait ends it: {e}"));
        assert_eq!(slot.take().map(|r| r.ok()), Some(Some(8)));
        slot.wake();
        waiter(&slot)
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("a wake-up given before the wait ends it: {e}"));
        assert!(!super::lock(&slot.state).woken, "the wake-up was consumed");
    }

    /// Runs one operation in `scope` to its applied outcome at `revision`.
    fn run(journal: &Journal, id: &str, scope: &str, revision: u64) {
        let op = Operation::new(id, intent()).scope(scope).session("s");
        match journal.submit(op) {
            Ok(Admission::Fresh(claim)) => {
                journal
                    .complete(&claim, Outcome::applied(revision, vec![7u8; 200]))
                    .unwrap_or_else(|e| panic!("{id} completes: {e}"));
            }
            other => panic!("{id} is fresh, not {other:?}"),
        }
    }

    /// Runs `id` to applied in a scope and session of its own (`s{n}`): a session's window
    /// holds 64 unacknowledged results.
    fn run_alone(journal: &Journal, id: &str, n: u64) {
        let op = Operation::new(id, intent())
            .scope(format!("s{n}"))
            .session(format!("s{n}"));
        match journal.submit(op) {
            Ok(Admission::Fresh(claim)) => {
                journal
                    .complete(&claim, Outcome::applied(1, vec![7u8; 200]))
                    .unwrap_or_else(|e| panic!("{id} completes: {e}"));
            }
            other => panic!("{id} is fresh, not {other:?}"),
        }
    }

    /// A builder for journals whose operations expire within hours of `clock`'s time
    /// (acknowledgement 10 min, result 1 h, audit 2 h), with 64 KiB checkpoints.
    fn expiring(clock: &crate::ManualClock) -> crate::JournalBuilder {
        Journal::builder()
            .checkpoint_size(64 * 1024)
            .clock(clock.clone())
            .ack_timeout(Duration::from_secs(600))
            .result_retention(Duration::from_secs(3600))
            .audit_retention(Duration::from_secs(7200))
    }

    /// The `i`-th id, in no order, as agents' are: the events of a pass's operations are
    /// anywhere in the file.
    fn scattered_id(i: u64) -> String {
        format!("op-{:016x}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    fn frozen(journal: &Journal) -> bool {
        super::read_lock(&journal.inner.committed).frozen.is_some()
    }

    /// Whether redb's last commit (not the memtables) holds `id`'s receipt.
    fn in_redb(journal: &Journal, id: &str) -> bool {
        let db = journal.inner.db().unwrap_or_else(|e| panic!("open: {e}"));
        let txn = db.begin_read().unwrap_or_else(|e| panic!("read: {e}"));
        let table = txn
            .open_table(<Receipts as Table>::def())
            .unwrap_or_else(|e| panic!("receipts: {e}"));
        table
            .get(id)
            .unwrap_or_else(|e| panic!("get: {e}"))
            .is_some()
    }

    /// Runs operations `{prefix}1`, `{prefix}2`, ... (each in its own scope) until a
    /// checkpoint froze the memtable and started the next cycle in the other log file; how
    /// many ran.
    fn run_until_frozen(journal: &Journal, prefix: &str) -> usize {
        let mut n = 0;
        while !frozen(journal) {
            n += 1;
            assert!(
                n < 10_000,
                "no checkpoint beside the log after {n} operations"
            );
            let id = format!("{prefix}{n}");
            run(journal, &id, &id, 1);
        }
        n
    }

    /// Runs operations `{prefix}1`, ... until the checkpoint thread has marked the file as
    /// keeping two log files and zeroed the second (the next checkpoint may switch files);
    /// how many ran.
    fn run_until_marked(journal: &Journal, prefix: &str) -> usize {
        let mut n = 0;
        while !super::lock(&journal.inner.log)
            .as_ref()
            .is_some_and(crate::log::Writer::spare_marked)
        {
            n += 1;
            assert!(n < 10_000, "no checkpoint after {n} operations");
            let id = format!("{prefix}{n}");
            run(journal, &id, &id, 1);
        }
        // The second file's zeroing, queued with the mark, has ended too: a checkpoint due
        // while it runs waits for the thread's queue (and so for a hold placed after it).
        journal.inner.checkpointer.wait_idle();
        n
    }

    /// Holds the journal's checkpoint thread until the returned sender is dropped (or
    /// sends): a checkpoint started meanwhile waits behind it, between its switch of log
    /// files and its commit.
    fn hold_checkpoints(journal: &Journal) -> std::sync::mpsc::Sender<()> {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        journal.inner.checkpointer.start(move || {
            let _ = rx.recv();
            Ok(())
        });
        tx
    }

    /// Asserts that `{prefix}1` to `{prefix}{n}` are applied.
    fn assert_applied(journal: &Journal, prefix: &str, n: usize) {
        for i in 1..=n {
            let status = journal
                .lookup(&format!("{prefix}{i}"))
                .unwrap_or_else(|e| panic!("lookup: {e}"))
                .map(|r| r.status);
            assert_eq!(status, Some(crate::ExecutionStatus::Applied), "{prefix}{i}");
        }
    }

    /// A journal file with 64 KiB checkpoints, run until a checkpoint switched log files
    /// while the checkpoint thread is held (so it has not committed); with its directory,
    /// its path, the operations run, and the hold.
    fn switched_on_disk() -> (
        tempfile::TempDir,
        std::path::PathBuf,
        Journal,
        usize,
        std::sync::mpsc::Sender<()>,
    ) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join("j.opj");
        let journal = Journal::builder()
            .checkpoint_size(64 * 1024)
            .session_window(1 << 20)
            .open(&path)
            .unwrap_or_else(|e| panic!("open: {e}"));
        let marked = run_until_marked(&journal, "a");
        let hold = hold_checkpoints(&journal);
        let mut n = marked;
        while !frozen(&journal) {
            n += 1;
            assert!(n < 10_000, "no switch after {n} operations");
            let id = format!("a{n}");
            run(&journal, &id, &id, 1);
        }
        (dir, path, journal, n, hold)
    }

    /// Copies a journal and its log as they are on disk (what a kill leaves).
    fn copy_journal(from: &std::path::Path, to: &std::path::Path) {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy: {e}"));
        for (from, to) in crate::FileLog::paths_for(from)
            .into_iter()
            .zip(crate::FileLog::paths_for(to))
        {
            if from.exists() {
                std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy: {e}"));
            }
        }
    }

    /// The version the journal file's format record stores (4 and 5 as they are), read
    /// from a copy that redb recovers if it was not closed.
    fn stored_format(path: &std::path::Path) -> u32 {
        let scratch = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let copy = scratch.path().join("format.redb");
        std::fs::copy(path, &copy).unwrap_or_else(|e| panic!("copy: {e}"));
        let db = redb::Database::open(&copy).unwrap_or_else(|e| panic!("open: {e}"));
        let txn = db.begin_read().unwrap_or_else(|e| panic!("read: {e}"));
        let meta = txn
            .open_table(<crate::index::Meta as Table>::def())
            .unwrap_or_else(|e| panic!("meta: {e}"));
        let bytes = meta
            .get("format")
            .unwrap_or_else(|e| panic!("get: {e}"))
            .unwrap_or_else(|| panic!("a format record"));
        crate::index::decode_format_raw(bytes.value())
            .unwrap_or_else(|e| panic!("decode: {e}"))
            .format_version
    }

    /// The file's events table as redb holds it (purged events not yet removed included),
    /// and whether its `meta` table holds deferred purges.
    fn raw_events(db: &impl ReadableDatabase) -> (u64, bool) {
        use redb::ReadableTableMetadata as _;
        let txn = db.begin_read().unwrap_or_else(|e| panic!("read: {e}"));
        let events = txn
            .open_table(<crate::index::Events as Table>::def())
            .and_then(|t| Ok(t.len()?))
            .unwrap_or_else(|e| panic!("events: {e}"));
        let meta = txn
            .open_table(<crate::index::Meta as Table>::def())
            .unwrap_or_else(|e| panic!("meta: {e}"));
        let pending = meta
            .get(crate::index::purged::KEY)
            .unwrap_or_else(|e| panic!("get: {e}"))
            .is_some();
        (events, pending)
    }

    #[test]
    fn a_pass_across_checkpoints_defers_its_event_purges_and_no_crash_brings_one_back() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join("j.opj");
        let clock = crate::ManualClock::new(crate::Timestamp(1_000_000));
        let builder = || expiring(&clock);
        let journal = builder()
            .open(&path)
            .unwrap_or_else(|e| panic!("open: {e}"));
        let run = |i: u64| run_alone(&journal, &scattered_id(i), i);
        (0..600).for_each(run);
        clock.advance(Duration::from_secs(3 * 3600));
        (600..620).for_each(run);
        let kept: Vec<_> = (600..620)
            .map(|i| {
                journal
                    .history(&scattered_id(i))
                    .unwrap_or_else(|e| panic!("history: {e}"))
            })
            .collect();
        // A pass that does not end (another is counted as running) leaves the purges its
        // checkpoints deferred in the file, as a crash in the middle of one would.
        journal
            .inner
            .compacting
            .fetch_add(1, super::Ordering::SeqCst);
        let report = journal.compact().unwrap_or_else(|e| panic!("compact: {e}"));
        assert_eq!(report.purged, 600);
        journal
            .inner
            .exclusive(|| journal.inner.checkpoint())
            .unwrap_or_else(|e| panic!("checkpoint: {e}"));
        let live = journal
            .stats()
            .unwrap_or_else(|e| panic!("stats: {e}"))
            .events;
        let (raw, pending) = raw_events(journal.inner.db().unwrap_or_else(|e| panic!("{e}")));
        assert!(pending, "the pass's checkpoints deferred the purges");
        assert!(raw > live, "{raw} events in the table, {live} live");
        let check = |j: &Journal| {
            for i in 0..600 {
                assert_eq!(
                    j.lookup(&scattered_id(i)).unwrap_or_else(|e| panic!("{e}")),
                    None
                );
                assert!(
                    j.history(&scattered_id(i))
                        .unwrap_or_else(|e| panic!("{e}"))
                        .is_empty()
                );
            }
            for (i, history) in (600..620).zip(&kept) {
                assert_eq!(
                    &j.history(&scattered_id(i))
                        .unwrap_or_else(|e| panic!("{e}")),
                    history
                );
            }
            assert_eq!(j.stats().unwrap_or_else(|e| panic!("{e}")).events, live);
        };
        check(&journal);
        // Killed now: the copy reads the same, verifies clean, and its first checkpoint
        // (no pass is running there) removes the purged events from the file.
        let copy = dir.path().join("copy.opj");
        copy_journal(&path, &copy);
        let report = crate::verify(&copy).unwrap_or_else(|e| panic!("verify: {e}"));
        assert!(report.findings.is_empty(), "{:?}", report.findings);
        assert_eq!(report.events, live);
        let copy_as = |name: &str| {
            let to = dir.path().join(name);
            copy_journal(&copy, &to);
            to
        };
        let repair = |p: &std::path::Path| {
            crate::repair(p, &crate::RepairOptions::default(), &mut |_, _| {})
                .unwrap_or_else(|e| panic!("repair: {e}"))
        };
        // Repair rebuilds from the events without the purged ones.
        let repaired = copy_as("repaired.opj");
        repair(&repaired);
        check(
            &builder()
                .open(&repaired)
                .unwrap_or_else(|e| panic!("open: {e}")),
        );
        // A damaged entry: verify names it, and repair keeps the purged operations (their
        // events are all that is left of them; nothing the journal held is lost).
        let damaged = copy_as("damaged.opj");
        {
            use redb::ReadableTable as _;
            let db = redb::Database::open(&damaged).unwrap_or_else(|e| panic!("open: {e}"));
            let txn = db.begin_write().unwrap_or_else(|e| panic!("write: {e}"));
            {
                let mut meta = txn
                    .open_table(<crate::index::Meta as Table>::def())
                    .unwrap_or_else(|e| panic!("meta: {e}"));
                let mut v = meta
                    .get(crate::index::purged::KEY)
                    .unwrap_or_else(|e| panic!("get: {e}"))
                    .map(|v| v.value().to_vec())
                    .unwrap_or_else(|| panic!("the entry is there"));
                let last = v.len() - 1;
                v[last] ^= 0xFF;
                meta.insert(crate::index::purged::KEY, v.as_slice())
                    .unwrap_or_else(|e| panic!("insert: {e}"));
            }
            txn.commit().unwrap_or_else(|e| panic!("commit: {e}"));
        }
        let report = crate::verify(&damaged).unwrap_or_else(|e| panic!("verify: {e}"));
        assert!(
            report
                .findings
                .iter()
                .any(|f| f.table == "meta" && f.key == crate::index::purged::KEY),
            "{:?}",
            report.findings
        );
        repair(&damaged);
        let kept = builder()
            .open(&damaged)
            .unwrap_or_else(|e| panic!("open: {e}"));
        assert!(
            !kept
                .history(&scattered_id(0))
                .unwrap_or_else(|e| panic!("{e}"))
                .is_empty()
        );
        drop(kept);
        {
            let crashed = builder()
                .open(&copy)
                .unwrap_or_else(|e| panic!("reopen copy: {e}"));
            check(&crashed);
            crashed.close().unwrap_or_else(|e| panic!("close: {e}"));
        }
        let closed = |p: &std::path::Path| {
            raw_events(&redb::ReadOnlyDatabase::open(p).unwrap_or_else(|e| panic!("open: {e}")))
        };
        assert_eq!(closed(&copy), (live, false));
        // The pass's end removes them in the journal that ran it.
        journal
            .inner
            .compacting
            .fetch_sub(1, super::Ordering::SeqCst);
        journal.compact().unwrap_or_else(|e| panic!("compact: {e}"));
        check(&journal);
        let db = journal.inner.db().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(raw_events(db), (live, false));
        journal.close().unwrap_or_else(|e| panic!("close: {e}"));
        assert_eq!(closed(&path), (live, false));
    }

    #[test]
    fn a_checkpoint_commits_beside_the_next_cycle_and_a_kill_before_its_commit_loses_nothing() {
        let (dir, path, journal, switched) = {
            let (dir, path, journal, n, hold) = switched_on_disk();
            // Records of the new cycle go into the second log file while redb has not
            // committed the cycle before.
            let mut m = n;
            for _ in 0..5 {
                m += 1;
                let id = format!("a{m}");
                run(&journal, &id, &id, 1);
            }
            assert!(frozen(&journal), "the checkpoint is held before its commit");
            assert!(!in_redb(&journal, &format!("a{n}")));
            let seen = journal
                .lookup(&format!("a{n}"))
                .unwrap_or_else(|e| panic!("lookup: {e}"))
                .map(|r| r.status);
            assert_eq!(seen, Some(crate::ExecutionStatus::Applied));
            // Killed now: the files as they are, both cycles in the logs. The file says
            // format 5, which a build that reads one log file refuses.
            let copy = dir.path().join("copy.opj");
            copy_journal(&path, &copy);
            assert_eq!(stored_format(&copy), crate::index::purged::FORMAT_TWO_LOGS);
            // `verify` reads both cycles and finds nothing wrong; a record damaged in the
            // second file, with valid ones after it, is damage.
            let report = crate::verify(&copy).unwrap_or_else(|e| panic!("verify: {e}"));
            assert!(
                report.is_clean(),
                "{:?} {:?}",
                report.integrity,
                report.findings
            );
            match &report.log {
                crate::LogCheck::Current { records, .. } => {
                    assert!(*records > 5, "both cycles' records: {records}")
                }
                other => panic!("the log is current, not {other:?}"),
            }
            let damaged = dir.path().join("damaged.opj");
            copy_journal(&path, &damaged);
            let second = crate::FileLog::spare_path_for(&damaged);
            let mut bytes = std::fs::read(&second).unwrap_or_else(|e| panic!("read: {e}"));
            bytes[crate::log::START as usize + crate::log::RECORD_HEADER_LEN + 1] ^= 0x40;
            std::fs::write(&second, bytes).unwrap_or_else(|e| panic!("write: {e}"));
            let report = crate::verify(&damaged).unwrap_or_else(|e| panic!("verify: {e}"));
            assert!(
                report
                    .findings
                    .iter()
                    .any(|f| f.table == "log" && f.problem.starts_with("damaged")),
                "{:?}",
                report.findings
            );
            {
                let crashed = Journal::open(&copy).unwrap_or_else(|e| panic!("reopen copy: {e}"));
                assert_applied(&crashed, "a", m);
                crashed.close().unwrap_or_else(|e| panic!("close: {e}"));
            }
            assert_eq!(
                stored_format(&copy),
                u32::from(crate::codec::FORMAT_VERSION),
                "a clean close leaves a file any format-3 build reads"
            );
            assert!(
                !crate::FileLog::paths_for(&copy).iter().any(|p| p.exists()),
                "a clean close removes both log files"
            );
            drop(hold);
            (dir, path, journal, m)
        };
        // Released, the thread commits the frozen cycle and drops it.
        let deadline = Instant::now() + Duration::from_secs(30);
        while frozen(&journal) {
            assert!(Instant::now() < deadline, "the checkpoint never committed");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(in_redb(&journal, "a1"));
        assert!(in_redb(&journal, &format!("a{}", switched - 5)));
        let mut n = switched;
        // Later checkpoints go on switching files, each file zeroed in between.
        for _ in 0..2 {
            n += run_until_frozen(&journal, &format!("b{n}-"));
        }
        journal.close().unwrap_or_else(|e| panic!("close: {e}"));
        let journal = Journal::open(&path).unwrap_or_else(|e| panic!("reopen: {e}"));
        assert_applied(&journal, "a", switched);
        drop(dir);
    }

    #[test]
    fn a_scope_hold_released_over_a_frozen_memtable_stays_released() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join("j.opj");
        let journal = Journal::builder()
            .checkpoint_size(64 * 1024)
            .session_window(1 << 20)
            .scope_lock(ScopeLock::HoldUntilAck)
            .open(&path)
            .unwrap_or_else(|e| panic!("open: {e}"));
        run_until_marked(&journal, "m");
        let hold = hold_checkpoints(&journal);
        // The hold is set in the memtable that the checkpoint freezes.
        run(&journal, "held", "doc", 1);
        run_until_frozen(&journal, "f");
        // Released in the newer memtable: the deletion of a key that only the frozen
        // memtable holds must hide it (redb does not have it, so a deletion checked
        // against redb alone would leave no tombstone).
        journal
            .acknowledge("held", Some("s"))
            .unwrap_or_else(|e| panic!("ack: {e}"));
        // Committed without waiting for the held checkpoint (as `Journal::flush` would).
        journal
            .inner
            .flush()
            .unwrap_or_else(|e| panic!("flush: {e}"));
        assert!(frozen(&journal), "still before the checkpoint's commit");
        let holders = || {
            use crate::index::View as _;
            super::read_lock(&journal.inner.committed)
                .snapshot()
                .holders("doc")
                .unwrap_or_else(|e| panic!("holders: {e}"))
        };
        assert_eq!(
            holders(),
            Vec::<String>::new(),
            "the released hold is hidden"
        );
        drop(hold);
        journal.inner.checkpointer.wait_idle();
        assert!(!frozen(&journal));
        assert_eq!(
            holders(),
            Vec::<String>::new(),
            "and stays so once committed"
        );
        run(&journal, "next", "doc", 2);
    }

    /// redb's storage in memory, whose writes (`write`, `set_len`, `sync_data`) fail while
    /// `failing` is set; counts the failures.
    #[derive(Debug)]
    struct FailingBackend {
        inner: redb::backends::InMemoryBackend,
        failing: std::sync::Arc<std::sync::atomic::AtomicBool>,
        failures: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl FailingBackend {
        fn check(&self) -> std::io::Result<()> {
            use std::sync::atomic::Ordering;
            if self.failing.load(Ordering::SeqCst) {
                self.failures.fetch_add(1, Ordering::SeqCst);
                return Err(std::io::Error::other("injected EIO"));
            }
            Ok(())
        }
    }

    impl redb::StorageBackend for FailingBackend {
        fn len(&self) -> std::io::Result<u64> {
            self.inner.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
            self.inner.read(offset, out)
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.check()?;
            self.inner.set_len(len)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.check()?;
            self.inner.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            self.check()?;
            self.inner.write(offset, data)
        }
    }

    /// A journal over storage (two logs in memory) whose redb writes fail from after its
    /// first checkpoint (commits append to the logs only, so the next write to redb's
    /// storage is the checkpoint that switches log files), run until that checkpoint froze
    /// the memtable; and the count of the storage's failures.
    fn frozen_over_failing_storage(
        background: bool,
    ) -> (Journal, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let failing = Arc::new(AtomicBool::new(false));
        let failures = Arc::new(AtomicUsize::new(0));
        let backend = FailingBackend {
            inner: redb::backends::InMemoryBackend::new(),
            failing: Arc::clone(&failing),
            failures: Arc::clone(&failures),
        };
        let journal = Journal::builder()
            .checkpoint_size(1 << 20)
            .cache_size(1 << 20)
            .session_window(1 << 20)
            .background_checkpoints(background)
            .open_backends_with_spare_log(
                backend,
                crate::MemoryLog::new(),
                crate::MemoryLog::new(),
                "failing",
            )
            .unwrap_or_else(|e| panic!("open: {e}"));
        run_until_marked(&journal, "m");
        failing.store(true, Ordering::SeqCst);
        // Until the checkpoint froze the memtable; the call whose batch started it may
        // fail after it (without background checkpoints, the checkpoint fails first).
        let mut n = 0;
        while !frozen(&journal) {
            n += 1;
            assert!(
                n < 10_000,
                "no checkpoint beside the log after {n} operations"
            );
            let id = format!("a{n}");
            let op = Operation::new(&id, intent()).scope(&id).session("s");
            if let Ok(Admission::Fresh(claim)) = journal.submit(op) {
                let _ = journal.complete(&claim, Outcome::applied(1, vec![7u8; 200]));
            }
        }
        (journal, failures)
    }

    #[test]
    fn a_checkpoint_that_fails_beside_the_log_poisons_the_handle() {
        use std::sync::atomic::Ordering;
        let (journal, failures) = frozen_over_failing_storage(true);
        // Nobody waits for the commit: the handle is poisoned when it fails.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !journal.is_poisoned() {
            assert!(
                Instant::now() < deadline,
                "a failed checkpoint left the handle usable ({} failures)",
                failures.load(Ordering::SeqCst),
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            failures.load(Ordering::SeqCst) > 0,
            "the checkpoint wrote to redb"
        );
        let err = journal
            .submit(Operation::new("after", intent()).session("s"))
            .map(|_| ())
            .expect_err("a poisoned handle refuses writes");
        assert_eq!(*err.kind(), crate::ErrorKind::Poisoned);
        // What was committed is still read, through the frozen memtable.
        assert!(frozen(&journal), "the failed checkpoint published nothing");
        let seen = journal
            .lookup("a1")
            .unwrap_or_else(|e| panic!("lookup: {e}"))
            .map(|r| r.status);
        assert_eq!(seen, Some(crate::ExecutionStatus::Applied));
    }

    #[test]
    fn without_background_checkpoints_the_call_that_switches_log_files_waits_for_the_commit() {
        use std::sync::atomic::Ordering;
        let (journal, failures) = frozen_over_failing_storage(false);
        // The checkpoint ran, and failed, before the call that reached it returned.
        assert!(
            failures.load(Ordering::SeqCst) > 0,
            "the checkpoint wrote to redb"
        );
        assert!(journal.is_poisoned(), "poisoned when the call returned");
    }

    #[test]
    fn a_poisoned_handle_with_a_checkpoint_held_closes_and_reopens_with_everything() {
        let (_dir, path, journal, n, hold) = switched_on_disk();
        // As after an I/O error in a later commit.
        journal
            .inner
            .poisoned
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Released as the handle closes: closing (and dropping) the handle waits for the
        // checkpoint thread, which holds redb.
        drop(hold);
        let closed = journal.close().map_err(|e| e.kind().clone());
        assert_eq!(closed, Err(crate::ErrorKind::Poisoned));
        let journal = Journal::open(&path).unwrap_or_else(|e| panic!("reopen: {e}"));
        assert_applied(&journal, "a", n);
    }

    /// A journal file with 64 KiB checkpoints whose expired operations a pass purged while
    /// checkpoints deferred the purges (another pass is counted as running, so the pass
    /// leaves them to a later checkpoint); with its directory and the purged ids.
    fn with_deferred_purges() -> (tempfile::TempDir, Journal, Vec<String>) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let clock = crate::ManualClock::new(crate::Timestamp(1_000_000));
        let journal = expiring(&clock)
            .open(dir.path().join("j.opj"))
            .unwrap_or_else(|e| panic!("open: {e}"));
        let ids: Vec<String> = (0..600u64).map(scattered_id).collect();
        for (i, id) in (0u64..).zip(&ids) {
            run_alone(&journal, id, i);
        }
        clock.advance(Duration::from_secs(3 * 3600));
        journal
            .inner
            .compacting
            .fetch_add(1, super::Ordering::SeqCst);
        let report = journal.compact().unwrap_or_else(|e| panic!("compact: {e}"));
        journal
            .inner
            .compacting
            .fetch_sub(1, super::Ordering::SeqCst);
        assert_eq!(report.purged, 600);
        journal.flush().unwrap_or_else(|e| panic!("flush: {e}"));
        let deferred = journal
            .inner
            .purges_deferred()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(deferred, "the pass's checkpoints deferred its purges");
        (dir, journal, ids)
    }

    #[test]
    fn the_removal_of_a_passs_deferred_purges_commits_beside_the_calls() {
        let (dir, journal, purged) = with_deferred_purges();
        let mut n = 0;
        let mut next = |journal: &Journal| {
            n += 1;
            let id = format!("after{n}");
            run(journal, &id, &id, 1);
        };
        next(&journal);
        // The checkpoint that removes them (as the pass's end runs it) returns with its
        // commit still to come: the thread is held.
        let hold = hold_checkpoints(&journal);
        journal
            .inner
            .exclusive(|| journal.inner.checkpoint_as(super::Checkpoint::Switch))
            .unwrap_or_else(|e| panic!("checkpoint: {e}"));
        assert!(frozen(&journal), "the checkpoint commits beside the log");
        let still = journal
            .inner
            .purges_deferred()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(still, "not committed yet");
        // Calls go on meanwhile, and the purged operations stay gone.
        next(&journal);
        for id in &purged {
            assert_eq!(journal.lookup(id).unwrap_or_else(|e| panic!("{e}")), None);
        }
        drop(hold);
        journal.flush().unwrap_or_else(|e| panic!("flush: {e}"));
        let (_, pending) = raw_events(journal.inner.db().unwrap_or_else(|e| panic!("{e}")));
        assert!(
            !pending,
            "the commit removed the deferred purges from the file"
        );
        assert!(
            !journal
                .inner
                .purges_deferred()
                .unwrap_or_else(|e| panic!("{e}"))
        );
        // A checkpoint still committing when a pass ends makes the pass wait, not the
        // calls: the pass's end waits for the thread outside the committer.
        let hold = hold_checkpoints(&journal);
        std::thread::scope(|s| {
            let end = s.spawn(|| journal.inner.checkpoint_beside());
            // (Time for the pass's end to reach its wait; the call must answer either way.)
            std::thread::sleep(Duration::from_millis(50));
            let call = s.spawn(|| run(&journal, "during", "during", 1));
            let deadline = Instant::now() + Duration::from_secs(10);
            while !call.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            let answered = call.is_finished();
            let waiting = !end.is_finished();
            drop(hold);
            let _ = call.join();
            end.join()
                .unwrap_or_else(|_| panic!("the pass's end panicked"))
                .unwrap_or_else(|e| panic!("checkpoint: {e}"));
            assert!(
                answered,
                "a call waited for a checkpoint behind the pass's end"
            );
            assert!(waiting, "the pass's end waits for the held thread");
        });
        drop(journal);
        let report = crate::verify(dir.path().join("j.opj")).unwrap_or_else(|e| panic!("{e}"));
        assert!(report.is_clean(), "{:?}", report.findings);
    }
}
