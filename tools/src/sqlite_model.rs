//! The opjournal protocol implemented on SQLite, as a baseline for the benchmarks.
//!
//! This is what a careful engineer would build on SQLite to get the same guarantees as
//! opjournal (DESIGN.md §3–§7), with the same durability points: `journal_mode=WAL` and
//! `synchronous=FULL`, every `submit` and `complete` durable before it returns, the
//! acknowledgement lazily durable (a crash can lose it, which only causes a harmless
//! redelivery: the contract of redb's `Durability::None`, which opjournal uses for it).
//!
//! - `submit` checks by operation id first (a known id answers at once, an intent mismatch
//!   is refused), then the scope's revision and lock holder (stale base, scope busy), the
//!   session window count, and writes the receipt, a `submitted` event and the scope lock.
//! - `complete` checks the claim (the epoch fences an older attempt) and that the revision
//!   moves forward, and writes a `completed` event, the result, the receipt and the scope.
//! - `acknowledge` marks the receipt acknowledged, with an `acknowledged` event.
//!
//! A benchmark against a weak SQLite would measure nothing, so [`SqlConfig`] offers what a
//! competent user would try, and the benchmark compares opjournal with the best
//! arrangement measured for each figure:
//!
//! - [`Writers`]: a connection per thread that waits in SQLite's busy handler, the same
//!   behind a process-wide mutex, or one writer thread with group commit.
//! - [`Acks`]: an acknowledgement in its own commit without a sync, or queued in memory and
//!   written inside the next durable transaction (what opjournal does).
//! - [`Cache`]: SQLite's default page cache, or a cache and a memory map sized like
//!   opjournal's page cache.
//! - [`Reads`]: a read transaction per lookup, or one kept open until the next commit
//!   (what opjournal does).
//!
//! Every write, whichever the arrangement, is one `BEGIN IMMEDIATE` … `COMMIT` transaction
//! holding the queued acknowledgements and one or more requests, each request in its own
//! `SAVEPOINT`: a refused request (intent mismatch, stale base, scope busy, window full,
//! stale claim) is rolled back to its savepoint and leaves the others in the transaction
//! alone.
//!
//! The schema mirrors opjournal's tables: an append-only `events` table with an index by
//! operation id (opjournal's `events` and `op_events`), `receipts` (the index by id, with
//! partial indexes standing in for opjournal's `timers` and `windows`), `results` stored
//! once, and `scopes`. Tables keyed by text are `WITHOUT ROWID`, SQLite's best layout for
//! lookups by key. The result lives in its own table and a lookup reads it with a JOIN:
//! storing the 1 KiB result in the receipt row was measured and is worse, because the row
//! then exceeds what SQLite keeps in a b-tree cell (about 1,000 bytes with 4 KiB pages), so
//! every receipt spills into an overflow page of its own: 468 MB instead of 148 MB for
//! 100,000 receipts, and 11–14 µs instead of 8 µs per lookup with the tuned cache.

use std::cell::Cell;
use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

/// The error type of this module.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
/// The result type of this module.
pub type Result<T> = std::result::Result<T, Error>;

const LEASE_MS: u64 = 5 * 60 * 1000;
const ACK_TIMEOUT_MS: u64 = 15 * 60 * 1000;
const RESULT_RETENTION_MS: u64 = 7 * 24 * 3600 * 1000;
const AUDIT_RETENTION_MS: u64 = 90 * 24 * 3600 * 1000;
const SESSION_WINDOW: i64 = 64;

const STATUS_RUNNING: i64 = 1;
const STATUS_APPLIED: i64 = 2;

const DELIVERY_PENDING: i64 = 0;
const DELIVERY_ACKED: i64 = 2;

const EV_SUBMITTED: i64 = 1;
const EV_COMPLETED: i64 = 2;
const EV_ACKNOWLEDGED: i64 = 3;

/// opjournal's default bound on its page cache (1 GiB), which the tuned page cache
/// (`PRAGMA cache_size`, negative: in KiB) and memory map (`PRAGMA mmap_size`) match.
const TUNED_CACHE_KIB: i64 = 1024 * 1024;
const TUNED_MMAP_BYTES: i64 = 1 << 30;

/// Queued acknowledgements are committed on their own once this many wait, or once the
/// oldest has waited this long while more arrive: opjournal's bounds for the same queue.
const ACK_QUEUE_MAX_ENTRIES: usize = 256;
const ACK_QUEUE_MAX_DELAY: Duration = Duration::from_millis(200);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS events(
    seq INTEGER PRIMARY KEY,
    op_id TEXT,
    at INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_op ON events(op_id, seq);
CREATE TABLE IF NOT EXISTS receipts(
    op_id TEXT PRIMARY KEY,
    attempt INTEGER NOT NULL,
    intent_name TEXT NOT NULL,
    intent_hash BLOB NOT NULL,
    scope TEXT,
    session TEXT,
    base_rev INTEGER,
    result_rev INTEGER,
    status INTEGER NOT NULL,
    delivery INTEGER,
    delivery_count INTEGER NOT NULL DEFAULT 0,
    epoch INTEGER NOT NULL,
    submitted_at INTEGER NOT NULL,
    lease_until INTEGER,
    completed_at INTEGER,
    acked_at INTEGER,
    ack_deadline INTEGER,
    retain_until INTEGER,
    purge_at INTEGER,
    result_seq INTEGER,
    result_size INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS receipts_lease ON receipts(lease_until) WHERE status = 1;
CREATE INDEX IF NOT EXISTS receipts_window ON receipts(session, ack_deadline) WHERE delivery IN (0, 1);
CREATE INDEX IF NOT EXISTS receipts_retain ON receipts(retain_until) WHERE result_seq IS NOT NULL;
CREATE INDEX IF NOT EXISTS receipts_purge ON receipts(purge_at);
CREATE TABLE IF NOT EXISTS results(
    seq INTEGER PRIMARY KEY,
    op_id TEXT NOT NULL,
    bytes BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS scopes(
    scope TEXT PRIMARY KEY,
    revision INTEGER NOT NULL,
    holder TEXT,
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;
";

// ---------------------------------------------------------------------------------------
// The arrangements
// ---------------------------------------------------------------------------------------

/// How write transactions reach the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writers {
    /// Each thread writes on its own connection. Threads that find the write lock taken
    /// wait in SQLite's busy handler, which sleeps 1, 2, 5, 10, … up to 100 ms between
    /// attempts: the naive arrangement, kept to show what it costs.
    Connections,
    /// Each thread writes on its own connection, but a process-wide mutex serializes the
    /// write transactions, so no thread ever sleeps in the busy handler.
    Mutex,
    /// One writer thread owns the writing connection. Requests come over a channel; the
    /// writer takes everything queued, runs it in one transaction (each request in its own
    /// savepoint) and commits once, one sync for the whole batch, then answers each
    /// requester. Reads stay on the requesters' own connections.
    GroupCommit,
    /// The writer a careful engineer writes for group commit ([`WriterCfg`]): one thread
    /// owns the writing connection and drains every queued request into one `BEGIN
    /// IMMEDIATE` transaction, with no savepoints (every check of a request runs before its
    /// first write, so a refused request wrote nothing), one `COMMIT` (one sync), then
    /// answers each requester. Queued acknowledgements ride in the next synced commit.
    Writer(WriterCfg),
}

/// The settings of [`Writers::Writer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriterCfg {
    /// At most this many requests in one transaction (0: everything queued). A cap makes
    /// smaller, more frequent commits, which can answer the first requesters sooner.
    pub max_batch: usize,
    /// Who copies the WAL back into the database file.
    pub checkpoints: Checkpoints,
}

/// Who checkpoints the WAL (copies its pages into the database file, so that it can start
/// over).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checkpoints {
    /// SQLite's automatic checkpoint: the connection whose commit takes the WAL past 1,000
    /// pages runs it, inside that commit (so the writer's requesters wait for it).
    Auto,
    /// A thread of its own on its own connection, `PRAGMA wal_checkpoint(PASSIVE)` every
    /// [`BACKGROUND_CHECKPOINT_EVERY`] while the store commits; the writer's automatic
    /// checkpoint is off. A passive checkpoint never blocks the writer.
    Background,
}

/// How often [`Checkpoints::Background`] checkpoints while the store commits.
pub const BACKGROUND_CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// When an acknowledgement is written. Either way it is lazily durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acks {
    /// In a transaction of its own, committed with `synchronous=OFF`: visible at once, its
    /// WAL frames written but not synced; the next `synchronous=FULL` commit syncs the WAL
    /// and the ack with it. The setting is toggled on the same connection for that one
    /// commit, rather than using a second connection, because a connection drops its page
    /// cache when another one wrote to the WAL.
    OwnCommit,
    /// Validated at once, queued in memory (shared by the store's connections, and seen
    /// by its lookups), and written inside the next durable transaction, whoever commits
    /// it. As opjournal does: no transaction of its own at all.
    NextCommit,
    /// Queued as [`Acks::NextCommit`], validated without a read: the store remembers the
    /// ids it completed whose acknowledgement it has not taken (inserted when their
    /// `complete` commits, removed when acknowledged), and reads the receipt only for an
    /// id it does not remember (completed before the store opened). The same answers as
    /// [`Acks::NextCommit`]; what opjournal does with its own state in memory. (A
    /// completed operation never acknowledged stays in the set until the store closes.)
    Remembered,
}

