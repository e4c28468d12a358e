//! A small editor service that embeds the journal: the service half of `opjournal demo`,
//! and the model for integrators (`examples/editor.rs` includes this file as it is).
//!
//! The editor holds one document (`document.rs`: a scene of named objects with a revision
//! number) and serves it over a TCP socket in JSON Lines (`protocol.rs`,
//! `docs/protocol.md`). Every mutating request goes through the journal, which is what
//! makes a retry safe:
//!
//! ```text
//! hello  (a connection or a reconnect)  -> undelivered(session): push what the client missed
//! submit                                -> journal.submit(op)
//!          Fresh(claim)  -> apply the edit -> complete(claim, outcome) -> send -> delivered
//!          InProgress    -> "running": attach, apply nothing
//!          Replay        -> the recorded result, marked replayed -> delivered
//!          Expired       -> "it finished at revision N; refresh, do not retry"
//!          InDoubt       -> "ask again": the editor must look at the document first
//! ack                                   -> acknowledge
//! status (ask about an id)              -> lookup + history
//! start / restart                       -> in_doubt(): check the document, then resolve
//! ```
//!
//! The edit is saved to the document file *before* the journal records the outcome, so a
//! crash between the two leaves the operation `InDoubt`; at start the service looks at the
//! document and records what really happened. Nothing is ever re-run on its own.
//!
//! [`Pauses`] and [`Service::restart`] are fault-injection devices for the demo: they hold
//! an operation at an exact step so that a client can disconnect there. A real service
//! has neither.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opjournal::{
    Admission, Claim, DeliveryState, ErrorKind, EventKind, ExecutionStatus, InDoubtCause, Journal,
    OpResult, Operation, Outcome, Receipt, Resolution,
};
use serde::{Deserialize, Serialize};

use super::document::Document;
use super::protocol::{Edit, Reply, Request, ResultMsg, StatusMsg};

/// The journal scope of the document: revisions and the mutation lock are per scope.
pub const SCOPE: &str = "scene/main";

/// The longest request line accepted, in bytes.
pub const MAX_LINE: usize = 64 * 1024;

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

// ---------------------------------------------------------------------------------------
// Errors.
// ---------------------------------------------------------------------------------------

/// Why the service could not do something.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// A journal call failed.
    #[error("could not {what}")]
    Journal {
        /// What was being done.
        what: String,
        /// The journal's error.
        #[source]
        source: opjournal::Error,
    },
    /// A file or socket operation failed.
    #[error("could not {what}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The document file is unusable.
    #[error("the document `{}` is unusable: {detail}", path.display())]
    Document {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// The journal is closed (the service is restarting or stopped).
    #[error("the journal is closed: the service is restarting or stopped")]
    Unavailable,
    /// Something did not happen in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        after: Duration,
    },
}

/// Adds what was being done to a journal error.
trait Context<T> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, ServiceError>;
}

impl<T> Context<T> for opjournal::Result<T> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, ServiceError> {
        self.map_err(|source| ServiceError::Journal {
            what: what(),
            source,
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------
// Demo device: pausing an operation at an exact step.
// ---------------------------------------------------------------------------------------

/// A step of executing a fresh operation, where [`Pauses`] can hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Accepted (recorded as running), the edit not yet applied.
    Accepted,
    /// The edit applied and saved, the outcome not yet recorded.
    Mutated,
    /// The outcome recorded, the result not yet sent.
    Committed,
}

/// How a paused operation goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Carry on.
    Continue,
    /// Stop dead, as if the process died here: record nothing more, send nothing.
    Crash,
}

/// Holds the next operation that reaches an armed [`Stage`] until released (demo only:
/// the service is not told why, and a client can disconnect at that exact moment).
#[derive(Default)]
pub struct Pauses {
    state: Mutex<PauseState>,
    cv: Condvar,
}

#[derive(Default)]
struct PauseState {
    armed: Option<Stage>,
    held: Option<(Stage, String)>,
    verdict: Option<Verdict>,
}

impl Pauses {
    /// Holds the next operation that reaches `stage`.
    pub fn arm(&self, stage: Stage) {
        lock(&self.state).armed = Some(stage);
    }

