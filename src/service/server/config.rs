//! How the service runs: its settings and limits.

use super::*;

/// The journal scope of the document: revisions and the mutation lock are per scope.
pub const SCOPE: &str = "scene/main";
// An object's changed asset, `SCOPE/NAME`, fits the journal's limit for an asset name.
const _: () =
    assert!(SCOPE.len() + 1 + crate::service::MAX_OBJECT_NAME_BYTES == crate::MAX_NAME_BYTES);

/// The stack of a connection thread: it parses JSON (nesting limited to 128 by serde_json)
/// and calls the journal; 512 KiB leaves ample room and keeps a full house of threads
/// small.
pub(super) const CONN_STACK: usize = 512 * 1024;
/// The stack of the thread that applies edits.
pub(super) const EDITOR_STACK: usize = 1024 * 1024;
/// Fresh operations waiting for the editor thread. The scope lock admits one operation at
/// a time, so more than two never wait; the bound is a guard, not a queue.
pub(super) const EDIT_QUEUE: usize = 16;
/// How long the accept loop waits after a failed `accept` (out of descriptors, say)
/// before trying again, instead of spinning.
pub(super) const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Descriptors kept free for everything but client connections: the journal's files, the
/// document's, the listener, the standard streams, a connection being refused.
pub(super) const FD_RESERVE: usize = 32;

/// The process's limit on open descriptors (the soft `RLIMIT_NOFILE`), where the system
/// says it (`/proc/self/limits` on Linux).
pub(super) fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Opens the journal; called at start and again by [`Service::restart`].
pub type JournalOpener = Box<dyn Fn() -> crate::Result<Journal> + Send + Sync>;

/// Receives the service's notes (what it recovered at start, errors it could only log).
pub type Notes = Box<dyn Fn(String) + Send + Sync>;

/// How the service runs. Start from [`ServiceConfig::new`] and change the fields.
#[non_exhaustive]
pub struct ServiceConfig {
    /// The document file (its log and temporary file live beside it).
    pub document: PathBuf,
    /// Connections served at once (default 256). The next one is answered with an `error`
    /// of kind `too_many_connections` and closed. Each connection has a thread and one
    /// descriptor; the service lowers the limit to fit the process's descriptor limit,
    /// keeping 32 for its files.
    pub max_connections: usize,
    /// A connection that sends no whole request for this long is told `idle_timeout` and
    /// closed (default 5 min). Results are pushed again on the next `hello`.
    pub idle_timeout: Duration,
    /// A reply not written in full this long after it is ready (the client stopped
    /// reading, or reads too slowly) closes the connection (default 10 s). It bounds the
    /// whole reply, not each `write`, so a client that reads a little now and then does
    /// not keep it open.
    pub write_timeout: Duration,
    /// How long the document remembers which operations it applied (default 90 days, the
    /// journal's default audit retention; keep it at least the journal's). In-doubt
    /// operations are settled from it.
    pub applied_retention: Duration,
    /// Edits between two snapshots of the document (default 1,000).
    pub snapshot_every: usize,
    /// Where notes go (default: nowhere).
    pub notes: Notes,
    /// The document in PostgreSQL instead of in files ([`ServiceConfig::in_database`]);
    /// `document` is then unused.
    #[cfg(feature = "postgres")]
    pub database: Option<DocumentDatabase>,
}

/// A document kept in PostgreSQL (feature `postgres`), in the database of a journal opened
/// with [`JournalBuilder::open_postgres`](crate::JournalBuilder::open_postgres): its tables
/// are `opjournal_scene_*`, created if missing, and the document is named after the journal.
/// Every edit commits with its receipt in one transaction
/// ([`Journal::execute_in`](crate::Journal::execute_in)), so several services on one
/// database serve one document.
#[cfg(feature = "postgres")]
#[derive(Clone)]
#[non_exhaustive]
pub struct DocumentDatabase {
    /// The connection string (`postgresql://user@host:5432/db`), the journal's.
    pub url: String,
    /// The document's name: the journal's name.
    pub name: String,
}

#[cfg(feature = "postgres")]
impl std::fmt::Debug for DocumentDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the URL: it may hold a password.
        f.debug_struct("DocumentDatabase")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ServiceConfig {
    /// The defaults, serving the document at `document`.
    pub fn new(document: impl Into<PathBuf>) -> ServiceConfig {
        ServiceConfig {
            document: document.into(),
            max_connections: 256,
            idle_timeout: Duration::from_secs(5 * 60),
            write_timeout: Duration::from_secs(10),
            applied_retention: Duration::from_secs(90 * 24 * 3600),
            snapshot_every: 1000,
            notes: Box::new(|_| {}),
            #[cfg(feature = "postgres")]
            database: None,
        }
    }

    /// The defaults, serving document `name` in the PostgreSQL database at `url` (feature
    /// `postgres`); the journal the service opens must be journal `name` in the same
    /// database.
    #[cfg(feature = "postgres")]
    pub fn in_database(url: &str, name: &str) -> ServiceConfig {
        let mut cfg = ServiceConfig::new(PathBuf::new());
        cfg.database = Some(DocumentDatabase {
            url: url.to_string(),
            name: name.to_string(),
        });
        cfg
    }
}

impl std::fmt::Debug for ServiceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("ServiceConfig");
        d.field("document", &self.document)
            .field("max_connections", &self.max_connections)
            .field("idle_timeout", &self.idle_timeout)
            .field("write_timeout", &self.write_timeout)
            .field("applied_retention", &self.applied_retention)
            .field("snapshot_every", &self.snapshot_every);
        #[cfg(feature = "postgres")]
        d.field("database", &self.database);
        d.finish_non_exhaustive()
    }
}
