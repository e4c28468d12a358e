//! The transactions the journal reads and writes through: [`PgRead`] (a snapshot),
//! [`PgWrite`] (under the writer lock, on a pooled connection) and [`PgWriteIn`] (under
//! the writer lock, in a transaction the caller owns). Each implements
//! [`Store`]; a write transaction reads its own changes.
//!
//! The writer lock is the journal's row in `opjournal_journals`. Taking it locks the row
//! and also updates it (`commits = commits + 1`), so that a writer whose snapshot predates
//! the previous writer's commit (a caller's REPEATABLE READ or SERIALIZABLE transaction)
//! fails with a serialization failure instead of reading entries that are no longer
//! current. In READ COMMITTED (our own write transactions) each statement after the lock
//! sees every earlier writer's commit. The server time of a write is `clock_timestamp()`
//! read by a statement after the lock statement completed: not earlier than the previous
//! writer's time, which was read before it committed (on one server whose clock does not
//! step back; nodes of a distributed database differ by their clock offset).

use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use postgres::SimpleQueryMessage;

use super::Shared;
use super::errors::{classify, classify_commit, connection_lost};
use super::pool::Conn;
use super::sql::{self, Exec, Sql};
use crate::error::{Error, ErrorKind, Result};
use crate::index::Memtable;
use crate::index::store::Store;

/// The server's time in ms since the epoch, as a column.
pub(super) const NOW_MS: &str = "(extract(epoch from now()) * 1000)::int8";

/// The server's clock in ms since the epoch, read when the statement runs (not when the
/// transaction began, as `now()` is).
const CLOCK_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::int8";

/// The statements (one simple query, one round trip) that lock `literal`'s row, waiting
/// or not, then read the server's clock and whether the row exists.
pub(super) fn lock_sql(literal: &str, wait: bool) -> String {
    let skip = if wait { "" } else { " SKIP LOCKED" };
    format!(
        "UPDATE opjournal_journals SET commits = commits + 1 WHERE name = \
         (SELECT name FROM opjournal_journals WHERE name = {literal} FOR UPDATE{skip}); \
         SELECT {CLOCK_MS}, EXISTS (SELECT 1 FROM opjournal_journals WHERE name = {literal})"
    )
}

/// A transaction idle this long before COMMIT may have lost its session meanwhile (an
/// idle-in-transaction timeout, a terminated backend): COMMIT first looks whether the
/// server ended it ([`Conn::alive`], about 1 ms), so that the error can say that nothing
/// was written rather than that the outcome is unknown. A COMMIT right after the last
/// statement, the usual case, pays nothing.
const IDLE_BEFORE_CHECK: Duration = Duration::from_millis(100);

/// What the lock statements answered: whether the lock was taken, the clock, and whether
/// the journal's row exists.
struct Locked {
    taken: bool,
    now_ms: u64,
    exists: bool,
}

/// Reads what [`lock_sql`] (after any BEGIN) answered.
fn locked(answers: &[SimpleQueryMessage], place: &str) -> Result<Locked> {
    let mut completes = Vec::new();
    let mut last_row = None;
    for a in answers {
        match a {
            SimpleQueryMessage::CommandComplete(n) => completes.push(*n),
            SimpleQueryMessage::Row(row) => last_row = Some(row),
            _ => {}
        }
    }
    // The UPDATE is the second statement from the end; the SELECT the last.
    let taken = completes.len() >= 2 && completes[completes.len() - 2] == 1;
    let row = last_row.ok_or_else(|| unexpected(place, "the lock statements returned no row"))?;
    let now_ms = parse_ms(row.get(0), place)?;
    let exists = matches!(row.get(1), Some("t" | "true"));
    Ok(Locked {
        taken,
        now_ms,
        exists,
    })
}

/// The server's time from a simple query's text column.
pub(super) fn parse_ms(text: Option<&str>, place: &str) -> Result<u64> {
    text.and_then(|t| t.trim().parse::<u64>().ok())
        .ok_or_else(|| unexpected(place, &format!("the server's time reads {text:?}")))
}

/// The last row's first column of a simple query's answers: the server's time.
pub(super) fn last_ms(answers: &[SimpleQueryMessage], place: &str) -> Result<u64> {
    let row = answers.iter().rev().find_map(|a| match a {
        SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    });
    match row {
        Some(row) => parse_ms(row.get(0), place),
        None => Err(unexpected(
            place,
            "the server's time came back without a row",
        )),
    }
}

/// An answer of the server that this layer does not expect: a server that is not
/// PostgreSQL-compatible enough, or a schema changed by hand.
pub(super) fn unexpected(place: &str, what: &str) -> Error {
    Error::with_source(
        ErrorKind::Storage,
        format!("{place}: {what}; check that the server speaks PostgreSQL's SQL"),
    )
}