    /// Waits until an operation is held; returns its id.
    pub fn wait_held(&self, timeout: Duration) -> Result<String, ServiceError> {
        let guard = lock(&self.state);
        let (guard, _) = self
            .cv
            .wait_timeout_while(guard, timeout, |s| s.held.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        guard
            .held
            .as_ref()
            .map(|(_, id)| id.clone())
            .ok_or_else(|| ServiceError::Timeout {
                what: "an operation to reach the armed step".into(),
                after: timeout,
            })
    }

    /// Lets the held operation go on (or die), and disarms.
    pub fn release(&self, verdict: Verdict) {
        let mut s = lock(&self.state);
        s.armed = None;
        if s.held.is_some() {
            s.verdict = Some(verdict);
            self.cv.notify_all();
        }
    }

    fn reach(&self, stage: Stage, id: &str) -> Verdict {
        let mut s = lock(&self.state);
        if s.armed != Some(stage) {
            return Verdict::Continue;
        }
        s.armed = None;
        s.held = Some((stage, id.to_string()));
        s.verdict = None;
        self.cv.notify_all();
        let mut s = self
            .cv
            .wait_while(s, |s| s.verdict.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        s.held = None;
        s.verdict.take().unwrap_or(Verdict::Continue)
    }
}

// ---------------------------------------------------------------------------------------
// The service.
// ---------------------------------------------------------------------------------------

/// Opens the journal; called at start and again by [`Service::restart`].
pub type JournalOpener = Box<dyn Fn() -> opjournal::Result<Journal> + Send + Sync>;

/// Receives the service's notes (what it recovered at start, errors it could only log).
pub type Notes = Box<dyn Fn(String) + Send + Sync>;

/// How the service runs.
pub struct ServiceConfig {
    /// The document file.
    pub document: PathBuf,
    /// How many deliveries of one result a reconnect may push: the journal's retry
    /// budget (`RetryPolicy::attempts`). Past it, a result is still answered when asked
    /// for, but no longer pushed, so a reconnect storm cannot multiply traffic.
    pub push_budget: u32,
    /// Where notes go.
    pub notes: Notes,
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

/// A running editor service: an accept thread, one thread per connection, one per
/// executing operation.
pub struct Service {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

struct Shared {
    cfg: ServiceConfig,
    open: JournalOpener,
    journal: Mutex<Option<Arc<Journal>>>,
    document: Mutex<Document>,
    live: Mutex<Live>,
    changed: Condvar,
    pauses: Pauses,
    stopping: AtomicBool,
}

#[derive(Default)]
struct Live {
    next_conn: u64,
    conns: HashMap<u64, Arc<Conn>>,
    /// Session → its current connection (the latest `hello`).
    sessions: HashMap<String, u64>,
    readers: usize,
    workers: usize,
}

struct Conn {
    id: u64,
    writer: Mutex<TcpStream>,
    session: Mutex<Option<String>>,
}

impl Conn {
    fn send(&self, reply: &Reply) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(reply).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut w = lock(&self.writer);
        w.write_all(&line)?;
        w.flush()
    }

    fn close(&self) {
        let _ = lock(&self.writer).shutdown(Shutdown::Both);
    }
}

/// Counts a thread in `Live` while it runs.
struct ThreadGuard<'a> {
    shared: &'a Shared,
    worker: bool,
}

impl Drop for ThreadGuard<'_> {
    fn drop(&mut self) {
        let mut live = lock(&self.shared.live);
        if self.worker {
            live.workers -= 1;
        } else {
            live.readers -= 1;
        }
        self.shared.changed.notify_all();
    }
}

impl Service {
    /// Loads the document, opens the journal, resolves what was left in doubt, and starts
    /// serving on `listener`.
    pub fn start(
        listener: TcpListener,
        open: JournalOpener,
        cfg: ServiceConfig,
    ) -> Result<Service, ServiceError> {
        let addr = listener.local_addr().map_err(|source| ServiceError::Io {
            what: "read the listening address".into(),
            source,
        })?;
        let shared = Arc::new(Shared {
            cfg,
            open,
            journal: Mutex::new(None),
            document: Mutex::new(Document::default()),
            live: Mutex::new(Live::default()),
            changed: Condvar::new(),
            pauses: Pauses::default(),
            stopping: AtomicBool::new(false),
        });
        for r in shared.boot()? {
            (shared.cfg.notes)(describe_reconciled(&r));
        }
        let accepting = shared.clone();
        let accept = std::thread::Builder::new()
            .name("editor-accept".into())
            .spawn(move || accepting.accept_loop(listener))
            .map_err(|source| ServiceError::Io {
                what: "start the accept thread".into(),
                source,
            })?;
        Ok(Service {
            shared,
            addr,
            accept: Some(accept),
        })
    }

