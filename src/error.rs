//! The one public error type, with a matchable [`ErrorKind`].
//!
//! Every message names the values involved and the next step. The underlying cause (a redb
//! or I/O error) is reachable through [`std::error::Error::source`] and never repeated in
//! `Display`.

use std::fmt;
use std::path::PathBuf;

use crate::clock::Timestamp;
use crate::intent_hash::IntentHash;

/// A specialized `Result` for journal operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The error returned by every fallible journal call.
///
/// Match on [`Error::kind`]; print with `Display` (one line, lowercase, with the next step)
/// and walk [`std::error::Error::source`] for the cause.
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    /// For I/O errors: what the journal was doing ("sync the journal's log").
    during: Option<&'static str>,
    /// For I/O errors: what it means for the journal, when not the writer's default (that
    /// the change may not be durable and the handle refuses writes).
    meaning: Option<&'static str>,
}

/// What went wrong. Variants carry the values a caller needs to react.
///
/// Errors marked *writes nothing* are refusals: the journal file is unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad input (writes nothing): an operation id, scope, session, intent name or
    /// configuration value that breaks a documented rule.
    InvalidInput {
        /// Which input (`operation id`, `scope`, `lease`, ...).
        what: &'static str,
        /// The offending value, shortened for display.
        value: String,
        /// The rule it breaks.
        reason: String,
    },
    /// A result payload (or failure message, or asset list) larger than the configured limit
    /// (writes nothing).
    ResultTooLarge {
        /// Size of what was given, in bytes.
        size: u64,
        /// The limit, in bytes.
        limit: u64,
    },
    /// The operation id is recorded with a different intent (writes nothing). The client
    /// reused an id for different work; it must pick a new id.
    IntentMismatch {
        /// The operation id.
        operation_id: String,
        /// The intent hash on record.
        recorded: IntentHash,
        /// The intent hash just submitted.
        submitted: IntentHash,
    },
    /// The client's base revision is older than the scope's revision (writes nothing).
    StaleBase {
        /// The scope.
        scope: String,
        /// The base revision the client saw.
        base: u64,
        /// The scope's current revision.
        current: u64,
    },
    /// Another operation holds the scope's mutation lock (writes nothing).
    ScopeBusy {
        /// The scope.
        scope: String,
        /// The operation holding the lock.
        holder: String,
    },
    /// The session already has the maximum number of unacknowledged results (writes nothing).
    WindowFull {
        /// The session.
        session: String,
        /// The window size.
        limit: u32,
        /// The oldest unacknowledged operation of the session.
        oldest: String,
        /// When the oldest result's acknowledgement expires and frees a slot.
        frees_at: Timestamp,
    },
    /// The claim is not the operation's current claim (writes nothing): another attempt,
    /// a resolution or a release happened since it was handed out.
    StaleClaim {
        /// The operation id.
        operation_id: String,
        /// The epoch the claim carries.
        claim_epoch: u64,
        /// What the operation's record says now.
        state: String,
    },
    /// The claim's lease has expired; it can no longer be extended (writes nothing). The
    /// claim holder may still complete or release while nothing else resolved the operation.
    LeaseExpired {
        /// The operation id.
        operation_id: String,
        /// When the lease expired.
        expired_at: Timestamp,
    },
    /// A revision that does not move the scope forward (writes nothing).
    RevisionNotForward {
        /// The scope.
        scope: String,
        /// The revision given.
        revision: u64,
        /// The scope's current revision.
        current: u64,
    },
    /// The call does not apply to the operation in its current state (writes nothing).
    InvalidState {
        /// The operation id.
        operation_id: String,
        /// What was attempted.
        action: &'static str,
        /// The operation's state.
        state: String,
    },
    /// The caller may not acknowledge this result (writes nothing): the operation was
    /// submitted with another session, and only that session acknowledges it (an
    /// acknowledgement stops the result being pushed to its owner). An operation submitted
    /// without a session may be acknowledged by any caller.
    NotOwner {
        /// The operation id.
        operation_id: String,
        /// The session the operation was submitted with.
        owner: String,
        /// The session of the caller (`None`: a caller that named no session).
        caller: Option<String>,
    },
    /// No operation with this id is recorded (writes nothing).
    UnknownOperation {
        /// The operation id.
        operation_id: String,
    },
    /// A stored record failed its CRC or could not be decoded. Run `opjournal verify`, then
    /// `opjournal repair`.
    Corrupt {
        /// The table holding the record.
        table: String,
        /// The record's key.
        key: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The file is not an opjournal journal (not a redb file, or a redb file without a
    /// journal's tables).
    NotAJournal {
        /// The file.
        path: PathBuf,
        /// Why it is not one.
        detail: String,
    },
    /// Another handle (in this or another process) has the journal open for writing.
    Locked {
        /// The file.
        path: PathBuf,
    },
    /// The file's format version is not the one this build reads.
    UnsupportedFormat {
        /// The version found in the file.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// An earlier commit failed with an I/O error; this handle refuses further writes. Drop
    /// the journal and open it again: reopening recovers the last durable state, and the
    /// operation ids make retries safe.
    Poisoned,
    /// An I/O error from the file system or redb.
    Io,
    /// The journal is closed (its handle was dropped while a background task still ran).
    Closed,
    /// A redb error that is none of the above.
    Storage,
    /// The database could not be reached, or dropped the transaction (a serialization
    /// failure, a deadlock, a timeout, a lost connection, a server shutting down): a
    /// journal kept in a database server, not a file. Retry after a backoff.
    ///
    /// When `outcome_unknown` is false the transaction did not commit and nothing was
    /// written. When it is true the connection was lost while the commit was in flight:
    /// the change may or may not be committed, so resubmit with the same operation id,
    /// which answers from the journal either way.
    Unavailable {
        /// What failed and where: the call, the journal and the database, and the reason
        /// (with its SQLSTATE when the server gave one).
        detail: String,
        /// Whether the commit may have happened (the connection was lost during it).
        outcome_unknown: bool,
    },
    /// A journal dump given to [`import_dump`](crate::import_dump) that cannot be loaded
    /// (nothing is written): a line that is not a dump record, a record that contradicts
    /// the ones before it, a newer format, or a dump that ends early. Check that the dump
    /// is a whole, unedited `opjournal export` of one journal, by a build of this format.
    InvalidDump {
        /// The line of the dump (1 for the first; one past the last for a dump that ends
        /// early).
        line: u64,
        /// What is wrong with it.
        detail: String,
    },
}

impl Error {
    pub(crate) fn new(kind: ErrorKind) -> Self {
        Error {
            inner: Box::new(Inner {
                kind,
                source: None,
                during: None,
                meaning: None,
            }),
        }
    }

    pub(crate) fn with_source(
        kind: ErrorKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Error {
            inner: Box::new(Inner {
                kind,
                source: Some(source.into()),
                during: None,
                meaning: None,
            }),
        }
    }

    /// What went wrong, for matching.
    pub fn kind(&self) -> &ErrorKind {
        &self.inner.kind
    }

    /// Whether this is a refusal that wrote nothing: the journal is unchanged and the call
    /// may be retried with corrected input.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self.kind(),
            ErrorKind::InvalidInput { .. }
                | ErrorKind::ResultTooLarge { .. }
                | ErrorKind::IntentMismatch { .. }
                | ErrorKind::StaleBase { .. }
                | ErrorKind::ScopeBusy { .. }
                | ErrorKind::WindowFull { .. }
                | ErrorKind::StaleClaim { .. }
                | ErrorKind::LeaseExpired { .. }
                | ErrorKind::RevisionNotForward { .. }
                | ErrorKind::InvalidState { .. }
                | ErrorKind::NotOwner { .. }
                | ErrorKind::UnknownOperation { .. }
        )
    }

    /// Whether the same call, unchanged, may succeed later: something else must finish
    /// first, and nothing about the request itself is wrong.
    ///
    /// True for:
    /// - [`ErrorKind::ScopeBusy`]: once the holder completes, is released, or its lease
    ///   expires;
    /// - [`ErrorKind::WindowFull`]: once the session acknowledges a result, or the oldest
    ///   acknowledgement expires (at `frees_at`);
    /// - [`ErrorKind::Locked`]: once the other handle closes the journal;
    /// - [`ErrorKind::Unavailable`]: once the database is reachable again or the
    ///   conflicting transaction has finished (resubmit with the same operation id);
    /// - [`ErrorKind::Storage`] when redb reports a transaction in progress
    ///   or the database already open (such as
    ///   [`Journal::reclaim_space`](crate::Journal::reclaim_space) beside a reader).
    ///
    /// False for every other kind: refusals of the input (`InvalidInput`,
    /// `ResultTooLarge`, `IntentMismatch`, `StaleBase`: resubmit against the current
    /// revision, which is a new request, `StaleClaim`, `LeaseExpired`,
    /// `RevisionNotForward`, `InvalidState`, `UnknownOperation`), damage (`Corrupt`,
    /// `NotAJournal`), `UnsupportedFormat`, and the errors that need a new handle
    /// (`Poisoned`: reopen the journal, which recovers the last durable state; `Closed`)
    /// or a look at the cause (`Io`). Kinds added later are classified here too.
    ///
    /// # Example
    ///
    /// ```
    /// # use opjournal::{Intent, Journal, Operation, Outcome};
    /// # let dir = tempfile::tempdir()?;
    /// let journal = Journal::open(dir.path().join("project.opj"))?;
    /// let intent = Intent::from_json("scene.add_light", &serde_json::json!({}))?;
    /// let first = journal.submit(Operation::new("op_1", intent.clone()).scope("scene/main"))?;
    /// // Another operation in the same scope waits for the first one to finish.
    /// let err = journal
    ///     .submit(Operation::new("op_2", intent).scope("scene/main"))
    ///     .expect_err("the scope is busy");
    /// assert!(err.is_retryable(), "{err}");
    /// # drop(first);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self.kind() {
            ErrorKind::ScopeBusy { .. }
            | ErrorKind::WindowFull { .. }
            | ErrorKind::Locked { .. }
            | ErrorKind::Unavailable { .. } => true,
            ErrorKind::Storage => self
                .inner
                .source
                .as_ref()
                .and_then(|s| s.downcast_ref::<redb::Error>())
                .is_some_and(|e| {
                    matches!(
                        e,
                        redb::Error::TransactionInProgress | redb::Error::DatabaseAlreadyOpen
                    )
                }),
            ErrorKind::InvalidInput { .. }
            | ErrorKind::ResultTooLarge { .. }
            | ErrorKind::IntentMismatch { .. }
            | ErrorKind::StaleBase { .. }
            | ErrorKind::StaleClaim { .. }
            | ErrorKind::LeaseExpired { .. }
            | ErrorKind::RevisionNotForward { .. }
            | ErrorKind::InvalidState { .. }
            | ErrorKind::UnknownOperation { .. }
            | ErrorKind::NotOwner { .. }
            | ErrorKind::Corrupt { .. }
            | ErrorKind::NotAJournal { .. }
            | ErrorKind::UnsupportedFormat { .. }
            | ErrorKind::Poisoned
            | ErrorKind::Io
            | ErrorKind::Closed
            | ErrorKind::InvalidDump { .. } => false,
        }
    }

    pub(crate) fn invalid(what: &'static str, value: &str, reason: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidInput {
            what,
            value: shorten(value, 80),
            reason: reason.into(),
        })
    }

    pub(crate) fn corrupt(
        table: impl Into<String>,
        key: impl fmt::Display,
        detail: impl Into<String>,
    ) -> Self {
        Error::new(ErrorKind::Corrupt {
            table: table.into(),
            key: shorten(&key.to_string(), 120),
            detail: detail.into(),
        })
    }

    pub(crate) fn io(err: std::io::Error) -> Self {
        Error::with_source(ErrorKind::Io, err)
    }

    /// A copy for another caller of a failed batch: the same kind and message, with the
    /// source chain flattened into one message.
    pub(crate) fn copied(&self) -> Error {
        let mut message = String::new();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            if !message.is_empty() {
                message.push_str(": ");
            }
            message.push_str(&s.to_string());
            source = s.source();
        }
        let mut e = if message.is_empty() {
            Error::new(self.kind().clone())
        } else {
            Error::with_source(self.kind().clone(), message)
        };
        e.inner.during = self.inner.during;
        e.inner.meaning = self.inner.meaning;
        e
    }

    /// An I/O error while the journal did `during` ("sync the journal's log"), which the
    /// message names.
    pub(crate) fn io_during(during: &'static str, err: std::io::Error) -> Self {
        let mut e = Error::with_source(ErrorKind::Io, err);
        e.inner.during = Some(during);
        e
    }

    /// An I/O error while doing `during` ("read the journal file"), and what that means for
    /// the journal ("the journal is unchanged"), which the message says instead of the
    /// writer's default.
    pub(crate) fn io_while(
        during: &'static str,
        meaning: &'static str,
        err: std::io::Error,
    ) -> Self {
        Error::io_during(during, err).meaning(meaning)
    }

    /// Names what the journal was doing and what it means, if this is an I/O error that
    /// does not say yet (a redb error converted with `From`). Other errors are
    /// returned as they are.
    pub(crate) fn while_doing(mut self, during: &'static str, meaning: &'static str) -> Self {
        if matches!(self.kind(), ErrorKind::Io) && self.inner.during.is_none() {
            self.inner.during = Some(during);
            self.inner.meaning = Some(meaning);
        }
        self
    }

    fn meaning(mut self, meaning: &'static str) -> Self {
        self.inner.meaning = Some(meaning);
        self
    }

    /// For an I/O error, what the journal was doing when it happened ("sync the repaired
    /// journal"), if known.
    pub fn during(&self) -> Option<&'static str> {
        self.inner.during
    }
}