/// The page cache and memory map of every connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cache {
    /// SQLite's defaults: a 2 MiB page cache per connection, no memory map.
    Default,
    /// Sized like opjournal's page cache: a page cache bounded at 1 GiB and the file
    /// memory-mapped up to 1 GiB (reads then copy nothing through `pread`).
    Tuned,
}

/// How lookups get their read transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reads {
    /// Each lookup runs in its own implicit read transaction (autocommit).
    PerLookup,
    /// A read transaction stays open on the connection until this store commits again, so
    /// lookups between two commits share one snapshot, as opjournal's reads share the read
    /// transaction of the latest commit. Sound because the store is the file's only writer,
    /// as opjournal is its file's only writer.
    HeldSnapshot,
}

/// One arrangement of the SQLite journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqlConfig {
    /// How writes reach the file.
    pub writers: Writers,
    /// When acknowledgements are written.
    pub acks: Acks,
    /// Page cache and memory map.
    pub cache: Cache,
    /// Read transactions of lookups.
    pub reads: Reads,
}

impl SqlConfig {
    /// Whether each request of a write transaction runs in its own savepoint: in every
    /// arrangement but [`Writers::Writer`], which checks before it writes instead.
    pub fn savepoints(&self) -> bool {
        !matches!(self.writers, Writers::Writer(_))
    }
}

// ---------------------------------------------------------------------------------------
// Protocol values
// ---------------------------------------------------------------------------------------

/// The right to complete one operation (as opjournal's `Claim`).
#[derive(Clone, Debug)]
pub struct SqlClaim {
    /// The operation id.
    pub op_id: String,
    /// The epoch: the seq of the `submitted` event.
    pub epoch: i64,
    /// The scope, if any.
    pub scope: Option<String>,
}

/// A recorded receipt with its result, as read by [`SqlJournal::lookup_replay`].
#[derive(Clone, Debug)]
pub struct SqlReplay {
    /// The operation id.
    pub op_id: String,
    /// The attempt.
    pub attempt: i64,
    /// The intent name.
    pub intent_name: String,
    /// The scope.
    pub scope: Option<String>,
    /// The session.
    pub session: Option<String>,
    /// The base revision.
    pub base_rev: Option<i64>,
    /// The result revision.
    pub result_rev: Option<i64>,
    /// The delivery state.
    pub delivery: Option<i64>,
    /// The delivery count.
    pub delivery_count: i64,
    /// The epoch.
    pub epoch: i64,
    /// Timestamps: submitted, completed, acknowledged.
    pub times: [Option<i64>; 3],
    /// The result payload.
    pub result: Vec<u8>,
    /// Always true.
    pub replayed: bool,
}

/// What `submit` answers.
#[derive(Debug)]
pub enum SqlAdmission {
    /// Unknown id: execute, then complete.
    Fresh(SqlClaim),
    /// The outcome is recorded: replay it.
    Replay(Box<SqlReplay>),
    /// Another state (running, expired, ...), named.
    Other(&'static str),
}

/// An operation as submitted. Owned, because the group-commit writer runs it on another
/// thread (opjournal's `Operation` is owned too).
#[derive(Clone, Debug)]
pub struct SqlOp {
    /// The operation id.
    pub id: String,
    /// The intent name.
    pub intent_name: String,
    /// The intent hash.
    pub intent_hash: [u8; 32],
    /// The scope.
    pub scope: Option<String>,
    /// The base revision.
    pub base_rev: Option<u64>,
    /// The session.
    pub session: Option<String>,
}

/// Counts of the receipts, for the benchmark's self-check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SqlCounts {
    /// Receipts (operations).
    pub operations: u64,
    /// Applied operations.
    pub applied: u64,
    /// Acknowledged results.
    pub acknowledged: u64,
}

fn now_ms(offset: Duration) -> i64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        + offset;
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs one statement without results through the connection's statement cache (rusqlite's
/// own transaction helpers compile `BEGIN`, `SAVEPOINT` and `RELEASE` anew every time).
fn exec(conn: &Connection, sql: &str) -> Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Writes: jobs, and the one transaction shape every arrangement commits them with
// ---------------------------------------------------------------------------------------

/// A write, with the time it was asked at.
struct Job {
    now: i64,
    work: Work,
}

enum Work {
    Submit(SqlOp),
    Complete {
        claim: SqlClaim,
        result_rev: u64,
        bytes: Vec<u8>,
    },
    /// An acknowledgement written by itself ([`Acks::OwnCommit`]).
    Acknowledge(String),
    /// Nothing: commits the queued acknowledgements.
    Flush,
    /// Deletes at most this many operations past audit retention, this way.
    Purge(usize, PurgeWay),
}

/// How a purge's statements are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PurgeWay {
    /// The due ids read first (in `purge_at` order), then three prepared `DELETE`s per
    /// operation.
    PerOperation,
    /// [`Self::PerOperation`] with the due ids read in key order: the receipts' and the
    /// events' index pages are then visited in order.
    PerOperationInKeyOrder,
    /// Three set-based `DELETE ... WHERE ... IN (SELECT <the due ids>)`, one per table.
    SetBased,
}

enum Done {
    Admission(SqlAdmission),
    Written,
    Purged(u64),
}

impl Job {
    /// Whether the caller needs the job durable before it returns: every write but the
    /// acknowledgement.
    fn durable(&self) -> bool {
        !matches!(self.work, Work::Acknowledge(_))
    }

    fn run(&self, conn: &Connection) -> Result<Done> {
        let now = self.now;
        Ok(match &self.work {
            Work::Submit(op) => Done::Admission(submit_in(conn, op, now)?),
            Work::Complete {
                claim,
                result_rev,
                bytes,
            } => {
                complete_in(conn, claim, *result_rev, bytes, now)?;
                Done::Written
            }
            Work::Acknowledge(id) => {
                acknowledge_in(conn, id, now)?;
                Done::Written
            }
            Work::Flush => Done::Written,
            Work::Purge(limit, way) => Done::Purged(purge_in(conn, now, *limit, *way)?),
        })
    }
}

/// Acknowledgements validated but not written yet ([`Acks::NextCommit`]).
#[derive(Default)]
struct AckQueue {
    /// Oldest first. An entry leaves only after the commit that wrote it, so a lookup
    /// finds it either here or in the file.
    entries: VecDeque<QueuedAck>,
    next_seq: u64,
}

struct QueuedAck {
    seq: u64,
    op_id: String,
    /// The time of the acknowledgement (the protocol's clock).
    at: i64,
    /// When it was queued (for the queue's bound on waiting).
    queued: Instant,
}

