//! The service: accepting connections, answering requests, and the one thread that applies
//! edits. See the module documentation for what it does and why.

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
use super::document::{ApplyError, Document, DocumentStore};
use super::pauses::{Pauses, Stage, Verdict};
use super::protocol::{Edit, Reply, Request, ResultMsg, StatusMsg};
use super::{Context, MAX_LINE, ServiceError, chain, lock};
use crate::{
    Admission, Claim, ErrorKind, EventKind, ExecutionStatus, InDoubtCause, Journal, OpResult,
    Operation, Outcome, Receipt, Resolution, RetireCause, validate_name,
};

/// The journal scope of the document: revisions and the mutation lock are per scope.
pub const SCOPE: &str = "scene/main";

/// The stack of a connection thread: it parses JSON (nesting limited to 128 by serde_json)
/// and calls the journal; 512 KiB leaves ample room and keeps a full house of threads
/// small.
const CONN_STACK: usize = 512 * 1024;
/// The stack of the thread that applies edits.
const EDITOR_STACK: usize = 1024 * 1024;
/// Fresh operations waiting for the editor thread. The scope lock admits one operation at
/// a time, so more than two never wait; the bound is a guard, not a queue.
const EDIT_QUEUE: usize = 16;
/// How long the accept loop waits after a failed `accept` (out of descriptors, say)
/// before trying again, instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Descriptors kept free for everything but client connections: the journal's files, the
/// document's, the listener, the standard streams, a connection being refused.
const FD_RESERVE: usize = 32;

/// The process's limit on open descriptors (the soft `RLIMIT_NOFILE`), where the system
/// says it (`/proc/self/limits` on Linux).
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// The stored result payload.
#[derive(Serialize, Deserialize)]
struct Stored {
    summary: String,
}

fn payload(summary: &str) -> Vec<u8> {
    // Serializing a struct of one string cannot fail; fall back to the bare text anyway.
    serde_json::to_vec(&Stored {
        summary: summary.to_string(),
    })
    .unwrap_or_else(|_| summary.as_bytes().to_vec())
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
    /// A reply that cannot be written for this long (the client stopped reading) closes the
    /// connection (default 10 s).
    pub write_timeout: Duration,
    /// How long the document remembers which operations it applied (default 90 days, the
    /// journal's default audit retention; keep it at least the journal's). In-doubt
    /// operations are settled from it.
    pub applied_retention: Duration,
    /// Edits between two snapshots of the document (default 1,000).
    pub snapshot_every: usize,
    /// Where notes go (default: nowhere).
    pub notes: Notes,
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
        }
    }
}

