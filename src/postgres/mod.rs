//! A journal in PostgreSQL (feature `postgres`): one journal in one database, shared by
//! the processes of a service on several machines. Open it with
//! [`JournalBuilder::open_postgres`](crate::JournalBuilder::open_postgres); complete an
//! operation together with an effect on the same database with
//! [`Journal::execute_in`](crate::Journal::execute_in), which takes this module's
//! [`Transaction`]. A database that cannot be reached, a timeout or a conflict the library's
//! own retries did not clear is [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable),
//! retryable. docs/postgres.md has the schema and what each guarantee rests on.

// How it works. The journal's group committer calls this layer; it knows tables as
// numbers, keys as bytes in key order and values as record bytes (the `Store` seam of
// `crate::index::store`), nothing of the state machine.
//
// - `Pg`: a pool of blocking `postgres::Client`s for one journal (schema created, version
//   checked and journal registered on `Pg::connect`);
// - `PgRead`: a snapshot (`REPEATABLE READ, READ ONLY`) and the server's time;
// - `PgWrite`: a write transaction holding the journal's writer lock, its row in
//   `opjournal_journals`;
// - `PgWriteIn`: the same, in a transaction the embedder owns;
// - `classify`, `classify_commit`, `is_conflict`: postgres errors as the journal's
//   (`ErrorKind::Unavailable` for what a retry may fix).
//
// Round trips: beginning a read (with the server's time) is one, beginning a write (the
// lock and the server's time) one, a `get`, `scan` or `count` one (plus one per
// connection for the statement's first use, to prepare it), a batch of up to 10,000
// changes one per kind (upserts, deletes), COMMIT and the end of a read one each.
//
// Only SQL that CockroachDB and YugabyteDB accept as well (`ON CONFLICT`, `FOR UPDATE`,
// `SKIP LOCKED`, arrays); no advisory locks, no sequences, no PL/pgSQL. No TLS yet.
//
// Every call on a pooled connection is bounded on the client too (`deadline.rs`): a
// server silent for longer than the server-side timeouts plus a margin while a call
// waits for its answer (a network partition, a proxy that holds the bytes) fails the call
// with `ErrorKind::Unavailable` and drops the connection.

/// The `postgres` crate's client types that [`Journal::execute_in`](crate::Journal::execute_in)
/// takes, re-exported so that an embedder uses the same version as the journal.
pub use ::postgres::{Client, Config, NoTls, Transaction};

mod deadline;
mod errors;
mod pool;
mod schema;
mod sql;
mod store;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub(crate) use errors::is_conflict;
pub(crate) use store::{PgRead, PgWrite, PgWriteIn};

use crate::error::{Error, Result};
use crate::index::Memtable;
use pool::Pool;

/// Connection settings for one journal in one database.
///
/// Defaults ([`PgConfig::new`]): a pool of 8 connections, a connect timeout of 5 s,
/// `statement_timeout`, `idle_in_transaction_session_timeout` and `lock_timeout` of 30 s
/// each ([`PgConfig::timeouts`]), TCP keepalives on (first probe after 10 s idle), and a
/// client-side limit on the server's silence during a call of the longest of those
/// timeouts plus a margin ([`call_limit`]). A zero server timeout turns that timeout
/// off.
#[derive(Clone)]
pub(crate) struct PgConfig {
    /// The connection string: a URL (`postgresql://user@host:5432/db`) or `key=value`
    /// pairs, as libpq takes them.
    pub(crate) url: String,
    /// The journal's name: its row in `opjournal_journals` and its entries' key prefix.
    /// Several journals share a database; none sees another's entries.
    pub(crate) journal: String,
    /// Most connections open at once (at least 1).
    pub(crate) pool_size: usize,
    /// How long opening a connection may take.
    pub(crate) connect_timeout: Duration,
    /// The server cancels a statement running longer (SQLSTATE 57014).
    pub(crate) statement_timeout: Duration,
    /// The server ends a session idle this long inside a transaction (SQLSTATE 25P03), so
    /// a process that stalls while holding the writer lock frees it.
    pub(crate) idle_in_transaction_timeout: Duration,
    /// The server stops a lock wait this long (SQLSTATE 55P03): the writer lock, and the
    /// rows' locks.
    pub(crate) lock_timeout: Duration,
    /// How long the server may stay silent while a call waits for its answer before the
    /// call fails (and `tcp_user_timeout`, for data the server never acknowledges).
    pub(crate) call_limit: Duration,
    /// Idle time before the first TCP keepalive probe (then every half of it, 3 probes),
    /// so that a peer that vanished is noticed on an idle connection.
    pub(crate) keepalive_idle: Duration,
}