/// `journal`'s row is missing: deleted since it was registered, or never registered in
/// this database. `place` names the journal and the database.
fn unregistered(journal: &str, place: &str) -> Error {
    Error::new(ErrorKind::NotAJournal {
        path: journal.into(),
        detail: format!(
            "{place} has no row in opjournal_journals (deleted since it was registered, or \
             never registered in this database); connect to it again to register it"
        ),
    })
}

/// Locks `mutex`; its contents stay usable after a panic elsewhere (a connection whose
/// statement panicked is found closed or in a failed transaction, and answers so).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A transaction on a leased connection: what [`PgRead`] and [`PgWrite`] share.
struct Txn {
    shared: Arc<Shared>,
    /// The connection, inside the transaction; `None` once it ended (or was lost).
    conn: Mutex<Option<Conn>>,
    /// The first error of a statement: the server aborted the transaction then, so a
    /// COMMIT would only roll it back.
    failed: Mutex<Option<Error>>,
}

impl Txn {
    /// The transaction `conn` is in (begun by [`Pool::begin`](super::pool::Pool::begin)).
    fn new(shared: Arc<Shared>, conn: Conn) -> Txn {
        Txn {
            shared,
            conn: Mutex::new(Some(conn)),
            failed: Mutex::new(None),
        }
    }

    /// What errors name: the journal and the database.
    fn place(&self) -> &str {
        self.shared.pool.place()
    }

    /// Runs `f` on the connection. An error ends the transaction's usefulness: it is
    /// remembered for [`Txn::commit`], and a lost connection is dropped at once.
    fn run<T>(
        &self,
        during: &'static str,
        f: impl FnOnce(&mut Conn, &str) -> Result<T, postgres::Error>,
    ) -> Result<T> {
        let mut guard = lock(&self.conn);
        let Some(conn) = guard.as_mut() else {
            return Err(self.ended(during));
        };
        let armed = conn.arm();
        let done = f(conn, &self.shared.journal);
        drop(armed);
        conn.last_used = Instant::now();
        match done {
            Ok(v) => Ok(v),
            Err(e) => {
                if connection_lost(&e)
                    && let Some(conn) = guard.take()
                {
                    self.shared.pool.discard(conn);
                }
                let err = classify(e, during, self.place());
                let mut failed = lock(&self.failed);
                if failed.is_none() {
                    *failed = Some(err.copied());
                }
                Err(err)
            }
        }
    }

    /// The error for a call after the transaction ended (its connection was lost).
    fn ended(&self, during: &'static str) -> Error {
        if let Some(first) = lock(&self.failed).as_ref() {
            return first.copied();
        }
        Error::new(ErrorKind::Unavailable {
            detail: format!(
                "could not {during} for {}: the transaction already ended",
                self.place()
            ),
            outcome_unknown: false,
        })
    }

    /// Ends the transaction with ROLLBACK and puts the connection back.
    fn roll_back(&self) {
        if let Some(conn) = lock(&self.conn).take() {
            self.shared.pool.roll_back(conn);
        }
    }

    /// COMMIT, then puts the connection back. After a failed statement it rolls back
    /// instead and returns that statement's error.
    fn commit(&self) -> Result<()> {
        let Some(mut conn) = lock(&self.conn).take() else {
            return Err(self.ended("commit the transaction"));
        };
        if let Some(first) = lock(&self.failed).take() {
            self.shared.pool.roll_back(conn);
            return Err(first);
        }
        if conn.last_used.elapsed() >= IDLE_BEFORE_CHECK && !conn.alive() {
            // The session ended before COMMIT was sent (the server said so, or closed the
            // socket, while the connection sat idle): the server rolled back.
            self.shared.pool.discard(conn);
            return Err(Error::new(ErrorKind::Unavailable {
                detail: format!(
                    "could not commit the transaction for {}: the connection was closed \
                     before COMMIT was sent",
                    self.place()
                ),
                outcome_unknown: false,
            }));
        }
        let armed = conn.arm();
        let committed = conn.client.batch_execute("COMMIT");
        drop(armed);
        match committed {
            Ok(()) => {
                self.shared.pool.give(conn);
                Ok(())
            }
            Err(e) => {
                if connection_lost(&e) {
                    self.shared.pool.discard(conn);
                } else {
                    // The server answered COMMIT with an error: the transaction is over
                    // (rolled back) and the session usable.
                    self.shared.pool.roll_back(conn);
                }
                Err(classify_commit(e, self.place()))
            }
        }
    }
}