/// Shortens `s` to at most `max` characters for messages, marking the cut.
pub(crate) fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(max).collect();
        out.push('…');
        out
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind() {
            ErrorKind::InvalidInput {
                what,
                value,
                reason,
            } => {
                write!(f, "invalid {what} `{value}`: {reason}")
            }
            ErrorKind::ResultTooLarge { size, limit } => write!(
                f,
                "result of {size} bytes exceeds the limit of {limit} bytes; \
                 store large payloads elsewhere and record a reference, or raise `max_result_bytes`"
            ),
            ErrorKind::IntentMismatch {
                operation_id,
                recorded,
                submitted,
            } => write!(
                f,
                "operation `{operation_id}` is recorded with intent `{recorded}` but was submitted \
                 with intent `{submitted}`; an operation id names one intent, so use a new id for new work"
            ),
            ErrorKind::StaleBase {
                scope,
                base,
                current,
            } => write!(
                f,
                "base revision {base} of scope `{scope}` is stale (current revision is {current}); \
                 refresh the client and resubmit against revision {current}"
            ),
            ErrorKind::ScopeBusy { scope, holder } => write!(
                f,
                "scope `{scope}` is busy with operation `{holder}`; retry after it completes or \
                 its lease expires"
            ),
            ErrorKind::WindowFull {
                session,
                limit,
                oldest,
                frees_at,
            } => write!(
                f,
                "session `{session}` already has {limit} unacknowledged results (oldest `{oldest}`); \
                 acknowledge results, or retry after {frees_at} when the oldest acknowledgement expires"
            ),
            ErrorKind::StaleClaim {
                operation_id,
                claim_epoch,
                state,
            } => write!(
                f,
                "claim with epoch {claim_epoch} on operation `{operation_id}` is stale ({state}); \
                 the effect must not be recorded through this claim: look the operation up instead"
            ),
            ErrorKind::LeaseExpired {
                operation_id,
                expired_at,
            } => write!(
                f,
                "lease on operation `{operation_id}` expired at {expired_at} and cannot be extended; \
                 complete or release the claim now, or resolve the operation"
            ),
            ErrorKind::RevisionNotForward {
                scope,
                revision,
                current,
            } => write!(
                f,
                "revision {revision} does not move scope `{scope}` forward (current revision is \
                 {current}); report a revision greater than {current}"
            ),
            ErrorKind::InvalidState {
                operation_id,
                action,
                state,
            } => write!(
                f,
                "cannot {action} operation `{operation_id}`: it is {state}"
            ),
            ErrorKind::NotOwner {
                operation_id,
                owner,
                caller,
            } => {
                let caller = match caller {
                    Some(session) => format!("session `{session}`"),
                    None => "a caller without a session".to_string(),
                };
                write!(
                    f,
                    "operation `{operation_id}` belongs to session `{owner}`, so {caller} cannot \
                     acknowledge it; only the submitting session acknowledges its results: \
                     acknowledge as session `{owner}`, or leave it to that session"
                )
            }
            ErrorKind::UnknownOperation { operation_id } => write!(
                f,
                "no operation `{operation_id}` is recorded (never submitted, released, or purged)"
            ),
            ErrorKind::Corrupt { table, key, detail } => write!(
                f,
                "corrupt record in table `{table}` at key `{key}`: {detail}; \
                 run `opjournal verify` and then `opjournal repair`"
            ),
            ErrorKind::NotAJournal { path, detail } => {
                write!(f, "`{}` is not an opjournal journal: {detail}", shown(path))
            }
            ErrorKind::Locked { path } => write!(
                f,
                "journal `{}` is open for writing by another handle (this or another process); \
                 close it first, or share one `Journal` through an `Arc`",
                shown(path)
            ),
            ErrorKind::UnsupportedFormat { found, supported } => write!(
                f,
                "journal format version {found} is not supported by this build, which reads \
                 version {supported}; use a matching opjournal version"
            ),
            ErrorKind::Poisoned => write!(
                f,
                "an earlier commit failed with an I/O error, so this handle refuses writes; \
                 drop the journal and open it again"
            ),
            ErrorKind::Io => match (self.inner.during, self.inner.meaning) {
                (Some(during), Some(meaning)) => {
                    write!(f, "I/O error: could not {during}; {meaning}")
                }
                (Some(during), None) => write!(
                    f,
                    "I/O error: could not {during}; what it was writing may not be durable, \
                     and this handle refuses further writes: open the journal again"
                ),
                (None, _) => write!(f, "I/O error on the journal file"),
            },
            ErrorKind::Closed => write!(f, "the journal is closed"),
            ErrorKind::Storage => write!(f, "storage engine error"),
            ErrorKind::Unavailable {
                detail,
                outcome_unknown: false,
            } => write!(
                f,
                "the database is unavailable: {detail}; the transaction did not commit and \
                 nothing was written: retry after a backoff (the same operation id is safe)"
            ),
            ErrorKind::Unavailable {
                detail,
                outcome_unknown: true,
            } => write!(
                f,
                "the database is unavailable: {detail}; the connection was lost while the \
                 commit was in flight, so the change may or may not be committed: resubmit \
                 with the same operation id, which answers from the journal either way"
            ),
            ErrorKind::InvalidDump { line, detail } => {
                write!(f, "line {line} of the dump: {detail}; nothing was imported")
            }
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.inner.kind);
        d.field("message", &self.to_string());
        if let Some(source) = &self.inner.source {
            d.field("source", source);
        }
        d.finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner
            .source
            .as_ref()
            .map(|s| s.as_ref() as &(dyn std::error::Error + 'static))
    }
}