impl PgConfig {
    /// The settings for `journal` in the database at `url`, with the defaults.
    pub(crate) fn new(url: &str, journal: &str) -> PgConfig {
        PgConfig {
            url: url.to_string(),
            journal: journal.to_string(),
            pool_size: 8,
            connect_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
            idle_in_transaction_timeout: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(30),
            call_limit: call_limit(Duration::from_secs(30)),
            keepalive_idle: Duration::from_secs(10),
        }
    }

    /// Sets `statement_timeout`, `lock_timeout` and `idle_in_transaction_session_timeout`
    /// to `timeout`, and the client's limit on the server's silence during a call to
    /// [`call_limit`]`(timeout)`.
    pub(crate) fn timeouts(mut self, timeout: Duration) -> PgConfig {
        self.statement_timeout = timeout;
        self.lock_timeout = timeout;
        self.idle_in_transaction_timeout = timeout;
        self.call_limit = call_limit(timeout);
        self
    }
}

/// The client's limit on the server's silence during a call when the server's own
/// timeouts are `timeout`: `timeout` plus a tenth of it, at least 1 s, so that a lock wait
/// or a statement the server is still allowed to run is never cut by the client first
/// (the server answers its own timeout with an error, which is not silence).
pub(crate) fn call_limit(timeout: Duration) -> Duration {
    timeout.saturating_add((timeout / 10).max(Duration::from_secs(1)))
}

/// Shows the settings without the password the URL may hold.
impl fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConfig")
            .field("url", &redact(&self.url))
            .field("journal", &self.journal)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .field(
                "idle_in_transaction_timeout",
                &self.idle_in_transaction_timeout,
            )
            .field("lock_timeout", &self.lock_timeout)
            .field("call_limit", &self.call_limit)
            .field("keepalive_idle", &self.keepalive_idle)
            .finish()
    }
}

/// What the pool and every transaction share.
pub(super) struct Shared {
    pool: Pool,
    /// The journal's name.
    journal: String,
    /// The journal's name as a SQL string literal, for the simple queries that take the
    /// lock (which carry no parameters).
    literal: String,
    /// The database, for messages: ``database `app` at db1:5432``.
    database: String,
}

/// A pool of blocking `postgres::Client`s for one journal in one database. Cheap to clone
/// (the clones share the pool); `Send + Sync`.
#[derive(Clone)]
pub(crate) struct Pg {
    shared: Arc<Shared>,
}

impl fmt::Debug for Pg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Pg").field(&self.describe()).finish()
    }
}

impl Pg {
    /// Connects, creates the schema if it is missing (several processes may do so at
    /// once), checks its version (migrating an older one) and registers the journal's
    /// name, whose row is the journal's writer lock. Opens one connection; the pool opens
    /// more as transactions need them.
    ///
    /// # Errors
    ///
    /// - [`ErrorKind::InvalidInput`] for a connection string that does not parse, or a
    ///   journal name that is empty, longer than 256 bytes or holds a control character;
    /// - [`ErrorKind::UnsupportedFormat`] when the database's schema is newer than this
    ///   build's ([`SCHEMA_VERSION`]): open it with a newer opjournal;
    /// - [`ErrorKind::Unavailable`] when the server cannot be reached;
    /// - [`ErrorKind::Storage`] for what the server refused otherwise (authentication, a
    ///   missing database, permissions), with its error as the source.
    pub(crate) fn connect(cfg: PgConfig) -> Result<Pg> {
        let shared = Pg::pool(cfg, "")?;
        Pg::first_connection(&shared, |conn, shared| {
            schema::prepare(conn, &shared.literal, shared.pool.place())
        })?;
        Ok(Pg { shared })
    }

