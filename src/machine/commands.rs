//! The commands: each validates against the effective state, refuses before any write,
//! then records its events.

use std::time::Duration;

use super::Ctx;
use super::clocks::{backoff, due_transitions, holds_lock, jitter};
use super::fold::{index_entries, state_name, transition};
use super::reads::*;

use crate::clock::Timestamp;
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::index::{TimerKind, View, WriteTables};
use crate::record::{
    Deadlines, DeliveryState, DoneRecord, Event, EventKind, ExecRecord, InDoubtCause, OutcomeKind,
    ReceiptRecord, ResolvedAs, ResultInfo, RevisionCause, ScopeRecord,
};
use crate::types::{
    Admission, Claim, OpResult, Operation, Outcome, Receipt, Resolution, StaleBasePolicy,
};
use crate::validate;

/// The most changed assets one result may list, and the longest asset name.
pub(crate) const MAX_ASSETS: usize = 256;
pub(crate) const MAX_ASSET_BYTES: usize = 256;
/// The longest failure message.
pub(crate) const MAX_MESSAGE_BYTES: usize = 16 * 1024;

/// Validates an operation's own fields (before any lookup).
pub(crate) fn validate_operation(op: &Operation) -> Result<()> {
    validate::name("operation id", &op.id)?;
    if let Some(scope) = &op.scope {
        validate::name("scope", scope)?;
    }
    if let Some(session) = &op.session {
        validate::name("session", session)?;
    }
    Ok(())
}

/// The checks for fresh work: stale base, scope busy, window full. Writes nothing.
fn check_fresh<V: View>(v: &V, now: Timestamp, cfg: &Config, op: &Operation) -> Result<()> {
    if let Some(scope) = &op.scope {
        if let (Some(base), StaleBasePolicy::Strict) = (op.base_revision, op.stale_base) {
            let current = v.scope_revision(scope)?;
            if base < current {
                return Err(Error::new(ErrorKind::StaleBase {
                    scope: scope.clone(),
                    base,
                    current,
                }));
            }
        }
        for holder in v.holders(scope)? {
            if holder == op.id {
                continue;
            }
            if let Some(rec) = effective_of(v, &holder, now)?
                && holds_lock(&rec)
            {
                return Err(Error::new(ErrorKind::ScopeBusy {
                    scope: scope.clone(),
                    holder: holder.to_string(),
                }));
            }
        }
    }
    if let Some(session) = &op.session {
        let limit = cfg.session_window as usize;
        let live = v.window_after(session, now.0, limit)?;
        if live.len() >= limit
            && let Some((deadline, oldest)) = live.first()
        {
            return Err(Error::new(ErrorKind::WindowFull {
                session: session.clone(),
                limit: cfg.session_window,
                oldest: oldest.to_string(),
                frees_at: Timestamp(*deadline),
            }));
        }
    }
    Ok(())
}

fn validate_outcome(cfg: &Config, outcome: &Outcome) -> Result<()> {
    let size = outcome.result.bytes.len() as u64;
    if size > cfg.max_result_bytes {
        return Err(Error::new(ErrorKind::ResultTooLarge {
            size,
            limit: cfg.max_result_bytes,
        }));
    }
    if let crate::types::OutcomeKind::Failed { message } = &outcome.kind
        && message.len() > MAX_MESSAGE_BYTES
    {
        return Err(Error::new(ErrorKind::ResultTooLarge {
            size: message.len() as u64,
            limit: MAX_MESSAGE_BYTES as u64,
        }));
    }
    let assets = &outcome.result.changed_assets;
    if assets.len() > MAX_ASSETS {
        return Err(Error::invalid(
            "changed assets",
            &format!("{} assets", assets.len()),
            format!("at most {MAX_ASSETS} assets may be listed"),
        ));
    }
    if let Some(a) = assets.iter().find(|a| a.len() > MAX_ASSET_BYTES) {
        return Err(Error::invalid(
            "changed asset",
            a,
            format!(
                "it is {} bytes long; the limit is {MAX_ASSET_BYTES}",
                a.len()
            ),
        ));
    }
    Ok(())
}