impl Drop for Txn {
    fn drop(&mut self) {
        self.roll_back();
    }
}

/// Shows what the transaction is on, not its connection.
impl std::fmt::Debug for Txn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let open = lock(&self.conn).is_some();
        f.debug_struct("Txn")
            .field("place", &self.place())
            .field("open", &open)
            .finish()
    }
}

/// A consistent read of one journal: a pooled connection in a `REPEATABLE READ, READ ONLY`
/// transaction (one snapshot for every call). Ends with ROLLBACK when finished or dropped,
/// which puts the connection back in the pool (or drops it, if it was lost).
#[derive(Debug)]
pub(crate) struct PgRead {
    txn: Txn,
}

impl PgRead {
    /// Begins the read: one round trip, which also reads the server's time.
    pub(super) fn begin(shared: &Arc<Shared>) -> Result<(PgRead, u64)> {
        let sql = format!("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY; SELECT {NOW_MS}");
        let (conn, answers) = shared.pool.begin(&sql, "begin a read transaction")?;
        let txn = Txn::new(Arc::clone(shared), conn);
        let now_ms = last_ms(&answers, txn.place())?;
        Ok((PgRead { txn }, now_ms))
    }

    /// Ends the read (ROLLBACK: it changed nothing) and puts the connection back.
    pub(crate) fn finish(self) {
        self.txn.roll_back();
    }
}

/// A write transaction on a pooled connection, holding the journal's writer lock from its
/// first statement to its end. Dropping it without [`PgWrite::commit`] rolls back.
#[derive(Debug)]
pub(crate) struct PgWrite {
    txn: Txn,
}

impl PgWrite {
    /// Begins a READ COMMITTED transaction and takes the writer lock (waiting for it, or
    /// not) in one round trip; `None` when `wait` is false and another transaction holds
    /// it. Returns the server's clock read after the lock was granted.
    pub(super) fn begin(shared: &Arc<Shared>, wait: bool) -> Result<Option<(PgWrite, u64)>> {
        let sql = format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; {}",
            lock_sql(&shared.literal, wait)
        );
        let (conn, answers) = shared.pool.begin(&sql, "take the journal's writer lock")?;
        let txn = Txn::new(Arc::clone(shared), conn);
        let lock = locked(&answers, txn.place())?;
        if !lock.exists {
            return Err(unregistered(&shared.journal, txn.place()));
        }
        if !lock.taken {
            // Dropping `txn` rolls back and puts the connection back.
            return Ok(None);
        }
        Ok(Some((PgWrite { txn }, lock.now_ms)))
    }

    /// Writes `changes` (upserts and deletes; a few statements for thousands of changes).
    ///
    /// # Errors
    ///
    /// What [`classify`] makes of the server's error; the transaction is then aborted and
    /// [`PgWrite::commit`] returns the same error.
    pub(crate) fn apply(&self, changes: &Memtable) -> Result<()> {
        self.txn
            .run("write the batch", |c, journal| {
                sql::apply(&mut Prepared(c), journal, changes)
            })
            .map(drop)
    }

    /// Whether the journal holds any entry (seen by this transaction).
    pub(super) fn any(&self) -> Result<bool> {
        self.txn
            .run("read whether the journal is empty", |c, journal| {
                sql::any(&mut Prepared(c), journal)
            })
    }

    /// COMMIT.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unavailable`] with `outcome_unknown` when the connection was lost while
    /// COMMIT was in flight (the change may or may not be committed); an earlier
    /// statement's error if one failed (then nothing was written).
    pub(crate) fn commit(self) -> Result<()> {
        self.txn.commit()
    }
}

/// A pooled connection as an [`Exec`]: its statements prepared once and cached.
struct Prepared<'c>(&'c mut Conn);

