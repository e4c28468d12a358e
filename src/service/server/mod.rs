//! The service: accepting connections ([`connections`]), answering requests
//! ([`requests`]), and the one thread that applies edits ([`edits`]); what it answers is
//! built in [`replies`], and how it runs is set in [`config`]. See the module
//! documentation of `service` for what it does and why.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::conn::{Conn, Line, LineReader, refuse};
use super::document::{AppliedEdit, ApplyError, Document, DocumentStore};
use super::pauses::{Pauses, Stage, Verdict};
use super::protocol::{Edit, Reply, Request, ResultMsg, StatusMsg};
use super::{Context, MAX_LINE, ServiceError, chain, lock};
use crate::{
    Admission, Claim, ErrorKind, EventKind, ExecutionStatus, InDoubtCause, Journal, OpResult,
    Operation, Outcome, Receipt, Resolution, RetireCause, validate_name,
};

/// How long a `submit` that finds its operation running waits for the thread the journal
/// admitted to record it as executing here (microseconds after its own answer) before
/// asking the journal again.
const ATTACH_WAIT: Duration = Duration::from_millis(100);

mod config;
mod connections;
#[cfg(feature = "postgres")]
mod database;
mod edits;
mod replies;
mod requests;

#[cfg(feature = "postgres")]
pub use config::DocumentDatabase;
use config::*;
pub use config::{JournalOpener, Notes, SCOPE, ServiceConfig};
use replies::*;

/// What the service found about an operation left in doubt, and how it resolved it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reconciled {
    /// The operation id.
    pub id: String,
    /// Why it was in doubt.
    pub cause: Option<InDoubtCause>,
    /// The revision its edit produced, if the edit is in the document (resolved as
    /// applied); `None` if it is not (resolved as not applied: a retry runs it anew).
    pub applied_at: Option<u64>,
}

/// A reconciliation in words, for the notes.
pub fn describe_reconciled(r: &Reconciled) -> String {
    let why = match r.cause {
        Some(InDoubtCause::Reopened) => "it was running when the service stopped",
        Some(InDoubtCause::LeaseTimeout) => "its execution lease expired",
        _ => "its outcome was unknown",
    };
    match r.applied_at {
        Some(rev) => format!(
            "{} was in doubt ({why}); the document has its edit at revision {rev}: recorded as applied, not run again",
            r.id
        ),
        None => format!(
            "{} was in doubt ({why}); the document does not have its edit: recorded as not applied, a retry will run it",
            r.id
        ),
    }
}

/// A running editor service: an accept thread, one thread per connection, and one thread
/// that applies edits in order.
pub struct Service {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
    editor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("addr", &self.addr)
            .field("config", &self.shared.cfg)
            .finish_non_exhaustive()
    }
}

struct Shared {
    cfg: ServiceConfig,
    open: JournalOpener,
    journal: Mutex<Option<Arc<Journal>>>,
    /// `None` while the service restarts, and always with the document in a database.
    document: Mutex<Option<DocumentStore>>,
    /// The document in PostgreSQL, when the service keeps it there.
    #[cfg(feature = "postgres")]
    database: Option<super::database::SceneDb>,
    live: Mutex<Live>,
    changed: Condvar,
    pauses: Pauses,
    stopping: AtomicBool,
    edits: Mutex<Option<SyncSender<Job>>>,
}

#[derive(Default)]
struct Live {
    next_conn: u64,
    conns: HashMap<u64, Arc<Conn>>,
    /// Session → its current connection (the latest `hello`).
    sessions: HashMap<String, u64>,
    /// Connection threads running.
    readers: usize,
    /// Operations accepted and not yet ended, with the connections attached to them.
    executing: HashMap<String, Execution>,
    /// Whether the editor thread is working on an edit.
    editing: bool,
    refused: u64,
    idle_closed: u64,
}

/// An operation the editor thread has not ended yet.
struct Execution {
    /// The session that submitted it: its current connection gets the answer.
    owner: String,
    /// Other connections that asked for it meanwhile and were told `running`.
    attached: Vec<u64>,
}

/// What submitting an operation gave.
enum Step {
    /// Answered already (with the document in a database, a fresh operation is run and
    /// answered at once), or to be answered with this reply.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Answered(Option<Reply>),
    /// The journal's admission, to act on.
    Known(Box<Admission>),
}

/// A fresh operation for the editor thread.
struct Job {
    claim: Claim,
    edit: Edit,
}

/// Counts a connection thread in `Live` while it runs.
struct ReaderGuard<'a> {
    shared: &'a Shared,
}

impl Drop for ReaderGuard<'_> {
    fn drop(&mut self) {
        let mut live = lock(&self.shared.live);
        live.readers = live.readers.saturating_sub(1);
        self.shared.changed.notify_all();
    }
}

/// Counts of what the service did, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServiceStats {
    /// Connections open now.
    pub connections: usize,
    /// Connection threads running now.
    pub threads: usize,
    /// Connections refused because the limit was reached.
    pub refused: u64,
    /// Connections closed for being idle.
    pub idle_closed: u64,
}

