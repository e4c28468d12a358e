//! The fold: how one event changes an operation's receipt, and which index entries a
//! receipt implies.

use crate::index::{IndexEntry, TimerKind};
use crate::record::DeliveryState;
use crate::record::{
    Deadlines, DeliveryRecord, DoneRecord, Event, EventKind, ExecRecord, InDoubtCause, OutcomeKind,
    ReceiptRecord, ResolvedAs, ResultInfo, RetireCause,
};

// ---------------------------------------------------------------------------------------
// Pure functions: fold, index entries, clocks, views.
// ---------------------------------------------------------------------------------------

pub(crate) fn state_name(rec: &ReceiptRecord) -> String {
    match &rec.state {
        ExecRecord::Running { .. } => "running".into(),
        ExecRecord::InDoubt { .. } => "in doubt".into(),
        ExecRecord::Vacant { .. } => "released".into(),
        ExecRecord::Done(d) => {
            let s = match (&d.outcome, d.retired_at) {
                (_, Some(_)) => "retired",
                (OutcomeKind::Applied { .. }, None) => "applied",
                (OutcomeKind::Failed { .. }, None) => "failed",
            };
            format!("{s} ({})", d.delivery.state.name())
        }
    }
}

/// Applies one event to an operation's receipt. `Err` names an event that does not fit
/// the receipt (a journal that is not a valid history).
pub(crate) fn transition(
    old: Option<&ReceiptRecord>,
    ev: &Event,
) -> std::result::Result<ReceiptRecord, String> {
    let id = ev
        .operation_id
        .as_deref()
        .ok_or_else(|| format!("{} event without an operation id", ev.kind.name()))?;
    let misfit = |rec: Option<&ReceiptRecord>| {
        format!(
            "{} event does not apply to operation `{id}` in state {}",
            ev.kind.name(),
            rec.map_or_else(|| "unknown".to_string(), state_name)
        )
    };
    match &ev.kind {
        EventKind::Submitted {
            attempt,
            intent_name,
            intent_hash,
            scope,
            session,
            base_revision,
            lease_until,
            hold_until_ack,
        } => {
            if let Some(rec) = old
                && !matches!(rec.state, ExecRecord::Vacant { .. })
            {
                return Err(misfit(old));
            }
            Ok(ReceiptRecord {
                operation_id: id.to_string(),
                attempt: *attempt,
                intent_name: intent_name.clone(),
                intent_hash: *intent_hash,
                scope: scope.clone(),
                session: session.clone(),
                base_revision: *base_revision,
                epoch: ev.seq,
                hold_until_ack: *hold_until_ack,
                submitted_at: ev.at,
                state: ExecRecord::Running {
                    lease_until: *lease_until,
                },
            })
        }
        EventKind::LeaseExtended { epoch, lease_until } => {
            let mut rec = old.cloned().ok_or_else(|| misfit(old))?;
            match &mut rec.state {
                ExecRecord::Running { lease_until: l } if rec.epoch == *epoch => {
                    *l = *lease_until;
                    Ok(rec)
                }
                _ => Err(misfit(old)),
            }
        }
        EventKind::Completed {
            epoch,
            outcome,
            result,
            deadlines,
        } => {
            let mut rec = old.cloned().ok_or_else(|| misfit(old))?;
            if rec.epoch != *epoch
                || !matches!(
                    rec.state,
                    ExecRecord::Running { .. } | ExecRecord::InDoubt { .. }
                )
            {
                return Err(misfit(old));
            }
            rec.state = ExecRecord::Done(done_record(
                ev,
                outcome.clone(),
                *result,
                *deadlines,
                Some(*epoch),
            ));
            Ok(rec)
        }
        EventKind::Released { epoch, purge_at } => {
            let mut rec = old.cloned().ok_or_else(|| misfit(old))?;
            if rec.epoch != *epoch
                || !matches!(
                    rec.state,
                    ExecRecord::Running { .. } | ExecRecord::InDoubt { .. }
                )
            {
                return Err(misfit(old));
            }
            rec.state = ExecRecord::Vacant {
                since: ev.at,
                purge_at: *purge_at,
            };
            Ok(rec)
        }
        EventKind::LeaseExpired { epoch, cause } => {
            let mut rec = old.cloned().ok_or_else(|| misfit(old))?;
            match rec.state {
                ExecRecord::Running { lease_until } if rec.epoch == *epoch => {
                    rec.state = ExecRecord::InDoubt {
                        since: ev.at,
                        cause: *cause,
                        lease_until,
                    };
                    Ok(rec)
                }
                _ => Err(misfit(old)),
            }
        }
        EventKind::Resolved { resolution } => {
            let mut rec = old.cloned().ok_or_else(|| misfit(old))?;
            if !matches!(
                rec.state,
                ExecRecord::Running { .. } | ExecRecord::InDoubt { .. }
            ) {
                return Err(misfit(old));
            }
            rec.state = match resolution {
                ResolvedAs::NotApplied { purge_at } => ExecRecord::Vacant {
                    since: ev.at,
                    purge_at: *purge_at,
                },
                ResolvedAs::Completed {
                    outcome,
                    result,
                    deadlines,
                } => ExecRecord::Done(done_record(ev, outcome.clone(), *result, *deadlines, None)),
            };
            Ok(rec)
        }
        EventKind::Delivered {
            count,
            next_due,
            final_attempt,
        } => {
            let mut rec = old.cloned().ok_or_else(|| misfit(old))?;
            let ExecRecord::Done(d) = &mut rec.state else {
                return Err(misfit(old));
            };
            d.delivery.count = *count;
            d.delivery.last_delivered_at = Some(ev.at);
            if matches!(
                d.delivery.state,
                DeliveryState::Pending | DeliveryState::Delivered
            ) {
                d.delivery.state = DeliveryState::Delivered;
                d.delivery.next_due = *next_due;
                d.delivery.final_attempt = *final_attempt;
            }
            Ok(rec)
        }
        EventKind::Acknowledged { .. } => {
            let mut rec = old.cloned().ok_or_else(|| misfit(old))?;
            let ExecRecord::Done(d) = &mut rec.state else {
                return Err(misfit(old));
            };
            d.delivery.state = DeliveryState::Acknowledged;
            d.delivery.acknowledged_at = Some(ev.at);
            Ok(rec)
        }
        EventKind::AckExpired => {
            let mut rec = old.cloned().ok_or_else(|| misfit(old))?;
            match &mut rec.state {
                ExecRecord::Done(d) if d.delivery.state.is_open() => {
                    d.delivery.state = DeliveryState::AckExpired;
                    Ok(rec)
                }
                _ => Err(misfit(old)),
            }
        }
        EventKind::Exhausted => {
            let mut rec = old.cloned().ok_or_else(|| misfit(old))?;
            match &mut rec.state {
                ExecRecord::Done(d)
                    if matches!(
                        d.delivery.state,
                        DeliveryState::Pending | DeliveryState::Delivered
                    ) =>
                {
                    d.delivery.state = DeliveryState::Exhausted;
                    Ok(rec)
                }
                _ => Err(misfit(old)),
            }
        }
        EventKind::Retired | EventKind::ResultLost => {
            let mut rec = old.cloned().ok_or_else(|| misfit(old))?;
            match &mut rec.state {
                ExecRecord::Done(d) if d.retired_at.is_none() => {
                    d.retired_at = Some(ev.at);
                    d.result_seq = None;
                    d.retire_cause = match ev.kind {
                        EventKind::ResultLost => RetireCause::Damage,
                        _ => RetireCause::Retention,
                    };
                    Ok(rec)
                }
                _ => Err(misfit(old)),
            }
        }
        EventKind::Salvaged {
            attempt,
            intent_name,
            intent_hash,
            scope,
            session,
            ..
        } => {
            let lease_until = match old.map(|r| &r.state) {
                Some(ExecRecord::Running { lease_until })
                | Some(ExecRecord::InDoubt { lease_until, .. }) => *lease_until,
                _ => ev.at,
            };
            Ok(ReceiptRecord {
                operation_id: id.to_string(),
                attempt: *attempt,
                intent_name: intent_name.clone(),
                intent_hash: *intent_hash,
                scope: scope.clone(),
                session: session.clone(),
                base_revision: old.and_then(|r| r.base_revision),
                epoch: ev.seq,
                hold_until_ack: false,
                submitted_at: old.map_or(ev.at, |r| r.submitted_at),
                state: ExecRecord::InDoubt {
                    since: ev.at,
                    cause: InDoubtCause::EventsLost,
                    lease_until,
                },
            })
        }
        EventKind::RevisionAdvanced { .. } => Err("a scope event has no receipt".to_string()),
        EventKind::FormatUpgraded { .. } => Err("a format event has no receipt".to_string()),
    }
}