/// What the connections of one store and its group-commit writer share.
#[derive(Default)]
struct Common {
    acks: Mutex<AckQueue>,
    /// Serializes write transactions ([`Writers::Mutex`]).
    write_lock: Mutex<()>,
    /// Commits made by this store so far: a held snapshot ([`Reads::HeldSnapshot`]) is
    /// current while this has not moved since it began.
    commits: AtomicU64,
    /// [`Acks::Remembered`]: the ids this store completed (committed) whose
    /// acknowledgement it has not taken yet. `None` in the other arrangements.
    completed: Option<Mutex<HashSet<String>>>,
}

impl Common {
    /// Queues an acknowledgement; returns whether the queue is due to be committed.
    fn queue_ack(&self, op_id: &str, now: i64) -> bool {
        let mut q = lock(&self.acks);
        if !q.entries.iter().any(|e| e.op_id == op_id) {
            let seq = q.next_seq;
            q.next_seq += 1;
            q.entries.push_back(QueuedAck {
                seq,
                op_id: op_id.to_string(),
                at: now,
                queued: Instant::now(),
            });
        }
        q.entries.len() >= ACK_QUEUE_MAX_ENTRIES
            || q.entries
                .front()
                .is_some_and(|e| e.queued.elapsed() >= ACK_QUEUE_MAX_DELAY)
    }

    /// The time of the queued acknowledgement of `op_id`, if one waits.
    fn queued_ack(&self, op_id: &str) -> Option<i64> {
        let q = lock(&self.acks);
        q.entries.iter().find(|e| e.op_id == op_id).map(|e| e.at)
    }

    fn has_queued_acks(&self) -> bool {
        !lock(&self.acks).entries.is_empty()
    }

    /// A copy of the queue, and the sequence number of its last entry.
    fn queued_acks(&self) -> (Vec<(String, i64)>, Option<u64>) {
        let q = lock(&self.acks);
        let last = q.entries.back().map(|e| e.seq);
        (
            q.entries.iter().map(|e| (e.op_id.clone(), e.at)).collect(),
            last,
        )
    }

    /// A transaction that wrote the queue up to `last` committed.
    fn committed(&self, last: Option<u64>) {
        self.commits.fetch_add(1, Ordering::SeqCst);
        if let Some(last) = last {
            let mut q = lock(&self.acks);
            // By sequence number, not by count: with `Writers::Connections` another
            // connection may have committed the same entries again in the meantime
            // (harmlessly: an acknowledgement is idempotent) and removed them already.
            q.entries.retain(|e| e.seq > last);
        }
    }
}

/// How one request runs inside a write transaction: the outer error is a failure of the
/// transaction itself, the inner one the request's answer (a refusal).
///
/// With `savepoints`, in its own savepoint, rolled back to it when refused. Without, as the
/// dedicated writer runs it: every check of a request runs before its first write, so a
/// refused request changed nothing (SQLite's count of changed rows says so) and the
/// transaction goes on; a request that failed after writing fails the whole transaction.
fn run_request<T>(
    conn: &Connection,
    savepoints: bool,
    f: impl FnOnce() -> Result<T>,
) -> Result<Result<T>> {
    if !savepoints {
        let before = conn.total_changes();
        return match f() {
            Ok(v) => Ok(Ok(v)),
            Err(e) if conn.total_changes() == before => Ok(Err(e)),
            Err(e) => Err(format!("a request failed after writing: {e}").into()),
        };
    }
    exec(conn, "SAVEPOINT job")?;
    let out = f();
    if out.is_err() {
        exec(conn, "ROLLBACK TO job")?;
    }
    exec(conn, "RELEASE job")?;
    Ok(out)
}

/// One write transaction: the queued acknowledgements, then each job, then one `COMMIT`.
/// Every arrangement commits through here, with one job (a connection per thread, the
/// mutex) or with everything queued (group commit, the writer). Returns each job's answer;
/// an error is a failure of the whole transaction.
fn commit_batch(
    conn: &Connection,
    common: &Common,
    savepoints: bool,
    jobs: &[Job],
) -> Result<Vec<Result<Done>>> {
    // Acknowledgements alone are lazily durable: committed without a sync, which the next
    // synced commit provides (see `Acks::OwnCommit`).
    let lazy = !jobs.iter().any(Job::durable);
    if lazy {
        exec(conn, "PRAGMA synchronous=OFF")?;
    }
    let out = transaction(conn, common, savepoints, jobs);
    if lazy {
        exec(conn, "PRAGMA synchronous=FULL")?;
    }
    out
}

fn transaction(
    conn: &Connection,
    common: &Common,
    savepoints: bool,
    jobs: &[Job],
) -> Result<Vec<Result<Done>>> {
    exec(conn, "BEGIN IMMEDIATE")?;
    let body = || -> Result<(Vec<Result<Done>>, Option<u64>)> {
        // Queued acknowledgements first, so that the requests see them (the session
        // window counts unacknowledged results).
        let (acks, last) = common.queued_acks();
        for (id, at) in &acks {
            // Validated when queued: one that fails now lost its operation to a purge in
            // the meantime, and is moot.
            let _moot = run_request(conn, savepoints, || acknowledge_in(conn, id, *at))?;
        }
        let answers = jobs
            .iter()
            .map(|j| run_request(conn, savepoints, || j.run(conn)))
            .collect::<Result<Vec<_>>>()?;
        exec(conn, "COMMIT")?;
        Ok((answers, last))
    };
    match body() {
        Ok((answers, last)) => {
            common.committed(last);
            if let Some(completed) = &common.completed {
                let mut completed = lock(completed);
                for (job, answer) in jobs.iter().zip(&answers) {
                    if let (Work::Complete { claim, .. }, Ok(_)) = (&job.work, answer) {
                        completed.insert(claim.op_id.clone());
                    }
                }
            }
            Ok(answers)
        }
        Err(e) => {
            // The queued acknowledgements stay queued for the next transaction.
            let _ = exec(conn, "ROLLBACK");
            Err(e)
        }
    }
}

// ---------------------------------------------------------------------------------------
// The group-commit writer
// ---------------------------------------------------------------------------------------

struct Request {
    job: Job,
    reply: mpsc::Sender<Result<Done>>,
}

/// What the checkpointer thread is told: to stop, or to checkpoint now ([`SqlStore::settle`]).
#[derive(Default)]
struct Orders {
    stop: bool,
    /// Checkpoints asked for now, and how many of those it has run.
    asked: u64,
    done: u64,
}

/// The checkpointer's orders, notified when they change (either way).
type OrdersSignal = (Mutex<Orders>, Condvar);

/// How the writer thread batches: [`Writers::GroupCommit`] or [`Writers::Writer`].
#[derive(Clone, Copy)]
struct Batching {
    savepoints: bool,
    max_batch: usize,
}

/// The writer thread of [`Writers::GroupCommit`] and [`Writers::Writer`] (and the
/// checkpointer of [`Checkpoints::Background`]); dropping this stops them.
struct GroupWriter {
    requests: Option<mpsc::Sender<Request>>,
    thread: Option<JoinHandle<()>>,
    checkpointer: Option<(Arc<OrdersSignal>, JoinHandle<()>)>,
}

impl GroupWriter {
    fn spawn(
        conn: Connection,
        common: Arc<Common>,
        batching: Batching,
        checkpointer: Option<Connection>,
    ) -> Result<GroupWriter> {
        let (tx, rx) = mpsc::channel();
        let checkpointer = match checkpointer {
            Some(ck) => {
                let signal = Arc::new((Mutex::new(Orders::default()), Condvar::new()));
                let (signal2, common2) = (signal.clone(), common.clone());
                let h = std::thread::Builder::new()
                    .name("sqlite-checkpointer".into())
                    .spawn(move || background_checkpoints(&ck, &common2, &signal2))?;
                Some((signal, h))
            }
            None => None,
        };
        let thread = std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || group_writer(&conn, &common, batching, &rx))?;
        Ok(GroupWriter {
            requests: Some(tx),
            thread: Some(thread),
            checkpointer,
        })
    }
}

