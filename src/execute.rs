//! [`Journal::execute`]: submit, apply, and record in one call.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use crate::error::Error;
use crate::journal::Journal;
use crate::types::{Admission, Claim, OpResult, Operation, Outcome, Receipt, Replay};

/// Why the work inside [`Journal::execute`] produced no outcome: the closure's error
/// says whether the effect may have happened.
#[derive(Debug)]
pub enum Failure<E> {
    /// Rejected before any effect (validation failed, a precondition did not hold): the
    /// claim is released, the id becomes unknown again and may be resubmitted, and
    /// `execute` returns [`ExecuteError::NotApplied`] with the error.
    NotApplied(E),
    /// Failed after the effect may have started: recorded as a failed outcome with this
    /// message, replayed like a success to every retry.
    Failed(String),
}

impl<E> Failure<E> {
    /// [`Failure::Failed`] with the message of `err`.
    pub fn failed(err: impl fmt::Display) -> Self {
        Failure::Failed(err.to_string())
    }
}

/// What [`Journal::execute`] did: the closure ran (`Fresh`), or the operation id was
/// known and answered without running it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[must_use]
pub enum Executed {
    /// The closure ran now and its outcome is recorded (durably): the receipt (status
    /// `Applied`, or `Failed` for a [`Failure::Failed`] or a failed [`Outcome`]) and the
    /// result to send.
    Fresh(Receipt, OpResult),
    /// The outcome was recorded before: send the recorded result, marked as a replay. The
    /// closure did not run.
    Replay(Replay),
    /// The same operation is running (another caller holds the claim): attach; the
    /// closure did not run.
    InProgress(Receipt),
    /// The outcome is known but its result aged out: tell the client it finished (at
    /// `result_revision`) and must refresh. The closure did not run.
    Expired(Receipt),
    /// The claim holder vanished: look at the project, then
    /// [`Journal::resolve`]. The closure did not run.
    InDoubt(Receipt),
}

impl Executed {
    /// The operation's receipt.
    pub fn receipt(&self) -> &Receipt {
        match self {
            Executed::Fresh(r, _)
            | Executed::InProgress(r)
            | Executed::Expired(r)
            | Executed::InDoubt(r) => r,
            Executed::Replay(replay) => &replay.receipt,
        }
    }

    /// The result to send: the new one (`Fresh`) or the recorded one (`Replay`).
    pub fn result(&self) -> Option<&OpResult> {
        match self {
            Executed::Fresh(_, result) => Some(result),
            Executed::Replay(replay) => Some(&replay.result),
            _ => None,
        }
    }

    /// Whether the answer repeats a recorded outcome (the closure did not run).
    pub fn is_replay(&self) -> bool {
        matches!(self, Executed::Replay(_))
    }
}

/// The error of [`Journal::execute`].
#[derive(Debug)]
#[non_exhaustive]
pub enum ExecuteError<E> {
    /// The journal refused the operation (for example
    /// [`ScopeBusy`](crate::ErrorKind::ScopeBusy); see [`Journal::submit`]) or could not
    /// read or write the file. The closure did not run.
    Journal(Error),
    /// The closure returned [`Failure::NotApplied`]: the claim was released and the id is
    /// unknown again.
    NotApplied(E),
    /// The closure returned [`Failure::NotApplied`], but releasing the claim failed: the
    /// operation stays `Running` until its lease expires, then is `InDoubt`.
    ReleaseFailed {
        /// The closure's error.
        error: E,
        /// Why the release failed.
        release: Error,
    },
    /// The closure produced an outcome (its effect may have happened) that could not be
    /// recorded; see [`Unrecorded`].
    Unrecorded(Box<Unrecorded>),
}

/// An outcome [`Journal::execute`] could not record ([`ExecuteError::Unrecorded`]).
///
/// A refusal ([`ResultTooLarge`](crate::ErrorKind::ResultTooLarge),
/// [`RevisionNotForward`](crate::ErrorKind::RevisionNotForward)) leaves the claim usable:
/// correct the outcome and call [`Journal::complete`] with `claim`. Otherwise the
/// operation becomes `InDoubt` when its lease expires, for [`Journal::resolve`].
#[derive(Debug)]
#[non_exhaustive]
pub struct Unrecorded {
    /// The claim, still current unless the operation was resolved meanwhile.
    pub claim: Claim,
    /// The outcome that was not recorded.
    pub outcome: Outcome,
    /// Why recording it failed.
    pub error: Error,
}

impl<E> From<Error> for ExecuteError<E> {
    fn from(err: Error) -> Self {
        ExecuteError::Journal(err)
    }
}

impl<E> fmt::Display for ExecuteError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecuteError::Journal(_) => f.write_str("the journal refused or failed the operation"),
            ExecuteError::NotApplied(_) => {
                f.write_str("the operation was rejected before any effect; its id is free again")
            }
            ExecuteError::ReleaseFailed { .. } => f.write_str(
                "the operation was rejected before any effect, but releasing its claim failed; \
                 it will be in doubt when its lease expires",
            ),
            ExecuteError::Unrecorded(u) => write!(
                f,
                "the outcome of operation `{}` could not be recorded; complete the claim again \
                 or resolve the operation once it is in doubt",
                u.claim.operation_id()
            ),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for ExecuteError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExecuteError::Journal(e) => Some(e),
            ExecuteError::NotApplied(e) => Some(e),
            ExecuteError::ReleaseFailed { release, .. } => Some(release),
            ExecuteError::Unrecorded(u) => Some(&u.error),
        }
    }
}

