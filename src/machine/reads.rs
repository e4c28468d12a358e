//! Reads shared by the read path and the write path: the public receipt of a record,
//! lookups, results and replays.

use super::clocks::effective;

use crate::clock::Timestamp;
use crate::error::{Error, ErrorKind, Result};
use crate::index::View;
use crate::intent::IntentHash;
use crate::record::{DeliveryState, ExecRecord, OutcomeKind, ReceiptRecord, RetireCause};
use crate::types::{Admission, ExecutionStatus, OpResult, Operation, Receipt, Replay};

/// The public receipt for an effective record; `None` for a vacant (unknown) id.
pub(crate) fn view(rec: &ReceiptRecord) -> Option<Receipt> {
    let names = Names {
        operation_id: rec.operation_id.clone(),
        intent_name: rec.intent_name.clone(),
        scope: rec.scope.clone(),
        session: rec.session.clone(),
    };
    view_with(rec, names)
}

/// [`view`] of a record no longer needed: its strings move into the receipt instead of
/// being copied (a replay answers with them).
pub(crate) fn into_view(mut rec: ReceiptRecord) -> Option<Receipt> {
    let names = Names {
        operation_id: std::mem::take(&mut rec.operation_id),
        intent_name: std::mem::take(&mut rec.intent_name),
        scope: rec.scope.take(),
        session: rec.session.take(),
    };
    view_with(&rec, names)
}

/// The strings of a receipt, copied or moved out of its record.
struct Names {
    operation_id: String,
    intent_name: String,
    scope: Option<String>,
    session: Option<String>,
}

fn view_with(rec: &ReceiptRecord, names: Names) -> Option<Receipt> {
    let Names {
        operation_id,
        intent_name,
        scope,
        session,
    } = names;
    let mut r = Receipt {
        operation_id,
        attempt: rec.attempt,
        intent_name,
        intent_hash: rec.intent_hash.into(),
        scope,
        session,
        base_revision: rec.base_revision,
        result_revision: None,
        status: ExecutionStatus::Running,
        failure: None,
        applied: None,
        in_doubt_cause: None,
        delivery: None,
        delivery_count: 0,
        epoch: rec.epoch,
        submitted_at: rec.submitted_at,
        lease_until: None,
        completed_at: None,
        acknowledged_at: None,
        next_delivery_at: None,
        ack_deadline: None,
        retain_until: None,
        purge_at: None,
        result_size: None,
        retire_cause: None,
    };
    match &rec.state {
        ExecRecord::Vacant { .. } => return None,
        ExecRecord::Running { lease_until } => r.lease_until = Some(*lease_until),
        ExecRecord::InDoubt {
            cause, lease_until, ..
        } => {
            r.status = ExecutionStatus::InDoubt;
            r.in_doubt_cause = Some((*cause).into());
            r.lease_until = Some(*lease_until);
        }
        ExecRecord::Done(d) => {
            match &d.outcome {
                OutcomeKind::Applied { result_revision } => {
                    r.status = ExecutionStatus::Applied;
                    r.result_revision = Some(*result_revision);
                    r.applied = Some(true);
                }
                OutcomeKind::Failed { message } => {
                    r.status = ExecutionStatus::Failed;
                    r.failure = Some(message.clone());
                    r.applied = Some(false);
                }
            }
            if let Some(at) = d.retired_at {
                r.status = ExecutionStatus::Retired;
                r.retire_cause = Some(match d.retire_cause {
                    RetireCause::Retention => crate::types::RetireCause::Retention,
                    RetireCause::Damage => crate::types::RetireCause::Damage { repaired_at: at },
                });
            } else {
                r.result_size = Some(d.result.len);
            }
            let pushing = matches!(
                d.delivery.state,
                DeliveryState::Pending | DeliveryState::Delivered
            );
            // The budget is spent once its last delivery is recorded: the receipt says
            // `Exhausted` from that moment (the journal records the event when the clock
            // is next applied; a journal written by an older build may hold the event
            // back by one backoff).
            let state = if pushing && d.delivery.final_attempt {
                DeliveryState::Exhausted
            } else {
                d.delivery.state
            };
            r.delivery = Some(state.into());
            r.delivery_count = d.delivery.count;
            r.completed_at = Some(d.completed_at);
            r.acknowledged_at = d.delivery.acknowledged_at;
            if pushing && !d.delivery.final_attempt && d.retired_at.is_none() {
                r.next_delivery_at = Some(d.delivery.next_due);
            }
            r.ack_deadline = Some(d.deadlines.ack);
            r.retain_until = Some(d.deadlines.retain);
            r.purge_at = Some(d.deadlines.purge);
        }
    }
    Some(r)
}

// ---------------------------------------------------------------------------------------
// Reads shared by the read path and the write path.
// ---------------------------------------------------------------------------------------

