//! The editor's document in PostgreSQL (feature `postgres`): what `opjournal serve
//! --postgres` serves, from as many processes as share the database. The journal lives in
//! the same database, so an edit and its receipt commit in one transaction
//! ([`Journal::execute_in`](crate::Journal::execute_in)): a process that dies mid-edit
//! leaves neither, and nothing is ever in doubt.
//!
//! # Tables
//!
//! Created by the service if missing (several processes may create them at once), and
//! versioned like the journal's own schema (`opjournal_scene_schema`: a newer version is
//! refused). Each document is keyed by its name (the journal's name):
//!
//! - `opjournal_scene_schema (id = 1, version)`;
//! - `opjournal_scene_documents (name, revision)`: one row per document, locked `FOR UPDATE`
//!   by every edit, which checks the edit's base revision under it;
//! - `opjournal_scene_objects (document, name, beside)`: the scene's objects;
//! - `opjournal_scene_applied (document, op, revision, at_ms, edit, summary, times)`: the
//!   applied-operation index (which operation's edit produced which revision, kept for the
//!   retention), what an in-doubt operation is settled from; `times` counts how often an
//!   edit of that operation was applied (1 in a correct service).
//!
//! Nothing is cached in the process: every read is a query, so every process serves the
//! same document.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use crate::Timestamp;
use crate::postgres::{Client, Config, NoTls, Transaction};

use super::document::{AppliedEdit, Document, cutoff};
use super::protocol::Edit;
use super::{ServiceError, lock};

/// The version of the document's tables this build creates, reads and writes.
pub(crate) const SCENE_SCHEMA_VERSION: i32 = 1;

/// The tables of [`SCENE_SCHEMA_VERSION`] and the version row, in one transaction.
const CREATE: &str = "BEGIN; \
    CREATE TABLE IF NOT EXISTS opjournal_scene_schema (\
        id int PRIMARY KEY CHECK (id = 1), \
        version int NOT NULL); \
    CREATE TABLE IF NOT EXISTS opjournal_scene_documents (\
        name text PRIMARY KEY, \
        revision int8 NOT NULL, \
        created_at timestamptz NOT NULL DEFAULT now()); \
    CREATE TABLE IF NOT EXISTS opjournal_scene_objects (\
        document text NOT NULL, \
        name text NOT NULL, \
        beside text, \
        PRIMARY KEY (document, name)); \
    CREATE TABLE IF NOT EXISTS opjournal_scene_applied (\
        document text NOT NULL, \
        op text NOT NULL, \
        revision int8 NOT NULL, \
        at_ms int8 NOT NULL, \
        edit text NOT NULL, \
        summary text NOT NULL, \
        times int4 NOT NULL, \
        PRIMARY KEY (document, op)); \
    CREATE INDEX IF NOT EXISTS opjournal_scene_applied_at \
        ON opjournal_scene_applied (document, at_ms); \
    INSERT INTO opjournal_scene_schema (id, version) VALUES (1, {version}) \
        ON CONFLICT (id) DO NOTHING; \
    COMMIT";

/// SQLSTATEs of a creation that raced another process's: try again.
const RACES: [&str; 5] = ["23505", "42P07", "42710", "40001", "40P01"];

/// Attempts at creating the tables while other processes create them too.
const ATTEMPTS: u32 = 8;

/// Applied-operation entries past the retention are dropped every this many revisions (in
/// the edit's transaction).
const PRUNE_EVERY: u64 = 1000;

/// The server-side timeouts of the service's own connections (statements, lock waits, a
/// transaction left idle), so that a process that stalls mid-edit cannot keep the
/// document's and the journal's locks: the journal's own default.
const SERVER_TIMEOUT: Duration = Duration::from_secs(30);

/// Why an edit made in the database changed nothing.
#[derive(Debug)]
pub(crate) enum EditFailure {
    /// The edit does not fit the document.
    Refused(String),
    /// The edit code panicked.
    Panicked(String),
    /// The document moved past the edit's base revision.
    Stale { base: u64, current: u64 },
    /// Fault injection: the process "died" here.
    Crashed,
    /// The database failed; the transaction is aborted.
    Database(ServiceError),
}

/// An edit applied in the caller's transaction: the revision it produced, in words.
#[derive(Debug)]
pub(crate) struct AppliedNow {
    pub(crate) revision: u64,
    pub(crate) summary: String,
}