    /// Connects to an existing journal for reading only: nothing is created, registered
    /// or written. Every session of the pool runs with `default_transaction_read_only`
    /// on, so a write sent by mistake fails on the server. Checks that the schema exists
    /// at this build's version and that the journal is registered.
    ///
    /// # Errors
    ///
    /// - [`ErrorKind::NotAJournal`](crate::ErrorKind::NotAJournal) (its `path` the
    ///   journal's name) when the database holds no opjournal schema, or no journal of
    ///   that name: the message names the database and the journals it holds;
    /// - [`ErrorKind::UnsupportedFormat`](crate::ErrorKind::UnsupportedFormat) when the
    ///   schema is newer than this build's ([`SCHEMA_VERSION`]), or older (a writer of
    ///   this build migrates it when it opens the journal);
    /// - as [`Pg::connect`] for the connection string, the name, and the server.
    pub(crate) fn connect_read_only(cfg: PgConfig) -> Result<Pg> {
        let shared = Pg::pool(cfg, "; SET default_transaction_read_only = on")?;
        Pg::first_connection(&shared, |conn, shared| {
            schema::check_existing(conn, &shared.journal, &shared.database, shared.pool.place())
        })?;
        Ok(Pg { shared })
    }

    /// The pool for `cfg` (no connection opened yet); `extra` is appended to the
    /// settings every new session runs.
    fn pool(cfg: PgConfig, extra: &str) -> Result<Arc<Shared>> {
        check_journal_name(&cfg.journal)?;
        let mut config = cfg.url.parse::<postgres::Config>().map_err(|e| {
            Error::invalid(
                "database url",
                &redact(&cfg.url),
                format!(
                    "it is not a PostgreSQL connection string ({e}); write it as \
                     `postgresql://user@host:5432/database` or as `host=... dbname=...`"
                ),
            )
        })?;
        let idle = cfg.keepalive_idle.max(Duration::from_secs(1));
        config
            .connect_timeout(cfg.connect_timeout)
            .keepalives(true)
            .keepalives_idle(idle)
            .keepalives_interval((idle / 2).max(Duration::from_secs(1)))
            .keepalives_retries(3)
            .tcp_user_timeout(cfg.call_limit);
        if config.get_application_name().is_none() {
            config.application_name("opjournal");
        }
        let db = database(&config);
        let place = format!("journal `{}` in {db}", cfg.journal);
        let settings = format!(
            "SET statement_timeout = '{}ms'; \
             SET idle_in_transaction_session_timeout = '{}ms'; \
             SET lock_timeout = '{}ms'{extra}",
            cfg.statement_timeout.as_millis(),
            cfg.idle_in_transaction_timeout.as_millis(),
            cfg.lock_timeout.as_millis(),
        );
        // A caller waits for a pooled connection as long as a leased one may legitimately
        // be busy: a lock wait or a statement, after connecting.
        let wait = cfg.connect_timeout + cfg.statement_timeout.max(cfg.lock_timeout);
        Ok(Arc::new(Shared {
            pool: Pool::new(config, settings, cfg.pool_size, wait, cfg.call_limit, place),
            literal: literal(&cfg.journal),
            journal: cfg.journal,
            database: db,
        }))
    }

    /// Opens the pool's first connection and runs `check` on it (outside a transaction),
    /// putting the connection back if it passes and dropping it if not.
    fn first_connection(
        shared: &Arc<Shared>,
        check: impl FnOnce(&mut pool::Conn, &Shared) -> Result<()>,
    ) -> Result<()> {
        let mut conn = shared.pool.take()?;
        let armed = conn.arm();
        let checked = check(&mut conn, shared);
        drop(armed);
        match checked {
            Ok(()) => {
                shared.pool.give(conn);
                Ok(())
            }
            Err(e) => {
                shared.pool.discard(conn);
                Err(e)
            }
        }
    }