fn terminal_deadlines(now: Timestamp, cfg: &Config) -> Deadlines {
    Deadlines {
        ack: now.saturating_add(cfg.ack_timeout),
        retain: now.saturating_add(cfg.result_retention),
        purge: now.saturating_add(cfg.audit_retention),
        first_push: now.saturating_add(cfg.retry.initial_backoff),
    }
}

fn result_info(result: &OpResult) -> ResultInfo {
    ResultInfo {
        len: result.bytes.len() as u64,
        crc32: crc32fast::hash(&result.bytes),
        assets: result.changed_assets.len() as u32,
    }
}

// ---------------------------------------------------------------------------------------
// Writes.
// ---------------------------------------------------------------------------------------

/// Applies an appended event to the indexes: the receipt (and its index entries) or the
/// scope. Used by the live write path and by `repair`, so both produce the same indexes.
pub(crate) fn apply(t: &mut WriteTables<'_>, ev: &Event) -> Result<()> {
    match &ev.kind {
        EventKind::RevisionAdvanced {
            scope, revision, ..
        } => {
            advance_scope(t, scope, *revision, ev, true)?;
        }
        // A record of the file's history: no index follows from it.
        EventKind::FormatUpgraded { .. } => {}
        _ => {
            let id = ev.operation_id.as_deref().unwrap_or("");
            let old = t.take_receipt(id)?;
            let new =
                transition(old.as_ref(), ev).map_err(|m| Error::corrupt("events", ev.seq, m))?;
            let old_entries = old.as_ref().map(index_entries).unwrap_or_default();
            let new_entries = index_entries(&new);
            for e in old_entries.iter().filter(|e| !new_entries.contains(e)) {
                t.remove_index(id, e)?;
            }
            for e in new_entries.iter().filter(|e| !old_entries.contains(e)) {
                t.insert_index(id, e)?;
            }
            let applied_rev = match &ev.kind {
                EventKind::Completed {
                    outcome: OutcomeKind::Applied { result_revision },
                    ..
                }
                | EventKind::Resolved {
                    resolution:
                        ResolvedAs::Completed {
                            outcome: OutcomeKind::Applied { result_revision },
                            ..
                        },
                } => Some(*result_revision),
                _ => None,
            };
            let advanced = match (applied_rev, &new.scope) {
                (Some(rev), Some(scope)) => Some((rev, scope.clone())),
                _ => None,
            };
            t.put_receipt(new)?;
            if let Some((rev, scope)) = advanced {
                advance_scope(t, &scope, rev, ev, false)?;
            }
        }
    }
    Ok(())
}

/// Moves a scope's revision to `revision` if it is ahead (or, for revision events, equal:
/// a checkpoint re-anchors the current revision). A revision event that stops being the
/// anchor gets a purge timer.
fn advance_scope(
    t: &mut WriteTables<'_>,
    scope: &str,
    revision: u64,
    ev: &Event,
    is_revision_event: bool,
) -> Result<()> {
    let current = t.scope(scope)?;
    let cur_rev = current.as_ref().map_or(0, |s| s.revision);
    let takes_over = revision > cur_rev || (is_revision_event && revision == cur_rev);
    if !takes_over {
        if is_revision_event {
            superseded(t, ev)?;
        }
        return Ok(());
    }
    if let Some(old) = &current
        && let Some(old_ev) = t.event(old.anchor_seq)?
    {
        superseded(t, &old_ev)?;
    }
    t.put_scope(&ScopeRecord {
        scope: scope.to_string(),
        revision,
        anchor_seq: ev.seq,
        updated_at: ev.at,
    })
}

/// A revision event that no longer anchors its scope becomes purgeable.
fn superseded(t: &mut WriteTables<'_>, ev: &Event) -> Result<()> {
    if let EventKind::RevisionAdvanced { purge_at, .. } = &ev.kind {
        t.put_scope_timer(purge_at.0, ev.seq)?;
    }
    Ok(())
}