    /// The address the service listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The journal, for housekeeping (`compact`, `stats`).
    pub fn journal(&self) -> Result<Arc<Journal>, ServiceError> {
        self.shared.journal()
    }

    /// A copy of the document as it stands.
    pub fn document(&self) -> Document {
        lock(&self.shared.document).clone()
    }

    /// Open client connections.
    pub fn connections(&self) -> usize {
        lock(&self.shared.live).conns.len()
    }

    /// The demo's pause points.
    pub fn pauses(&self) -> &Pauses {
        &self.shared.pauses
    }

    /// Waits until `session` has no connection (the service noticed the client leave).
    pub fn wait_disconnected(&self, session: &str, timeout: Duration) -> Result<(), ServiceError> {
        self.shared
            .wait(timeout, "the client's connection to close", |live| {
                !live.sessions.contains_key(session)
            })
    }

    /// Waits until no operation is executing.
    pub fn wait_idle(&self, timeout: Duration) -> Result<(), ServiceError> {
        self.shared
            .wait(timeout, "running operations to finish", |live| {
                live.workers == 0
            })
    }

    /// Demo device: the editor process dies and starts again. Connections drop, an
    /// operation held by [`Pauses`] dies where it stands, the journal is closed; then the
    /// document is reloaded from its file, the journal reopened (operations that were
    /// running are now in doubt), and each in-doubt operation is resolved by looking at
    /// the document.
    pub fn restart(&self, timeout: Duration) -> Result<Vec<Reconciled>, ServiceError> {
        self.shared.close_connections();
        self.shared.pauses.release(Verdict::Crash);
        self.shared
            .wait(timeout, "connections and operations to stop", |live| {
                live.readers == 0 && live.workers == 0
            })?;
        self.shared.close_journal()?;
        self.shared.boot()
    }

    /// Stops serving and closes the journal.
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
        self.shared
            .wait(Duration::from_secs(10), "the service to stop", |live| {
                live.readers == 0 && live.workers == 0
            })?;
        self.shared.close_journal()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if self.accept.is_some() {
            let _ = self.stop();
        }
    }
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

impl Shared {
    fn journal(&self) -> Result<Arc<Journal>, ServiceError> {
        lock(&self.journal).clone().ok_or(ServiceError::Unavailable)
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
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        Ok(())
    }

    /// Start-up: load the document, open the journal, settle what was left in doubt.
    fn boot(&self) -> Result<Vec<Reconciled>, ServiceError> {
        let doc = Document::load_or_create(&self.cfg.document)?;
        let journal = (self.open)().doing(|| "open the journal".into())?;
        // Operations that were running when the editor stopped are in doubt: the journal
        // never re-runs them. Only the editor can tell whether the edit landed, by looking
        // at the document; it records what it finds.
        let mut report = Vec::new();
        for r in journal
            .in_doubt()
            .doing(|| "list in-doubt operations".into())?
        {
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
            report.push(Reconciled {
                id,
                cause: r.in_doubt_cause,
                applied_at: applied.map(|a| a.revision),
            });
        }
        // The journal's revision of the scope follows the document (a no-op when equal).
        journal
            .advance_revision(SCOPE, doc.revision)
            .doing(|| format!("report revision {} of `{SCOPE}`", doc.revision))?;
        *lock(&self.document) = doc;
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

    fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        for stream in listener.incoming() {
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            let Ok(stream) = stream else { continue };
            let writer = match stream.try_clone() {
                Ok(w) => w,
                Err(e) => {
                    (self.cfg.notes)(format!("could not serve a connection: {e}"));
                    continue;
                }
            };
            let conn = {
                let mut live = lock(&self.live);
                live.next_conn += 1;
                live.readers += 1;
                let conn = Arc::new(Conn {
                    id: live.next_conn,
                    writer: Mutex::new(writer),
                    session: Mutex::new(None),
                });
                live.conns.insert(conn.id, conn.clone());
                conn
            };
            let shared = self.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("editor-conn-{}", conn.id))
                .spawn(move || shared.serve(conn, stream));
            if let Err(e) = spawned {
                (self.cfg.notes)(format!("could not start a connection thread: {e}"));
            }
        }
    }

