//! The schema: its tables, its version row, and the journal's registration.
//!
//! Several processes may open journals in a new database at once: the tables are created
//! with `CREATE TABLE IF NOT EXISTS` in one transaction with the version row (`ON CONFLICT
//! DO NOTHING`), and a creation that loses the race (PostgreSQL reports a unique violation
//! on its catalog, CockroachDB a serialization failure) is rolled back and tried again,
//! when it finds the tables made. An existing schema costs one statement: its version is
//! read before any DDL is sent.

use std::thread;
use std::time::Duration;

use super::errors::classify;
use super::pool::Conn;
use crate::error::{Error, ErrorKind, Result};

/// The schema version this build creates, reads and writes.
pub(crate) const SCHEMA_VERSION: i32 = 1;

/// The schema of [`SCHEMA_VERSION`], and its version row (`{version}`), in one transaction.
///
/// - `opjournal_schema`: one row (`id = 1`), the schema's version;
/// - `opjournal_journals`: one row per journal, its writer lock (locked and updated by
///   every write transaction: `commits` counts the committed ones);
/// - `opjournal_kv`: every journal's entries: the table's number, the key in byte order,
///   the record's bytes.
const CREATE: &str = "BEGIN; \
    CREATE TABLE IF NOT EXISTS opjournal_schema (\
        id int PRIMARY KEY CHECK (id = 1), \
        version int NOT NULL); \
    CREATE TABLE IF NOT EXISTS opjournal_journals (\
        name text PRIMARY KEY, \
        created_at timestamptz NOT NULL DEFAULT now(), \
        commits int8 NOT NULL DEFAULT 0); \
    CREATE TABLE IF NOT EXISTS opjournal_kv (\
        journal text NOT NULL, \
        tbl smallint NOT NULL, \
        k bytea NOT NULL, \
        v bytea NOT NULL, \
        PRIMARY KEY (journal, tbl, k)); \
    INSERT INTO opjournal_schema (id, version) VALUES (1, {version}) \
        ON CONFLICT (id) DO NOTHING; \
    COMMIT";

/// The steps from an older schema to the next version: `(from, statements)`, the
/// statements run in the transaction that then records version `from + 1`. Version 1 is
/// the first, so there is none yet.
const MIGRATIONS: &[(i32, &str)] = &[];

/// Attempts at creating the schema while other processes create it too.
const ATTEMPTS: u32 = 8;

/// SQLSTATEs of a creation that raced another: try again.
const RACES: [&str; 5] = [
    "23505", // unique_violation (PostgreSQL's catalog: pg_type, pg_class)
    "42P07", // duplicate_table
    "42710", // duplicate_object
    "40001", // serialization_failure
    "40P01", // deadlock_detected
];

/// Creates the schema if it is missing, checks its version (migrating an older one) and
/// registers `literal` (the journal's name as a SQL literal): what
/// [`Pg::connect`](super::Pg::connect) does on its first connection.
pub(super) fn prepare(conn: &mut Conn, literal: &str, place: &str) -> Result<()> {
    let version = ensure(conn, place)?;
    if version > SCHEMA_VERSION {
        return Err(Error::new(ErrorKind::UnsupportedFormat {
            found: u32::try_from(version).unwrap_or(0),
            supported: SCHEMA_VERSION as u32,
        }));
    }
    if version < SCHEMA_VERSION {
        migrate(conn, place)?;
    }
    conn.client
        .batch_execute(&format!(
            "INSERT INTO opjournal_journals (name) VALUES ({literal}) \
             ON CONFLICT (name) DO NOTHING"
        ))
        .map_err(|e| classify(e, "register the journal", place))
}

/// The most journal names an error about a missing journal lists.
const NAMES_LISTED: i64 = 20;