impl Ctx<'_, '_> {
    /// Appends an event and applies it.
    pub(crate) fn append(&mut self, operation_id: Option<&str>, kind: EventKind) -> Result<Event> {
        let seq = self.state.next_seq;
        self.state.next_seq = seq
            .checked_add(1)
            .ok_or_else(|| Error::corrupt("meta", "state", "event sequence exhausted"))?;
        self.count(&kind);
        let ev = Event {
            seq,
            at: self.now,
            operation_id: operation_id.map(str::to_string),
            kind,
        };
        self.t.put_event(&ev)?;
        apply(self.t, &ev)?;
        Ok(ev)
    }

    /// Counts a clock transition for the compaction report.
    fn count(&mut self, kind: &EventKind) {
        match kind {
            EventKind::LeaseExpired { .. } => self.fired.lease_expired += 1,
            EventKind::Exhausted => self.fired.exhausted += 1,
            EventKind::AckExpired => self.fired.ack_expired += 1,
            EventKind::Retired => self.fired.retired += 1,
            _ => {}
        }
    }

    /// Records every clock transition due for `id` and purges it if due. Returns the
    /// record as it stands afterwards (`None` if absent or purged).
    pub(crate) fn materialize(&mut self, id: &str) -> Result<Option<ReceiptRecord>> {
        let Some(rec) = self.t.receipt(id)? else {
            return Ok(None);
        };
        self.materialize_read(rec, None)
    }

    /// [`Ctx::materialize`] for a receipt the caller read (as the tables hold it now) and,
    /// if it read them too, its operation's `op_events` sequence numbers (`None`: the
    /// purge reads them).
    pub(crate) fn materialize_read(
        &mut self,
        rec: ReceiptRecord,
        op_events: Option<&[u64]>,
    ) -> Result<Option<ReceiptRecord>> {
        let id = rec.operation_id.as_str();
        let (events, purge) = due_transitions(&rec, self.now);
        if purge {
            // The purge erases the record with its events: count what the clocks did, but
            // write none of it.
            for kind in &events {
                self.count(kind);
            }
            self.purge(&rec, op_events)?;
            return Ok(None);
        }
        if events.is_empty() {
            return Ok(Some(rec));
        }
        for kind in events {
            if let EventKind::Retired = kind
                && let ExecRecord::Done(d) = &rec.state
                && let Some(seq) = d.result_seq
            {
                self.t.delete_result(seq)?;
            }
            self.append(Some(id), kind)?;
        }
        self.t.receipt(id)
    }

    /// Removes an operation, its events, its result and its index entries. If one of its
    /// events anchors its scope's revision, a checkpoint event keeps the revision.
    fn purge(&mut self, rec: &ReceiptRecord, op_events: Option<&[u64]>) -> Result<()> {
        let id = rec.operation_id.as_str();
        let taken;
        let seqs = match op_events {
            Some(seqs) => {
                self.t.drop_op_events(id, seqs);
                seqs
            }
            None => {
                taken = self.t.take_op_events(id)?;
                &taken[..]
            }
        };
        if let Some(scope) = &rec.scope
            && let Some(s) = self.t.scope(scope)?
            && seqs.contains(&s.anchor_seq)
        {
            let purge_at = self.now.saturating_add(self.cfg.audit_retention);
            self.append(
                None,
                EventKind::RevisionAdvanced {
                    scope: scope.clone(),
                    revision: s.revision,
                    cause: RevisionCause::Checkpoint,
                    purge_at,
                },
            )?;
        }
        for &seq in seqs {
            self.t.delete_event(seq)?;
        }
        if let ExecRecord::Done(d) = &rec.state
            && let Some(seq) = d.result_seq
        {
            self.t.delete_result(seq)?;
        }
        for e in index_entries(rec) {
            self.t.remove_index(id, &e)?;
        }
        self.t.delete_receipt(id)?;
        self.fired.purged += 1;
        Ok(())
    }