    /// One connection: read requests line by line until the client goes away.
    fn serve(self: Arc<Self>, conn: Arc<Conn>, stream: TcpStream) {
        let _counted = ThreadGuard {
            shared: &self,
            worker: false,
        };
        let mut reader = BufReader::new(stream);
        loop {
            let mut line = String::new();
            let read = Read::by_ref(&mut reader)
                .take(MAX_LINE as u64 + 1)
                .read_line(&mut line);
            match read {
                Ok(0) | Err(_) => break,
                // A line cut off by the connection closing is a torn request: dropped
                // unread, so nothing of it was accepted.
                Ok(_) if !line.ends_with('\n') => {
                    if line.len() > MAX_LINE {
                        let _ = conn.send(&Reply::Error {
                            id: None,
                            kind: "bad_request".into(),
                            message: format!("request lines are limited to {MAX_LINE} bytes"),
                        });
                    }
                    break;
                }
                Ok(_) => {}
            }
            let request = match serde_json::from_str::<Request>(line.trim_end()) {
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
                (self.cfg.notes)(chain(&e));
                break;
            }
        }
        let mut live = lock(&self.live);
        live.conns.remove(&conn.id);
        if let Some(session) = lock(&conn.session).take()
            && live.sessions.get(&session) == Some(&conn.id)
        {
            live.sessions.remove(&session);
        }
        self.changed.notify_all();
    }

    /// Answers one request. `Err` ends the connection (it could not be answered).
    fn handle(self: &Arc<Self>, conn: &Arc<Conn>, request: Request) -> Result<(), ServiceError> {
        let sent = |r: std::io::Result<()>| {
            r.map_err(|source| ServiceError::Io {
                what: "send a reply".into(),
                source,
            })
        };
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
            (Request::Ack { id }, Some(_)) => {
                self.ack(&id).unwrap_or_else(|e| refusal(Some(id), &e))
            }
            (Request::Status { id }, Some(_)) => {
                self.status(&id).unwrap_or_else(|e| refusal(Some(id), &e))
            }
        };
        sent(conn.send(&answer))
    }