impl std::fmt::Debug for ServiceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceConfig")
            .field("document", &self.document)
            .field("max_connections", &self.max_connections)
            .field("idle_timeout", &self.idle_timeout)
            .field("write_timeout", &self.write_timeout)
            .field("applied_retention", &self.applied_retention)
            .field("snapshot_every", &self.snapshot_every)
            .finish_non_exhaustive()
    }
}

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
    /// `None` while the service restarts.
    document: Mutex<Option<DocumentStore>>,
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
        let shared = Arc::new(Shared {
            cfg,
            open,
            journal: Mutex::new(None),
            document: Mutex::new(None),
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

    /// A copy of the document as it stands (empty while the service restarts).
    pub fn document(&self) -> Document {
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
            report.push(reconcile(&journal, store.document(), &r)?);
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

    fn revision(&self) -> u64 {
        lock(&self.document)
            .as_ref()
            .map_or(0, |s| s.document().revision())
    }

    // -----------------------------------------------------------------------------------
    // Connections.
    // -----------------------------------------------------------------------------------

    fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        let mut last_note: Option<Instant> = None;
        loop {
            let accepted = listener.accept();
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, say: wait instead of spinning, note it at most
                    // once a second.
                    if last_note.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                        self.note(format!("could not accept a connection: {e}"));
                        last_note = Some(Instant::now());
                    }
                    std::thread::sleep(ACCEPT_BACKOFF);
                    continue;
                }
            };
            // A reply is one small write: without this, Nagle's algorithm holds a reply
            // back until the previous one is acknowledged (a delayed ACK, up to 40 ms).
            let _ = stream.set_nodelay(true);
            let _ = stream.set_write_timeout(Some(self.cfg.write_timeout));
            self.admit(stream);
        }
    }

    fn admit(self: &Arc<Self>, stream: TcpStream) {
        let conn = {
            let mut live = lock(&self.live);
            if live.conns.len() >= self.cfg.max_connections {
                live.refused += 1;
                drop(live);
                refuse(
                    stream,
                    "too_many_connections",
                    format!(
                        "the service already serves {} connections, its limit; close an idle connection or retry after a backoff",
                        self.cfg.max_connections
                    ),
                );
                return;
            }
            live.next_conn += 1;
            let conn = Arc::new(Conn::new(live.next_conn, stream));
            live.conns.insert(conn.id, conn.clone());
            live.readers += 1;
            conn
        };
        let shared = self.clone();
        let serving = conn.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("editor-conn-{}", conn.id))
            .stack_size(CONN_STACK)
            .spawn(move || shared.serve(serving));
        if let Err(e) = spawned {
            let mut live = lock(&self.live);
            live.conns.remove(&conn.id);
            live.readers = live.readers.saturating_sub(1);
            drop(live);
            let _ = conn.send(&Reply::Error {
                id: None,
                kind: "unavailable".into(),
                message: format!("the service could not start serving this connection ({e}); retry after a backoff"),
            });
            conn.close();
        }
    }

    /// One connection: read requests line by line until the client goes away or idles.
    fn serve(self: Arc<Self>, conn: Arc<Conn>) {
        let _counted = ReaderGuard { shared: &self };
        let mut reader = LineReader::new();
        loop {
            let bytes = match reader.next(conn.stream(), self.cfg.idle_timeout) {
                Line::Request(bytes) => bytes,
                // A line cut off by the connection closing is a torn request: dropped
                // unread, so nothing of it was accepted.
                Line::End | Line::Torn | Line::Failed => break,
                Line::TooLong => {
                    let _ = conn.send(&Reply::Error {
                        id: None,
                        kind: "bad_request".into(),
                        message: format!("request lines are limited to {MAX_LINE} bytes"),
                    });
                    break;
                }
                Line::Idle => {
                    lock(&self.live).idle_closed += 1;
                    let _ = conn.send(&Reply::Error {
                        id: None,
                        kind: "idle_timeout".into(),
                        message: format!(
                            "no request for {}; closing the connection: reconnect and say `hello` to go on",
                            human_duration(self.cfg.idle_timeout)
                        ),
                    });
                    break;
                }
            };
            let request = match serde_json::from_slice::<Request>(&bytes) {
                Ok(r) => r,
                Err(e) => {
                    let reply = Reply::Error {
                        id: None,
                        kind: "bad_request".into(),
                        message: format!("not a request: {e}"),
                    };
                    if conn.send(&reply).is_err() {
                        break;
                    }
                    continue;
                }
            };
            if let Err(e) = self.handle(&conn, request) {
                self.note(chain(&e));
                break;
            }
        }
        conn.close();
        let mut live = lock(&self.live);
        live.conns.remove(&conn.id);
        if let Some(session) = lock(&conn.session).take()
            && live.sessions.get(&session) == Some(&conn.id)
        {
            live.sessions.remove(&session);
        }
        self.changed.notify_all();
    }

    fn session_conn(&self, live: &Live, session: &str) -> Option<Arc<Conn>> {
        live.sessions
            .get(session)
            .and_then(|c| live.conns.get(c))
            .cloned()
    }

    // -----------------------------------------------------------------------------------
    // Requests.
    // -----------------------------------------------------------------------------------

    /// Answers one request. `Err` ends the connection (it could not be answered).
    fn handle(self: &Arc<Self>, conn: &Arc<Conn>, request: Request) -> Result<(), ServiceError> {
        let session = lock(&conn.session).clone();
        let answer = match (request, session) {
            (Request::Hello { session }, _) => return self.hello(conn, session),
            (Request::Submit { id, .. } | Request::Ack { id } | Request::Status { id }, None) => {
                Reply::Error {
                    id: Some(id),
                    kind: "bad_request".into(),
                    message: "say `hello` with your session first".into(),
                }
            }
            (
                Request::Submit {
                    id,
                    base_revision,
                    edit,
                },
                Some(session),
            ) => match self.submit(conn, &session, &id, base_revision, edit) {
                Ok(Some(reply)) => reply,
                Ok(None) => return Ok(()),
                Err(e) => refusal(Some(id), &e),
            },
            (Request::Ack { id }, Some(session)) => self
                .ack(&id, &session)
                .unwrap_or_else(|e| refusal(Some(id), &e)),
            (Request::Status { id }, Some(_)) => {
                self.status(&id).unwrap_or_else(|e| refusal(Some(id), &e))
            }
        };
        conn.send(&answer).map_err(|source| ServiceError::Io {
            what: "send a reply".into(),
            source,
        })
    }

    /// `hello`: the connection becomes the session's, then whatever the session has not
    /// acknowledged is pushed again, as long as its retry budget lasts (the journal says
    /// when it is spent).
    fn hello(&self, conn: &Arc<Conn>, session: String) -> Result<(), ServiceError> {
        if let Err(e) = validate_name("session", &session) {
            let reply = refusal(None, &journal_error("accept the session", e));
            return conn.send(&reply).map_err(|source| ServiceError::Io {
                what: "send a refusal".into(),
                source,
            });
        }
        {
            let mut live = lock(&self.live);
            live.sessions.insert(session.clone(), conn.id);
            *lock(&conn.session) = Some(session.clone());
        }
        let journal = self.journal()?;
        let waiting = journal
            .undelivered(&session)
            .doing(|| format!("list the results waiting for `{session}`"))?;
        // Record each delivery before sending it, and announce only what will be sent.
        let mut pushes = Vec::with_capacity(waiting.len());
        for r in waiting {
            let id = r.receipt.operation_id.clone();
            match journal.delivered(&id) {
                Ok(receipt) => pushes.push(Reply::Result(result_msg(&receipt, &r.result, true))),
                Err(e) if e.is_refusal() => {} // retired or expired since the listing
                Err(source) => {
                    return Err(ServiceError::Journal {
                        what: format!("record a delivery of `{id}`"),
                        source,
                    });
                }
            }
        }
        let welcome = Reply::Welcome {
            session,
            scope: SCOPE.into(),
            revision: self.revision(),
            pushing: pushes.len(),
        };
        for reply in std::iter::once(&welcome).chain(&pushes) {
            conn.send(reply).map_err(|source| ServiceError::Io {
                what: "send the welcome and the pushed results".into(),
                source,
            })?;
        }
        Ok(())
    }

    /// `submit`: ask the journal first; only a fresh operation is executed. `Ok(None)`
    /// when the answer was already sent.
    fn submit(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        session: &str,
        id: &str,
        base_revision: u64,
        edit: Edit,
    ) -> Result<Option<Reply>, ServiceError> {
        let intent = edit.intent().doing(|| format!("describe `{id}`"))?;
        let op = Operation::new(id, intent)
            .scope(SCOPE)
            .base_revision(base_revision)
            .session(session);
        let journal = self.journal()?;
        // A second round only after settling an in-doubt operation or finding that an
        // attached operation ended meanwhile; the third answers whatever the journal says.
        for round in 0..3 {
            let admission = journal
                .submit(op.clone())
                .doing(|| format!("submit `{id}`"))?;
            match admission {
                // New work, durably recorded as running: the editor thread applies it.
                Admission::Fresh(claim) => return self.accept(conn, session, claim, edit),
                // The same operation is executing: attach to it; its answer will follow.
                Admission::InProgress(r) => {
                    let mut live = lock(&self.live);
                    if let Some(ex) = live.executing.get_mut(id) {
                        if !ex.attached.contains(&conn.id) {
                            ex.attached.push(conn.id);
                        }
                        return Ok(Some(Reply::Running {
                            id: id.to_string(),
                            since: r.submitted_at,
                        }));
                    }
                    // It ended between the two looks: ask the journal again.
                    if round == 2 {
                        return Ok(Some(Reply::Error {
                            id: Some(id.to_string()),
                            kind: "unavailable".into(),
                            message: format!(
                                "`{id}` is recorded as running but is not being applied here; ask with `status` after a backoff"
                            ),
                        }));
                    }
                }
                // Done before: answer with the recorded outcome. Never re-applied.
                Admission::Replay(replay) => {
                    let receipt = journal
                        .delivered(id)
                        .doing(|| format!("record a delivery of `{id}`"))?;
                    return Ok(Some(Reply::Result(result_msg(
                        &receipt,
                        &replay.result,
                        true,
                    ))));
                }
                // The result is gone: it aged out, or damage took it (a repair found it lost).
                // Say which; do not run it again.
                Admission::Expired(r) => {
                    let repaired_at = match r.retire_cause {
                        Some(RetireCause::Damage { repaired_at }) => Some(repaired_at),
                        _ => None,
                    };
                    return Ok(Some(Reply::Expired {
                        id: id.to_string(),
                        applied: r.applied == Some(true),
                        revision: r.result_revision,
                        completed_at: r.completed_at,
                        current_revision: self.revision(),
                        reason: if repaired_at.is_some() {
                            "damage"
                        } else {
                            "retention"
                        }
                        .into(),
                        repaired_at,
                    }));
                }
                // Its execution ended without an outcome (a lease that ran out, a restart):
                // look at the document and record what happened, then answer from that.
                Admission::InDoubt(r) => {
                    let executing = lock(&self.live).executing.contains_key(id);
                    if executing || round == 2 {
                        return Ok(Some(Reply::InDoubt {
                            id: id.to_string(),
                            since: r.submitted_at,
                        }));
                    }
                    let settled = {
                        let doc = lock(&self.document);
                        let Some(store) = doc.as_ref() else {
                            return Err(ServiceError::Unavailable);
                        };
                        reconcile(&journal, store.document(), &r)?
                    };
                    self.note(describe_reconciled(&settled));
                }
            }
        }
        Err(ServiceError::Unavailable)
    }

    /// A fresh operation: attach the submitting session, answer `accepted`, and hand it to
    /// the editor thread.
    fn accept(
        &self,
        conn: &Arc<Conn>,
        session: &str,
        claim: Claim,
        edit: Edit,
    ) -> Result<Option<Reply>, ServiceError> {
        let id = claim.operation_id().to_string();
        lock(&self.live).executing.insert(
            id.clone(),
            Execution {
                owner: session.to_string(),
                attached: Vec::new(),
            },
        );
        let accepted = Reply::Accepted {
            id: id.clone(),
            attempt: claim.attempt(),
        };
        let _ = conn.send(&accepted);
        let sent = match lock(&self.edits).as_ref() {
            Some(tx) => tx.try_send(Job { claim, edit }).map_err(|e| match e {
                TrySendError::Full(job) | TrySendError::Disconnected(job) => job,
            }),
            None => Err(Job { claim, edit }),
        };
        if let Err(job) = sent {
            // The editor thread cannot take it: end it now, nothing was applied.
            let journal = self.journal()?;
            let released = journal.release(&job.claim);
            self.finish(
                &id,
                Answer::Released {
                    reason: "the editor is stopping or overloaded and did not apply the edit"
                        .into(),
                    retry: true,
                },
                &journal,
            );
            released.doing(|| format!("release `{id}`"))?;
        }
        Ok(None)
    }

    fn ack(&self, id: &str, session: &str) -> Result<Reply, ServiceError> {
        validate_name("operation id", id).map_err(|e| journal_error("acknowledge", e))?;
        let journal = self.journal()?;
        let late = journal
            .lookup(id)
            .doing(|| format!("look up `{id}`"))?
            .is_some_and(|r| r.delivery == Some(crate::DeliveryState::AckExpired));
        // The journal refuses another session's result (`NotOwner`).
        journal
            .acknowledge(id, Some(session))
            .doing(|| format!("acknowledge `{id}`"))?;
        Ok(Reply::Acked {
            id: id.to_string(),
            late,
        })
    }

    fn status(&self, id: &str) -> Result<Reply, ServiceError> {
        validate_name("operation id", id).map_err(|e| journal_error("look up", e))?;
        let journal = self.journal()?;
        let Some(r) = journal.lookup(id).doing(|| format!("look up `{id}`"))? else {
            return Ok(Reply::Status(StatusMsg {
                id: id.to_string(),
                state: "unknown".into(),
                revision: None,
                delivery: None,
                deliveries: 0,
                ack_deadline: None,
                history: Vec::new(),
            }));
        };
        let history = journal
            .history(id)
            .doing(|| format!("read the history of `{id}`"))?
            .iter()
            .map(|ev| match &ev.kind {
                EventKind::LeaseExpired {
                    cause: InDoubtCause::Reopened,
                    ..
                } => "in_doubt:reopened".to_string(),
                EventKind::LeaseExpired { .. } => "in_doubt:lease_expired".to_string(),
                other => other.name().to_string(),
            })
            .collect();
        Ok(Reply::Status(StatusMsg {
            id: id.to_string(),
            state: r.status.name().to_string(),
            revision: r.result_revision,
            delivery: r.delivery.map(|d| d.name().to_string()),
            deliveries: r.delivery_count,
            ack_deadline: r.ack_deadline,
            history,
        }))
    }

    // -----------------------------------------------------------------------------------
    // Applying edits.
    // -----------------------------------------------------------------------------------

    /// The editor thread: applies fresh operations one at a time, in the order accepted.
    fn edit_loop(self: Arc<Self>, jobs: Receiver<Job>) {
        while let Ok(job) = jobs.recv() {
            lock(&self.live).editing = true;
            if let Err(e) = self.execute(&job) {
                self.note(chain(&e));
            }
            let mut live = lock(&self.live);
            live.editing = false;
            self.changed.notify_all();
        }
    }

    /// A fresh operation: apply, record, answer. Every path ends the operation in the
    /// journal (complete or release) before answering, except a journal that cannot be
    /// written at all (then the next start settles it from the document).
    fn execute(&self, job: &Job) -> Result<(), ServiceError> {
        let claim = &job.claim;
        let id = claim.operation_id();
        let verdict = self.pauses.reach(Stage::Accepted, id);
        if verdict == Verdict::Crash {
            return Ok(());
        }
        let journal = self.journal()?;
        // 1. The effect: apply the edit and save it in the document.
        let applied = {
            let mut doc = lock(&self.document);
            let Some(store) = doc.as_mut() else {
                return Err(ServiceError::Unavailable);
            };
            store.apply(id, &job.edit, journal.now(), || {
                if verdict == Verdict::Panic {
                    panic!("injected fault: the edit of `{id}` panicked");
                }
            })
        };
        let (revision, summary) = match applied {
            Ok(done) => done,
            Err(failure) => return self.unapplied(&journal, claim, &job.edit, failure),
        };
        if self.pauses.reach(Stage::Mutated, id) == Verdict::Crash {
            return Ok(());
        }
        // 2. The outcome, durable before `complete` returns: from now on the id is
        //    answered with this result, never executed again.
        let result = OpResult {
            bytes: payload(&summary),
            changed_assets: changed_assets(&job.edit),
        };
        let outcome = Outcome::applied(revision, result.bytes.clone())
            .changed_assets(result.changed_assets.clone());
        let completed = journal.complete(claim, outcome);
        if let Err(e) = completed {
            self.finish(id, Answer::Unrecorded(e.to_string()), &journal);
            return Err(journal_error(&format!("record the outcome of `{id}`"), e));
        }
        if self.pauses.reach(Stage::Committed, id) == Verdict::Crash {
            return Ok(());
        }
        // 3. Answer the owner's current connection and every attached one. Without any,
        //    the result waits for the session's next `hello`.
        self.finish(id, Answer::Result(result), &journal);
        self.snapshot_if_due(&journal);
        Ok(())
    }

    /// The edit did not change the document as asked: end the operation at once.
    fn unapplied(
        &self,
        journal: &Journal,
        claim: &Claim,
        edit: &Edit,
        failure: ApplyError,
    ) -> Result<(), ServiceError> {
        let id = claim.operation_id();
        let (answer, ended) = match failure {
            // Refused before any change: give the id back, so a corrected retry runs.
            ApplyError::Refused(reason) => (
                Answer::Rejected(format!("cannot {}: {reason}", edit.describe())),
                journal.release(claim).map(drop),
            ),
            ApplyError::Panicked(message) => (
                Answer::Released {
                    reason: format!(
                        "the editor failed while applying {} ({message}); nothing changed",
                        edit.describe()
                    ),
                    retry: false,
                },
                journal.release(claim).map(drop),
            ),
            ApplyError::NotSaved(e) => {
                self.note(format!("`{id}` not applied: {}", chain(&e)));
                (
                    Answer::Released {
                        reason: format!(
                            "the document could not be saved ({}); nothing changed",
                            chain(&e)
                        ),
                        retry: true,
                    },
                    journal.release(claim).map(drop),
                )
            }
            // The edit may be in the file: that is an outcome, recorded as a failure and
            // replayed like one. The document is reloaded from its files, to be what a
            // restart would see.
            ApplyError::Uncertain(e) => {
                self.note(format!("`{id}` may or may not be saved: {}", chain(&e)));
                let message = format!(
                    "the document may or may not have saved {} ({}); refresh before going on",
                    edit.describe(),
                    chain(&e)
                );
                self.reload_document(journal);
                match journal.complete(claim, Outcome::failed(message)) {
                    Ok(_) => {
                        let result = OpResult::default();
                        self.finish(id, Answer::Result(result), journal);
                        return Ok(());
                    }
                    Err(e) => (Answer::Unrecorded(e.to_string()), Err(e)),
                }
            }
        };
        match ended {
            Ok(()) => {
                self.finish(id, answer, journal);
                Ok(())
            }
            Err(e) => {
                self.finish(id, Answer::Unrecorded(e.to_string()), journal);
                Err(journal_error(&format!("end `{id}`"), e))
            }
        }
    }

    /// After a save that may have half-happened: the document becomes what its files say.
    fn reload_document(&self, journal: &Journal) {
        let mut doc = lock(&self.document);
        match DocumentStore::open(
            &self.cfg.document,
            self.cfg.applied_retention,
            journal.now(),
        ) {
            Ok(mut store) => {
                store.snapshot_every = self.cfg.snapshot_every;
                let revision = store.document().revision();
                if let Err(e) = journal.advance_revision(SCOPE, revision) {
                    self.note(format!("could not report revision {revision}: {e}"));
                }
                *doc = Some(store);
            }
            Err(e) => self.note(format!(
                "could not reload the document, keeping it as it was in memory: {}",
                chain(&e)
            )),
        }
    }

    fn snapshot_if_due(&self, journal: &Journal) {
        let mut doc = lock(&self.document);
        if let Some(store) = doc.as_mut()
            && store.snapshot_due()
            && let Err(e) = store.write_snapshot(journal.now())
        {
            self.note(format!(
                "could not write a snapshot of the document (the log keeps every edit; retried after the next edit): {}",
                chain(&e)
            ));
        }
    }

    /// Ends `id`'s execution: sends its answer to the owner's current connection and to
    /// every connection attached to it. A result is recorded as one delivery per copy; the
    /// first copy is the new execution's, every other one is marked as a replay.
    fn finish(&self, id: &str, answer: Answer, journal: &Journal) {
        let recipients: Vec<Arc<Conn>> = {
            let mut live = lock(&self.live);
            let Some(ex) = live.executing.remove(id) else {
                return;
            };
            let mut out: Vec<Arc<Conn>> = Vec::new();
            let owner = self.session_conn(&live, &ex.owner);
            for c in owner.into_iter().chain(
                ex.attached
                    .iter()
                    .filter_map(|c| live.conns.get(c).cloned()),
            ) {
                if !out.iter().any(|o| o.id == c.id) {
                    out.push(c);
                }
            }
            self.changed.notify_all();
            out
        };
        let reply = |first: bool| -> Option<Reply> {
            Some(match &answer {
                Answer::Result(result) => {
                    let receipt = match journal.delivered(id) {
                        Ok(r) => r,
                        Err(e) => {
                            self.note(format!("could not record a delivery of `{id}`: {e}"));
                            return None;
                        }
                    };
                    Reply::Result(result_msg(&receipt, result, !first))
                }
                Answer::Rejected(reason) => Reply::Rejected {
                    id: id.to_string(),
                    reason: reason.clone(),
                },
                Answer::Released { reason, retry } => Reply::Released {
                    id: id.to_string(),
                    reason: reason.clone(),
                    retry: *retry,
                },
                Answer::Unrecorded(message) => Reply::Error {
                    id: Some(id.to_string()),
                    kind: "unavailable".into(),
                    message: format!(
                        "the outcome of `{id}` could not be recorded ({message}); ask with `status` after the service restarts"
                    ),
                },
            })
        };
        for (i, conn) in recipients.iter().enumerate() {
            if let Some(r) = reply(i == 0) {
                let _ = conn.send(&r);
            }
        }
    }
}