/// The document `name` in one database, and this process's two connections to it: one for
/// edits (they run one at a time, under the journal's writer lock), one for reads.
pub(crate) struct SceneDb {
    config: Config,
    name: String,
    retention: Duration,
    edits: Mutex<Option<Client>>,
    reads: Mutex<Option<Client>>,
}

impl std::fmt::Debug for SceneDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the URL: it may hold a password.
        f.debug_struct("SceneDb")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A connection taken from its slot; put back when dropped unless it was closed (then the
/// next use connects anew).
pub(crate) struct Connection<'a> {
    slot: MutexGuard<'a, Option<Client>>,
    client: Option<Client>,
}

impl Connection<'_> {
    pub(crate) fn client(&mut self) -> Option<&mut Client> {
        self.client.as_mut()
    }
}

impl Drop for Connection<'_> {
    fn drop(&mut self) {
        if let Some(client) = self.client.take()
            && !client.is_closed()
        {
            *self.slot = Some(client);
        }
    }
}

fn db_err(what: impl Into<String>) -> impl FnOnce(::postgres::Error) -> ServiceError {
    let what = what.into();
    move |source| ServiceError::Database { what, source }
}

fn to_u64(v: i64, what: &str, name: &str) -> Result<u64, ServiceError> {
    u64::try_from(v).map_err(|_| ServiceError::Document {
        path: format!("postgres:{name}").into(),
        detail: format!("{what} is {v}, below zero; the table was changed by hand"),
    })
}

fn to_i64(v: u64, what: &str, name: &str) -> Result<i64, ServiceError> {
    i64::try_from(v).map_err(|_| ServiceError::Document {
        path: format!("postgres:{name}").into(),
        detail: format!("{what} {v} does not fit in the table's int8"),
    })
}

impl SceneDb {
    /// Connects to the database at `url`, creates the document's tables if missing (checking
    /// their version), and creates document `name` (the starter scene at revision 0) if it
    /// does not exist yet.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Database`] when the database cannot be reached or refuses a
    /// statement; [`ServiceError::Document`] when its tables are of a newer version.
    pub(crate) fn open(
        url: &str,
        name: &str,
        retention: Duration,
    ) -> Result<SceneDb, ServiceError> {
        let mut config: Config = url.parse().map_err(db_err(
            "read the database URL (postgresql://user@host:port/db)",
        ))?;
        config
            .connect_timeout(Duration::from_secs(5))
            .keepalives_idle(Duration::from_secs(10))
            .application_name("opjournal serve");
        let db = SceneDb {
            config,
            name: name.to_string(),
            retention,
            edits: Mutex::new(None),
            reads: Mutex::new(None),
        };
        let mut conn = db.connection(&db.edits)?;
        let client = conn.client().ok_or(ServiceError::Unavailable)?;
        ensure_schema(client, name)?;
        create_document(client, name)?;
        drop(conn);
        Ok(db)
    }

    fn connect(&self) -> Result<Client, ServiceError> {
        let mut client = self
            .config
            .connect(NoTls)
            .map_err(db_err("connect to the document's database"))?;
        let ms = SERVER_TIMEOUT.as_millis();
        client
            .batch_execute(&format!(
                "SET statement_timeout = {ms}; SET lock_timeout = {ms}; \
                 SET idle_in_transaction_session_timeout = {ms}"
            ))
            .map_err(db_err("set the timeouts of a connection to the database"))?;
        Ok(client)
    }