    /// `hello`: the connection becomes the session's, then whatever the session has not
    /// acknowledged is pushed again (within the retry budget), marked as replays.
    fn hello(&self, conn: &Arc<Conn>, session: String) -> Result<(), ServiceError> {
        {
            let mut live = lock(&self.live);
            live.sessions.insert(session.clone(), conn.id);
            *lock(&conn.session) = Some(session.clone());
        }
        let journal = self.journal()?;
        let pushes: Vec<_> = journal
            .undelivered(&session)
            .doing(|| format!("list the results waiting for `{session}`"))?
            .into_iter()
            .filter(|r| {
                matches!(
                    r.receipt.delivery,
                    Some(DeliveryState::Pending | DeliveryState::Delivered)
                ) && r.receipt.delivery_count < self.cfg.push_budget
            })
            .collect();
        let revision = lock(&self.document).revision;
        let welcome = Reply::Welcome {
            session,
            scope: SCOPE.into(),
            revision,
            pushing: pushes.len(),
        };
        conn.send(&welcome).map_err(|source| ServiceError::Io {
            what: "send the welcome".into(),
            source,
        })?;
        for r in pushes {
            self.send_result(conn, &journal, &r.receipt.operation_id, &r.result, true)?;
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
        let admission = journal.submit(op).doing(|| format!("submit `{id}`"))?;
        Ok(Some(match admission {
            // New work, durably recorded as running: execute it on its own thread.
            Admission::Fresh(claim) => {
                let accepted = Reply::Accepted {
                    id: id.to_string(),
                    attempt: claim.attempt(),
                };
                let _ = conn.send(&accepted);
                self.spawn_execution(claim, edit, session.to_string());
                return Ok(None);
            }
            // The same operation is executing: attach to it; its result will be pushed.
            Admission::InProgress(r) => Reply::Running {
                id: id.to_string(),
                since: r.submitted_at,
            },
            // Done before: answer with the recorded outcome. Never re-applied.
            Admission::Replay(replay) => {
                if let Err(e) = self.send_result(conn, &journal, id, &replay.result, true) {
                    (self.cfg.notes)(chain(&e));
                }
                return Ok(None);
            }
            // Done long ago: the result aged out. Say so; do not run it again.
            Admission::Expired(r) => Reply::Expired {
                id: id.to_string(),
                applied: r.applied == Some(true),
                revision: r.result_revision,
                completed_at: r.completed_at,
                current_revision: lock(&self.document).revision,
            },
            // The service stopped while running it and has not settled it yet.
            Admission::InDoubt(r) => Reply::InDoubt {
                id: id.to_string(),
                since: r.submitted_at,
            },
            _ => Reply::Error {
                id: Some(id.to_string()),
                kind: "internal".into(),
                message: "the journal gave an answer this service does not know".into(),
            },
        }))
    }

    fn spawn_execution(self: &Arc<Self>, claim: Claim, edit: Edit, session: String) {
        lock(&self.live).workers += 1;
        let shared = self.clone();
        let id = claim.operation_id().to_string();
        let spawned = std::thread::Builder::new()
            .name(format!("editor-op-{id}"))
            .spawn(move || {
                let _counted = ThreadGuard {
                    shared: &shared,
                    worker: true,
                };
                if let Err(e) = shared.execute(&claim, &edit, &session) {
                    (shared.cfg.notes)(chain(&e));
                }
            });
        if let Err(e) = spawned {
            let mut live = lock(&self.live);
            live.workers -= 1;
            (self.cfg.notes)(format!(
                "could not start `{id}`: {e}; it stays running in the journal until its lease expires, then in doubt"
            ));
        }
    }

    /// A fresh operation: apply, record, deliver.
    fn execute(&self, claim: &Claim, edit: &Edit, session: &str) -> Result<(), ServiceError> {
        let id = claim.operation_id();
        if self.pauses.reach(Stage::Accepted, id) == Verdict::Crash {
            return Ok(());
        }
        let journal = self.journal()?;
        // 1. The effect: apply the edit and save the document.
        let applied = {
            let mut doc = lock(&self.document);
            let mut next = doc.clone();
            match next.apply(id, edit) {
                Ok(summary) => {
                    next.save(&self.cfg.document)?;
                    *doc = next;
                    Ok((doc.revision, summary))
                }
                Err(reason) => Err(reason),
            }
        };
        let (revision, summary) = match applied {
            Ok(done) => done,
            Err(reason) => {
                // Refused before any change: give the id back, so a corrected retry runs.
                journal.release(claim).doing(|| format!("release `{id}`"))?;
                let rejected = Reply::Rejected {
                    id: id.to_string(),
                    reason: format!("cannot {}: {reason}", edit.describe()),
                };
                if let Some(conn) = self.session_conn(session) {
                    let _ = conn.send(&rejected);
                }
                return Ok(());
            }
        };
        if self.pauses.reach(Stage::Mutated, id) == Verdict::Crash {
            return Ok(());
        }
        // 2. The outcome, durable before `complete` returns: from now on the id is
        //    answered with this result, never executed again.
        let result = OpResult {
            bytes: payload(&summary),
            changed_assets: changed_assets(edit),
        };
        let outcome = Outcome::applied(revision, result.bytes.clone())
            .changed_assets(result.changed_assets.clone());
        journal
            .complete(claim, outcome)
            .doing(|| format!("record the outcome of `{id}`"))?;
        if self.pauses.reach(Stage::Committed, id) == Verdict::Crash {
            return Ok(());
        }
        // 3. Deliver to the session's current connection. Without one, the result waits
        //    for the session's next `hello`.
        if let Some(conn) = self.session_conn(session) {
            self.send_result(&conn, &journal, id, &result, false)?;
        }
        Ok(())
    }

    fn session_conn(&self, session: &str) -> Option<Arc<Conn>> {
        let live = lock(&self.live);
        live.sessions
            .get(session)
            .and_then(|c| live.conns.get(c))
            .cloned()
    }

    /// Records a delivery, then sends the result. The delivery count is in the message,
    /// so the client can tell a repeat from a first sending.
    fn send_result(
        &self,
        conn: &Conn,
        journal: &Journal,
        id: &str,
        result: &OpResult,
        replayed: bool,
    ) -> Result<(), ServiceError> {
        let receipt = journal
            .delivered(id)
            .doing(|| format!("record a delivery of `{id}`"))?;
        let reply = Reply::Result(result_msg(&receipt, result, replayed));
        conn.send(&reply).map_err(|source| ServiceError::Io {
            what: format!("send the result of `{id}`"),
            source,
        })
    }

    fn ack(&self, id: &str) -> Result<Reply, ServiceError> {
        let journal = self.journal()?;
        let late = journal
            .lookup(id)
            .doing(|| format!("look up `{id}`"))?
            .is_some_and(|r| r.delivery == Some(DeliveryState::AckExpired));
        journal
            .acknowledge(id)
            .doing(|| format!("acknowledge `{id}`"))?;
        Ok(Reply::Acked {
            id: id.to_string(),
            late,
        })
    }

    fn status(&self, id: &str) -> Result<Reply, ServiceError> {
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
                message: "the service is restarting; ask again shortly".into(),
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

/// An error and its causes on one line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