impl Drop for GroupWriter {
    fn drop(&mut self) {
        // Closing the channel ends the writer's loop.
        self.requests.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some((signal, t)) = self.checkpointer.take() {
            lock(&signal.0).stop = true;
            signal.1.notify_all();
            let _ = t.join();
        }
    }
}

fn group_writer(
    conn: &Connection,
    common: &Common,
    batching: Batching,
    rx: &mpsc::Receiver<Request>,
) {
    let max = if batching.max_batch == 0 {
        usize::MAX
    } else {
        batching.max_batch
    };
    // Requests pile up while a batch syncs: the next batch takes all of them (up to the
    // cap), so one sync serves every requester that arrived in the meantime.
    while let Ok(first) = rx.recv() {
        let (jobs, replies): (Vec<Job>, Vec<_>) = std::iter::once(first)
            .chain(rx.try_iter().take(max - 1))
            .map(|r| (r.job, r.reply))
            .unzip();
        match commit_batch(conn, common, batching.savepoints, &jobs) {
            Ok(answers) => {
                for (answer, reply) in answers.into_iter().zip(replies) {
                    // A requester that went away needs no answer.
                    let _ = reply.send(answer);
                }
            }
            Err(e) => {
                let e = e.to_string();
                for reply in replies {
                    let _ = reply.send(Err(format!("group commit failed: {e}").into()));
                }
            }
        }
    }
    if common.has_queued_acks() {
        let flush = Job {
            now: now_ms(Duration::ZERO),
            work: Work::Flush,
        };
        let _ = commit_batch(
            conn,
            common,
            batching.savepoints,
            std::slice::from_ref(&flush),
        );
    }
}

/// [`Checkpoints::Background`]: a passive checkpoint every
/// [`BACKGROUND_CHECKPOINT_EVERY`] while the store commits, until told to stop.
/// A checkpoint asked for ([`SqlStore::settle`]) runs at once, and its asker is told when
/// it has ended.
fn background_checkpoints(conn: &Connection, common: &Common, signal: &OrdersSignal) {
    let mut seen = common.commits.load(Ordering::SeqCst);
    let mut orders = lock(&signal.0);
    while !orders.stop {
        if orders.asked == orders.done {
            orders = signal
                .1
                .wait_timeout(orders, BACKGROUND_CHECKPOINT_EVERY)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let now = common.commits.load(Ordering::SeqCst);
        if now != seen && !orders.stop {
            seen = now;
            // A failure (the file busy) only leaves the WAL longer until the next one.
            let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        }
        if orders.asked != orders.done {
            orders.done = orders.asked;
            signal.1.notify_all();
        }
    }
}

// ---------------------------------------------------------------------------------------
// The store and its connections
// ---------------------------------------------------------------------------------------

/// Opens a connection: WAL, `synchronous=FULL`, a busy timeout, and the cache arrangement.
fn open_conn(path: &Path, cache: Cache) -> Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(30))?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!("sqlite refused WAL mode (got `{mode}`)").into());
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.set_prepared_statement_cache_capacity(64);
    if cache == Cache::Tuned {
        conn.pragma_update(None, "cache_size", -TUNED_CACHE_KIB)?;
        conn.pragma_update(None, "mmap_size", TUNED_MMAP_BYTES)?;
    }
    Ok(conn)
}

struct Shared {
    path: PathBuf,
    cfg: SqlConfig,
    common: Arc<Common>,
    /// The connection that created the schema, handed to the first `connect` (so that a
    /// store with one user opens one connection, as an application would).
    spare: Mutex<Option<Connection>>,
    writer: Option<GroupWriter>,
}

