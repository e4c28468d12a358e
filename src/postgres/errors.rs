//! PostgreSQL errors as the journal's: what the server or the connection said, sorted into
//! [`ErrorKind::Unavailable`] (retry: the database is unreachable or dropped the
//! transaction) and [`ErrorKind::Storage`] (anything else: a bug, a schema someone changed,
//! a permission), in one place so that every call answers alike.
//!
//! The postgres error stays the source of the journal's error (so [`is_conflict`] reads its
//! SQLSTATE), and the detail names the SQLSTATE too, for copies of the error whose source
//! was flattened into text ([`Error::copied`]).

use std::error::Error as _;

use postgres::error::{DbError, Severity, SqlState};

use crate::error::{Error, ErrorKind};

/// The SQLSTATEs the committer answers by running the batch again itself: the server
/// aborted the transaction because another one conflicted with it.
const CONFLICTS: [&str; 2] = [
    "40001", // serialization_failure (CockroachDB's "restart transaction" too)
    "40P01", // deadlock_detected
];

/// Classifies `e`, which happened while the journal tried to `during` ("read the journal's
/// entries") on `place` (what [`Pg::describe`](super::Pg::describe) says: the journal and
/// the database). A statement that is not a COMMIT never leaves an unknown outcome: the
/// transaction it ran in did not commit.
///
/// - [`ErrorKind::Unavailable`] (retryable): SQLSTATE 40001 (serialization failure),
///   40P01 (deadlock), 40003 (statement completion unknown), 55P03 (lock timeout), 57014
///   (statement timeout or cancel), 57P01, 57P02, 57P03 (the server ended the session, is
///   shutting down or starting), 25P03 (idle in transaction too long), 53300 (no
///   connection slot), class 08 (connection exception), and a closed connection or an I/O
///   error on it;
/// - [`ErrorKind::Storage`] with the postgres error as its source: anything else.
pub(crate) fn classify(e: postgres::Error, during: &'static str, place: &str) -> Error {
    sort(e, during, place, false)
}

/// As [`classify`], for an error of COMMIT itself (ours, or the caller's transaction that
/// a [`PgWriteIn`](super::PgWriteIn) wrote in): when the connection was lost while COMMIT
/// was in flight (no answer, or the server ended the session), or the server could not
/// tell whether it completed (SQLSTATE 40003), the outcome is unknown and the error says
/// so (`outcome_unknown: true`). An ERROR the server answered COMMIT with (a serialization
/// failure at commit, a deferred constraint) means it rolled back: nothing was written.
pub(crate) fn classify_commit(e: postgres::Error, place: &str) -> Error {
    sort(e, "commit the transaction", place, true)
}

/// Whether `e` is a serialization failure or a deadlock (SQLSTATE 40001, 40P01): another
/// transaction conflicted with this one, nothing was written, and the same batch run again
/// may pass. False for a lost connection, a timeout and every other error.
pub(crate) fn is_conflict(e: &Error) -> bool {
    let ErrorKind::Unavailable { detail, .. } = e.kind() else {
        return false;
    };
    match e.source().and_then(|s| s.downcast_ref::<postgres::Error>()) {
        Some(pg) => pg.code().is_some_and(|c| CONFLICTS.contains(&c.code())),
        // A copy (the source flattened to text) keeps the SQLSTATE in its detail.
        None => CONFLICTS
            .iter()
            .any(|c| detail.contains(&format!("(SQLSTATE {c})"))),
    }
}

/// Whether the connection `e` came from is gone (closed, an I/O error, a session the
/// server ended): a pooled connection that answers this is discarded, never reused.
pub(super) fn connection_lost(e: &postgres::Error) -> bool {
    if e.is_closed() || io_cause(e) {
        return true;
    }
    match e.as_db_error() {
        Some(db) => fatal(db) || db.code().code().starts_with("08"),
        None => false,
    }
}

/// Whether `e` is the connection timing out: the client's deadline on a silent server
/// (see `deadline.rs`), or the kernel giving up on the socket (`tcp_user_timeout`,
/// keepalives). The server could not be reached for that long: trying another connection
/// at once would most likely wait as long again.
pub(super) fn timed_out(e: &postgres::Error) -> bool {
    io_kind(e) == Some(std::io::ErrorKind::TimedOut)
}