impl Exec for Prepared<'_> {
    fn rows(
        &mut self,
        sql: Sql,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Vec<postgres::Row>, postgres::Error> {
        let Conn {
            client, prepared, ..
        } = &mut *self.0;
        prepared.rows(client, sql, params)
    }

    fn run(
        &mut self,
        sql: Sql,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<u64, postgres::Error> {
        let Conn {
            client, prepared, ..
        } = &mut *self.0;
        prepared.run(client, sql, params)
    }
}

#[cfg(test)]
impl PgRead {
    /// The server process serving this transaction (to terminate it in tests).
    pub(super) fn backend_pid(&self) -> Result<i32> {
        self.txn.run("read the backend's pid", |c, _| {
            c.client
                .query_one("SELECT pg_backend_pid()", &[])?
                .try_get(0)
        })
    }
}

#[cfg(test)]
impl PgWrite {
    /// The server process serving this transaction (to terminate it in tests).
    pub(super) fn backend_pid(&self) -> Result<i32> {
        self.txn.run("read the backend's pid", |c, _| {
            c.client
                .query_one("SELECT pg_backend_pid()", &[])?
                .try_get(0)
        })
    }
}

/// The Store calls on a leased transaction, for [`PgRead`] and [`PgWrite`].
macro_rules! pooled_store {
    ($t:ty) => {
        impl Store for $t {
            fn get(&self, table: u8, key: &[u8]) -> Result<Option<Vec<u8>>> {
                self.txn.run("read a journal entry", |c, journal| {
                    sql::get(&mut Prepared(c), journal, table, key)
                })
            }

            fn scan(
                &self,
                table: u8,
                lo: Bound<&[u8]>,
                hi: Bound<&[u8]>,
                limit: usize,
            ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
                self.txn
                    .run("read a range of journal entries", |c, journal| {
                        sql::scan(&mut Prepared(c), journal, table, lo, hi, limit)
                    })
            }

            fn count(&self, table: u8) -> Result<u64> {
                self.txn.run("count journal entries", |c, journal| {
                    sql::count(&mut Prepared(c), journal, table)
                })
            }
        }
    };
}
pooled_store!(PgRead);
pooled_store!(PgWrite);

/// The journal's reads and writes in a transaction the caller owns (the embedder's own
/// `postgres::Transaction`), so that its effect and the journal's receipt commit together,
/// or neither. The caller commits or rolls back; this never does.
///
/// The caller's session settings apply (its `lock_timeout`, `statement_timeout`): the
/// pool's do not reach a connection it does not own.
pub(crate) struct PgWriteIn<'a, 't> {
    /// The caller's transaction; a mutex so that [`Store`]'s `&self` calls can use it.
    txn: Mutex<&'a mut postgres::Transaction<'t>>,
    journal: String,
    /// What errors name.
    place: String,
}

/// Shows the journal, not the caller's transaction.
impl std::fmt::Debug for PgWriteIn<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgWriteIn")
            .field("place", &self.place)
            .finish()
    }
}

impl<'a, 't> PgWriteIn<'a, 't> {
    /// Takes `journal`'s writer lock inside `txn` (waiting for it) in one round trip, and
    /// returns the server's clock read after the lock was granted. The lock is held until
    /// the caller's transaction ends.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`] for a name no journal can have;
    /// [`ErrorKind::NotAJournal`] when the journal is not registered in this database
    /// ([`Pg::connect`](super::Pg::connect) registers it); what [`classify`] makes of the
    /// server's error (a lock timeout, a serialization failure when the caller's snapshot
    /// predates the previous writer's commit: roll back and run the transaction again).
    pub(crate) fn lock_in(
        txn: &'a mut postgres::Transaction<'t>,
        journal: &str,
    ) -> Result<(Self, u64)> {
        super::check_journal_name(journal)?;
        let place = format!("journal `{journal}` in the caller's transaction");
        let answers = txn
            .simple_query(&lock_sql(&super::literal(journal), true))
            .map_err(|e| classify(e, "take the journal's writer lock", &place))?;
        let lock = locked(&answers, &place)?;
        if !lock.exists || !lock.taken {
            return Err(unregistered(journal, &place));
        }
        Ok((
            PgWriteIn {
                txn: Mutex::new(txn),
                journal: journal.to_string(),
                place,
            },
            lock.now_ms,
        ))
    }

    /// Writes `changes` in the caller's transaction.
    ///
    /// # Errors
    ///
    /// What [`classify`] makes of the server's error; the caller's transaction is then
    /// aborted and must be rolled back.
    pub(crate) fn apply(&self, changes: &Memtable) -> Result<()> {
        let mut txn = lock(&self.txn);
        sql::apply(&mut **txn, &self.journal, changes)
            .map(drop)
            .map_err(|e| classify(e, "write the batch", &self.place))
    }
}

impl Store for PgWriteIn<'_, '_> {
    fn get(&self, table: u8, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut txn = lock(&self.txn);
        sql::get(&mut **txn, &self.journal, table, key)
            .map_err(|e| classify(e, "read a journal entry", &self.place))
    }

    fn scan(
        &self,
        table: u8,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut txn = lock(&self.txn);
        sql::scan(&mut **txn, &self.journal, table, lo, hi, limit)
            .map_err(|e| classify(e, "read a range of journal entries", &self.place))
    }

    fn count(&self, table: u8) -> Result<u64> {
        let mut txn = lock(&self.txn);
        sql::count(&mut **txn, &self.journal, table)
            .map_err(|e| classify(e, "count journal entries", &self.place))
    }
}