impl Journal {
    /// Submits `op` and, for fresh work, runs `work` with the claim and records what it
    /// returns: the whole admission pattern in one call, like an `@idempotent` decorator.
    ///
    /// - An unknown id runs `work`. `Ok(outcome)` is recorded ([`Journal::complete`]) and
    ///   answered [`Executed::Fresh`]. `Err(Failure::Failed(msg))` is recorded as a failed
    ///   outcome and answered `Fresh` too (failures are outcomes, replayed to retries).
    ///   `Err(Failure::NotApplied(e))` releases the claim and returns
    ///   [`ExecuteError::NotApplied`].
    /// - A known id is answered without running `work`: [`Executed::Replay`],
    ///   [`Executed::InProgress`], [`Executed::Expired`] or [`Executed::InDoubt`].
    ///
    /// **A panic in `work`** is recorded as a failed outcome (`the operation panicked:
    /// ...`), since its effect may have started, and then the panic continues (is
    /// re-raised) in the caller. If recording fails too, the operation is `InDoubt` once
    /// its lease expires. It is never released: a release says no effect happened.
    ///
    /// `work` runs on the calling thread, under a lease of the configured duration; for
    /// long work, extend it with [`Journal::extend_lease`].
    ///
    /// # Errors
    ///
    /// - [`ExecuteError::Journal`]: a refusal of [`Journal::submit`] (such as
    ///   [`ScopeBusy`](crate::ErrorKind::ScopeBusy), [`StaleBase`](crate::ErrorKind::StaleBase),
    ///   [`IntentMismatch`](crate::ErrorKind::IntentMismatch)) or a storage error; `work`
    ///   did not run.
    /// - [`ExecuteError::NotApplied`]: `work` rejected the operation before any effect.
    /// - [`ExecuteError::ReleaseFailed`]: as `NotApplied`, but the release failed.
    /// - [`ExecuteError::Unrecorded`]: `work` returned an outcome that could not be
    ///   recorded (a refusal of [`Journal::complete`] or a storage error).
    ///
    /// # Example
    ///
    /// ```
    /// use opjournal::{Executed, ExecuteError, Failure, Intent, Journal, Operation, Outcome};
    /// use serde_json::json;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let journal = Journal::open(dir.path().join("project.opj"))?;
    /// let mut lights = Vec::new(); // the project
    ///
    /// let op = Operation::new("op_7f3", Intent::from_json("scene.add_light", &json!({"near": "door"}))?)
    ///     .scope("scene/main");
    /// for _attempt in 0..2 {
    ///     let answer = journal.execute(op.clone(), |_claim| {
    ///         if lights.len() >= 8 {
    ///             return Err(Failure::NotApplied("the scene is full"));
    ///         }
    ///         lights.push("light-1");
    ///         Outcome::applied_json(1, &json!({"light": "light-1"})).map_err(Failure::failed)
    ///     });
    ///     match answer {
    ///         Ok(done) => {
    ///             let result: serde_json::Value = done.result().expect("applied").json()?;
    ///             assert_eq!(result["light"], "light-1"); // send it (marked if a replay)
    ///         }
    ///         Err(ExecuteError::NotApplied(why)) => println!("refused: {why}"),
    ///         Err(other) => return Err(other.to_string().into()),
    ///     }
    /// }
    /// assert_eq!(lights.len(), 1); // the retry was replayed, not re-applied
    /// # Ok(())
    /// # }
    /// ```
    pub fn execute<E, F>(&self, op: Operation, work: F) -> Result<Executed, ExecuteError<E>>
    where
        F: FnOnce(&Claim) -> Result<Outcome, Failure<E>>,
    {
        let _span = crate::trace_span!(DEBUG, "execute", operation_id = %op.id);
        let claim = match self.submit(op)? {
            Admission::Fresh(claim) => claim,
            Admission::Replay(replay) => return Ok(Executed::Replay(replay)),
            Admission::InProgress(receipt) => return Ok(Executed::InProgress(receipt)),
            Admission::Expired(receipt) => return Ok(Executed::Expired(receipt)),
            Admission::InDoubt(receipt) => return Ok(Executed::InDoubt(receipt)),
        };
        // The panic is re-raised below, so nothing observes state the closure left
        // half-changed.
        let ran = catch_unwind(AssertUnwindSafe(|| work(&claim)));
        let outcome = match ran {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(Failure::Failed(message))) => Outcome::failed(message),
            Ok(Err(Failure::NotApplied(error))) => {
                return match self.release(&claim) {
                    Ok(()) => Err(ExecuteError::NotApplied(error)),
                    Err(release) => Err(ExecuteError::ReleaseFailed { error, release }),
                };
            }
            Err(panic) => {
                let message = crate::panics::message(panic.as_ref()).unwrap_or("(no message)");
                let message = crate::error::shorten(message, 1000);
                crate::trace_event!(ERROR, operation_id = %claim.operation_id, "operation panicked");
                let _ = self.complete(
                    &claim,
                    Outcome::failed(format!("the operation panicked: {message}")),
                );
                resume_unwind(panic);
            }
        };
        match self.complete(&claim, outcome.clone()) {
            Ok(receipt) => Ok(Executed::Fresh(receipt, outcome.result)),
            Err(error) => Err(ExecuteError::Unrecorded(Box::new(Unrecorded {
                claim,
                outcome,
                error,
            }))),
        }
    }
}
