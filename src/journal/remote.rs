//! A journal in PostgreSQL (feature `postgres`): the same calls and state machine as a
//! file journal, with the database as the only state. Every batch of the group committer
//! is one transaction that holds the journal's writer lock (its row in
//! `opjournal_journals`, `FOR UPDATE`), so that batches of every process on the database
//! apply one after the other and each sees all the earlier ones: one `Fresh` per operation
//! id, epoch fencing, scope locks, session windows and forward-only revisions hold across
//! processes as they hold across threads. Reads are `REPEATABLE READ` snapshots, taken
//! without the lock. Time is the server's (one reading per transaction) unless the
//! embedder set a clock. Nothing is cached between calls: another process may change any
//! receipt.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::index::{Base, Layers, Memtable, Snapshot, View, WriteTables};
use crate::postgres::{Pg, PgConfig, is_conflict};

use super::committer::{BatchOutcome, Job};
use super::reads::{LazyEntry, ReadView, read_lock};
use super::{Inner, Journal, Storage};

/// Times a batch is run again after a serialization failure or a deadlock before its
/// callers get [`ErrorKind::Unavailable`]. With the writer lock taken first, conflicts are
/// rare (a transaction of the embedder's that holds rows the batch needs).
const CONFLICT_RETRIES: u32 = 8;

/// Opens (or creates) the journal `name` in the database at `url`.
pub(crate) fn open_postgres(url: &str, name: &str, mut cfg: Config) -> Result<Journal> {
    let pg = Pg::connect(PgConfig::new(url, name).timeouts(cfg.database_timeout))?;
    pg.initialize(&super::memory::new_journal_records(&cfg)?)?;
    // Another process may change any receipt: answers are never cached here.
    cfg.replay_cache_bytes = 0;
    let label = format!("postgres:{}", pg.describe());
    let custom_clock = cfg.custom_clock;
    let journal = super::memory::handle(
        Storage::Postgres(Box::new(pg)),
        &label,
        Memtable::default(),
        cfg,
    );
    if !custom_clock {
        // The server's time decides; this machine's clock must not raise the mark.
        journal.inner.high_water.store(0, Ordering::SeqCst);
        journal
            .inner
            .persisted_high_water
            .store(0, Ordering::SeqCst);
    }
    let (format, state) = journal.inner.read_with(None, |snap, _| {
        Ok((snap.tables.format()?, snap.tables.state()?))
    })?;
    // Time never runs backwards across opens: not below the journal's high-water mark.
    let mark = state.clock_high_water.0;
    journal.inner.high_water.fetch_max(mark, Ordering::SeqCst);
    journal
        .inner
        .persisted_high_water
        .fetch_max(mark, Ordering::SeqCst);
    match format {
        Some(f) if f.format_version == u32::from(crate::codec::FORMAT_VERSION) => Ok(journal),
        Some(f) => Err(Error::new(ErrorKind::UnsupportedFormat {
            found: f.format_version,
            supported: u32::from(crate::codec::FORMAT_VERSION),
        })),
        None => Err(Error::corrupt(
            "meta",
            "format",
            "the journal's format record is missing from the database",
        )),
    }
}

impl Inner {
    /// The database, for a journal in PostgreSQL.
    pub(super) fn pg(&self) -> Option<&Pg> {
        match &self.storage {
            Storage::Postgres(pg) => Some(pg),
            _ => None,
        }
    }

    /// The time of a transaction that read `server_ms` on the database server: the
    /// server's, never below what this handle has seen (the embedder's clock, if it set
    /// one).
    pub(super) fn time_at(&self, server_ms: u64) -> Timestamp {
        if self.cfg.custom_clock {
            return self.now();
        }
        let prev = self.high_water.fetch_max(server_ms, Ordering::SeqCst);
        Timestamp(prev.max(server_ms))
    }