/// Checks, without creating or writing anything, that the schema exists at
/// [`SCHEMA_VERSION`] and that `journal` is registered: what
/// [`Pg::connect_read_only`](super::Pg::connect_read_only) does on its first connection.
///
/// `db` names the database (``database `app` at db1:5432``), `place` the journal in it.
pub(super) fn check_existing(conn: &mut Conn, journal: &str, db: &str, place: &str) -> Result<()> {
    let Some(version) = version(conn, place)? else {
        return Err(Error::new(ErrorKind::NotAJournal {
            path: journal.into(),
            detail: format!(
                "{db} holds no opjournal schema (no journal was ever created there; \
                 journals present: none); check the URL's database, or create the journal \
                 by opening it with the library (`JournalBuilder::open_postgres`), which \
                 creates the schema"
            ),
        }));
    };
    if version != SCHEMA_VERSION {
        return Err(Error::new(ErrorKind::UnsupportedFormat {
            found: u32::try_from(version).unwrap_or(0),
            supported: SCHEMA_VERSION as u32,
        }));
    }
    let during = "look the journal up";
    let found = conn
        .client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM opjournal_journals WHERE name = $1)",
            &[&journal],
        )
        .and_then(|r| r.try_get::<_, bool>(0))
        .map_err(|e| classify(e, during, place))?;
    if found {
        return Ok(());
    }
    let rows = conn
        .client
        .query(
            "SELECT name, count(*) OVER () FROM opjournal_journals ORDER BY name LIMIT $1",
            &[&NAMES_LISTED],
        )
        .map_err(|e| classify(e, "list the journals", place))?;
    let mut total = 0i64;
    let mut names = Vec::with_capacity(rows.len());
    for row in &rows {
        let name: String = row
            .try_get(0)
            .map_err(|e| classify(e, "list the journals", place))?;
        total = row
            .try_get(1)
            .map_err(|e| classify(e, "list the journals", place))?;
        names.push(format!("`{name}`"));
    }
    let listed = i64::try_from(names.len()).unwrap_or(i64::MAX);
    let present = if names.is_empty() {
        "none".to_string()
    } else if listed < total {
        format!("{} and {} more", names.join(", "), total - listed)
    } else {
        names.join(", ")
    };
    Err(Error::new(ErrorKind::NotAJournal {
        path: journal.into(),
        detail: format!(
            "{db} has no journal named `{journal}` (journals present: {present}); check the \
             name, or create the journal by opening it with the library \
             (`JournalBuilder::open_postgres`)"
        ),
    }))
}

/// The schema's version, after creating the schema if it is missing.
fn ensure(conn: &mut Conn, place: &str) -> Result<i32> {
    for attempt in 0..ATTEMPTS {
        if let Some(v) = version(conn, place)? {
            return Ok(v);
        }
        let create = CREATE.replace("{version}", &SCHEMA_VERSION.to_string());
        if let Err(e) = conn.client.batch_execute(&create) {
            // A failed statement leaves the transaction open and aborted.
            let _ = conn.client.batch_execute("ROLLBACK");
            let raced = e.code().is_some_and(|c| RACES.contains(&c.code()));
            if !raced {
                return Err(classify(e, "create the schema", place));
            }
            // Let the winner commit, then read what it made.
            thread::sleep(Duration::from_millis(10 << attempt.min(6)));
        }
    }
    Err(Error::new(ErrorKind::Unavailable {
        detail: format!(
            "could not create the schema for {place}: {ATTEMPTS} attempts raced other \
             processes creating it"
        ),
        outcome_unknown: false,
    }))
}

/// The version row's value; `None` when the schema's tables or row do not exist.
fn version(conn: &mut Conn, place: &str) -> Result<Option<i32>> {
    match conn
        .client
        .query_opt("SELECT version FROM opjournal_schema WHERE id = 1", &[])
    {
        Ok(row) => row
            .map(|r| r.try_get::<_, i32>(0))
            .transpose()
            .map_err(|e| classify(e, "read the schema version", place)),
        Err(e) if e.code().is_some_and(|c| c.code() == "42P01") => Ok(None),
        Err(e) => Err(classify(e, "read the schema version", place)),
    }
}

/// Moves an older schema to [`SCHEMA_VERSION`], one step of [`MIGRATIONS`] at a time, in
/// one transaction that holds the version row (a second process migrating at once waits,
/// then finds the work done).
fn migrate(conn: &mut Conn, place: &str) -> Result<()> {
    let during = "migrate the schema";
    let mut txn = conn
        .client
        .transaction()
        .map_err(|e| classify(e, during, place))?;
    let mut version: i32 = txn
        .query_one(
            "SELECT version FROM opjournal_schema WHERE id = 1 FOR UPDATE",
            &[],
        )
        .and_then(|r| r.try_get(0))
        .map_err(|e| classify(e, during, place))?;
    if version >= SCHEMA_VERSION {
        // Another process migrated it meanwhile (a newer one is refused on the next open).
        return txn.commit().map_err(|e| classify(e, during, place));
    }
    while version < SCHEMA_VERSION {
        let Some((_, step)) = MIGRATIONS.iter().find(|(from, _)| *from == version) else {
            // Dropping `txn` rolls back.
            return Err(Error::new(ErrorKind::UnsupportedFormat {
                found: u32::try_from(version).unwrap_or(0),
                supported: SCHEMA_VERSION as u32,
            }));
        };
        txn.batch_execute(step)
            .map_err(|e| classify(e, during, place))?;
        version += 1;
    }
    txn.execute(
        "UPDATE opjournal_schema SET version = $1 WHERE id = 1",
        &[&SCHEMA_VERSION],
    )
    .map_err(|e| classify(e, during, place))?;
    txn.commit().map_err(|e| classify(e, during, place))
}