    /// Purges a superseded revision event whose audit retention passed.
    pub(crate) fn purge_revision_event(&mut self, due: u64, seq: u64) -> Result<()> {
        self.t.delete_scope_timer(due, seq)?;
        if let Some(ev) = self.t.event(seq)?
            && let EventKind::RevisionAdvanced { scope, .. } = &ev.kind
        {
            let anchored = self.t.scope(scope)?.is_some_and(|s| s.anchor_seq == seq);
            if !anchored {
                self.t.delete_event(seq)?;
                self.fired.revision_events_purged += 1;
            }
        }
        Ok(())
    }
}

/// `submit`, in a write transaction: lookup by id first, then the checks for fresh work.
pub(crate) fn submit(ctx: &mut Ctx<'_, '_>, op: &Operation) -> Result<Admission> {
    let eff = effective_of(&*ctx.t, &op.id, ctx.now)?;
    if let Some(answer) = answer_known(eff, op, |rec| result_of(&*ctx.t, rec))? {
        return Ok(answer);
    }
    check_fresh(&*ctx.t, ctx.now, ctx.cfg, op)?;
    // Validated: from here on, writes. Record what is due for the old record (it may be
    // purged), then the new attempt.
    let prior = ctx.materialize(&op.id)?;
    let attempt = match &prior {
        Some(rec) => rec.attempt.saturating_add(1),
        None => 1,
    };
    let lease_until = ctx.now.saturating_add(ctx.cfg.lease);
    let hold_until_ack = ctx.cfg.scope_lock == crate::config::ScopeLock::HoldUntilAck;
    let ev = ctx.append(
        Some(&op.id),
        EventKind::Submitted {
            attempt,
            intent_name: op.intent.name().to_string(),
            intent_hash: op.intent.hash().into(),
            scope: op.scope.clone(),
            session: op.session.clone(),
            base_revision: op.base_revision,
            lease_until,
            hold_until_ack,
        },
    )?;
    Ok(Admission::Fresh(Claim {
        operation_id: op.id.clone(),
        epoch: ev.seq,
        attempt,
        lease_until,
        scope: op.scope.clone(),
        base_revision: op.base_revision,
    }))
}

fn stale(claim: &Claim, state: impl Into<String>) -> Error {
    Error::new(ErrorKind::StaleClaim {
        operation_id: claim.operation_id.clone(),
        claim_epoch: claim.epoch,
        state: state.into(),
    })
}

/// Checks that `claim` is current and its operation is Running or InDoubt (effective).
fn check_claim<V: View>(v: &V, now: Timestamp, claim: &Claim) -> Result<ReceiptRecord> {
    let Some(rec) = effective_of(v, &claim.operation_id, now)? else {
        return Err(stale(
            claim,
            "the operation is unknown (purged or never submitted)",
        ));
    };
    if rec.epoch != claim.epoch {
        return Err(stale(
            claim,
            format!(
                "attempt {} with epoch {} is current, and it is {}",
                rec.attempt,
                rec.epoch,
                state_name(&rec)
            ),
        ));
    }
    match &rec.state {
        ExecRecord::Running { .. } | ExecRecord::InDoubt { .. } => Ok(rec),
        ExecRecord::Vacant { .. } => Err(stale(claim, "the claim was released")),
        ExecRecord::Done(d) if d.completed_by == Some(claim.epoch) => Err(stale(
            claim,
            format!(
                "it was already completed through this claim and is {}",
                state_name(&rec)
            ),
        )),
        ExecRecord::Done(_) => Err(stale(
            claim,
            format!("the embedder resolved it; it is {}", state_name(&rec)),
        )),
    }
}