/// The effective record of `id` at `now` (`None`: unknown or purged-due).
pub(crate) fn effective_of<V: View>(
    v: &V,
    id: &str,
    now: Timestamp,
) -> Result<Option<ReceiptRecord>> {
    Ok(v.receipt(id)?.and_then(|r| effective(r, now)))
}

/// The public receipt of `id` at `now`.
pub(crate) fn lookup<V: View>(v: &V, id: &str, now: Timestamp) -> Result<Option<Receipt>> {
    Ok(effective_of(v, id, now)?.and_then(into_view))
}

/// Whether the stored record is terminal with its result still kept.
pub(crate) fn has_result(rec: &ReceiptRecord) -> bool {
    matches!(&rec.state, ExecRecord::Done(d) if d.result_seq.is_some())
}

/// The recorded result of an effective, unretired, terminal record.
pub(crate) fn result_of<V: View>(v: &V, rec: &ReceiptRecord) -> Result<Option<OpResult>> {
    kept_result(rec, |seq, id| v.result(seq, id))
}

/// As [`result_of`], for a record whose stored value was read and holds no result inline
/// (`View::receipt_and_inline_result` said so): one lookup in `results`, without reading
/// the receipt again.
pub(crate) fn stored_result_of<V: View>(v: &V, rec: &ReceiptRecord) -> Result<Option<OpResult>> {
    kept_result(rec, |seq, id| v.stored_result(seq, id))
}

/// The result a terminal record keeps, read by `read` (from its completing seq and its
/// operation id); a kept result that `read` does not find is corrupt.
fn kept_result(
    rec: &ReceiptRecord,
    read: impl FnOnce(u64, &str) -> Result<Option<OpResult>>,
) -> Result<Option<OpResult>> {
    let ExecRecord::Done(d) = &rec.state else {
        return Ok(None);
    };
    let Some(seq) = d.result_seq else {
        return Ok(None);
    };
    match read(seq, &rec.operation_id)? {
        Some(r) => Ok(Some(r)),
        None => Err(Error::corrupt(
            "results",
            seq,
            format!("the result of operation `{}` is missing", rec.operation_id),
        )),
    }
}

/// A replay of an effective terminal record with its result.
pub(crate) fn replay_of<V: View>(v: &V, rec: &ReceiptRecord) -> Result<Option<Replay>> {
    let Some(receipt) = view(rec) else {
        return Ok(None);
    };
    let Some(result) = result_of(v, rec)? else {
        return Ok(None);
    };
    Ok(Some(Replay {
        receipt,
        result,
        replayed: true,
    }))
}

/// The answer for an id that is known (not unknown/vacant), or `None` for fresh work.
/// `result` reads the result of a terminal, unretired record (see [`result_of`]).
pub(crate) fn answer_known(
    eff: Option<ReceiptRecord>,
    op: &Operation,
    result: impl FnOnce(&ReceiptRecord) -> Result<Option<OpResult>>,
) -> Result<Option<Admission>> {
    let Some(rec) = eff else { return Ok(None) };
    if matches!(rec.state, ExecRecord::Vacant { .. }) {
        return Ok(None);
    }
    // An all-zero hash means `repair` lost the intent: any intent is answered in doubt.
    // The intent is hashed under the recorded hash's scheme, so a retry matches across a
    // change of the current scheme (format 1 recorded the first scheme).
    let recorded = IntentHash::from(rec.intent_hash);
    if !recorded.matches(&op.intent) && !rec.intent_hash.is_lost() {
        return Err(Error::new(ErrorKind::IntentMismatch {
            operation_id: op.id.clone(),
            recorded,
            submitted: op
                .intent
                .hash_as(recorded.scheme())
                .unwrap_or(op.intent.hash()),
        }));
    }
    // The answer is chosen (and the result read) while the record is borrowed; the receipt
    // then takes the record's strings instead of copies.
    enum Known {
        InProgress,
        InDoubt,
        Expired,
        Replay(OpResult),
    }
    let known = match &rec.state {
        ExecRecord::Vacant { .. } => return Ok(None),
        ExecRecord::Running { .. } => Known::InProgress,
        ExecRecord::InDoubt { .. } => Known::InDoubt,
        ExecRecord::Done(d) if d.retired_at.is_some() => Known::Expired,
        ExecRecord::Done(_) => result(&rec)?.map_or(Known::Expired, Known::Replay),
    };
    Ok(into_view(rec).map(|receipt| match known {
        Known::InProgress => Admission::InProgress(receipt),
        Known::InDoubt => Admission::InDoubt(receipt),
        Known::Expired => Admission::Expired(receipt),
        Known::Replay(result) => Admission::Replay(Replay {
            receipt,
            result,
            replayed: true,
        }),
    }))
}