impl Shared {
    /// See [`SqlStore::settle`]. The checkpointer thread lives as long as `self`, so the
    /// wait ends.
    fn settle(&self) {
        let Some((orders, _)) = self.writer.as_ref().and_then(|w| w.checkpointer.as_ref()) else {
            return;
        };
        let mut o = lock(&orders.0);
        o.asked += 1;
        let want = o.asked;
        orders.1.notify_all();
        while o.done < want {
            o = orders.1.wait(o).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// One SQLite journal file and its arrangement, shared by the threads of this process:
/// each thread takes its own connection with [`SqlStore::connect`]. Open one store per
/// file: the queued acknowledgements, the write mutex and the writer thread belong to it.
#[derive(Clone)]
pub struct SqlStore {
    shared: Arc<Shared>,
}

impl SqlStore {
    /// Opens (creating if missing) the journal at `path` and creates the schema; starts the
    /// writer thread for [`Writers::GroupCommit`] and [`Writers::Writer`] (and the
    /// checkpointer of [`Checkpoints::Background`]).
    pub fn open(path: &Path, cfg: SqlConfig) -> Result<SqlStore> {
        let conn = open_conn(path, cfg.cache)?;
        conn.execute_batch(SCHEMA)?;
        let common = Arc::new(Common {
            completed: (cfg.acks == Acks::Remembered).then(Mutex::default),
            ..Common::default()
        });
        let group = |max_batch: usize| Batching {
            savepoints: cfg.savepoints(),
            max_batch,
        };
        let (spare, writer) = match cfg.writers {
            Writers::GroupCommit => {
                let w = GroupWriter::spawn(conn, common.clone(), group(0), None)?;
                (None, Some(w))
            }
            Writers::Writer(w) => {
                let checkpointer = match w.checkpoints {
                    Checkpoints::Auto => None,
                    Checkpoints::Background => {
                        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
                        Some(open_conn(path, Cache::Default)?)
                    }
                };
                let w = GroupWriter::spawn(conn, common.clone(), group(w.max_batch), checkpointer)?;
                (None, Some(w))
            }
            Writers::Connections | Writers::Mutex => (Some(conn), None),
        };
        Ok(SqlStore {
            shared: Arc::new(Shared {
                path: path.to_path_buf(),
                cfg,
                common,
                spare: Mutex::new(spare),
                writer,
            }),
        })
    }

    /// Runs the background checkpoint of what is committed now, if this arrangement has a
    /// checkpointer thread ([`Checkpoints::Background`]), and waits for it: so that a
    /// measurement counts this store's background writes in its own time, not in the next
    /// engine's (opjournal's counterpart: `Journal::flush`).
    pub fn settle(&self) {
        self.shared.settle();
    }

    /// The arrangement.
    pub fn config(&self) -> SqlConfig {
        self.shared.cfg
    }

    /// A connection for the calling thread.
    pub fn connect(&self) -> Result<SqlJournal> {
        let spare = lock(&self.shared.spare).take();
        let conn = match spare {
            Some(c) => c,
            None => open_conn(&self.shared.path, self.shared.cfg.cache)?,
        };
        Ok(SqlJournal {
            conn,
            shared: self.shared.clone(),
            replies: mpsc::channel(),
            snapshot: Cell::new(None),
            clock_offset: Duration::ZERO,
        })
    }
}

/// One thread's connection to a [`SqlStore`]. Not `Sync`: take one per thread.
pub struct SqlJournal {
    conn: Connection,
    shared: Arc<Shared>,
    /// Where the group-commit writer answers this connection's requests.
    replies: (mpsc::Sender<Result<Done>>, mpsc::Receiver<Result<Done>>),
    /// With [`Reads::HeldSnapshot`], the store's commit count when the read transaction
    /// open on this connection began.
    snapshot: Cell<Option<u64>>,
    /// Added to the system clock (to simulate time passing).
    pub clock_offset: Duration,
}

impl SqlJournal {
    /// [`SqlStore::settle`] for this connection's store.
    pub fn settle(&self) {
        self.shared.settle();
    }

    fn now(&self) -> i64 {
        now_ms(self.clock_offset)
    }

    /// `submit`: durable before it returns.
    pub fn submit(&mut self, op: SqlOp) -> Result<SqlAdmission> {
        match self.write(Work::Submit(op))? {
            Done::Admission(a) => Ok(a),
            _ => Err("submit: unexpected answer".into()),
        }
    }

    /// `complete(applied)`: durable before it returns.
    pub fn complete(&mut self, claim: &SqlClaim, result_rev: u64, bytes: &[u8]) -> Result<()> {
        self.write(Work::Complete {
            claim: claim.clone(),
            result_rev,
            bytes: bytes.to_vec(),
        })
        .map(drop)
    }

    /// `acknowledge`: lazily durable, as the arrangement's [`Acks`] says.
    pub fn acknowledge(&mut self, op_id: &str) -> Result<()> {
        match self.shared.cfg.acks {
            Acks::OwnCommit => self.write(Work::Acknowledge(op_id.to_string())).map(drop),
            Acks::Remembered
                if self
                    .shared
                    .common
                    .completed
                    .as_ref()
                    .is_some_and(|c| lock(c).remove(op_id)) =>
            {
                if self.shared.common.queue_ack(op_id, self.now()) {
                    self.flush()?;
                }
                Ok(())
            }
            Acks::NextCommit | Acks::Remembered => {
                // Validated now, as opjournal does: an unknown id fails here, not in
                // somebody else's commit later.
                let now = self.now();
                let delivery = self.read(|c| delivery_of(c, op_id))?;
                match delivery {
                    None | Some(None) => Err(format!("cannot acknowledge `{op_id}`").into()),
                    Some(Some(DELIVERY_ACKED)) => Ok(()),
                    Some(Some(_)) => {
                        if self.shared.common.queue_ack(op_id, now) {
                            self.flush()?;
                        }
                        Ok(())
                    }
                }
            }
        }
    }

    /// Commits the queued acknowledgements now (a durable transaction of their own).
    pub fn flush(&mut self) -> Result<()> {
        if self.shared.common.has_queued_acks() {
            self.write(Work::Flush)?;
        }
        Ok(())
    }

    /// Deletes every operation whose audit retention passed, in durable transactions of at
    /// most `batch` operations each (events, result and receipt), with a statement per
    /// operation ([`PurgeWay::PerOperation`]). Returns how many.
    pub fn purge_expired(&mut self, batch: usize) -> Result<u64> {
        self.purge_expired_with(batch, PurgeWay::PerOperation)
    }

    /// [`Self::purge_expired`], the statements written `way`; `usize::MAX` as `batch`
    /// purges everything in one transaction.
    pub fn purge_expired_with(&mut self, batch: usize, way: PurgeWay) -> Result<u64> {
        let mut purged = 0u64;
        loop {
            match self.write(Work::Purge(batch, way))? {
                Done::Purged(0) => return Ok(purged),
                Done::Purged(n) => purged += n,
                _ => return Err("purge: unexpected answer".into()),
            }
        }
    }

    /// One write, committed the arrangement's way.
    fn write(&mut self, work: Work) -> Result<Done> {
        let job = Job {
            now: self.now(),
            work,
        };
        match self.shared.cfg.writers {
            Writers::Connections => self.commit_here(job),
            Writers::Mutex => {
                let _serialized = lock(&self.shared.common.write_lock);
                self.commit_here(job)
            }
            Writers::GroupCommit | Writers::Writer(_) => {
                let stopped = || Error::from("the group-commit writer stopped");
                let writer = self
                    .shared
                    .writer
                    .as_ref()
                    .and_then(|w| w.requests.as_ref());
                writer
                    .ok_or_else(stopped)?
                    .send(Request {
                        job,
                        reply: self.replies.0.clone(),
                    })
                    .map_err(|_| stopped())?;
                self.replies.1.recv().map_err(|_| stopped())?
            }
        }
    }

    /// Commits one job on this thread's own connection.
    fn commit_here(&self, job: Job) -> Result<Done> {
        // A write transaction cannot begin inside the held read transaction.
        self.end_snapshot()?;
        let savepoints = self.shared.cfg.savepoints();
        commit_batch(
            &self.conn,
            &self.shared.common,
            savepoints,
            std::slice::from_ref(&job),
        )?
        .pop()
        .ok_or("no answer for the job")?
    }

    /// Runs a read on this connection, in its own implicit transaction or, with
    /// [`Reads::HeldSnapshot`], in the read transaction held since the store's last commit.
    fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        if self.shared.cfg.reads == Reads::HeldSnapshot {
            // Read before `BEGIN`: a commit that lands in between moves the count past
            // it, so the next read begins afresh (never the other way round).
            let commits = self.shared.common.commits.load(Ordering::SeqCst);
            if self.snapshot.get() != Some(commits) {
                self.end_snapshot()?;
                // Deferred: the snapshot is taken by the first read.
                exec(&self.conn, "BEGIN")?;
                self.snapshot.set(Some(commits));
            }
        }
        f(&self.conn)
    }

    fn end_snapshot(&self) -> Result<()> {
        if self.snapshot.take().is_some() {
            exec(&self.conn, "COMMIT")?;
        }
        Ok(())
    }

    /// Runs `n` whole lifecycles (submit, complete, ack) in one transaction per `batch`:
    /// the same statements, used to build large journals quickly (not measured). Directly
    /// on this connection, whatever the arrangement: run it with no other writer.
    pub fn populate(
        &mut self,
        ops: &[(String, String, String)],
        hash: &[u8; 32],
        payload: &[u8],
        batch: usize,
    ) -> Result<()> {
        self.end_snapshot()?;
        let mut revs: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        for chunk in ops.chunks(batch.max(1)) {
            let now = self.now();
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            for (id, scope, session) in chunk {
                let rev = revs.entry(scope.clone()).or_insert(0);
                let op = SqlOp {
                    id: id.clone(),
                    intent_name: "bench.edit".into(),
                    intent_hash: *hash,
                    scope: Some(scope.clone()),
                    base_rev: Some(*rev),
                    session: Some(session.clone()),
                };
                let SqlAdmission::Fresh(claim) = submit_in(&tx, &op, now)? else {
                    return Err(format!("populate: `{id}` was not fresh").into());
                };
                *rev += 1;
                complete_in(&tx, &claim, *rev, payload, now)?;
                acknowledge_in(&tx, id, now)?;
            }
            tx.commit()?;
            self.shared.common.committed(None);
        }
        Ok(())
    }

    /// The replay path of `submit` for a known id, without a write transaction: one
    /// prepared `SELECT` of the receipt joined with its result, the intent check and the
    /// clocks applied, a queued acknowledgement applied, and the row copied into an owned
    /// value (as opjournal answers).
    pub fn lookup_replay(&self, op_id: &str, intent_hash: &[u8; 32]) -> Result<SqlAdmission> {
        let now = self.now();
        let row = self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT r.attempt, r.intent_name, r.intent_hash, r.scope, r.session, r.base_rev,
                        r.result_rev, r.status, r.delivery, r.delivery_count, r.epoch,
                        r.submitted_at, r.completed_at, r.acked_at, r.retain_until, r.purge_at,
                        res.bytes
                 FROM receipts r LEFT JOIN results res ON res.seq = r.result_seq
                 WHERE r.op_id = ?1",
            )?;
            let row = stmt
                .query_row(params![op_id], |r| {
                    let hash: Vec<u8> = r.get(2)?;
                    let status: i64 = r.get(7)?;
                    let retain_until: Option<i64> = r.get(14)?;
                    let purge_at: Option<i64> = r.get(15)?;
                    let replay = SqlReplay {
                        op_id: op_id.to_string(),
                        attempt: r.get(0)?,
                        intent_name: r.get(1)?,
                        scope: r.get(3)?,
                        session: r.get(4)?,
                        base_rev: r.get(5)?,
                        result_rev: r.get(6)?,
                        delivery: r.get(8)?,
                        delivery_count: r.get(9)?,
                        epoch: r.get(10)?,
                        times: [r.get(11)?, r.get(12)?, r.get(13)?],
                        result: r.get::<_, Option<Vec<u8>>>(16)?.unwrap_or_default(),
                        replayed: true,
                    };
                    Ok((hash, status, retain_until, purge_at, replay))
                })
                .optional()?;
            Ok(row)
        })?;
        let Some((hash, status, retain_until, purge_at, mut replay)) = row else {
            return Ok(SqlAdmission::Other("unknown"));
        };
        if hash.as_slice() != intent_hash.as_slice() {
            return Err(format!("intent mismatch for `{op_id}`").into());
        }
        if purge_at.is_some_and(|p| now >= p) {
            return Ok(SqlAdmission::Other("unknown"));
        }
        if retain_until.is_some_and(|r| now >= r) {
            return Ok(SqlAdmission::Other("expired"));
        }
        if replay.delivery != Some(DELIVERY_ACKED)
            && let Some(at) = self.shared.common.queued_ack(op_id)
        {
            replay.delivery = Some(DELIVERY_ACKED);
            replay.times[2] = Some(at);
        }
        match status {
            STATUS_APPLIED => Ok(SqlAdmission::Replay(Box::new(replay))),
            STATUS_RUNNING => Ok(SqlAdmission::Other("in_progress")),
            _ => Ok(SqlAdmission::Other("other")),
        }
    }

    /// Operations, applied ones and acknowledged ones, after committing the queued
    /// acknowledgements (for the benchmark's self-check).
    pub fn counts(&mut self) -> Result<SqlCounts> {
        self.flush()?;
        let (operations, applied, acknowledged): (i64, i64, i64) = self.read(|c| {
            Ok(c.query_row(
                "SELECT count(*), coalesce(sum(status = ?1), 0), coalesce(sum(delivery = ?2), 0)
                 FROM receipts",
                params![STATUS_APPLIED, DELIVERY_ACKED],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?)
        })?;
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(SqlCounts {
            operations: n(operations),
            applied: n(applied),
            acknowledged: n(acknowledged),
        })
    }
}