/// `complete`: the claim holder records the outcome.
pub(crate) fn complete(ctx: &mut Ctx<'_, '_>, claim: &Claim, outcome: &Outcome) -> Result<Receipt> {
    let rec = check_claim(&*ctx.t, ctx.now, claim)?;
    validate_outcome(ctx.cfg, outcome)?;
    if let (crate::types::OutcomeKind::Applied { result_revision }, Some(scope)) =
        (&outcome.kind, &rec.scope)
    {
        let current = ctx.t.scope_revision(scope)?;
        if *result_revision <= current {
            return Err(Error::new(ErrorKind::RevisionNotForward {
                scope: scope.clone(),
                revision: *result_revision,
                current,
            }));
        }
    }
    ctx.materialize(&claim.operation_id)?;
    let ev = ctx.append(
        Some(&claim.operation_id),
        EventKind::Completed {
            epoch: claim.epoch,
            outcome: (&outcome.kind).into(),
            result: result_info(&outcome.result),
            deadlines: terminal_deadlines(ctx.now, ctx.cfg),
        },
    )?;
    ctx.t
        .put_result(ev.seq, &claim.operation_id, &outcome.result)?;
    current_view(ctx, &claim.operation_id)
}

fn current_view(ctx: &mut Ctx<'_, '_>, id: &str) -> Result<Receipt> {
    ctx.t
        .receipt(id)?
        .as_ref()
        .and_then(view)
        .ok_or_else(|| Error::corrupt("receipts", id, "the receipt vanished after a write"))
}

/// `release`: the claim holder gives the id back (no effect happened).
pub(crate) fn release(ctx: &mut Ctx<'_, '_>, claim: &Claim) -> Result<()> {
    check_claim(&*ctx.t, ctx.now, claim)?;
    ctx.materialize(&claim.operation_id)?;
    let purge_at = ctx.now.saturating_add(ctx.cfg.audit_retention);
    ctx.append(
        Some(&claim.operation_id),
        EventKind::Released {
            epoch: claim.epoch,
            purge_at,
        },
    )?;
    Ok(())
}

/// `extend_lease`: the claim holder pushes its lease to `now + by`.
pub(crate) fn extend_lease(ctx: &mut Ctx<'_, '_>, claim: &Claim, by: Duration) -> Result<Claim> {
    let rec = check_claim(&*ctx.t, ctx.now, claim)?;
    if let ExecRecord::InDoubt { lease_until, .. } = rec.state {
        return Err(Error::new(ErrorKind::LeaseExpired {
            operation_id: claim.operation_id.clone(),
            expired_at: lease_until,
        }));
    }
    let lease_until = ctx.now.saturating_add(by);
    ctx.append(
        Some(&claim.operation_id),
        EventKind::LeaseExtended {
            epoch: claim.epoch,
            lease_until,
        },
    )?;
    let mut out = claim.clone();
    out.lease_until = lease_until;
    Ok(out)
}

pub(crate) fn known_or_unknown<V: View>(v: &V, id: &str, now: Timestamp) -> Result<ReceiptRecord> {
    match effective_of(v, id, now)? {
        Some(rec) if !matches!(rec.state, ExecRecord::Vacant { .. }) => Ok(rec),
        _ => Err(Error::new(ErrorKind::UnknownOperation {
            operation_id: id.to_string(),
        })),
    }
}

/// `resolve`: the embedder records how an InDoubt operation ended.
pub(crate) fn resolve(
    ctx: &mut Ctx<'_, '_>,
    id: &str,
    resolution: &Resolution,
) -> Result<Option<Receipt>> {
    let rec = known_or_unknown(&*ctx.t, id, ctx.now)?;
    if !matches!(rec.state, ExecRecord::InDoubt { .. }) {
        let state = match &rec.state {
            ExecRecord::Running { lease_until } => {
                format!(
                    "running under a live lease until {lease_until}; only in-doubt operations are resolved"
                )
            }
            _ => format!(
                "{}; only in-doubt operations are resolved",
                state_name(&rec)
            ),
        };
        return Err(Error::new(ErrorKind::InvalidState {
            operation_id: id.to_string(),
            action: "resolve",
            state,
        }));
    }
    match resolution {
        Resolution::NotApplied => {
            ctx.materialize(id)?;
            let purge_at = ctx.now.saturating_add(ctx.cfg.audit_retention);
            ctx.append(
                Some(id),
                EventKind::Resolved {
                    resolution: ResolvedAs::NotApplied { purge_at },
                },
            )?;
            Ok(None)
        }
        Resolution::Completed(outcome) => {
            validate_outcome(ctx.cfg, outcome)?;
            ctx.materialize(id)?;
            let ev = ctx.append(
                Some(id),
                EventKind::Resolved {
                    resolution: ResolvedAs::Completed {
                        outcome: (&outcome.kind).into(),
                        result: result_info(&outcome.result),
                        deadlines: terminal_deadlines(ctx.now, ctx.cfg),
                    },
                },
            )?;
            ctx.t.put_result(ev.seq, id, &outcome.result)?;
            current_view(ctx, id).map(Some)
        }
    }
}

