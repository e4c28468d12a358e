//! The [`Journal`] handle: the public calls, over the group committer.

mod builder;
pub(crate) mod cache;
mod checkpointer;
mod committer;
pub(crate) mod compactor;
mod memory;
pub(crate) mod open;
mod pacing;
mod reads;
#[cfg(feature = "postgres")]
mod remote;

pub use builder::JournalBuilder;
pub use compactor::{CompactionReport, CompactorHandle};

use committer::{Committer, lock};
use reads::{Committed, LazyBuffer};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use redb::{Database, ReadableDatabase};

use crate::clock::Timestamp;
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::index::{self, Base, Layered, TimerKind, View};
use crate::machine::{self};
use crate::types::Event;
use crate::types::{Admission, Claim, OpResult, Operation, Outcome, Receipt, Replay, Resolution};

/// An open operation journal: a redb file (the index) and, while it is open, its log.
///
/// `Journal` is `Send + Sync` and cheap to clone: clones are handles to the same open
/// journal (share one between threads by cloning it, or through an `Arc`). Calls are
/// synchronous (async embedders use `spawn_blocking`). Every call that changes execution
/// state is durable (its log record synced) before it returns `Ok`; concurrent callers
/// share commits. The journal closes when its last handle is dropped or
/// [closed](Journal::close): closing writes the log into the redb file and removes it.
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
    /// Set by [`Journal::close`], which counts the handle out itself.
    released: bool,
}

impl Clone for Journal {
    /// Another handle to the same open journal.
    fn clone(&self) -> Journal {
        self.inner.handles.fetch_add(1, Ordering::SeqCst);
        Journal {
            inner: self.inner.clone(),
            released: false,
        }
    }
}

/// Where a journal keeps its tables.
pub(crate) enum Storage {
    /// A redb file, with its log while open: `db` and `log` are set.
    File,
    /// In memory only (tests, fuzzers): the memtable is everything; no `db`, no `log`.
    Memory,
    /// In a PostgreSQL database shared with other processes: read on every call, no
    /// `db`, no `log`, an empty memtable.
    #[cfg(feature = "postgres")]
    Postgres(Box<crate::postgres::Pg>),
}

pub(crate) struct Inner {
    pub(crate) storage: Storage,
    /// `None` only while `Inner` is dropped (see its `Drop`), and for storage other than a
    /// file.
    db: Option<Arc<Database>>,
    pub(crate) cfg: Config,
    path: PathBuf,
    high_water: AtomicU64,
    /// The high-water mark of the last commit (the persisted one).
    persisted_high_water: AtomicU64,
    poisoned: Arc<AtomicBool>,
    /// Foreground calls queued for the writer: a compaction batch in progress ends early
    /// when one arrives, so foreground calls wait behind as little compaction as possible.
    pub(crate) foreground_waiting: Arc<AtomicUsize>,
    /// Compaction passes running: while one is, checkpoints defer the deletions of events
    /// and results (see `index::purged`), and a checkpoint at the pass's end, beside the
    /// log, applies them.
    pub(crate) compacting: AtomicUsize,
    /// What this process has committed (see [`Committed`]).
    pub(crate) committed: Arc<RwLock<Committed>>,
    /// Open handles ([`Journal`] clones); the last one to go closes the journal.
    pub(crate) handles: AtomicUsize,
    /// Terminal answers kept in memory (see [`cache::ReplayCache`]).
    pub(crate) cache: Mutex<cache::ReplayCache>,
    /// The log; used by the group committer's leader only (`None` once closed).
    pub(crate) log: Mutex<Option<crate::log::Writer>>,
    /// Deliveries and acknowledgements not committed yet (see [`LazyBuffer`]).
    lazy: RwLock<LazyBuffer>,
    committer: Committer,
    /// The thread that writes checkpoints into redb (see [`checkpointer`]).
    checkpointer: checkpointer::Checkpointer,
    /// Held by a background compactor during a pass; `true` once the journal is dropped,
    /// so no pass starts after that and the file closes as soon as `Journal` drops.
    pub(crate) gate: Arc<Mutex<bool>>,
    /// [`Journal::reclaim_space`] shrank the file: closing compacts again after its own
    /// commits (see [`shrink_before_close`]).
    pub(crate) reclaimed: AtomicBool,
}

