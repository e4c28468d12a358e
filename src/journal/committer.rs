//! The group committer: callers enqueue jobs; one leader runs them in one write
//! transaction and commits once.
//! The [`Journal`] handle: opening, the group committer, and the public API.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::engine::{self, Ctx};
use crate::error::{Error, ErrorKind, Result};
use crate::index::{View, WriteTables};

use super::Inner;
use super::reads::{LazyEntry, read_lock, write_lock};

// ---------------------------------------------------------------------------------------
// Group commit.
//
// Callers enqueue jobs. Whoever finds no leader becomes the leader: it takes every queued
// job, runs them in one write transaction, commits once (one sync), and hands each caller
// its own answer. Jobs queued meanwhile form the next batch. A lone caller leads its own
// batch at once, so it waits for nothing but its own commit.
// ---------------------------------------------------------------------------------------

pub(crate) struct Committer {
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

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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

impl Inner {
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
}

enum BatchOutcome {
    Done,
    Retry(usize),
}
