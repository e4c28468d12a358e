//! The opjournal protocol implemented on SQLite, as a baseline for the benchmarks.
//!
//! This is what a careful engineer would build on SQLite to get the same guarantees as
//! opjournal (DESIGN.md §3–§7), with the same durability points:
//!
//! - `submit` is one durable transaction (`BEGIN IMMEDIATE` … `COMMIT` with
//!   `synchronous=FULL`): check-then-insert by operation id, the scope's revision and
//!   lock-holder check, the session window count, then the receipt, a `submitted` event
//!   and the scope lock row.
//! - `complete` is one durable transaction: the claim (epoch) check, the forward-revision
//!   check, a `completed` event, the result row, the receipt update and the scope row.
//! - `acknowledge` is lazily durable. It is its own transaction, committed with
//!   `synchronous=OFF` on the same connection (toggled for that one commit): the ack is
//!   committed and visible at once, its WAL frames are written but not synced, and the next
//!   `synchronous=FULL` commit by any connection syncs the WAL file and with it the ack.
//!   That is exactly the contract of redb's `Durability::None`, which opjournal uses for
//!   acks under `Sharing::Exclusive` (a crash can lose the ack, which only causes a harmless
//!   redelivery). Toggling on the same connection, rather than using a second connection
//!   with `synchronous=OFF`, keeps SQLite's page cache warm (a connection drops its cache
//!   when another connection wrote to the WAL).
//!
//! The schema mirrors opjournal's tables: an append-only `events` table with an index by
//! operation id (opjournal's `events` and `op_events`), `receipts` (the index by id, with
//! partial indexes standing in for opjournal's `timers` and `windows`), `results` stored
//! once, and `scopes`. Tables keyed by text are `WITHOUT ROWID`, SQLite's best layout for
//! lookups by key.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// An operation as submitted.
#[derive(Clone, Debug)]
pub struct SqlOp<'a> {
    /// The operation id.
    pub id: &'a str,
    /// The intent name.
    pub intent_name: &'a str,
    /// The intent hash.
    pub intent_hash: &'a [u8; 32],
    /// The scope.
    pub scope: Option<&'a str>,
    /// The base revision.
    pub base_rev: Option<u64>,
    /// The session.
    pub session: Option<&'a str>,
}