/// Moves down the pages that the commits after [`Journal::reclaim_space`] wrote, so the
/// file closes as small as the reclaim left it. redb grows a file with no free page by
/// doubling it, and the commits of the close (its checkpoint) landed their pages at the
/// top of that growth, where no later shrink can reach: a reclaimed file closed at twice
/// its size. redb's own close, right after its compaction, records its allocator state
/// from the lowest pages and trims the rest.
///
/// A reader in another process (redb refuses to move pages under it) leaves the file as
/// it is: nothing is lost, the space stays allocated.
fn shrink_before_close(db: &mut Database) -> Result<()> {
    loop {
        match db.compact() {
            Ok(true) => {}
            Ok(false) | Err(redb::CompactionError::TransactionInProgress) => return Ok(()),
            Err(e) => return Err(Error::from(e)),
        }
    }
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.inner.path)
            .field("config", &self.inner.cfg)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing redb writes its allocator state. After the engine panicked on damaged
        // data (caught, and the handle poisoned) its internal locks may be poisoned and
        // closing panics too: contain that here, so dropping a journal never panics. The
        // file is closed either way (the unwinding drops the engine's fields). A checkpoint
        // still running beside the log (or zeroing a log file) ends first: it holds redb,
        // which must be closed here, not on its thread after the journal is gone.
        self.checkpointer.wait_idle();
        let shrink = self.reclaimed.load(Ordering::SeqCst) && !self.poisoned.load(Ordering::SeqCst);
        if shrink {
            // Its read snapshot would keep redb from moving pages.
            reads::write_lock(&self.committed).base = None;
        }
        let db = self.db.take();
        let _ = crate::preflight::guarded("close", || {
            match db.map(Arc::try_unwrap) {
                Some(Ok(mut db)) if shrink => {
                    let _ = shrink_before_close(&mut db);
                    drop(db);
                }
                other => drop(other),
            }
            Ok(())
        });
    }
}

impl Inner {
    /// redb; gone only while the journal is being dropped.
    pub(crate) fn db(&self) -> Result<&Database> {
        self.db
            .as_deref()
            .ok_or_else(|| Error::new(ErrorKind::Closed))
    }

    /// redb, shared with a job of the checkpoint thread (which drops it before answering).
    pub(crate) fn db_shared(&self) -> Result<Arc<Database>> {
        self.db.clone().ok_or_else(|| Error::new(ErrorKind::Closed))
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
}

impl Drop for Journal {
    fn drop(&mut self) {
        if self.released || self.inner.handles.fetch_sub(1, Ordering::SeqCst) != 1 {
            return;
        }
        // The last handle: a failure to close leaves the log in place, and the next open
        // reads it back ([`Journal::close`] reports it).
        let _ = self.close_last();
    }
}

impl Journal {
    /// Closes the journal and reports whether it closed cleanly: pending deliveries and
    /// acknowledgements are committed, everything in the logs is written into the redb
    /// file (a checkpoint), and both log files are removed, so that the journal is one file
    /// again.
    /// Dropping the last handle does the same but cannot report an error.
    ///
    /// While other handles (clones) exist, this one is dropped and the journal stays open
    /// for them: the error says so ([`ErrorKind::InvalidInput`]), and the journal closes
    /// when the last handle is dropped or closed.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`] while other handles exist; [`ErrorKind::Io`] naming what
    /// failed (writing the checkpoint, removing the log, closing the file): nothing is lost,
    /// the next open reads the log again or recovers the file; [`ErrorKind::Poisoned`] if an earlier write failed on this handle (the
    /// log is kept for the next open).
    ///
    /// # Example
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("project.opj");
    /// let journal = opjournal::Journal::open(&path)?;
    /// let other = journal.clone();
    /// assert!(other.close().is_err(), "another handle is still open");
    /// journal.close()?;
    /// assert!(!opjournal::FileLog::paths_for(&path).iter().any(|p| p.exists()));
    /// # Ok::<(), opjournal::Error>(())
    /// ```
    pub fn close(mut self) -> Result<()> {
        self.released = true;
        let others = self.inner.handles.fetch_sub(1, Ordering::SeqCst) - 1;
        if others > 0 {
            Err(Error::invalid(
                "journal handle to close",
                &self.inner.path.display().to_string(),
                format!(
                    "{others} other handle(s) share the journal, which stays open for them and \
                     closes when the last one is dropped or closed"
                ),
            ))
        } else {
            self.close_last()?;
            self.close_file()
        }
    }