/// How an execution ended, for its recipients.
enum Answer {
    Result(OpResult),
    Rejected(String),
    Released { reason: String, retry: bool },
    Unrecorded(String),
}

/// Settles one in-doubt operation from the document: applied at its revision if its edit
/// is there (with the same intent), else not applied (a retry runs it anew).
fn reconcile(journal: &Journal, doc: &Document, r: &Receipt) -> Result<Reconciled, ServiceError> {
    let id = r.operation_id.clone();
    let applied = doc.applied(&id).filter(|a| {
        a.edit
            .intent()
            .is_ok_and(|intent| r.intent_hash.matches(&intent))
    });
    let resolution = match applied {
        Some(a) => Resolution::Completed(
            Outcome::applied(a.revision, payload(&a.summary))
                .changed_assets(changed_assets(&a.edit)),
        ),
        None => Resolution::not_applied(),
    };
    journal
        .resolve(&id, resolution)
        .doing(|| format!("resolve `{id}`"))?;
    Ok(Reconciled {
        id,
        cause: r.in_doubt_cause,
        applied_at: applied.map(|a| a.revision),
    })
}

fn journal_error(what: &str, source: crate::Error) -> ServiceError {
    ServiceError::Journal {
        what: what.to_string(),
        source,
    }
}

fn changed_assets(edit: &Edit) -> Vec<String> {
    let name = match edit {
        Edit::Add { object, .. } | Edit::Delete { object } => object,
        Edit::Rename { to, .. } => to,
    };
    vec![format!("{SCOPE}/{name}")]
}