impl Service {
    /// Loads the document, opens the journal, resolves what was left in doubt, and starts
    /// serving on `listener`.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Journal`] when the journal cannot be opened or the in-doubt
    /// operations resolved; [`ServiceError::Document`] or [`ServiceError::Io`] when the
    /// document cannot be loaded; [`ServiceError::Io`] when a thread cannot be started.
    pub fn start(
        listener: TcpListener,
        open: JournalOpener,
        mut cfg: ServiceConfig,
    ) -> Result<Service, ServiceError> {
        // A connection costs one descriptor: never admit more than the process can open,
        // or the document and the journal would be the ones to fail.
        if let Some(limit) = open_files_limit() {
            let budget = limit.saturating_sub(FD_RESERVE).max(1);
            if cfg.max_connections > budget {
                (cfg.notes)(format!(
                    "serving at most {budget} connections instead of {}: the process may open {limit} files, and {FD_RESERVE} are kept for the journal and the document",
                    cfg.max_connections
                ));
                cfg.max_connections = budget;
            }
        }
        let addr = listener.local_addr().map_err(|source| ServiceError::Io {
            what: "read the listening address".into(),
            source,
        })?;
        let (tx, rx) = std::sync::mpsc::sync_channel(EDIT_QUEUE);
        #[cfg(feature = "postgres")]
        let database = match &cfg.database {
            Some(d) => Some(super::database::SceneDb::open(
                &d.url,
                &d.name,
                cfg.applied_retention,
            )?),
            None => None,
        };
        let shared = Arc::new(Shared {
            cfg,
            open,
            journal: Mutex::new(None),
            document: Mutex::new(None),
            #[cfg(feature = "postgres")]
            database,
            live: Mutex::new(Live::default()),
            changed: Condvar::new(),
            pauses: Pauses::default(),
            stopping: AtomicBool::new(false),
            edits: Mutex::new(Some(tx)),
        });
        for r in shared.boot()? {
            (shared.cfg.notes)(describe_reconciled(&r));
        }
        let editing = shared.clone();
        let editor = std::thread::Builder::new()
            .name("editor-apply".into())
            .stack_size(EDITOR_STACK)
            .spawn(move || editing.edit_loop(rx))
            .map_err(|source| ServiceError::Io {
                what: "start the editor thread".into(),
                source,
            })?;
        let accepting = shared.clone();
        let accept = std::thread::Builder::new()
            .name("editor-accept".into())
            .stack_size(CONN_STACK)
            .spawn(move || accepting.accept_loop(listener))
            .map_err(|source| ServiceError::Io {
                what: "start the accept thread".into(),
                source,
            })?;
        Ok(Service {
            shared,
            addr,
            accept: Some(accept),
            editor: Some(editor),
        })
    }

    /// The address the service listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The journal, for housekeeping (`compact`, `stats`).
    ///
    /// # Errors
    ///
    /// [`ServiceError::Unavailable`] while the service restarts or after it stopped.
    pub fn journal(&self) -> Result<Arc<Journal>, ServiceError> {
        self.shared.journal()
    }

    /// A copy of the document as it stands (empty while the service restarts, or when the
    /// database cannot be read).
    pub fn document(&self) -> Document {
        #[cfg(feature = "postgres")]
        if let Some(db) = &self.shared.database {
            let now = self
                .shared
                .journal()
                .map_or(crate::Timestamp::from_millis(0), |j| j.now());
            return db.document(now).unwrap_or_default();
        }
        lock(&self.shared.document)
            .as_ref()
            .map(|s| s.document().clone())
            .unwrap_or_default()
    }

    /// Open client connections.
    pub fn connections(&self) -> usize {
        lock(&self.shared.live).conns.len()
    }

    /// Counts of connections and threads.
    pub fn stats(&self) -> ServiceStats {
        let live = lock(&self.shared.live);
        ServiceStats {
            connections: live.conns.len(),
            threads: live.readers,
            refused: live.refused,
            idle_closed: live.idle_closed,
        }
    }

    /// The fault-injection device (demos and tests).
    pub fn pauses(&self) -> &Pauses {
        &self.shared.pauses
    }

    /// Waits until `session` has no connection (the service noticed the client leave).
    ///
    /// # Errors
    ///
    /// [`ServiceError::Timeout`].
    pub fn wait_disconnected(&self, session: &str, timeout: Duration) -> Result<(), ServiceError> {
        self.shared
            .wait(timeout, "the client's connection to close", |live| {
                !live.sessions.contains_key(session)
            })
    }

    /// Waits until no operation is executing.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Timeout`].
    pub fn wait_idle(&self, timeout: Duration) -> Result<(), ServiceError> {
        self.shared
            .wait(timeout, "running operations to finish", |live| {
                live.executing.is_empty() && !live.editing
            })
    }

