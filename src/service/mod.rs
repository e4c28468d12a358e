//! The reference editor service: a small editor that embeds the journal and serves one
//! document over TCP. It is what `opjournal demo` and `opjournal serve` run and what
//! `examples/editor.rs` starts, and it is the model to copy when you put opjournal behind
//! a network protocol. (Enabled by the `service` feature, which the `cli` feature turns on;
//! embedders with `default-features = false` do not compile it.)
//!
//! The editor holds one document ([`Document`]: a scene of named objects with a revision
//! number) and speaks JSON Lines ([`protocol`], `docs/protocol.md`). Every mutating request
//! goes through the journal, which is what makes a retry safe:
//!
//! ```text
//! hello  (a connection or a reconnect)  -> undelivered(session): push what the client missed
//! submit                                -> journal.submit(op)
//!          Fresh(claim)  -> apply the edit (one thread, in order) -> complete or release
//!                           -> send to the owner and to every connection attached to it
//!          InProgress    -> "running": attach this connection, apply nothing
//!          Replay        -> the recorded result, marked replayed -> delivered
//!          Expired       -> "it finished at revision N; refresh, do not retry"
//!          InDoubt       -> look at the document, resolve, answer from the record
//! ack                                   -> acknowledge(id, Some(session)): owners only
//! status (ask about an id)              -> lookup + history
//! start                                 -> in_doubt(): check the document, then resolve
//! ```
//!
//! What to copy, and why:
//!
//! - **Save the effect before recording the outcome.** The edit is made durable in the
//!   document (one synced log line, see [`DocumentStore`]) before `complete`. A crash in
//!   between leaves the operation `InDoubt`; the service looks at the document and records
//!   what really happened. Nothing is ever re-run on its own.
//! - **End every operation.** An edit that is refused, panics (caught) or cannot be saved
//!   is released at once (nothing changed; the client hears `rejected` or `released`, and
//!   whether a retry can help); a save whose result is unknown (a failed sync) is completed
//!   as failed. An operation is never left `Running` for its lease to expire.
//! - **Stay bounded.** At most [`ServiceConfig::max_connections`] connections (the next one
//!   hears `too_many_connections` and is closed), one thread each plus one thread that
//!   applies edits (its answers are written by short-lived threads, at most 4 waiting per
//!   connection, so it never waits for a client); an idle connection is closed after [`ServiceConfig::idle_timeout`];
//!   request lines are at most [`MAX_LINE`] bytes; a client that stops reading is dropped
//!   after [`ServiceConfig::write_timeout`]. Every socket has `TCP_NODELAY`: a reply is
//!   one small write, and Nagle's algorithm would hold the next one back for an ACK.
//! - **Let the journal decide.** Whether to push a result again is read from the receipt
//!   ([`DeliveryState::Exhausted`](crate::DeliveryState::Exhausted) once the retry budget is
//!   spent), and who may acknowledge is checked by the journal ([`Journal::acknowledge`]).
//!   Names from clients are checked with [`validate_name`](crate::validate_name), the rules
//!   `submit` applies.
//!
//! [`Pauses`] and [`Service::restart`] are fault-injection devices for the demo and tests:
//! they hold an operation at an exact step so a client can disconnect there, or make the
//! edit panic. A real service never arms them.
//!
//! # Example
//!
//! ```no_run
//! use std::net::TcpListener;
//! use opjournal::Journal;
//! use opjournal::service::{JournalOpener, Service, ServiceConfig};
//!
//! let open: JournalOpener = Box::new(|| Journal::open("project.opj"));
//! let service = Service::start(
//!     TcpListener::bind(("127.0.0.1", 0))?,
//!     open,
//!     ServiceConfig::new("project.scene.json"),
//! )?;
//! println!("listening on {}", service.addr());
//! # service.shutdown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Journal::acknowledge`]: crate::Journal::acknowledge

mod conn;
#[cfg(feature = "postgres")]
mod database;
mod document;
mod pauses;
pub mod protocol;
mod server;

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

#[cfg(feature = "mcp")]
pub(crate) use document::ApplyError;
pub use document::{AppliedEdit, Document, DocumentStore};
pub use pauses::{Pauses, Stage, Verdict};
pub use protocol::{Edit, MAX_OBJECT_NAME_BYTES, Reply, Request, ResultMsg, StatusMsg};
#[cfg(feature = "postgres")]
pub use server::DocumentDatabase;
pub use server::{
    JournalOpener, Notes, Reconciled, SCOPE, Service, ServiceConfig, ServiceStats,
    describe_reconciled,
};

/// The longest request line accepted, in bytes (the newline excluded).
pub const MAX_LINE: usize = 64 * 1024;

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
        source: crate::Error,
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
    /// The document's database refused a statement or could not be reached (feature
    /// `postgres`).
    #[cfg(feature = "postgres")]
    #[error("could not {what}")]
    Database {
        /// What was being done.
        what: String,
        /// The database client's error.
        #[source]
        source: ::postgres::Error,
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

impl<T> Context<T> for crate::Result<T> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, ServiceError> {
        self.map_err(|source| ServiceError::Journal {
            what: what(),
            source,
        })
    }
}

/// Locks a mutex; a panic elsewhere never leaves its data half-changed here (every
/// critical section is a few assignments), so a poisoned lock is taken as it is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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