    /// Runs `f` on a snapshot of the database with `pending` lazy writes over it.
    pub(super) fn read_pg<R>(
        &self,
        pg: &Pg,
        pending: Vec<LazyEntry>,
        f: impl FnOnce(&ReadView<'_>, Timestamp) -> Result<R>,
    ) -> Result<R> {
        let (read, server_ms) = pg.read()?;
        let now = self.time_at(server_ms);
        let read = Arc::new(read);
        let base = Base::store(read.clone());
        let out = {
            let view = ReadView {
                tables: Snapshot {
                    base: Some(&base),
                    layers: Layers::default(),
                },
                pending,
            };
            f(&view, now)
        };
        drop(base);
        if let Ok(read) = Arc::try_unwrap(read) {
            read.finish();
        }
        out
    }

    /// One batch as one transaction under the writer lock; run again after a
    /// serialization failure or deadlock. A failure never poisons the handle: the
    /// database holds the whole state, so the next call starts from it.
    pub(super) fn try_batch_pg(&self, pg: &Pg, jobs: &mut Vec<Box<dyn Job>>) -> BatchOutcome {
        let fail_all = |jobs: &mut Vec<Box<dyn Job>>, e: Error| {
            for mut job in jobs.drain(..) {
                job.finish(Err(&e));
            }
            BatchOutcome::Done
        };
        let pending: Vec<LazyEntry> = read_lock(&self.lazy).entries.clone();
        let yield_if_locked = jobs.iter().all(|j| j.skip_if_locked());
        let mut attempt = 0;
        loop {
            attempt += 1;
            let retry = |e: &Error| is_conflict(e) && attempt <= CONFLICT_RETRIES;
            let (write, server_ms) = match pg.write(!yield_if_locked) {
                Ok(Some(w)) => w,
                Ok(None) => {
                    for mut job in jobs.drain(..) {
                        job.skip();
                    }
                    return BatchOutcome::Done;
                }
                Err(e) if retry(&e) => {
                    backoff(attempt);
                    continue;
                }
                Err(e) => return fail_all(jobs, e),
            };
            let now = self.time_at(server_ms);
            let write = Arc::new(write);
            let base = Base::store(write.clone());
            let mut t = WriteTables::over(Some(&base), Layers::default());
            let run = self.run_jobs(&mut t, now, &pending, jobs);
            let changes = t.into_changes();
            drop(base);
            let Ok(write) = Arc::try_unwrap(write) else {
                return fail_all(jobs, Error::new(ErrorKind::Storage));
            };
            match run {
                Ok(true) => {}
                Ok(false) => {
                    // Nothing changed: the transaction ends without a commit to wait for.
                    drop(write);
                    self.lazy_committed(pending.len());
                    for mut job in jobs.drain(..) {
                        job.finish(Ok(()));
                    }
                    return BatchOutcome::Done;
                }
                Err((Some(i), _)) => return BatchOutcome::Retry(i),
                Err((None, e)) if retry(&e) => {
                    drop(write);
                    backoff(attempt);
                    continue;
                }
                Err((None, e)) => return fail_all(jobs, e),
            }
            match write.apply(&changes).and_then(|()| write.commit()) {
                Ok(()) => {
                    self.persisted_high_water.fetch_max(now.0, Ordering::SeqCst);
                    self.lazy_committed(pending.len());
                    for mut job in jobs.drain(..) {
                        job.finish(Ok(()));
                    }
                    return BatchOutcome::Done;
                }
                Err(e) if retry(&e) => {
                    backoff(attempt);
                    continue;
                }
                Err(e) => return fail_all(jobs, e),
            }
        }
    }
}

/// A short, growing wait before running a batch again after a conflict.
fn backoff(attempt: u32) {
    std::thread::sleep(Duration::from_millis(u64::from(attempt.min(6)) * 2));
}

impl Inner {
    /// Runs `f` as a batch of its own inside the caller's transaction `txn`, under the
    /// journal's writer lock (held until the caller's transaction ends), and writes its
    /// changes there: they commit or roll back with the caller's transaction.
    fn run_in<T>(
        &self,
        pg: &Pg,
        txn: &mut postgres::Transaction<'_>,
        f: impl FnOnce(&mut crate::machine::Ctx<'_, '_>) -> Result<T>,
    ) -> Result<T> {
        let (write, server_ms) = crate::postgres::PgWriteIn::lock_in(txn, pg.journal())?;
        let write = Arc::new(write);
        let base = Base::store(write.clone());
        let mut t = WriteTables::over(Some(&base), Layers::default());
        let mut state = t.state()?;
        let now = self.time_at(server_ms).max(state.clock_high_water);
        state.clock_high_water = now;
        let mut ctx = crate::machine::Ctx {
            t: &mut t,
            now,
            cfg: &self.cfg,
            state: &mut state,
            fired: Default::default(),
        };
        let out = f(&mut ctx)?;
        let state = ctx.state.clone();
        if t.dirty {
            t.put_state(&state)?;
        }
        let changes = t.into_changes();
        drop(base);
        let write = Arc::try_unwrap(write).map_err(|_| Error::new(ErrorKind::Storage))?;
        write.apply(&changes)?;
        Ok(out)
    }
}

impl Journal {
    /// [`Journal::execute`] inside the embedder's own PostgreSQL transaction (feature
    /// `postgres`): the admission, the effect `work` makes through `txn`, and the receipt
    /// are written in `txn`, so they commit together when the caller commits, or not at
    /// all. A crash before the commit leaves neither the effect nor the claim: the id is
    /// unknown and the retry runs fresh, so such an operation is never in doubt.
    ///
    /// The journal must be the one in `txn`'s database ([`JournalBuilder::open_postgres`]
    /// on the same database). The journal's writer lock is held from the admission until
    /// `txn` ends, so other writers of this journal (in every process) wait for the
    /// caller's commit: keep the transaction short. Nothing is durable until the caller
    /// commits; deliveries and acknowledgements recorded lazily are not part of it.
    ///
    /// `Err(Failure::NotApplied(e))` releases the claim in `txn` (the id is free again,
    /// whether the caller commits or rolls back). A panic in `work` records nothing and
    /// unwinds through the caller, whose transaction then rolls back.
    ///
    /// # Errors
    ///
    /// As [`Journal::execute`], and [`ErrorKind::InvalidInput`] when the journal is not in
    /// PostgreSQL. A journal error inside `txn` (such as
    /// [`ErrorKind::Unavailable`]) leaves `txn` aborted: roll it back and retry the whole
    /// transaction with the same operation id.
    ///
    /// [`JournalBuilder::open_postgres`]: crate::JournalBuilder::open_postgres
    pub fn execute_in<E, F>(
        &self,
        txn: &mut postgres::Transaction<'_>,
        op: crate::Operation,
        work: F,
    ) -> std::result::Result<crate::Executed, crate::ExecuteError<E>>
    where
        F: FnOnce(
            &mut postgres::Transaction<'_>,
            &crate::Claim,
        ) -> std::result::Result<crate::Outcome, crate::Failure<E>>,
    {
        use crate::{Admission, ExecuteError, Executed, Failure, Outcome};
        let _span = crate::trace_span!(DEBUG, "execute_in", operation_id = %op.id);
        let inner = &self.inner;
        let pg = inner.pg().ok_or_else(|| {
            Error::invalid(
                "journal",
                &inner.path.display().to_string(),
                "execute_in needs a journal in PostgreSQL (JournalBuilder::open_postgres); \
                 use Journal::execute for this one",
            )
        })?;
        inner.check_writable()?;
        crate::machine::validate_operation(&op)?;
        let claim = match inner.run_in(pg, txn, |ctx| crate::machine::submit(ctx, &op))? {
            Admission::Fresh(claim) => claim,
            Admission::Replay(replay) => return Ok(Executed::Replay(replay)),
            Admission::InProgress(receipt) => return Ok(Executed::InProgress(receipt)),
            Admission::Expired(receipt) => return Ok(Executed::Expired(receipt)),
            Admission::InDoubt(receipt) => return Ok(Executed::InDoubt(receipt)),
        };
        let outcome = match work(txn, &claim) {
            Ok(outcome) => outcome,
            Err(Failure::Failed(message)) => Outcome::failed(message),
            Err(Failure::NotApplied(error)) => {
                return match inner.run_in(pg, txn, |ctx| crate::machine::release(ctx, &claim)) {
                    Ok(()) => Err(ExecuteError::NotApplied(error)),
                    Err(release) => Err(ExecuteError::ReleaseFailed { error, release }),
                };
            }
        };
        let recorded = inner.run_in(pg, txn, |ctx| {
            crate::machine::complete(ctx, &claim, &outcome)
        });
        match recorded {
            Ok(receipt) => Ok(Executed::Fresh(receipt, outcome.result)),
            Err(error) => Err(ExecuteError::Unrecorded(Box::new(
                crate::execute::Unrecorded {
                    claim,
                    outcome,
                    error,
                },
            ))),
        }
    }
}