fn append_event(tx: &Connection, op_id: &str, at: i64, kind: i64, body: &[u8]) -> Result<i64> {
    let mut stmt =
        tx.prepare_cached("INSERT INTO events(op_id, at, kind, body) VALUES (?1, ?2, ?3, ?4)")?;
    stmt.execute(params![op_id, at, kind, body])?;
    Ok(tx.last_insert_rowid())
}

/// `submit` inside an open transaction.
pub fn submit_in(tx: &Connection, op: &SqlOp, now: i64) -> Result<SqlAdmission> {
    // Lookup by id comes first.
    {
        let mut stmt =
            tx.prepare_cached("SELECT status, intent_hash FROM receipts WHERE op_id = ?1")?;
        let known: Option<(i64, Vec<u8>)> = stmt
            .query_row(params![op.id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        if let Some((status, hash)) = known {
            if hash.as_slice() != op.intent_hash.as_slice() {
                return Err(format!("intent mismatch for `{}`", op.id).into());
            }
            return Ok(SqlAdmission::Other(if status == STATUS_RUNNING {
                "in_progress"
            } else {
                "known"
            }));
        }
    }
    // Checks for fresh work: scope revision and lock, session window.
    if let Some(scope) = op.scope.as_deref() {
        let mut stmt = tx.prepare_cached("SELECT revision, holder FROM scopes WHERE scope = ?1")?;
        let row: Option<(i64, Option<String>)> = stmt
            .query_row(params![scope], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        if let Some((revision, holder)) = row {
            if let Some(base) = op.base_rev
                && to_i64(base) < revision
            {
                return Err(format!("stale base {base} < {revision} in `{scope}`").into());
            }
            if let Some(h) = holder {
                return Err(format!("scope `{scope}` busy: held by `{h}`").into());
            }
        }
    }
    if let Some(session) = op.session.as_deref() {
        let mut stmt = tx.prepare_cached(
            "SELECT count(*) FROM receipts WHERE session = ?1 AND delivery IN (0, 1) AND ack_deadline > ?2",
        )?;
        let open: i64 = stmt.query_row(params![session, now], |r| r.get(0))?;
        if open >= SESSION_WINDOW {
            return Err(format!("window full for `{session}`").into());
        }
    }
    let lease_until = now + to_i64(LEASE_MS);
    let mut body = Vec::with_capacity(48);
    body.extend_from_slice(&op.intent_hash);
    body.extend_from_slice(&lease_until.to_le_bytes());
    body.extend_from_slice(&to_i64(op.base_rev.unwrap_or(0)).to_le_bytes());
    let epoch = append_event(tx, &op.id, now, EV_SUBMITTED, &body)?;
    {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO receipts(op_id, attempt, intent_name, intent_hash, scope, session,
                 base_rev, status, epoch, submitted_at, lease_until)
             VALUES (?1, 1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        )?;
        stmt.execute(params![
            op.id,
            op.intent_name,
            op.intent_hash.as_slice(),
            op.scope,
            op.session,
            op.base_rev.map(to_i64),
            STATUS_RUNNING,
            epoch,
            now,
            lease_until
        ])?;
    }
    if let Some(scope) = &op.scope {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO scopes(scope, revision, holder, updated_at) VALUES (?1, 0, ?2, ?3)
             ON CONFLICT(scope) DO UPDATE SET holder = excluded.holder, updated_at = excluded.updated_at",
        )?;
        stmt.execute(params![scope, op.id, now])?;
    }
    Ok(SqlAdmission::Fresh(SqlClaim {
        op_id: op.id.clone(),
        epoch,
        scope: op.scope.clone(),
    }))
}

/// `complete(applied)` inside an open transaction.
pub fn complete_in(
    tx: &Connection,
    claim: &SqlClaim,
    result_rev: u64,
    bytes: &[u8],
    now: i64,
) -> Result<()> {
    {
        let mut stmt = tx.prepare_cached("SELECT epoch, status FROM receipts WHERE op_id = ?1")?;
        let row: Option<(i64, i64)> = stmt
            .query_row(params![claim.op_id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        match row {
            Some((epoch, STATUS_RUNNING)) if epoch == claim.epoch => {}
            other => return Err(format!("stale claim for `{}`: {other:?}", claim.op_id).into()),
        }
    }
    let rev = to_i64(result_rev);
    if let Some(scope) = &claim.scope {
        let mut stmt = tx.prepare_cached("SELECT revision FROM scopes WHERE scope = ?1")?;
        let current: Option<i64> = stmt.query_row(params![scope], |r| r.get(0)).optional()?;
        if current.is_some_and(|c| rev <= c) {
            return Err(format!("revision {rev} not forward in `{scope}`").into());
        }
    }
    let ack_deadline = now + to_i64(ACK_TIMEOUT_MS);
    let retain_until = now + to_i64(RESULT_RETENTION_MS);
    let purge_at = now + to_i64(AUDIT_RETENTION_MS);
    let mut body = Vec::with_capacity(40);
    body.extend_from_slice(&claim.epoch.to_le_bytes());
    body.extend_from_slice(&rev.to_le_bytes());
    body.extend_from_slice(&ack_deadline.to_le_bytes());
    body.extend_from_slice(&retain_until.to_le_bytes());
    body.extend_from_slice(&purge_at.to_le_bytes());
    let seq = append_event(tx, &claim.op_id, now, EV_COMPLETED, &body)?;
    {
        let mut stmt =
            tx.prepare_cached("INSERT INTO results(seq, op_id, bytes) VALUES (?1, ?2, ?3)")?;
        stmt.execute(params![seq, claim.op_id, bytes])?;
    }
    {
        let mut stmt = tx.prepare_cached(
            "UPDATE receipts SET status = ?2, result_rev = ?3, delivery = ?4, completed_at = ?5,
                 lease_until = NULL, ack_deadline = ?6, retain_until = ?7, purge_at = ?8,
                 result_seq = ?9, result_size = ?10
             WHERE op_id = ?1",
        )?;
        stmt.execute(params![
            claim.op_id,
            STATUS_APPLIED,
            rev,
            DELIVERY_PENDING,
            now,
            ack_deadline,
            retain_until,
            purge_at,
            seq,
            to_i64(bytes.len() as u64)
        ])?;
    }
    if let Some(scope) = &claim.scope {
        let mut stmt = tx.prepare_cached(
            "UPDATE scopes SET revision = ?2, holder = NULL, updated_at = ?3 WHERE scope = ?1",
        )?;
        stmt.execute(params![scope, rev, now])?;
    }
    Ok(())
}

/// The delivery state of `op_id`: `None` if unknown, `Some(None)` if not terminal.
fn delivery_of(conn: &Connection, op_id: &str) -> Result<Option<Option<i64>>> {
    let mut stmt = conn.prepare_cached("SELECT delivery FROM receipts WHERE op_id = ?1")?;
    Ok(stmt.query_row(params![op_id], |r| r.get(0)).optional()?)
}

/// `acknowledge` inside an open transaction.
pub fn acknowledge_in(tx: &Connection, op_id: &str, now: i64) -> Result<()> {
    match delivery_of(tx, op_id)? {
        None | Some(None) => Err(format!("cannot acknowledge `{op_id}`").into()),
        Some(Some(DELIVERY_ACKED)) => Ok(()),
        Some(Some(_)) => {
            append_event(tx, op_id, now, EV_ACKNOWLEDGED, &[])?;
            let mut stmt = tx.prepare_cached(
                "UPDATE receipts SET delivery = ?2, acked_at = ?3 WHERE op_id = ?1",
            )?;
            stmt.execute(params![op_id, DELIVERY_ACKED, now])?;
            Ok(())
        }
    }
}

/// Deletes at most `limit` operations past audit retention (events, result and receipt)
/// inside an open transaction. Returns how many.
fn purge_in(tx: &Connection, now: i64, limit: usize, way: PurgeWay) -> Result<u64> {
    // SQLite reads a negative LIMIT as none.
    let limit = i64::try_from(limit).unwrap_or(-1);
    match way {
        PurgeWay::PerOperation | PurgeWay::PerOperationInKeyOrder => {
            let due: Vec<(String, Option<i64>)> = {
                let mut stmt = tx.prepare_cached(if way == PurgeWay::PerOperation {
                    "SELECT op_id, result_seq FROM receipts WHERE purge_at <= ?1 LIMIT ?2"
                } else {
                    "SELECT op_id, result_seq FROM receipts WHERE purge_at <= ?1 \
                     ORDER BY op_id LIMIT ?2"
                })?;
                let rows = stmt.query_map(params![now, limit], |r| Ok((r.get(0)?, r.get(1)?)))?;
                rows.collect::<std::result::Result<_, _>>()?
            };
            let mut del_events = tx.prepare_cached("DELETE FROM events WHERE op_id = ?1")?;
            let mut del_result = tx.prepare_cached("DELETE FROM results WHERE seq = ?1")?;
            let mut del_receipt = tx.prepare_cached("DELETE FROM receipts WHERE op_id = ?1")?;
            for (id, seq) in &due {
                del_events.execute(params![id])?;
                if let Some(seq) = seq {
                    del_result.execute(params![seq])?;
                }
                del_receipt.execute(params![id])?;
            }
            Ok(due.len() as u64)
        }
        PurgeWay::SetBased => {
            // The same rows in all three statements: nothing else writes inside the
            // transaction, and `receipts_purge` yields them in (purge_at, op_id) order.
            const DUE: &str =
                "SELECT op_id FROM receipts WHERE purge_at <= ?1 ORDER BY purge_at, op_id LIMIT ?2";
            let events = format!("DELETE FROM events WHERE op_id IN ({DUE})");
            let results = DUE.replacen("op_id", "result_seq", 1);
            let results = format!("DELETE FROM results WHERE seq IN ({results})");
            let receipts = format!("DELETE FROM receipts WHERE op_id IN ({DUE})");
            tx.prepare_cached(&events)?.execute(params![now, limit])?;
            tx.prepare_cached(&results)?.execute(params![now, limit])?;
            let n = tx.prepare_cached(&receipts)?.execute(params![now, limit])?;
            Ok(n as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: [u8; 32] = [7; 32];

    fn cfg(writers: Writers, acks: Acks) -> SqlConfig {
        SqlConfig {
            writers,
            acks,
            cache: Cache::Tuned,
            reads: Reads::PerLookup,
        }
    }

    const WRITER: Writers = Writers::Writer(WriterCfg {
        max_batch: 0,
        checkpoints: Checkpoints::Auto,
    });
    const WRITER_CAPPED_BG: Writers = Writers::Writer(WriterCfg {
        max_batch: 2,
        checkpoints: Checkpoints::Background,
    });

    const ALL: [(Writers, Acks); 11] = [
        (Writers::Connections, Acks::OwnCommit),
        (Writers::Connections, Acks::NextCommit),
        (Writers::Mutex, Acks::OwnCommit),
        (Writers::Mutex, Acks::NextCommit),
        (Writers::GroupCommit, Acks::OwnCommit),
        (Writers::GroupCommit, Acks::NextCommit),
        (WRITER, Acks::NextCommit),
        (WRITER, Acks::Remembered),
        (WRITER_CAPPED_BG, Acks::NextCommit),
        (WRITER_CAPPED_BG, Acks::Remembered),
        (Writers::Mutex, Acks::Remembered),
    ];

    fn op(id: &str, scope: &str, base_rev: u64, hash: [u8; 32]) -> SqlOp {
        SqlOp {
            id: id.into(),
            intent_name: "test".into(),
            intent_hash: hash,
            scope: Some(scope.into()),
            base_rev: Some(base_rev),
            session: Some(format!("session-{scope}")),
        }
    }

    fn fresh(a: SqlAdmission) -> SqlClaim {
        match a {
            SqlAdmission::Fresh(c) => c,
            other => panic!("expected a fresh admission, got {other:?}"),
        }
    }

    fn err_text<T: std::fmt::Debug>(r: Result<T>) -> String {
        r.expect_err("expected a refusal").to_string()
    }

    #[test]
    fn every_arrangement_keeps_the_protocol() {
        for (writers, acks) in ALL {
            let dir = tempfile::tempdir().unwrap();
            let store = SqlStore::open(&dir.path().join("j.sqlite"), cfg(writers, acks)).unwrap();
            let mut db = store.connect().unwrap();
            let claim = fresh(db.submit(op("a", "s", 0, HASH)).unwrap());
            // The scope is held until `a` completes; its id is known at once.
            assert!(err_text(db.submit(op("b", "s", 0, HASH))).contains("busy"));
            assert!(matches!(
                db.submit(op("a", "s", 0, HASH)).unwrap(),
                SqlAdmission::Other("in_progress")
            ));
            assert!(err_text(db.submit(op("a", "s", 0, [9; 32]))).contains("intent mismatch"));
            // An older claim (another epoch) cannot complete.
            let stale = SqlClaim {
                epoch: claim.epoch + 1,
                ..claim.clone()
            };
            assert!(err_text(db.complete(&stale, 1, b"r")).contains("stale claim"));
            db.complete(&claim, 1, b"r").unwrap();
            assert!(err_text(db.submit(op("c", "s", 0, HASH))).contains("stale base"));
            assert!(err_text(db.acknowledge("nobody")).contains("cannot acknowledge"));
            db.acknowledge("a").unwrap();
            let SqlAdmission::Replay(r) = db.lookup_replay("a", &HASH).unwrap() else {
                panic!("expected a replay");
            };
            assert_eq!(
                (r.delivery, r.result.as_slice()),
                (Some(DELIVERY_ACKED), &b"r"[..])
            );
            fresh(db.submit(op("c", "s", 1, HASH)).unwrap());
            let counts = db.counts().unwrap();
            assert_eq!(
                counts,
                SqlCounts {
                    operations: 2,
                    applied: 1,
                    acknowledged: 1
                },
                "{writers:?} {acks:?}"
            );
        }
    }

    #[test]
    fn every_purge_way_deletes_exactly_the_expired_operations() {
        let ways = [
            PurgeWay::PerOperation,
            PurgeWay::PerOperationInKeyOrder,
            PurgeWay::SetBased,
        ];
        for way in ways {
            for batch in [2, usize::MAX] {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("j.sqlite");
                let store = SqlStore::open(&path, cfg(Writers::Mutex, Acks::NextCommit)).unwrap();
                let mut db = store.connect().unwrap();
                for i in 0..5 {
                    let id = format!("done-{i}");
                    let claim = fresh(db.submit(op(&id, &id, 0, HASH)).unwrap());
                    db.complete(&claim, 1, b"r").unwrap();
                    db.acknowledge(&id).unwrap();
                }
                // Still running: it has no purge time and must stay.
                fresh(db.submit(op("running", "r", 0, HASH)).unwrap());
                db.flush().unwrap();
                db.clock_offset = Duration::from_secs(91 * 24 * 3600);
                assert_eq!(db.purge_expired_with(batch, way).unwrap(), 5, "{way:?}");
                let conn = open_conn(&path, Cache::Default).unwrap();
                let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
                assert_eq!(count("SELECT count(*) FROM receipts"), 1, "{way:?} {batch}");
                assert_eq!(count("SELECT count(*) FROM results"), 0, "{way:?} {batch}");
                assert_eq!(
                    count("SELECT count(*) FROM events WHERE op_id <> 'running'"),
                    0,
                    "{way:?} {batch}"
                );
                assert!(count("SELECT count(*) FROM events WHERE op_id = 'running'") > 0);
            }
        }
    }

    #[test]
    fn a_refused_request_rolls_back_to_its_savepoint_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.sqlite");
        drop(SqlStore::open(&path, cfg(Writers::Mutex, Acks::NextCommit)).unwrap());
        let conn = open_conn(&path, Cache::Default).unwrap();
        let common = Common::default();
        let job = |id: &str, scope: &str| Job {
            now: now_ms(Duration::ZERO),
            work: Work::Submit(op(id, scope, 0, HASH)),
        };
        // One batch, as the group-commit writer runs it: the second request finds the
        // scope held by the first, and only it is rolled back.
        let answers = commit_batch(
            &conn,
            &common,
            true,
            &[job("a", "s"), job("b", "s"), job("c", "t")],
        )
        .unwrap();
        let ok: Vec<bool> = answers.iter().map(Result::is_ok).collect();
        assert_eq!(ok, [true, false, true]);
        let ids: Vec<String> = conn
            .prepare("SELECT op_id FROM receipts ORDER BY op_id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<std::result::Result<_, _>>()
            .unwrap();
        assert_eq!(ids, ["a", "c"]);
        let holder: Option<String> = conn
            .query_row("SELECT holder FROM scopes WHERE scope = 's'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(holder.as_deref(), Some("a"));
    }

    #[test]
    fn queued_acks_are_seen_at_once_and_written_by_the_next_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.sqlite");
        let store = SqlStore::open(&path, cfg(Writers::Mutex, Acks::NextCommit)).unwrap();
        let mut db = store.connect().unwrap();
        let claim = fresh(db.submit(op("a", "s", 0, HASH)).unwrap());
        db.complete(&claim, 1, b"r").unwrap();
        db.acknowledge("a").unwrap();
        let in_file = |c: &Connection| -> i64 {
            c.query_row("SELECT delivery FROM receipts WHERE op_id = 'a'", [], |r| {
                r.get(0)
            })
            .unwrap()
        };
        let other = open_conn(&path, Cache::Default).unwrap();
        assert_eq!(in_file(&other), DELIVERY_PENDING);
        let SqlAdmission::Replay(r) = db.lookup_replay("a", &HASH).unwrap() else {
            panic!("expected a replay");
        };
        assert_eq!(r.delivery, Some(DELIVERY_ACKED));
        fresh(db.submit(op("b", "s", 1, HASH)).unwrap());
        assert_eq!(in_file(&other), DELIVERY_ACKED);
        assert!(!store.shared.common.has_queued_acks());
    }

    #[test]
    fn settle_returns_once_the_background_checkpoint_has_copied_the_commits_into_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.sqlite");
        let store = SqlStore::open(&path, cfg(WRITER_CAPPED_BG, Acks::NextCommit)).unwrap();
        let mut db = store.connect().unwrap();
        for i in 0..200 {
            let (id, scope) = (format!("op-{i}"), format!("s{i}"));
            let claim = fresh(db.submit(op(&id, &scope, 0, HASH)).unwrap());
            db.complete(&claim, 1, &[7u8; 1024]).unwrap();
        }
        // The commits are in the WAL; the checkpointer copies them on its timer, or at once
        // when asked.
        store.settle();
        // Every page the database has (its WAL included) is in the file: it is as long as
        // they are.
        let other = open_conn(&path, Cache::Default).unwrap();
        let pragma = |name: &str| -> u64 {
            let n: i64 = other
                .query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
                .unwrap();
            n.try_into().unwrap()
        };
        let pages = pragma("page_count") * pragma("page_size");
        let file = std::fs::metadata(&path).unwrap().len();
        assert!(pages > 200 * 1024, "{pages} bytes of pages");
        assert_eq!(file, pages, "the file holds every page");
        // A store without a checkpointer thread has nothing to settle.
        let plain =
            SqlStore::open(&dir.path().join("p.sqlite"), cfg(WRITER, Acks::NextCommit)).unwrap();
        plain.settle();
    }

    #[test]
    fn group_commit_serves_many_threads() {
        for (writers, acks) in [
            (Writers::GroupCommit, Acks::OwnCommit),
            (Writers::GroupCommit, Acks::NextCommit),
            (WRITER, Acks::NextCommit),
            (WRITER, Acks::Remembered),
            (WRITER_CAPPED_BG, Acks::Remembered),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let store = SqlStore::open(&dir.path().join("j.sqlite"), cfg(writers, acks)).unwrap();
            std::thread::scope(|s| {
                for t in 0..8 {
                    let store = &store;
                    s.spawn(move || {
                        let mut db = store.connect().unwrap();
                        let scope = format!("s{t}");
                        for i in 0..20u64 {
                            let id = format!("{t}-{i}");
                            let claim = fresh(db.submit(op(&id, &scope, i, HASH)).unwrap());
                            db.complete(&claim, i + 1, b"r").unwrap();
                            db.acknowledge(&id).unwrap();
                        }
                    });
                }
            });
            let counts = store.connect().unwrap().counts().unwrap();
            assert_eq!(
                counts,
                SqlCounts {
                    operations: 160,
                    applied: 160,
                    acknowledged: 160
                },
                "{writers:?} {acks:?}"
            );
        }
    }

    #[test]
    fn without_savepoints_a_refused_request_writes_nothing_and_the_batch_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.sqlite");
        drop(SqlStore::open(&path, cfg(WRITER, Acks::NextCommit)).unwrap());
        let conn = open_conn(&path, Cache::Default).unwrap();
        let common = Common::default();
        let now = now_ms(Duration::ZERO);
        let submit = |id: &str, scope: &str, base: u64| Job {
            now,
            work: Work::Submit(op(id, scope, base, HASH)),
        };
        let answers = commit_batch(
            &conn,
            &common,
            false,
            &[
                submit("a", "s", 0),
                submit("b", "s", 0),
                submit("a", "t", 0),
                submit("c", "t", 0),
            ],
        )
        .unwrap();
        let ok: Vec<bool> = answers.iter().map(Result::is_ok).collect();
        // `b` finds the scope held, the second `a` is a known id (answered, not written).
        assert_eq!(ok, [true, false, true, true]);
        let n: i64 = conn
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
    }

    #[test]
    fn a_held_snapshot_sees_every_commit_of_its_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqlStore::open(
            &dir.path().join("j.sqlite"),
            SqlConfig {
                reads: Reads::HeldSnapshot,
                ..cfg(Writers::GroupCommit, Acks::NextCommit)
            },
        )
        .unwrap();
        let mut writer = store.connect().unwrap();
        let reader = store.connect().unwrap();
        for i in 0..3u64 {
            let id = format!("op-{i}");
            let claim = fresh(writer.submit(op(&id, "s", i, HASH)).unwrap());
            assert!(matches!(
                reader.lookup_replay(&id, &HASH).unwrap(),
                SqlAdmission::Other("in_progress")
            ));
            writer.complete(&claim, i + 1, b"r").unwrap();
            assert!(matches!(
                reader.lookup_replay(&id, &HASH).unwrap(),
                SqlAdmission::Replay(_)
            ));
        }
    }
}