    /// Writes `initial` (a new journal's first records: format, state, checkpoint) iff the
    /// journal holds no entry yet, in one transaction under the writer lock; returns
    /// whether it wrote. Of several processes creating the journal at once, one writes.
    ///
    /// # Errors
    ///
    /// As [`Pg::write`] and [`PgWrite::commit`] (after an unknown outcome, call it again:
    /// it answers `false` if the first call committed).
    pub(crate) fn initialize(&self, initial: &Memtable) -> Result<bool> {
        let Some((w, _)) = self.write(true)? else {
            return Err(store::unexpected(
                self.shared.pool.place(),
                "a lock wait came back without the lock",
            ));
        };
        if w.any()? {
            // Dropping `w` rolls back.
            return Ok(false);
        }
        w.apply(initial)?;
        w.commit()?;
        Ok(true)
    }

    /// A consistent read: a pooled connection in `BEGIN ISOLATION LEVEL REPEATABLE READ,
    /// READ ONLY`, and the server's time in ms since the epoch (`now()`, the transaction's
    /// start), in one round trip.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unavailable`] when no connection can be had or the server drops it.
    pub(crate) fn read(&self) -> Result<(PgRead, u64)> {
        PgRead::begin(&self.shared)
    }

    /// A write transaction (READ COMMITTED) holding the journal's writer lock, and the
    /// server's clock in ms since the epoch read after the lock was granted, in one round
    /// trip. When `wait` is false and another transaction holds the lock: `Ok(None)`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unavailable`] when no connection can be had, the server drops it, or
    /// the lock wait passes `lock_timeout` (SQLSTATE 55P03); [`ErrorKind::NotAJournal`]
    /// when the journal's row was deleted since [`Pg::connect`].
    pub(crate) fn write(&self, wait: bool) -> Result<Option<(PgWrite, u64)>> {
        PgWrite::begin(&self.shared, wait)
    }

    /// The journal's name.
    pub(crate) fn journal(&self) -> &str {
        &self.shared.journal
    }

    /// The journal's name and the database, for messages:
    /// ``journal `orders` in database `app` at db1:5432``.
    pub(crate) fn describe(&self) -> String {
        self.shared.pool.place().to_string()
    }
}

/// Checks a journal's name: the rules of operation ids (non-empty, at most 256 bytes, no
/// control characters, so no NUL, which PostgreSQL's text cannot hold).
pub(super) fn check_journal_name(journal: &str) -> Result<()> {
    crate::validate::name("journal name", journal)
}

/// `s` as a SQL string literal that means `s` whatever `standard_conforming_strings` says:
/// an escape string (`E'...'`) with each backslash doubled and each quote doubled.
pub(super) fn literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 3);
    out.push_str("E'");
    for c in s.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// The database `config` names, for messages: ``database `app` at db1:5432``.
fn database(config: &postgres::Config) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                postgres::config::Host::Tcp(name) => name.clone(),
                postgres::config::Host::Unix(path) => crate::error::shown(path),
            };
            // libpq's rule: one port for every host, or one per host.
            match ports.get(i).or(ports.first()) {
                Some(port) => format!("{host}:{port}"),
                None => format!("{host}:5432"),
            }
        })
        .collect();
    let db = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("(default)");
    if hosts.is_empty() {
        format!("database `{db}`")
    } else {
        format!("database `{db}` at {}", hosts.join(","))
    }
}

/// `url` without its password (`postgresql://user:***@host/db`, `password=***`), for
/// messages.
fn redact(url: &str) -> String {
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            let user_info = &rest[..at];
            if let Some(colon) = user_info.find(':') {
                return format!(
                    "{}{}:***{}",
                    &url[..scheme_end + 3],
                    &user_info[..colon],
                    &rest[at..]
                );
            }
        }
        // A password in the query string (`?password=...`).
        return redact_pairs(url, '&');
    }
    redact_pairs(url, ' ')
}

/// `s` with the value of each `password=` pair (separated by `sep`) replaced by `***`.
fn redact_pairs(s: &str, sep: char) -> String {
    let Some(start) = s.find("password=") else {
        return s.to_string();
    };
    let value = start + "password=".len();
    let end = s[value..].find(sep).map_or(s.len(), |i| value + i);
    format!("{}***{}", &s[..value], redact_pairs(&s[end..], sep))
}
