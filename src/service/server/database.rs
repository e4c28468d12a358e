//! The service with its document in PostgreSQL (feature `postgres`): an edit runs in the
//! connection's thread as one database transaction that holds the journal's admission,
//! the document's change and the receipt ([`Journal::execute_in`]), so a process that
//! dies mid-edit leaves nothing, and a retry on any process runs it fresh or replays it.
//! Only after the commit is the client told `accepted`, then the result.

use super::*;
use crate::service::database::{EditFailure, SceneDb};
use crate::{ExecuteError, Executed, Failure};

impl Shared {
    /// Start-up with the document in the database: settle what the journal lists in doubt
    /// (only operations run outside this service can be: its own edits commit with their
    /// receipts) from the applied-operation index, and bring the journal's revision of the
    /// scope up to the document's.
    pub(super) fn boot_database(
        &self,
        db: &SceneDb,
        journal: Journal,
    ) -> Result<Vec<Reconciled>, ServiceError> {
        let mut report = Vec::new();
        for r in journal
            .in_doubt()
            .doing(|| "list in-doubt operations".into())?
        {
            let applied = db.applied(&r.operation_id)?;
            report.push(reconcile(&journal, applied.as_ref(), &r)?);
        }
        let revision = db.revision()?;
        match journal.advance_revision(SCOPE, revision) {
            Ok(_) => {}
            // Another process committed an edit meanwhile: the journal is ahead, as it should.
            Err(e) if matches!(e.kind(), ErrorKind::RevisionNotForward { .. }) => {}
            Err(e) => {
                return Err(journal_error(
                    &format!("report revision {revision} of `{SCOPE}`"),
                    e,
                ));
            }
        }
        *lock(&self.journal) = Some(Arc::new(journal));
        Ok(report)
    }

    /// `submit` with the document in the database: admission, edit and receipt in one
    /// transaction. A fresh operation is answered here (`accepted`, then its `result`,
    /// `rejected` or `released`); a known one is handed back as the journal's admission.
    pub(super) fn execute_in_database(
        &self,
        db: &SceneDb,
        conn: &Arc<Conn>,
        journal: &Journal,
        op: &Operation,
        base: u64,
        edit: &Edit,
    ) -> Result<Step, ServiceError> {
        let id = op.id.as_str();
        let at = journal.now();
        let mut attempt = 1;
        let mut connection = db.edit_connection()?;
        let client = connection.client().ok_or(ServiceError::Unavailable)?;
        let mut txn = client
            .transaction()
            .map_err(|source| ServiceError::Database {
                what: format!("begin the transaction of `{id}`"),
                source,
            })?;
        let executed = journal.execute_in(&mut txn, op.clone(), |txn, claim| {
            attempt = claim.attempt();
            let verdict = self.pauses.reach(Stage::Accepted, id);
            if verdict == Verdict::Crash {
                return Err(Failure::NotApplied(EditFailure::Crashed));
            }
            let applied = db
                .apply_in(txn, id, base, edit, at, || {
                    if verdict == Verdict::Panic {
                        panic!("injected fault: the edit of `{id}` panicked");
                    }
                })
                .map_err(Failure::NotApplied)?;
            if self.pauses.reach(Stage::Mutated, id) == Verdict::Crash {
                return Err(Failure::NotApplied(EditFailure::Crashed));
            }
            Ok(
                Outcome::applied(applied.revision, payload(&applied.summary))
                    .changed_assets(edit.changed_assets()),
            )
        });
        let commit = |txn: crate::postgres::Transaction<'_>| {
            txn.commit().map_err(|source| ServiceError::Database {
                what: format!("commit the transaction of `{id}`"),
                source,
            })
        };
        let failure = match executed {
            Ok(Executed::Fresh(_, result)) => {
                if let Err(e) = commit(txn) {
                    return Ok(Step::Answered(Some(Reply::Error {
                        id: Some(id.to_string()),
                        kind: "unavailable".into(),
                        message: format!(
                            "the edit of `{id}` may or may not be committed ({}); send the same id again: the journal answers it either way",
                            chain(&e)
                        ),
                    })));
                }
                drop(connection);
                return Ok(Step::Answered(
                    self.answer_fresh(conn, journal, id, attempt, &result),
                ));
            }
            Ok(known) => {
                commit(txn)?;
                return Ok(Step::Known(Box::new(match known {
                    Executed::Replay(replay) => Admission::Replay(replay),
                    Executed::InProgress(r) => Admission::InProgress(r),
                    Executed::Expired(r) => Admission::Expired(r),
                    Executed::InDoubt(r) => Admission::InDoubt(r),
                    // Answered above; never reached.
                    Executed::Fresh(r, _) => Admission::InProgress(r),
                })));
            }
            Err(ExecuteError::Journal(e)) => {
                return Err(journal_error(&format!("submit `{id}`"), e));
            }
            Err(ExecuteError::Unrecorded(u)) => {
                return Err(journal_error(
                    &format!("record the outcome of `{id}` (nothing was applied)"),
                    u.error,
                ));
            }
            Err(ExecuteError::ReleaseFailed { error, release }) => match error {
                EditFailure::Database(e) => return Err(e),
                EditFailure::Crashed => return Ok(Step::Answered(None)),
                _ => return Err(journal_error(&format!("release `{id}`"), release)),
            },
            Err(ExecuteError::NotApplied(failure)) => failure,
        };
        // Nothing applied; the claim was released in `txn`.
        let reply = match failure {
            // The process "died": its transaction ends with its connection.
            EditFailure::Crashed => return Ok(Step::Answered(None)),
            EditFailure::Database(e) => return Err(e),
            EditFailure::Refused(reason) => Reply::Rejected {
                id: id.to_string(),
                reason: format!("cannot {}: {reason}", edit.describe()),
            },
            EditFailure::Panicked(message) => Reply::Released {
                id: id.to_string(),
                reason: format!(
                    "the editor failed while applying {} ({message}); nothing changed",
                    edit.describe()
                ),
                retry: false,
            },
            EditFailure::Stale { base, current } => Reply::Error {
                id: Some(id.to_string()),
                kind: "stale_base".into(),
                message: format!(
                    "`{id}` is based on revision {base}, but the document is at revision {current}: say `hello`, decide again on the current document, and submit with a new id"
                ),
            },
        };
        commit(txn)?;
        Ok(Step::Answered(Some(reply)))
    }

    /// A fresh operation, committed: `accepted`, then its result (one delivery recorded).
    fn answer_fresh(
        &self,
        conn: &Arc<Conn>,
        journal: &Journal,
        id: &str,
        attempt: u32,
        result: &OpResult,
    ) -> Option<Reply> {
        if self.pauses.reach(Stage::Committed, id) == Verdict::Crash {
            return None;
        }
        let _ = conn.send(&Reply::Accepted {
            id: id.to_string(),
            attempt,
        });
        match journal.delivered(id) {
            Ok(delivered) => Some(Reply::Result(result_msg(&delivered, result, false))),
            Err(e) => {
                self.note(format!("could not record a delivery of `{id}`: {e}"));
                Some(Reply::Error {
                    id: Some(id.to_string()),
                    kind: "unavailable".into(),
                    message: format!(
                        "`{id}` is applied and recorded, but its delivery could not be ({e}); send the same id again for its result"
                    ),
                })
            }
        }
    }
}