    fn connection<'a>(
        &self,
        slot: &'a Mutex<Option<Client>>,
    ) -> Result<Connection<'a>, ServiceError> {
        let mut slot = lock(slot);
        let client = match slot.take() {
            Some(c) if !c.is_closed() => c,
            _ => self.connect()?,
        };
        Ok(Connection {
            slot,
            client: Some(client),
        })
    }

    /// The connection edits run on (one at a time in this process).
    pub(crate) fn edit_connection(&self) -> Result<Connection<'_>, ServiceError> {
        self.connection(&self.edits)
    }

    /// The document's revision now.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Database`]; [`ServiceError::Document`] when the row is missing.
    pub(crate) fn revision(&self) -> Result<u64, ServiceError> {
        let mut conn = self.connection(&self.reads)?;
        let client = conn.client().ok_or(ServiceError::Unavailable)?;
        let row = client
            .query_opt(
                "SELECT revision FROM opjournal_scene_documents WHERE name = $1",
                &[&self.name],
            )
            .map_err(db_err(format!(
                "read the revision of document `{}`",
                self.name
            )))?;
        let revision: i64 = row
            .ok_or_else(|| self.missing())?
            .try_get(0)
            .map_err(db_err("read a revision"))?;
        to_u64(revision, "the revision", &self.name)
    }

    /// The whole document (objects, revision, applied-operation index within the
    /// retention), read in one snapshot.
    ///
    /// # Errors
    ///
    /// As [`SceneDb::revision`]; [`ServiceError::Document`] for a row that is not an edit.
    pub(crate) fn document(&self, now: Timestamp) -> Result<Document, ServiceError> {
        let mut conn = self.connection(&self.reads)?;
        let client = conn.client().ok_or(ServiceError::Unavailable)?;
        let mut txn = client
            .build_transaction()
            .isolation_level(::postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(db_err("begin reading the document"))?;
        let revision = txn
            .query_opt(
                "SELECT revision FROM opjournal_scene_documents WHERE name = $1",
                &[&self.name],
            )
            .map_err(db_err("read the document's revision"))?
            .ok_or_else(|| self.missing())?
            .try_get::<_, i64>(0)
            .map_err(db_err("read a revision"))?;
        let objects = objects(&mut txn, &self.name)?;
        let since = to_i64(
            cutoff(now, self.retention).as_millis(),
            "the cutoff",
            &self.name,
        )?;
        let rows = txn
            .query(
                "SELECT op, revision, at_ms, edit, summary, times FROM opjournal_scene_applied \
                 WHERE document = $1 AND at_ms >= $2",
                &[&self.name, &since],
            )
            .map_err(db_err("read the applied-operation index"))?;
        let applied = rows
            .iter()
            .map(|row| self.applied_row(row))
            .collect::<Result<Vec<_>, _>>()?;
        txn.commit().map_err(db_err("end reading the document"))?;
        Ok(Document::from_parts(
            to_u64(revision, "the revision", &self.name)?,
            objects,
            applied,
        ))
    }

    /// The applied edit of operation `op`, if its effect is in the document.
    ///
    /// # Errors
    ///
    /// As [`SceneDb::document`].
    pub(crate) fn applied(&self, op: &str) -> Result<Option<AppliedEdit>, ServiceError> {
        let mut conn = self.connection(&self.reads)?;
        let client = conn.client().ok_or(ServiceError::Unavailable)?;
        let row = client
            .query_opt(
                "SELECT op, revision, at_ms, edit, summary, times FROM opjournal_scene_applied \
                 WHERE document = $1 AND op = $2",
                &[&self.name, &op],
            )
            .map_err(db_err(format!(
                "look up `{op}` in the applied-operation index"
            )))?;
        row.map(|r| self.applied_row(&r)).transpose()
    }

    fn applied_row(&self, row: &::postgres::Row) -> Result<AppliedEdit, ServiceError> {
        let get = db_err("read a row of the applied-operation index");
        let (op, revision, at, edit, summary, times) = (|| {
            Ok::<_, ::postgres::Error>((
                row.try_get::<_, String>(0)?,
                row.try_get::<_, i64>(1)?,
                row.try_get::<_, i64>(2)?,
                row.try_get::<_, String>(3)?,
                row.try_get::<_, String>(4)?,
                row.try_get::<_, i32>(5)?,
            ))
        })()
        .map_err(get)?;
        let edit: Edit = serde_json::from_str(&edit).map_err(|e| ServiceError::Document {
            path: format!("postgres:{}", self.name).into(),
            detail: format!("the applied edit of `{op}` is not an edit ({e}): {edit}"),
        })?;
        Ok(AppliedEdit {
            revision: to_u64(revision, "a revision", &self.name)?,
            at: Timestamp::from_millis(to_u64(at, "a time", &self.name)?),
            edit,
            summary,
            times: u32::try_from(times).unwrap_or(0),
            op,
        })
    }

    fn missing(&self) -> ServiceError {
        ServiceError::Document {
            path: format!("postgres:{}", self.name).into(),
            detail: "its row in opjournal_scene_documents is missing (deleted by hand?); \
                     restart the service to create a new document"
                .into(),
        }
    }

    /// Applies `edit` as operation `op` in `txn`: locks the document's row, checks the base
    /// revision under the lock, checks the edit (catching a panic of the edit code, which
    /// `fault` may cause), then writes the changed objects, the applied-operation entry and
    /// the new revision. Nothing is committed here: the caller's transaction decides.
    pub(crate) fn apply_in(
        &self,
        txn: &mut Transaction<'_>,
        op: &str,
        base: u64,
        edit: &Edit,
        at: Timestamp,
        fault: impl FnOnce(),
    ) -> Result<AppliedNow, EditFailure> {
        let name = &self.name;
        let db = |e: ServiceError| EditFailure::Database(e);
        let current: i64 = txn
            .query_opt(
                "SELECT revision FROM opjournal_scene_documents WHERE name = $1 FOR UPDATE",
                &[name],
            )
            .map_err(db_err(format!("lock document `{name}`")))
            .map_err(db)?
            .ok_or_else(|| db(self.missing()))?
            .try_get(0)
            .map_err(db_err("read a revision"))
            .map_err(db)?;
        let current = to_u64(current, "the revision", name).map_err(db)?;
        if base < current {
            return Err(EditFailure::Stale { base, current });
        }
        let mut doc = Document::from_parts(current, objects(txn, name).map_err(db)?, Vec::new());
        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fault();
            doc.check(edit)
        }));
        let summary = match checked {
            Ok(Ok(summary)) => summary,
            Ok(Err(reason)) => return Err(EditFailure::Refused(reason)),
            Err(panic) => {
                let message = crate::panics::message(panic.as_ref());
                let message = message.unwrap_or("a panic without a message");
                return Err(EditFailure::Panicked(message.to_string()));
            }
        };
        let before = doc.objects().clone();
        let revision = current.saturating_add(1);
        doc.apply_edit(op, revision, at, edit, &summary);
        self.write(txn, &before, &doc, op, at).map_err(db)?;
        Ok(AppliedNow { revision, summary })
    }

    /// Writes what `after` changed from `before`, its applied entry for `op` and its
    /// revision, in `txn`.
    fn write(
        &self,
        txn: &mut Transaction<'_>,
        before: &BTreeMap<String, Option<String>>,
        after: &Document,
        op: &str,
        at: Timestamp,
    ) -> Result<(), ServiceError> {
        let name = &self.name;
        for (object, beside) in after.objects() {
            if before.get(object) != Some(beside) {
                txn.execute(
                    "INSERT INTO opjournal_scene_objects (document, name, beside) \
                     VALUES ($1, $2, $3) \
                     ON CONFLICT (document, name) DO UPDATE SET beside = EXCLUDED.beside",
                    &[name, object, beside],
                )
                .map_err(db_err(format!("write object `{object}`")))?;
            }
        }
        for object in before.keys().filter(|o| !after.objects().contains_key(*o)) {
            txn.execute(
                "DELETE FROM opjournal_scene_objects WHERE document = $1 AND name = $2",
                &[name, object],
            )
            .map_err(db_err(format!("delete object `{object}`")))?;
        }
        let revision = to_i64(after.revision(), "the revision", name)?;
        let Some(entry) = after.applied(op) else {
            return Err(ServiceError::Document {
                path: format!("postgres:{name}").into(),
                detail: format!(
                    "the edit of `{op}` is missing from the index it was just added to"
                ),
            });
        };
        let edit_json = serde_json::to_string(&entry.edit).map_err(|e| ServiceError::Document {
            path: format!("postgres:{name}").into(),
            detail: format!("the edit of `{}` could not be serialized: {e}", entry.op),
        })?;
        let at_ms = to_i64(at.as_millis(), "the time", name)?;
        txn.execute(
            "INSERT INTO opjournal_scene_applied \
                 (document, op, revision, at_ms, edit, summary, times) \
             VALUES ($1, $2, $3, $4, $5, $6, 1) \
             ON CONFLICT (document, op) DO UPDATE SET revision = EXCLUDED.revision, \
                 at_ms = EXCLUDED.at_ms, edit = EXCLUDED.edit, summary = EXCLUDED.summary, \
                 times = opjournal_scene_applied.times + 1",
            &[
                name,
                &entry.op,
                &revision,
                &at_ms,
                &edit_json,
                &entry.summary,
            ],
        )
        .map_err(db_err(format!(
            "record `{}` in the applied-operation index",
            entry.op
        )))?;
        txn.execute(
            "UPDATE opjournal_scene_documents SET revision = $2 WHERE name = $1",
            &[name, &revision],
        )
        .map_err(db_err(format!(
            "move document `{name}` to revision {revision}"
        )))?;
        if after.revision().is_multiple_of(PRUNE_EVERY) {
            let since = to_i64(cutoff(at, self.retention).as_millis(), "the cutoff", name)?;
            txn.execute(
                "DELETE FROM opjournal_scene_applied WHERE document = $1 AND at_ms < $2",
                &[name, &since],
            )
            .map_err(db_err("drop applied-operation entries past the retention"))?;
        }
        Ok(())
    }
}