/// The kind of the first I/O error in `e`'s chain.
fn io_kind(e: &postgres::Error) -> Option<std::io::ErrorKind> {
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        source = s.source();
    }
    None
}

/// Whether a cause in `e`'s chain is an I/O error (the socket failed or the server could
/// not be reached).
fn io_cause(e: &postgres::Error) -> bool {
    let mut source = e.source();
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// Whether the server ended the session with this error (FATAL or PANIC).
fn fatal(db: &DbError) -> bool {
    matches!(
        db.parsed_severity(),
        Some(Severity::Fatal | Severity::Panic)
    ) || matches!(db.severity(), "FATAL" | "PANIC")
}

/// Why a retryable SQLSTATE happened, in the journal's words; `None` for the others.
fn retryable_reason(code: &SqlState) -> Option<&'static str> {
    let c = code.code();
    Some(match c {
        "40001" => "a concurrent transaction conflicted with this one (serialization failure)",
        "40P01" => "the server broke a deadlock by aborting this transaction",
        "40003" => "the server could not tell whether the statement completed",
        "55P03" => "a lock wait ran past lock_timeout",
        "57014" => "a statement ran past statement_timeout or was canceled",
        "57P01" => "the server ended the session (terminated by an administrator or shutdown)",
        "57P02" => "the server is restarting after a crash",
        "57P03" => "the server cannot accept connections yet (starting up or shutting down)",
        "25P03" => "the transaction sat idle past idle_in_transaction_session_timeout",
        "53300" => "the server has no connection slot free",
        _ if c.starts_with("08") => "the connection to the server failed",
        _ => return None,
    })
}

/// [`classify`] and [`classify_commit`] in one: `at_commit` says whether `e` answered a
/// COMMIT, where a lost session leaves the outcome unknown.
fn sort(e: postgres::Error, during: &'static str, place: &str, at_commit: bool) -> Error {
    let code = e.code().cloned();
    let lost = connection_lost(&e);
    let reason = match &code {
        Some(code) => retryable_reason(code).map(|r| format!("{r} (SQLSTATE {})", code.code())),
        None if e.is_closed() => Some("the connection was closed".to_string()),
        None if timed_out(&e) => Some(
            "the server did not answer in time (the connection timed out: a network \
             partition, or a server that stopped responding)"
                .to_string(),
        ),
        None if io_cause(&e) => Some("the connection failed or could not be opened".to_string()),
        None => None,
    };
    let Some(reason) = reason else {
        return Error::with_source(ErrorKind::Storage, e);
    };
    let ambiguous = code.as_ref().is_some_and(|c| c.code() == "40003");
    // At COMMIT, a session that ended (or never answered) may have committed first.
    let outcome_unknown = at_commit && (lost || ambiguous);
    Error::with_source(
        ErrorKind::Unavailable {
            detail: format!("could not {during} for {place}: {reason}"),
            outcome_unknown,
        },
        e,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_of_a_conflict_is_still_a_conflict_and_other_kinds_never_are() {
        let e = Error::new(ErrorKind::Unavailable {
            detail: "could not x for y: z (SQLSTATE 40001)".into(),
            outcome_unknown: false,
        });
        assert!(is_conflict(&e));
        assert!(is_conflict(&e.copied()));
        let timeout = Error::new(ErrorKind::Unavailable {
            detail: "could not x for y: z (SQLSTATE 55P03)".into(),
            outcome_unknown: false,
        });
        assert!(!is_conflict(&timeout));
        assert!(!is_conflict(&Error::new(ErrorKind::Storage)));
    }

    #[test]
    fn the_reasons_name_their_sqlstate_classes() {
        assert!(retryable_reason(&SqlState::CONNECTION_FAILURE).is_some());
        assert!(retryable_reason(&SqlState::T_R_SERIALIZATION_FAILURE).is_some());
        assert!(retryable_reason(&SqlState::UNIQUE_VIOLATION).is_none());
        assert!(retryable_reason(&SqlState::UNDEFINED_TABLE).is_none());
    }
}