/// One connection to the SQLite journal. Not `Sync`: open one per thread.
pub struct SqlJournal {
    conn: Connection,
    /// Added to the system clock (to simulate time passing).
    pub clock_offset: Duration,
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

impl SqlJournal {
    /// Opens (creating if missing) with `journal_mode=WAL`, `synchronous=FULL` and a busy
    /// timeout, and creates the schema.
    pub fn open(path: &Path) -> Result<SqlJournal> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(30))?;
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(format!("sqlite refused WAL mode (got `{mode}`)").into());
        }
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.set_prepared_statement_cache_capacity(64);
        conn.execute_batch(SCHEMA)?;
        Ok(SqlJournal {
            conn,
            clock_offset: Duration::ZERO,
        })
    }

    /// The underlying connection.
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    fn now(&self) -> i64 {
        now_ms(self.clock_offset)
    }

    /// `submit` in its own durable transaction.
    pub fn submit(&mut self, op: &SqlOp<'_>) -> Result<SqlAdmission> {
        let now = self.now();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = submit_in(&tx, op, now)?;
        tx.commit()?;
        Ok(out)
    }

    /// `complete(applied)` in its own durable transaction.
    pub fn complete(&mut self, claim: &SqlClaim, result_rev: u64, bytes: &[u8]) -> Result<()> {
        let now = self.now();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        complete_in(&tx, claim, result_rev, bytes, now)?;
        tx.commit()?;
        Ok(())
    }

    /// `acknowledge`, lazily durable: committed with `synchronous=OFF` (see the module docs).
    pub fn acknowledge(&mut self, op_id: &str) -> Result<()> {
        let now = self.now();
        self.conn.pragma_update(None, "synchronous", "OFF")?;
        let r = (|| -> Result<()> {
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            acknowledge_in(&tx, op_id, now)?;
            tx.commit()?;
            Ok(())
        })();
        self.conn.pragma_update(None, "synchronous", "FULL")?;
        r
    }

    /// Runs `n` whole lifecycles (submit, complete, ack) in one transaction per `batch`:
    /// the same statements, used to build large journals quickly (not measured).
    pub fn populate(
        &mut self,
        ops: &[(String, String, String)],
        hash: &[u8; 32],
        payload: &[u8],
        batch: usize,
    ) -> Result<()> {
        let mut revs: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        for chunk in ops.chunks(batch.max(1)) {
            let now = self.now();
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            for (id, scope, session) in chunk {
                let rev = revs.entry(scope.clone()).or_insert(0);
                let op = SqlOp {
                    id,
                    intent_name: "bench.edit",
                    intent_hash: hash,
                    scope: Some(scope),
                    base_rev: Some(*rev),
                    session: Some(session),
                };
                let SqlAdmission::Fresh(claim) = submit_in(&tx, &op, now)? else {
                    return Err(format!("populate: `{id}` was not fresh").into());
                };
                *rev += 1;
                complete_in(&tx, &claim, *rev, payload, now)?;
                acknowledge_in(&tx, id, now)?;
            }
            tx.commit()?;
        }
        Ok(())
    }

    /// The replay path of `submit` for a known id, without a write transaction: one
    /// prepared `SELECT` of the receipt joined with its result, the intent check and the
    /// clocks applied, and the row copied into an owned value (as opjournal answers).
    pub fn lookup_replay(&self, op_id: &str, intent_hash: &[u8; 32]) -> Result<SqlAdmission> {
        let now = self.now();
        let mut stmt = self.conn.prepare_cached(
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
        let Some((hash, status, retain_until, purge_at, replay)) = row else {
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
        match status {
            STATUS_APPLIED => Ok(SqlAdmission::Replay(Box::new(replay))),
            STATUS_RUNNING => Ok(SqlAdmission::Other("in_progress")),
            _ => Ok(SqlAdmission::Other("other")),
        }
    }

    /// Deletes every operation whose audit retention passed, in durable transactions of at
    /// most `batch` operations each (events, result and receipt). Returns how many.
    pub fn purge_expired(&mut self, batch: usize) -> Result<u64> {
        let mut purged = 0u64;
        loop {
            let now = self.now();
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let due: Vec<(String, Option<i64>)> = {
                let mut stmt = tx.prepare_cached(
                    "SELECT op_id, result_seq FROM receipts WHERE purge_at <= ?1 LIMIT ?2",
                )?;
                let rows = stmt.query_map(params![now, to_i64(batch as u64)], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?;
                rows.collect::<std::result::Result<_, _>>()?
            };
            if due.is_empty() {
                tx.commit()?;
                return Ok(purged);
            }
            {
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
            }
            tx.commit()?;
            purged += due.len() as u64;
        }
    }
}

fn append_event(tx: &Connection, op_id: &str, at: i64, kind: i64, body: &[u8]) -> Result<i64> {
    let mut stmt =
        tx.prepare_cached("INSERT INTO events(op_id, at, kind, body) VALUES (?1, ?2, ?3, ?4)")?;
    stmt.execute(params![op_id, at, kind, body])?;
    Ok(tx.last_insert_rowid())
}

/// `submit` inside an open transaction.
pub fn submit_in(tx: &Connection, op: &SqlOp<'_>, now: i64) -> Result<SqlAdmission> {
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
    if let Some(scope) = op.scope {
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
    if let Some(session) = op.session {
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
    body.extend_from_slice(op.intent_hash);
    body.extend_from_slice(&lease_until.to_le_bytes());
    body.extend_from_slice(&to_i64(op.base_rev.unwrap_or(0)).to_le_bytes());
    let epoch = append_event(tx, op.id, now, EV_SUBMITTED, &body)?;
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
    if let Some(scope) = op.scope {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO scopes(scope, revision, holder, updated_at) VALUES (?1, 0, ?2, ?3)
             ON CONFLICT(scope) DO UPDATE SET holder = excluded.holder, updated_at = excluded.updated_at",
        )?;
        stmt.execute(params![scope, op.id, now])?;
    }
    Ok(SqlAdmission::Fresh(SqlClaim {
        op_id: op.id.to_string(),
        epoch,
        scope: op.scope.map(str::to_string),
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

/// `acknowledge` inside an open transaction.
pub fn acknowledge_in(tx: &Connection, op_id: &str, now: i64) -> Result<()> {
    let delivery: Option<Option<i64>> = {
        let mut stmt = tx.prepare_cached("SELECT delivery FROM receipts WHERE op_id = ?1")?;
        stmt.query_row(params![op_id], |r| r.get(0)).optional()?
    };
    match delivery {
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