/// The document's objects, read in `txn`.
fn objects(
    txn: &mut Transaction<'_>,
    name: &str,
) -> Result<BTreeMap<String, Option<String>>, ServiceError> {
    let rows = txn
        .query(
            "SELECT name, beside FROM opjournal_scene_objects WHERE document = $1",
            &[&name],
        )
        .map_err(db_err(format!("read the objects of document `{name}`")))?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_, ::postgres::Error>>()
        .map_err(db_err("read an object"))
}

/// Creates the tables if missing and checks their version.
fn ensure_schema(client: &mut Client, name: &str) -> Result<(), ServiceError> {
    for attempt in 0..ATTEMPTS {
        match client.query_opt(
            "SELECT version FROM opjournal_scene_schema WHERE id = 1",
            &[],
        ) {
            Ok(Some(row)) => {
                let version: i32 = row.try_get(0).map_err(db_err("read the tables' version"))?;
                if version > SCENE_SCHEMA_VERSION {
                    return Err(ServiceError::Document {
                        path: format!("postgres:{name}").into(),
                        detail: format!(
                            "its tables (opjournal_scene_*) are version {version}, newer than \
                             this build's {SCENE_SCHEMA_VERSION}; use a newer opjournal"
                        ),
                    });
                }
                // Version 1 is the first: nothing older to migrate.
                return Ok(());
            }
            Ok(None) => {}
            Err(e) if e.code().is_some_and(|c| c.code() == "42P01") => {}
            Err(e) => return Err(db_err("read the version of the document's tables")(e)),
        }
        let create = CREATE.replace("{version}", &SCENE_SCHEMA_VERSION.to_string());
        if let Err(e) = client.batch_execute(&create) {
            let _ = client.batch_execute("ROLLBACK");
            if !e.code().is_some_and(|c| RACES.contains(&c.code())) {
                return Err(db_err("create the document's tables (opjournal_scene_*)")(
                    e,
                ));
            }
            // Another process created them meanwhile: let it commit, then read its work.
            thread::sleep(Duration::from_millis(10 << attempt.min(6)));
        }
    }
    Err(ServiceError::Document {
        path: format!("postgres:{name}").into(),
        detail: format!(
            "its tables could not be created: {ATTEMPTS} attempts raced other processes \
             creating them; start the service again"
        ),
    })
}

/// Creates document `name` (the starter scene at revision 0) unless it exists. Processes
/// starting at once wait for the first one's insert, then find the row.
fn create_document(client: &mut Client, name: &str) -> Result<(), ServiceError> {
    let mut txn = client
        .transaction()
        .map_err(db_err("begin creating the document"))?;
    let created = txn
        .query_opt(
            "INSERT INTO opjournal_scene_documents (name, revision) VALUES ($1, 0) \
             ON CONFLICT (name) DO NOTHING RETURNING name",
            &[&name],
        )
        .map_err(db_err(format!("create document `{name}`")))?;
    if created.is_some() {
        for (object, beside) in Document::starter().objects() {
            txn.execute(
                "INSERT INTO opjournal_scene_objects (document, name, beside) VALUES ($1, $2, $3)",
                &[&name, object, beside],
            )
            .map_err(db_err(format!(
                "write object `{object}` of the new document"
            )))?;
        }
    }
    txn.commit()
        .map_err(db_err(format!("commit the new document `{name}`")))
}