/// Classifies a redb error. I/O errors become [`ErrorKind::Io`], detected corruption becomes
/// [`ErrorKind::Corrupt`], a previous I/O error becomes [`ErrorKind::Poisoned`].
impl From<redb::Error> for Error {
    fn from(err: redb::Error) -> Self {
        match err {
            redb::Error::Io(io) => Error::io(io),
            redb::Error::PreviousIo => Error::new(ErrorKind::Poisoned),
            // redb's own words stay in the cause chain, not in the message.
            redb::Error::Corrupted(detail) => Error::with_source(
                ErrorKind::Corrupt {
                    table: "(redb)".into(),
                    key: "(page)".into(),
                    detail: "the storage engine found its own structures damaged".into(),
                },
                redb::Error::Corrupted(detail),
            ),
            // Without the path at hand this is no `Locked` (which names the file): opening a
            // journal goes through `crate::preflight::file::open_error`, which names it. The cause
            // stays reachable, and `is_retryable` recognizes it.
            // The journal always opens its tables with the same types: a table whose stored
            // definition differs is damage (found by fuzzing), which `repair` salvages.
            redb::Error::TableTypeMismatch { table, key, value } => Error::corrupt(
                table,
                "(definition)",
                format!(
                    "the table is stored with key type `{}` and value type `{}`, not the journal's",
                    key.name(),
                    value.name()
                ),
            ),
            // A table whose stored definition is not the journal's, a table of the wrong
            // kind, or the engine's own lock left poisoned by a panic on damaged data: what
            // a damaged file causes. redb's words stay in the cause chain.
            e @ (redb::Error::TypeDefinitionChanged { .. }
            | redb::Error::TableIsMultimap(_)
            | redb::Error::TableIsNotMultimap(_)
            | redb::Error::LockPoisoned(_)) => Error::with_source(
                ErrorKind::Corrupt {
                    table: "(redb)".into(),
                    key: "(tables)".into(),
                    detail: "the storage engine found its own structures damaged".into(),
                },
                e,
            ),
            other => Error::with_source(ErrorKind::Storage, other),
        }
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(err: $t) -> Self {
                Error::from(redb::Error::from(err))
            }
        }
    )*};
}
from_redb!(
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::CommitError,
    redb::DatabaseError,
    redb::CompactionError,
    redb::SetDurabilityError
);