    /// With the last handle to the open journal, closes redb too and reports
    /// its error (it syncs its allocator state and marks the file closed). A background
    /// compactor that still holds the journal closes it when it stops.
    fn close_file(&mut self) -> Result<()> {
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            return Ok(());
        };
        // A job still on the checkpoint thread (a poisoned handle's checkpoint, which no
        // close waited for) holds redb: it ends first.
        inner.checkpointer.wait_idle();
        reads::write_lock(&inner.committed).base = None;
        let Some(db) = inner.db.take() else {
            return Ok(());
        };
        // Unshared: a checkpoint's job drops its copy before the checkpoint returns.
        let Ok(mut db) = Arc::try_unwrap(db) else {
            return Ok(());
        };
        let shrink = inner.reclaimed.load(Ordering::SeqCst);
        crate::preflight::guarded("close", || {
            if shrink {
                shrink_before_close(&mut db).map_err(|e| {
                    e.while_doing(
                        "shrink the journal file at close, after reclaiming space",
                        "everything is checkpointed into the file; it stays larger than \
                         the reclaim left it",
                    )
                })?;
            }
            db.close().map_err(|e| {
                Error::from(e).while_doing(
                    "close the journal file",
                    "everything committed is durable, but the file is marked as not closed \
                     cleanly, and the next open recovers it",
                )
            })
        })
    }

    /// Closes the journal: the caller holds its last handle.
    fn close_last(&self) -> Result<()> {
        // Wait for a background compaction pass in flight, and keep new ones from
        // starting, so the file is closed when this returns.
        *lock(&self.inner.gate) = true;
        // Closing checkpoints into redb, which may panic on a damaged file (as every call
        // that reads or writes it may): contain that, so dropping a journal never panics.
        crate::preflight::guarded("close", || self.inner.close())
    }