    /// Demo device: the editor process dies and starts again. Connections drop, an
    /// operation held by [`Pauses`] dies where it stands, the journal is closed; then the
    /// document is reloaded from its files, the journal reopened (operations that were
    /// running are now in doubt), and each in-doubt operation is resolved by looking at the
    /// document.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Timeout`] when threads do not stop within `timeout`; the errors of
    /// [`Service::start`] for the reload.
    pub fn restart(&self, timeout: Duration) -> Result<Vec<Reconciled>, ServiceError> {
        self.shared.close_connections();
        self.shared.pauses.release(Verdict::Crash);
        self.shared
            .wait(timeout, "connections and operations to stop", |live| {
                live.readers == 0 && !live.editing
            })?;
        lock(&self.shared.live).executing.clear();
        // Dies: no snapshot is written, the journal's lazy writes are lost.
        *lock(&self.shared.document) = None;
        self.shared.close_journal()?;
        self.shared.boot()
    }

    /// Stops serving, writes a snapshot of the document and closes the journal.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Timeout`] when threads do not stop in time; [`ServiceError::Io`]
    /// when the snapshot cannot be written.
    pub fn shutdown(mut self) -> Result<(), ServiceError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), ServiceError> {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the accept loop with a connection of our own.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        self.shared.close_connections();
        self.shared.pauses.release(Verdict::Crash);
        // No more edits: the editor thread ends when the queue is empty.
        lock(&self.shared.edits).take();
        if let Some(t) = self.editor.take() {
            let _ = t.join();
        }
        self.shared
            .wait(Duration::from_secs(10), "the service to stop", |live| {
                live.readers == 0
            })?;
        let snapshot = match (lock(&self.shared.document).as_mut(), self.shared.journal()) {
            (Some(store), Ok(journal)) if store.logged() > 0 => store.write_snapshot(journal.now()),
            _ => Ok(()),
        };
        self.shared.close_journal()?;
        snapshot
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if self.accept.is_some() {
            let _ = self.stop();
        }
    }
}

impl Shared {
    fn journal(&self) -> Result<Arc<Journal>, ServiceError> {
        lock(&self.journal).clone().ok_or(ServiceError::Unavailable)
    }

    fn note(&self, note: String) {
        (self.cfg.notes)(note);
    }

    fn wait(
        &self,
        timeout: Duration,
        what: &str,
        mut done: impl FnMut(&Live) -> bool,
    ) -> Result<(), ServiceError> {
        let deadline = Instant::now() + timeout;
        let mut live = lock(&self.live);
        while !done(&live) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ServiceError::Timeout {
                    what: what.to_string(),
                    after: timeout,
                });
            }
            live = self
                .changed
                .wait_timeout(live, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        Ok(())
    }

    /// Start-up: open the journal, load the document, settle what was left in doubt.
    fn boot(&self) -> Result<Vec<Reconciled>, ServiceError> {
        let journal = (self.open)().doing(|| "open the journal".into())?;
        #[cfg(feature = "postgres")]
        if let Some(db) = &self.database {
            return self.boot_database(db, journal);
        }
        let mut store = DocumentStore::open(
            &self.cfg.document,
            self.cfg.applied_retention,
            journal.now(),
        )?;
        store.snapshot_every = self.cfg.snapshot_every;
        // Operations that were running when the editor stopped are in doubt: the journal
        // never re-runs them. Only the editor can tell whether the edit landed, by looking
        // at the document; it records what it finds.
        let mut report = Vec::new();
        for r in journal
            .in_doubt()
            .doing(|| "list in-doubt operations".into())?
        {
            let applied = store.document().applied(&r.operation_id);
            report.push(reconcile(&journal, applied, &r)?);
        }
        // The journal's revision of the scope follows the document (a no-op when equal).
        let revision = store.document().revision();
        journal
            .advance_revision(SCOPE, revision)
            .doing(|| format!("report revision {revision} of `{SCOPE}`"))?;
        *lock(&self.document) = Some(store);
        *lock(&self.journal) = Some(Arc::new(journal));
        Ok(report)
    }

    fn close_journal(&self) -> Result<(), ServiceError> {
        let Some(journal) = lock(&self.journal).take() else {
            return Ok(());
        };
        // Every thread that used it has stopped, so this is the last handle: dropping it
        // closes the file.
        match Arc::try_unwrap(journal) {
            Ok(journal) => {
                drop(journal);
                Ok(())
            }
            Err(_) => Err(ServiceError::Timeout {
                what: "the last user of the journal to let go of it".into(),
                after: Duration::ZERO,
            }),
        }
    }

    fn close_connections(&self) {
        let conns: Vec<Arc<Conn>> = lock(&self.live).conns.values().cloned().collect();
        for c in conns {
            c.close();
        }
    }

    /// The document's revision (0 while the service restarts).
    fn revision(&self) -> Result<u64, ServiceError> {
        #[cfg(feature = "postgres")]
        if let Some(db) = &self.database {
            return db.revision();
        }
        Ok(lock(&self.document)
            .as_ref()
            .map_or(0, |s| s.document().revision()))
    }

    /// The applied edit of operation `id`, if its effect is in the document.
    fn applied(&self, id: &str) -> Result<Option<AppliedEdit>, ServiceError> {
        #[cfg(feature = "postgres")]
        if let Some(db) = &self.database {
            return db.applied(id);
        }
        let doc = lock(&self.document);
        let store = doc.as_ref().ok_or(ServiceError::Unavailable)?;
        Ok(store.document().applied(id).cloned())
    }
}