impl From<std::io::Error> for Error {
    fn from(err: std::io::Error) -> Self {
        Error::io(err)
    }
}

/// A path as messages show it: its control characters escaped (`\n`), so that a message
/// naming a strange path is still one line of a log.
pub(crate) fn shown(path: &std::path::Path) -> String {
    path.display()
        .to_string()
        .chars()
        .map(|c| {
            if c.is_control() {
                c.escape_debug().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intent_hash::{HashScheme, IntentHash};

    /// One error of every kind, with whether the same call may succeed later.
    fn every_kind() -> Vec<(Error, bool)> {
        let hash = IntentHash::new(HashScheme::JcsV2, [1; 32]);
        let kinds = vec![
            (Error::invalid("scope", "", "it is empty"), false),
            (
                Error::new(ErrorKind::ResultTooLarge { size: 2, limit: 1 }),
                false,
            ),
            (
                Error::new(ErrorKind::IntentMismatch {
                    operation_id: "op".into(),
                    recorded: hash,
                    submitted: hash,
                }),
                false,
            ),
            (
                Error::new(ErrorKind::StaleBase {
                    scope: "s".into(),
                    base: 1,
                    current: 2,
                }),
                false,
            ),
            (
                Error::new(ErrorKind::ScopeBusy {
                    scope: "s".into(),
                    holder: "op".into(),
                }),
                true,
            ),
            (
                Error::new(ErrorKind::WindowFull {
                    session: "tab".into(),
                    limit: 1,
                    oldest: "op".into(),
                    frees_at: Timestamp(0),
                }),
                true,
            ),
            (
                Error::new(ErrorKind::StaleClaim {
                    operation_id: "op".into(),
                    claim_epoch: 1,
                    state: "released".into(),
                }),
                false,
            ),
            (
                Error::new(ErrorKind::LeaseExpired {
                    operation_id: "op".into(),
                    expired_at: Timestamp(0),
                }),
                false,
            ),
            (
                Error::new(ErrorKind::RevisionNotForward {
                    scope: "s".into(),
                    revision: 1,
                    current: 1,
                }),
                false,
            ),
            (
                Error::new(ErrorKind::InvalidState {
                    operation_id: "op".into(),
                    action: "deliver",
                    state: "running".into(),
                }),
                false,
            ),
            (
                Error::new(ErrorKind::UnknownOperation {
                    operation_id: "op".into(),
                }),
                false,
            ),
            (
                Error::new(ErrorKind::NotOwner {
                    operation_id: "op".into(),
                    owner: "tab-1".into(),
                    caller: Some("tab-2".into()),
                }),
                false,
            ),
            (Error::corrupt("events", 1, "bad crc"), false),
            (
                Error::new(ErrorKind::NotAJournal {
                    path: "x.opj".into(),
                    detail: "empty".into(),
                }),
                false,
            ),
            (
                Error::new(ErrorKind::Locked {
                    path: "x.opj".into(),
                }),
                true,
            ),
            (
                Error::new(ErrorKind::UnsupportedFormat {
                    found: 9,
                    supported: 1,
                }),
                false,
            ),
            (Error::new(ErrorKind::Poisoned), false),
            (Error::io(std::io::Error::other("disk")), false),
            (Error::new(ErrorKind::Closed), false),
            (
                Error::new(ErrorKind::InvalidDump {
                    line: 3,
                    detail: "not JSON".into(),
                }),
                false,
            ),
            (Error::from(redb::Error::TransactionInProgress), true),
            (
                Error::new(ErrorKind::Unavailable {
                    detail: "could not commit".into(),
                    outcome_unknown: true,
                }),
                true,
            ),
            (
                Error::with_source(ErrorKind::Storage, redb::Error::ValueTooLarge(1)),
                false,
            ),
        ];
        // Keep this list complete: a kind missing from it fails the match below.
        for (e, _) in &kinds {
            match e.kind() {
                ErrorKind::InvalidInput { .. }
                | ErrorKind::ResultTooLarge { .. }
                | ErrorKind::IntentMismatch { .. }
                | ErrorKind::StaleBase { .. }
                | ErrorKind::ScopeBusy { .. }
                | ErrorKind::WindowFull { .. }
                | ErrorKind::StaleClaim { .. }
                | ErrorKind::LeaseExpired { .. }
                | ErrorKind::RevisionNotForward { .. }
                | ErrorKind::InvalidState { .. }
                | ErrorKind::UnknownOperation { .. }
                | ErrorKind::NotOwner { .. }
                | ErrorKind::Corrupt { .. }
                | ErrorKind::NotAJournal { .. }
                | ErrorKind::Locked { .. }
                | ErrorKind::UnsupportedFormat { .. }
                | ErrorKind::Poisoned
                | ErrorKind::Io
                | ErrorKind::Closed
                | ErrorKind::Storage
                | ErrorKind::Unavailable { .. }
                | ErrorKind::InvalidDump { .. } => {}
            }
        }
        kinds
    }

    #[test]
    fn exactly_scope_busy_window_full_locked_unavailable_and_engine_contention_are_retryable() {
        let kinds = every_kind();
        let distinct: std::collections::BTreeSet<String> = kinds
            .iter()
            .map(|(e, _)| format!("{:?}", std::mem::discriminant(e.kind())))
            .collect();
        assert_eq!(distinct.len(), 22, "every kind is listed");
        for (err, retryable) in kinds {
            assert_eq!(err.is_retryable(), retryable, "{err:?}");
        }
    }

    #[test]
    fn an_engine_lock_error_without_a_path_claims_no_path() {
        let err = Error::from(redb::DatabaseError::DatabaseAlreadyOpen);
        assert!(!matches!(err.kind(), ErrorKind::Locked { .. }), "{err:?}");
        assert!(!err.to_string().contains("``"), "{err}");
        assert!(err.is_retryable(), "{err:?}");
        assert!(std::error::Error::source(&err).is_some(), "{err:?}");
    }
}