fn done_or_refuse<'r>(rec: &'r ReceiptRecord, action: &'static str) -> Result<&'r DoneRecord> {
    match &rec.state {
        ExecRecord::Done(d) => Ok(d),
        _ => Err(Error::new(ErrorKind::InvalidState {
            operation_id: rec.operation_id.clone(),
            action,
            state: format!(
                "{}; only terminal operations have a result",
                state_name(rec)
            ),
        })),
    }
}

/// A lazily durable write: a delivery attempt or an acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LazyKind<'a> {
    Delivered,
    /// An acknowledgement by the caller's session (`None`: the caller named none).
    Acknowledged {
        session: Option<&'a str>,
    },
}

/// Only the session an operation was submitted with may acknowledge its result; an
/// operation submitted without a session may be acknowledged by any caller.
fn check_owner(rec: &ReceiptRecord, caller: Option<&str>) -> Result<()> {
    match &rec.session {
        Some(owner) if caller != Some(owner.as_str()) => Err(Error::new(ErrorKind::NotOwner {
            operation_id: rec.operation_id.clone(),
            owner: owner.clone(),
            caller: caller.map(str::to_string),
        })),
        _ => Ok(()),
    }
}

/// The event a lazy write records on the effective record `rec`, decided at `at`, or
/// `None` when there is nothing to record (already acknowledged).
pub(crate) fn lazy_event(
    rec: &ReceiptRecord,
    kind: LazyKind<'_>,
    at: Timestamp,
    cfg: &Config,
) -> Result<Option<EventKind>> {
    match kind {
        LazyKind::Delivered => {
            let d = done_or_refuse(rec, "record a delivery of")?;
            if d.retired_at.is_some() {
                return Err(Error::new(ErrorKind::InvalidState {
                    operation_id: rec.operation_id.clone(),
                    action: "record a delivery of",
                    state: "retired: its result was dropped, so there is nothing to deliver".into(),
                }));
            }
            let count = d.delivery.count.saturating_add(1);
            // The last permitted delivery spends the budget: its exhaustion is due at once
            // (reads show `Exhausted` from now on, and compaction records the event), so a
            // service stops pushing exactly when the journal says so. Further deliveries
            // (replays a client asked for) change nothing.
            let (next_due, final_attempt) = if matches!(
                d.delivery.state,
                DeliveryState::Pending | DeliveryState::Delivered
            ) && !d.delivery.final_attempt
            {
                if count >= cfg.retry.attempts {
                    (at, true)
                } else {
                    let cap = backoff(cfg, count);
                    (
                        at.saturating_add(jitter(&rec.operation_id, rec.epoch, count, cap)),
                        false,
                    )
                }
            } else {
                (d.delivery.next_due, d.delivery.final_attempt)
            };
            Ok(Some(EventKind::Delivered {
                count,
                next_due,
                final_attempt,
            }))
        }
        LazyKind::Acknowledged { session } => {
            check_owner(rec, session)?;
            let d = done_or_refuse(rec, "acknowledge")?;
            if d.delivery.state == DeliveryState::Acknowledged {
                return Ok(None);
            }
            Ok(Some(EventKind::Acknowledged {
                late: d.delivery.state == DeliveryState::AckExpired,
            }))
        }
    }
}