    /// Runs `f`, turning a panic of redb into [`ErrorKind::Corrupt`]: redb
    /// trusts its pages and may panic on a damaged file. The
    /// handle is then poisoned, as after a failed commit: the engine's own state may be
    /// inconsistent, so writes are refused until the journal is reopened (or repaired).
    fn guard<T>(&self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let mut finished = false;
        let r = crate::preflight::guarded(what, || {
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

    /// Opens a new, empty journal that lives in memory only, with every default: the same
    /// calls, answers and clocks as a file journal, nothing durable (it is gone when its
    /// last handle is dropped). For tests and fuzzers of code that embeds the journal.
    ///
    /// # Errors
    ///
    /// As [`JournalBuilder::open_in_memory`].
    ///
    /// # Example
    ///
    /// ```
    /// use opjournal::{Admission, Intent, Journal, Operation, Outcome};
    ///
    /// let journal = Journal::in_memory()?;
    /// let op = Operation::new("op_1", Intent::from_json("scene.add", &serde_json::json!({}))?);
    /// let Admission::Fresh(claim) = journal.submit(op.clone())? else { unreachable!() };
    /// journal.complete(&claim, Outcome::applied(1, b"ok".to_vec()))?;
    /// assert!(matches!(journal.submit(op)?, Admission::Replay(_)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_memory() -> Result<Journal> {
        JournalBuilder::new().open_in_memory()
    }

    /// The journal file's path (`:memory:` for a journal in memory).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The journal's current time: the clock, never below the persisted high-water mark.
    pub fn now(&self) -> Timestamp {
        self.inner.now()
    }

    /// Submits an operation. Lookup by operation id comes first (a known id is answered
    /// `InProgress`, `Replay`, `Expired` or `InDoubt`); the scope, revision and session
    /// window checks apply only to fresh work. A `Fresh` admission is durable before this
    /// returns.
    ///
    /// # Errors
    ///
    /// Refusals that write nothing: [`ErrorKind::InvalidInput`] (bad id, scope or session),
    /// [`ErrorKind::IntentMismatch`] (the id is recorded with another intent),
    /// [`ErrorKind::StaleBase`], [`ErrorKind::ScopeBusy`], [`ErrorKind::WindowFull`].
    /// Storage errors: [`ErrorKind::Corrupt`], [`ErrorKind::Io`], [`ErrorKind::Poisoned`].
    pub fn submit(&self, op: Operation) -> Result<Admission> {
        let _span = crate::trace_span!(DEBUG, "submit", operation_id = %op.id);
        self.guard("submit", || {
            machine::validate_operation(&op)?;
            // Fast path: a known id is answered from a read snapshot without the writer.
            let known = self.inner.read_with(Some(&op.id), |snap, now| {
                snap.answer_known(&op, now, &self.inner.cache)
            })?;
            if let Some(answer) = known {
                return Ok(answer);
            }
            self.inner.write(move |ctx| machine::submit(ctx, &op))
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
        let _span = crate::trace_span!(DEBUG, "complete", operation_id = %claim.operation_id);
        self.guard("complete", || {
            let claim = claim.clone();
            self.inner
                .write(move |ctx| machine::complete(ctx, &claim, &outcome))
        })
    }

    /// Gives the id back: the work was rejected before any effect. The id becomes unknown
    /// (reusable); its history is kept until the audit retention passes.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::StaleClaim`]; storage errors as for [`Journal::submit`].
    pub fn release(&self, claim: &Claim) -> Result<()> {
        let _span = crate::trace_span!(DEBUG, "release", operation_id = %claim.operation_id);
        self.guard("release", || {
            let claim = claim.clone();
            self.inner.write(move |ctx| machine::release(ctx, &claim))
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
        let _span = crate::trace_span!(DEBUG, "extend_lease", operation_id = %claim.operation_id);
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
                .write(move |ctx| machine::extend_lease(ctx, &claim, by))
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
        let _span = crate::trace_span!(DEBUG, "resolve", operation_id = %operation_id);
        self.guard("resolve", || {
            let id = operation_id.to_string();
            self.inner
                .write(move |ctx| machine::resolve(ctx, &id, &resolution))
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
        let _span = crate::trace_span!(DEBUG, "delivered", operation_id = %operation_id);
        self.guard("delivered", || {
            self.inner
                .lazy_write(operation_id, machine::LazyKind::Delivered)
        })
    }

    /// Records the client's acknowledgement, made by `session` (the caller's session, or
    /// `None` for a caller that has none). Idempotent; an acknowledgement after expiry is
    /// accepted and recorded as late. Durable lazily, like [`Journal::delivered`].
    ///
    /// Only the owner acknowledges: an operation submitted with a session may be
    /// acknowledged only with `Some(that session)`, since an acknowledgement stops the
    /// result being pushed to its owner. An operation submitted without a session may be
    /// acknowledged by any caller.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotOwner`] (another session's result), [`ErrorKind::UnknownOperation`],
    /// [`ErrorKind::InvalidState`] (not terminal): all write nothing. Storage errors as for
    /// [`Journal::submit`].
    ///
    /// # Example
    ///
    /// ```
    /// use opjournal::{Admission, ErrorKind, Intent, Journal, Operation, Outcome};
    /// use serde_json::json;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let journal = Journal::open(dir.path().join("project.opj"))?;
    /// let intent = Intent::from_json("scene.add_light", &json!({"near": "door"}))?;
    /// let op = Operation::new("op_7f3", intent).session("tab-1");
    /// let Admission::Fresh(claim) = journal.submit(op)? else { unreachable!() };
    /// journal.complete(&claim, Outcome::applied(1, b"light-1".to_vec()))?;
    ///
    /// // Another tab may not acknowledge tab-1's result ...
    /// let err = journal.acknowledge("op_7f3", Some("tab-2")).unwrap_err();
    /// assert!(matches!(err.kind(), ErrorKind::NotOwner { .. }), "{err}");
    /// // ... tab-1 may.
    /// journal.acknowledge("op_7f3", Some("tab-1"))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acknowledge(&self, operation_id: &str, session: Option<&str>) -> Result<Receipt> {
        let _span = crate::trace_span!(DEBUG, "acknowledge", operation_id = %operation_id);
        self.guard("acknowledge", || {
            self.inner
                .lazy_write(operation_id, machine::LazyKind::Acknowledged { session })
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
        let _span = crate::trace_span!(DEBUG, "advance_revision", scope = %scope, revision);
        self.guard("advance_revision", || {
            let scope = scope.to_string();
            self.inner
                .write(move |ctx| machine::advance_revision(ctx, &scope, revision))
        })
    }

    /// Makes lazily committed acknowledgements and delivery counts durable now, and waits
    /// for a checkpoint that is committing into the journal file in the background (see
    /// [`JournalBuilder::background_checkpoints`]): on return, nothing this handle started
    /// is still writing to its files.
    ///
    /// # Errors
    ///
    /// Storage errors; [`ErrorKind::Poisoned`], also when the background checkpoint failed.
    pub fn flush(&self) -> Result<()> {
        let _span = crate::trace_span!(DEBUG, "flush");
        self.guard("flush", || {
            self.inner.flush()?;
            self.inner.checkpointer.wait_idle();
            self.inner.check_writable()
        })
    }

    /// The receipt of `operation_id` with every clock applied, or `None` if the id is
    /// unknown (never submitted, released, resolved as not applied, or purged).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn lookup(&self, operation_id: &str) -> Result<Option<Receipt>> {
        let _span = crate::trace_span!(DEBUG, "lookup", operation_id = %operation_id);
        self.guard("lookup", || {
            self.inner.read_with(Some(operation_id), |snap, now| {
                snap.lookup(operation_id, now)
            })
        })
    }

    /// The recorded result of a terminal, unretired operation.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn result(&self, operation_id: &str) -> Result<Option<OpResult>> {
        let _span = crate::trace_span!(DEBUG, "result", operation_id = %operation_id);
        self.guard("result", || {
            self.inner.read_with(Some(operation_id), |snap, now| {
                match snap.effective(operation_id, now)? {
                    Some(rec) => machine::result_of(&snap.tables, &rec),
                    None => Ok(None),
                }
            })
        })
    }

    /// The operation's events, oldest first (all attempts still retained), as this handle
    /// sees them: the committed ones, then the deliveries and acknowledgements it recorded
    /// that are not committed yet ([`Journal::delivered`] is durable lazily), each marked
    /// [`Event::pending`], so that `history` agrees with [`Journal::lookup`].
    /// [`Journal::flush`] commits them now. This read writes nothing.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn history(&self, operation_id: &str) -> Result<Vec<Event>> {
        let _span = crate::trace_span!(DEBUG, "history", operation_id = %operation_id);
        self.guard("history", || {
            self.inner.read_with(Some(operation_id), |snap, _| {
                let mut out = Vec::new();
                for seq in snap.tables.op_event_seqs(operation_id)? {
                    if let Some(ev) = snap.tables.event(seq)? {
                        out.push(Event::from(&ev));
                    }
                }
                out.extend(snap.pending.iter().map(|p| Event {
                    seq: 0,
                    at: p.at,
                    operation_id: Some(p.id.clone()),
                    kind: (&p.kind).into(),
                    pending: true,
                }));
                Ok(out)
            })
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
        let _span = crate::trace_span!(DEBUG, "undelivered", session = %session);
        self.guard("undelivered", || {
            self.inner.read_with(None, |snap, now| {
                let mut out = Vec::new();
                for (_, id) in snap.tables.window_after(session, now.0, usize::MAX)? {
                    if let Some(rec) = snap.effective(&id, now)?
                        && let Some(replay) = machine::replay_of(&snap.tables, &rec)?
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
        })
    }

    /// Results whose next push is due, earliest first, at most `limit`. Exhausted and
    /// expired deliveries are not returned. Record each push with [`Journal::delivered`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn due_redeliveries(&self, limit: usize) -> Result<Vec<Replay>> {
        let _span = crate::trace_span!(DEBUG, "due_redeliveries", limit);
        self.guard("due_redeliveries", || {
            self.inner.read_with(None, |snap, now| {
                let mut out = Vec::new();
                // Entries past their ack deadline may still be indexed until compaction runs;
                // scan past them, but not unboundedly.
                let mut ids: Vec<String> = snap
                    .tables
                    .timers_due(TimerKind::Redeliver, now.0, limit.saturating_mul(4).max(64))?
                    .into_iter()
                    .map(|(_, id)| id.to_string())
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
                        && let Some(replay) = machine::replay_of(&snap.tables, &rec)?
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
                    let key =
                        |r: &Replay| (r.receipt.next_delivery_at, r.receipt.operation_id.clone());
                    key(a).cmp(&key(b))
                });
                out.truncate(limit);
                Ok(out)
            })
        })
    }

    /// Operations in doubt (including `Running` ones whose lease has expired), oldest
    /// lease first. Each needs [`Journal::resolve`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn in_doubt(&self) -> Result<Vec<Receipt>> {
        let _span = crate::trace_span!(DEBUG, "in_doubt");
        self.guard("in_doubt", || {
            self.inner.read_with(None, |snap, now| {
                let mut ids: Vec<String> = Vec::new();
                for (_, id) in snap
                    .tables
                    .timers_due(TimerKind::Lease, now.0, usize::MAX)?
                {
                    ids.push(id.to_string());
                }
                for entry in snap.tables.all::<index::InDoubt>()? {
                    ids.push(entry?.0.to_string());
                }
                let mut out = Vec::new();
                for id in ids {
                    if let Some(r) = snap.lookup(&id, now)?
                        && r.status == crate::ExecutionStatus::InDoubt
                    {
                        out.push(r);
                    }
                }
                out.sort_by_key(|r| r.lease_until);
                Ok(out)
            })
        })
    }

    /// The scope's current revision (0 if never recorded).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Corrupt`], [`ErrorKind::Io`].
    pub fn scope_revision(&self, scope: &str) -> Result<u64> {
        let _span = crate::trace_span!(DEBUG, "scope_revision", scope = %scope);
        self.guard("scope_revision", || {
            self.inner
                .read_with(None, |snap, _| snap.tables.scope_revision(scope))
        })
    }

    /// Fires every due timer now, in bounded batches (one write transaction each).
    ///
    /// The checkpoints that come due during the pass leave the events and results it
    /// purged in the file, hidden from every read, and a pass that crossed one ends with a
    /// checkpoint that removes them all, each table in one pass (a pass over a journal
    /// whose retention passed for most of its history would otherwise rewrite its events
    /// table at every checkpoint). That checkpoint commits on the journal's checkpoint
    /// thread, beside the calls made meanwhile (a journal file; storage with one log commits
    /// it before returning): on return every change of the pass is durable in the log, and
    /// [`Journal::flush`] waits until the journal file holds it too.
    ///
    /// # Errors
    ///
    /// Storage errors; [`ErrorKind::Poisoned`].
    pub fn compact(&self) -> Result<CompactionReport> {
        let _span = crate::trace_span!(DEBUG, "compact");
        self.guard("compact", || crate::journal::compactor::run(&self.inner))
    }

    /// Shrinks the file: redb moves live pages down and truncates the free
    /// space that purges left behind (redb's `Database::compact`, run until it has nothing
    /// more to do). [`Journal::compact`] fires timers but never shrinks the file. Returns the
    /// file size in bytes before and after (0 for a journal that is not a file). Closing the
    /// journal afterwards compacts once more, after its own commits, so the closed file stays
    /// that small (redb grows a file without free pages by doubling it).
    ///
    /// It needs the handle to itself (`&mut self`, and no running background compactor),
    /// and with [`Sharing::LiveReaders`](crate::Sharing::LiveReaders) no read transaction open in another process (such
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
        let _span = crate::trace_span!(DEBUG, "reclaim_space");
        self.flush()?;
        if !matches!(self.inner.storage, Storage::File) {
            return Ok((0, 0));
        }
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
        // Everything logged goes into redb first, then redb compacts, which needs no read
        // transaction open: the snapshot goes while it runs and comes back after.
        inner.exclusive(|| inner.checkpoint())?;
        reads::write_lock(&inner.committed).base = None;
        // Unshared: a checkpoint's job drops its copy before the checkpoint returns.
        let db = inner
            .db
            .as_mut()
            .and_then(Arc::get_mut)
            .ok_or_else(|| Error::new(ErrorKind::Closed))?;
        let compacted = (|| -> Result<()> {
            while db.compact()? {}
            Ok(())
        })();
        reads::write_lock(&inner.committed).base = Some(Base::new(db.begin_read()?));
        compacted?;
        inner.reclaimed.store(true, Ordering::SeqCst);
        Ok((before, size(&inner.path)))
    }

    /// Starts a background thread that runs [`Journal::compact`] (and makes lazy writes
    /// durable) every `interval`. Dropping the handle stops and joins it, so keep it; failed
    /// passes are counted and kept on the handle ([`CompactorHandle::last_error`]).
    #[must_use = "the compactor stops when its handle is dropped: keep the handle while it should run"]
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
        let _span = crate::trace_span!(DEBUG, "stats");
        self.guard("stats", || {
            let mut stats = self.inner.read_with(None, |snap, now| {
                // Pending deliveries and acknowledgements count as they will be committed.
                crate::machine::stats::collect(&snap.tables, now, |rec| snap.overlaid(rec, now))
            })?;
            // A journal in memory or in a database has no files of its own: a file that
            // happens to carry its display name is not it.
            let on_file = matches!(self.inner.storage, Storage::File);
            let size = |p: &Path| {
                if on_file {
                    std::fs::metadata(p).map_or(0, |m| m.len())
                } else {
                    0
                }
            };
            stats.file_bytes = size(&self.inner.path);
            let (bytes, entries, hits, misses) = lock(&self.inner.cache).figures();
            stats.replay_cache = crate::machine::stats::ReplayCacheStats {
                bytes: bytes as u64,
                entries: entries as u64,
                hits,
                misses,
            };
            stats.log_bytes = crate::log::FileLog::paths_for(&self.inner.path)
                .iter()
                .map(|p| size(p))
                .sum();
            Ok(stats)
        })
    }

    /// Copies the journal, as this handle has committed it, into a new journal file at
    /// `dest`: one closed file without a log, that [`Journal::open`] and
    /// [`verify`](crate::verify) accept (see [`backup`](crate::backup), for a journal that
    /// another process has open). Writers are not held up while it copies: the copy is
    /// of the last commit when it began. Deliveries and acknowledgements not yet committed
    /// (they are durable lazily) are not in it: call [`Journal::flush`] first to include
    /// them. The report's `access` is [`Access::Live`](crate::Access::Live).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`] if `dest` exists (nothing is written);
    /// [`ErrorKind::Io`], [`ErrorKind::Storage`] writing the copy (nothing is left at
    /// `dest`); [`ErrorKind::Corrupt`] for a damaged index page of this journal.
    pub fn backup(&self, dest: impl AsRef<Path>) -> Result<crate::BackupReport> {
        let _span = crate::trace_span!(DEBUG, "backup");
        let dest = dest.as_ref();
        self.guard("backup", || {
            // A read transaction taken now sees the last checkpoint, or a checkpoint being
            // installed, which holds exactly the memtables' changes: laid over it again,
            // they change nothing. The memtables are bounded by the checkpoint size.
            let (base, mem) = {
                let committed = reads::read_lock(&self.inner.committed);
                let base = match (&self.inner.storage, &self.inner.db) {
                    (Storage::File, Some(db)) => Some(index::Base::new(db.begin_read()?)),
                    (Storage::File, None) => return Err(Error::new(ErrorKind::Closed)),
                    // In memory, the memtable is everything.
                    (Storage::Memory, _) => None,
                    // One snapshot of the database: the copy is of one moment.
                    #[cfg(feature = "postgres")]
                    (Storage::Postgres(pg), _) => {
                        Some(index::Base::store(std::sync::Arc::new(pg.read()?.0)))
                    }
                };
                (base, (committed.mem.clone(), committed.frozen.clone()))
            };
            let (mem, frozen) = mem;
            let snap = index::Snapshot {
                base: base.as_ref(),
                layers: match &frozen {
                    Some(frozen) => index::Layers::new(&[&mem, frozen]),
                    None => index::Layers::new(&[&mem]),
                },
            };
            let mut report = crate::transfer::backup_snapshot(&snap, dest)?;
            report.access = crate::Access::Live;
            Ok(report)
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
        let _span = crate::trace_span!(DEBUG, "event_count");
        self.guard("event_count", || {
            self.inner
                .read_with(None, |snap, _| snap.tables.count::<index::Events>())
        })
    }
}