fn done_record(
    ev: &Event,
    outcome: OutcomeKind,
    result: ResultInfo,
    deadlines: Deadlines,
    completed_by: Option<u64>,
) -> DoneRecord {
    DoneRecord {
        outcome,
        completed_at: ev.at,
        completed_by,
        result_seq: Some(ev.seq),
        result,
        deadlines,
        retired_at: None,
        delivery: DeliveryRecord {
            state: DeliveryState::Pending,
            count: 0,
            next_due: deadlines.first_push,
            final_attempt: false,
            last_delivered_at: None,
            acknowledged_at: None,
        },
        retire_cause: RetireCause::Retention,
    }
}

/// The index entries a receipt implies. Indexes hold exactly the union of these.
pub(crate) fn index_entries(rec: &ReceiptRecord) -> Vec<IndexEntry> {
    let mut out = Vec::new();
    match &rec.state {
        ExecRecord::Running { lease_until } => {
            out.push(IndexEntry::Timer(TimerKind::Lease, lease_until.0));
            if let Some(scope) = &rec.scope {
                out.push(IndexEntry::Hold(scope.clone()));
            }
        }
        ExecRecord::InDoubt { .. } => out.push(IndexEntry::InDoubt),
        ExecRecord::Vacant { purge_at, .. } => {
            out.push(IndexEntry::Timer(TimerKind::Purge, purge_at.0))
        }
        ExecRecord::Done(d) => {
            if d.retired_at.is_some() {
                out.push(IndexEntry::Timer(TimerKind::Purge, d.deadlines.purge.0));
            } else {
                out.push(IndexEntry::Timer(TimerKind::Retain, d.deadlines.retain.0));
                if d.delivery.state.is_open() {
                    out.push(IndexEntry::Timer(TimerKind::AckTimeout, d.deadlines.ack.0));
                    if let Some(session) = &rec.session {
                        out.push(IndexEntry::Window(session.clone(), d.deadlines.ack.0));
                    }
                    if rec.hold_until_ack
                        && let Some(scope) = &rec.scope
                    {
                        out.push(IndexEntry::Hold(scope.clone()));
                    }
                }
                if matches!(
                    d.delivery.state,
                    DeliveryState::Pending | DeliveryState::Delivered
                ) {
                    if !d.delivery.final_attempt {
                        out.push(IndexEntry::Timer(
                            TimerKind::Redeliver,
                            d.delivery.next_due.0,
                        ));
                    } else if d.delivery.next_due < d.deadlines.ack {
                        out.push(IndexEntry::Timer(TimerKind::Exhaust, d.delivery.next_due.0));
                    }
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}