fn result_msg(receipt: &Receipt, result: &OpResult, replayed: bool) -> ResultMsg {
    let summary = match (
        &receipt.failure,
        serde_json::from_slice::<Stored>(&result.bytes),
    ) {
        (Some(message), _) => message.clone(),
        (None, Ok(stored)) => stored.summary,
        (None, Err(_)) => String::from_utf8_lossy(&result.bytes).into_owned(),
    };
    ResultMsg {
        id: receipt.operation_id.clone(),
        outcome: match receipt.status {
            ExecutionStatus::Failed => "failed".into(),
            _ => "applied".into(),
        },
        revision: receipt.result_revision,
        summary,
        changed: result.changed_assets.clone(),
        replayed,
        delivery: receipt.delivery_count,
    }
}

/// A failed request as a protocol error. Journal refusals keep their own message (it
/// names the values and the next step).
fn refusal(id: Option<String>, e: &ServiceError) -> Reply {
    let e = match e {
        ServiceError::Journal { source, .. } => source,
        ServiceError::Unavailable => {
            return Reply::Error {
                id,
                kind: "unavailable".into(),
                message: "the service is restarting; retry after a backoff".into(),
            };
        }
        other => {
            return Reply::Error {
                id,
                kind: "internal".into(),
                message: chain(other),
            };
        }
    };
    let kind = match e.kind() {
        ErrorKind::IntentMismatch { .. } => "intent_mismatch",
        ErrorKind::StaleBase { .. } => "stale_base",
        ErrorKind::ScopeBusy { .. } => "scope_busy",
        ErrorKind::WindowFull { .. } => "window_full",
        ErrorKind::NotOwner { .. } => "not_owner",
        ErrorKind::InvalidInput { .. } => "bad_request",
        ErrorKind::UnknownOperation { .. } | ErrorKind::InvalidState { .. } => "bad_request",
        ErrorKind::Io | ErrorKind::Poisoned | ErrorKind::Closed => "unavailable",
        _ => "internal",
    };
    Reply::Error {
        id,
        kind: kind.into(),
        message: e.to_string(),
    }
}

/// `d` in the largest whole unit that shows it exactly (`5min`, `30s`, `1500ms`).
fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(3_600_000) && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}min", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}