/// Whether a pending lazy event is already reflected in `rec` (it was committed): pending
/// events are applied to reads idempotently.
fn lazy_applied(rec: &ReceiptRecord, kind: &EventKind) -> bool {
    let ExecRecord::Done(d) = &rec.state else {
        return true;
    };
    match kind {
        EventKind::Delivered { count, .. } => d.delivery.count >= *count,
        EventKind::Acknowledged { .. } => d.delivery.state == DeliveryState::Acknowledged,
        _ => true,
    }
}

/// Applies pending lazy events (not yet committed) to an effective record, for reads.
pub(crate) fn overlay(mut rec: ReceiptRecord, pending: &[(Timestamp, EventKind)]) -> ReceiptRecord {
    for (at, kind) in pending {
        if lazy_applied(&rec, kind) {
            continue;
        }
        let ev = Event {
            seq: 0,
            at: *at,
            operation_id: Some(rec.operation_id.clone()),
            kind: kind.clone(),
        };
        if let Ok(next) = transition(Some(&rec), &ev) {
            rec = next;
        }
    }
    rec
}

/// Commits a pending lazy event as of `at`, the time of the call that made it (so the
/// committed receipt is the one its caller was shown, even if a clock passed since). One
/// that no longer fits (the event is already committed) is dropped.
pub(crate) fn record_lazy(
    ctx: &mut Ctx<'_, '_>,
    id: &str,
    kind: &EventKind,
    at: Timestamp,
) -> Result<()> {
    let batch_now = ctx.now;
    ctx.now = at;
    let r = record_lazy_now(ctx, id, kind);
    ctx.now = batch_now;
    r
}

fn record_lazy_now(ctx: &mut Ctx<'_, '_>, id: &str, kind: &EventKind) -> Result<()> {
    let Some(rec) = effective_of(&*ctx.t, id, ctx.now)? else {
        return Ok(());
    };
    let fits = match (&rec.state, kind) {
        (ExecRecord::Done(d), EventKind::Delivered { .. }) => d.retired_at.is_none(),
        (ExecRecord::Done(_), EventKind::Acknowledged { .. }) => true,
        _ => false,
    };
    if !fits || lazy_applied(&rec, kind) {
        return Ok(());
    }
    ctx.materialize(id)?;
    ctx.append(Some(id), kind.clone())?;
    Ok(())
}

/// `advance_revision`: the embedder reports a change made outside the journal.
pub(crate) fn advance_revision(ctx: &mut Ctx<'_, '_>, scope: &str, revision: u64) -> Result<u64> {
    validate::name("scope", scope)?;
    let current = ctx.t.scope_revision(scope)?;
    if revision < current {
        return Err(Error::new(ErrorKind::RevisionNotForward {
            scope: scope.to_string(),
            revision,
            current,
        }));
    }
    if revision == current {
        return Ok(current);
    }
    let purge_at = ctx.now.saturating_add(ctx.cfg.audit_retention);
    ctx.append(
        None,
        EventKind::RevisionAdvanced {
            scope: scope.to_string(),
            revision,
            cause: RevisionCause::External,
            purge_at,
        },
    )?;
    Ok(revision)
}

/// At open: every operation still `Running` lost its claim holder.
pub(crate) fn mark_running_in_doubt(ctx: &mut Ctx<'_, '_>) -> Result<u64> {
    let running = ctx.t.timers_due(TimerKind::Lease, u64::MAX, usize::MAX)?;
    let mut n = 0;
    for (_, id) in running {
        if let Some(rec) = ctx.t.receipt(&id)?
            && let ExecRecord::Running { .. } = rec.state
        {
            ctx.append(
                Some(&id),
                EventKind::LeaseExpired {
                    epoch: rec.epoch,
                    cause: InDoubtCause::Reopened,
                },
            )?;
            n += 1;
        }
    }
    Ok(n)
}
