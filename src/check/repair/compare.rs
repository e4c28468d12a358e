//! Phases 3 and 4: every operation compared with what the damaged file answered, building
//! [`RepairReport::lost`](super::RepairReport::lost), and the events that settle those
//! whose history is incomplete (in doubt, or retired when their result was lost); every
//! scope compared with its recorded revision, which never moves back.

use std::collections::BTreeSet;

use smol_str::SmolStr;

use crate::clock::Timestamp;
use crate::error::Result;
use crate::index::{self, Layered, View};
use crate::machine::{self, Ctx};
use crate::record::{
    Event, EventKind, ExecRecord, IntentDigest, ReceiptRecord, RetireCause, RevisionCause,
    ScopeRecord,
};

use super::LostOperation;
use super::rebuild::Build;
use crate::check::verify::{Finding, corrupt_detail};

impl<'s> Build<'s> {
    /// Phase 3: every operation compared with what the file answered. Returns the events
    /// to append (in id order).
    pub(super) fn compare_operations(&mut self, dropped: &super::Dropped) -> Result<Vec<Action>> {
        let mut actions = Vec::new();
        // Every operation of the new file, in id order (what phase 1 built, written out:
        // nothing below writes until the actions are applied).
        self.out.flush(false)?;
        let ids_of_new =
            |b: &Build<'_>, from: Option<&SmolStr>, n: usize| -> Result<Vec<SmolStr>> {
                b.out.view(|snap| {
                    let lo = match from {
                        Some(f) => std::ops::Bound::Excluded(f),
                        None => std::ops::Bound::Unbounded,
                    };
                    let mut out = Vec::new();
                    for entry in snap.range::<index::Receipts>(lo, std::ops::Bound::Unbounded)? {
                        out.push(entry?.0);
                        if out.len() >= n {
                            break;
                        }
                    }
                    Ok(out)
                })
            };
        let mut checked: BTreeSet<String> = BTreeSet::new();
        let mut last: Option<SmolStr> = None;
        loop {
            let ids = ids_of_new(self, last.as_ref(), 1024)?;
            let Some(l) = ids.last().cloned() else { break };
            for id in ids {
                if let Some(a) = self.compare_one(&id, dropped, None)? {
                    actions.push(a);
                }
                if self.damaged.contains_key(id.as_str()) || dropped.ops.contains(id.as_str()) {
                    checked.insert(id.to_string());
                }
            }
            last = Some(l);
        }
        // Operations the file knew (a receipt, or events its index lists) that the new file
        // does not have. Only those are kept (memory follows what was lost, not the
        // journal's size: collecting every id took ~140 bytes per operation).
        let mut known: BTreeSet<String> = BTreeSet::new();
        {
            let (src, out) = (&mut *self.src, &self.out);
            let missing =
                |op: &str| -> Result<bool> { Ok(out.view(|snap| snap.receipt(op))?.is_none()) };
            let g1 = src.read_table::<index::Receipts>(|k, _| {
                if missing(&k)? {
                    known.insert(k.to_string());
                }
                Ok(())
            })?;
            let mut last_op: Option<SmolStr> = None;
            let g2 = src.read_table::<index::OpEvents>(|(op, _), ()| {
                if last_op.as_deref() != Some(op.as_str()) {
                    if missing(&op)? {
                        known.insert(op.to_string());
                    }
                    last_op = Some(op);
                }
                Ok(())
            })?;
            let _ = (g1, g2);
        }
        for id in &known {
            if self.new_receipt(id)?.is_none()
                && let Some(a) = self.compare_one(id, dropped, None)?
            {
                actions.push(a);
            }
        }
        checked.extend(known);
        // Damaged operations whose id is known only from their quarantined events, and
        // operations known only from dropped log records.
        let rest: Vec<String> = self
            .damaged
            .keys()
            .chain(dropped.ops.iter())
            .filter(|k| !checked.contains(*k))
            .cloned()
            .collect::<BTreeSet<String>>()
            .into_iter()
            .collect();
        for id in rest {
            // The latest receipt the dropped log records hold, unless it says released (the
            // id was free anyway): what holds the operation in doubt if nothing else is left.
            let copy = dropped.receipts.get(&id).filter(|r| {
                machine::effective((*r).clone(), self.now)
                    .is_some_and(|e| !matches!(e.state, ExecRecord::Vacant { .. }))
            });
            if self.new_receipt(&id)?.is_none()
                && !actions.iter().any(|a| a.op() == id)
                && let Some(a) = self.compare_one(&id, dropped, copy)?
            {
                actions.push(a);
            }
            checked.insert(id);
        }
        // Operations known only from an intact copy of their receipt in the raw bytes (the
        // engine could not read their receipt, and none of their events is left): without
        // this they would vanish unnamed, and a resubmission would run them again. One
        // whose copy says it is released, or past its audit retention, answered unknown.
        let found: Vec<ReceiptRecord> = self
            .candidates
            .map(|c| {
                c.receipts
                    .values()
                    .filter(|r| !checked.contains(&r.operation_id))
                    .filter(|r| {
                        machine::effective((*r).clone(), self.now)
                            .is_some_and(|e| !matches!(e.state, ExecRecord::Vacant { .. }))
                    })
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for rec in found {
            let id = rec.operation_id.clone();
            if self.new_receipt(&id)?.is_none()
                && !actions.iter().any(|a| a.op() == id)
                && let Some(a) = self.compare_one(&id, dropped, Some(&rec))?
            {
                actions.push(a);
            }
        }
        Ok(actions)
    }

    /// Compares one operation; names it in the report if it does not answer as before, and
    /// returns the event that settles it, if one is needed. `copy` is an intact copy of its
    /// receipt found in the raw bytes or in the log records not taken, for an operation
    /// that left nothing else.
    pub(super) fn compare_one(
        &mut self,
        id: &str,
        dropped: &super::Dropped,
        copy: Option<&ReceiptRecord>,
    ) -> Result<Option<Action>> {
        let now = self.now;
        let after = self.new_receipt(id)?;
        let new_seqs: BTreeSet<u64> = self
            .out
            .view(|snap| snap.op_event_seqs(id))?
            .into_iter()
            .collect();
        let before = self.src.view(|v| v.receipt(id));
        let orig_seqs = self.src.view(|v| v.op_event_seqs(id));
        let before_result = match &before {
            Ok(Some(rec)) => match &rec.state {
                ExecRecord::Done(d) => match d.result_seq {
                    Some(seq) => self
                        .src
                        .view(|v| v.result(seq, id))
                        .ok()
                        .flatten()
                        .is_some(),
                    None => false,
                },
                _ => false,
            },
            _ => false,
        };
        let damage = self.damaged.get(id);
        let quarantined = damage.map_or(0, |d| d.quarantined);
        let uncertain = damage.is_some_and(|d| d.uncertain);
        let missing: u32 = match &orig_seqs {
            Ok(seqs) => {
                let gone: Vec<u64> = seqs
                    .iter()
                    .filter(|s| !new_seqs.contains(s))
                    .copied()
                    .collect();
                // Listed by the index but not read: an intact copy may be in the raw bytes.
                self.wanted.event_keys.extend(gone.iter().copied());
                gone.len() as u32
            }
            Err(_) => 0,
        };
        let lost_events = quarantined.max(missing);
        let index_readable = orig_seqs.is_ok();
        let in_log_drop = dropped.ops.contains(id);
        // Only an intact copy of its receipt is left: its history is not complete.
        let copy = copy.filter(|_| after.is_none() && !matches!(before, Ok(Some(_))));
        let complete = index_readable && lost_events == 0 && !uncertain && copy.is_none();

        let describe_view = |rec: Option<&ReceiptRecord>| -> String {
            match rec.and_then(|r| machine::effective(r.clone(), now)) {
                None => "unknown".into(),
                Some(r) => match machine::into_view(r) {
                    None => "unknown (released)".into(),
                    Some(v) => status_text(&v),
                },
            }
        };
        // Whether, by its rebuilt history, the operation still keeps its result now (terminal,
        // and its retention has not passed).
        let kept_by_history = after
            .as_ref()
            .and_then(|r| machine::effective(r.clone(), now))
            .is_some_and(|r| matches!(&r.state, ExecRecord::Done(d) if d.retired_at.is_none()));
        let was = match &before {
            Ok(Some(r)) => {
                let mut s = describe_view(Some(r));
                let kept = matches!(r.state, ExecRecord::Done(ref d) if d.result_seq.is_some())
                    && !s.starts_with("retired");
                if kept && before_result {
                    s.push_str(", with its result");
                } else if kept {
                    s.push_str(", its result unreadable");
                }
                s
            }
            Ok(None) => match copy {
                Some(c) if in_log_drop => format!(
                    "unknown (no receipt; the log records not taken say {})",
                    describe_view(Some(c))
                ),
                _ => "unknown (no receipt)".into(),
            },
            // What its events say it was: the stored receipt is gone with the damage, and
            // its history is the record of what it answered.
            Err(e) if complete && !in_log_drop && after.is_some() => format!(
                "{}{} (as its events tell: its stored receipt could not be read: {})",
                describe_view(after.as_ref()),
                if kept_by_history {
                    ", with its result"
                } else {
                    ""
                },
                corrupt_detail(e)
            ),
            Err(e) => match copy {
                Some(c) => format!(
                    "{} (as an intact copy of its receipt found in the file tells, which may \
                     predate its last changes; the storage engine could not read it: {})",
                    describe_view(Some(c)),
                    corrupt_detail(e)
                ),
                None => format!("unreadable ({})", corrupt_detail(e)),
            },
        };

        // What settles an operation whose history is incomplete.
        let mut action = None;
        let mut now_rec = after.clone();
        if !complete || in_log_drop {
            let info = after
                .clone()
                .or_else(|| before.as_ref().ok().cloned().flatten())
                .or_else(|| copy.cloned());
            let keeps_outcome =
                matches!(after.as_ref().map(|r| &r.state), Some(ExecRecord::Done(_)));
            let before_gone = matches!(before, Ok(None)) && after.is_none() && copy.is_none();
            if !keeps_outcome
                && !before_gone
                && (lost_events > 0 || uncertain || in_log_drop || info.is_some())
            {
                let a = Action::Salvage {
                    op: id.to_string(),
                    info: info.clone().map(Box::new),
                    lost: lost_events.max(1),
                };
                now_rec = a.simulate(after.as_ref(), now);
                action = Some(a);
            }
        }
        // A live terminal receipt without its payload answers expired.
        if action.is_none()
            && let Some(rec) = &after
            && let ExecRecord::Done(d) = &rec.state
            && d.retired_at.is_none()
            && let Some(seq) = d.result_seq
        {
            let has = self.out.view(|snap| snap.result_stored(id, seq))?;
            if !has {
                self.wanted.result_keys.insert(seq);
                // Damage took the payload unless retention had already dropped it: the file
                // answered retired (its `Retired` or `ResultLost` event is what was lost),
                // or, by its history, its retention has passed.
                let before_cause = match &before {
                    Ok(Some(r)) => machine::effective(r.clone(), now).and_then(|e| match e.state {
                        ExecRecord::Done(d) if d.retired_at.is_some() => Some(d.retire_cause),
                        _ => None,
                    }),
                    _ => None,
                };
                let a = Action::Retire {
                    op: id.to_string(),
                    seq,
                    lost: match before_cause {
                        Some(cause) => cause == RetireCause::Damage,
                        None => kept_by_history,
                    },
                };
                now_rec = a.simulate(after.as_ref(), now);
                action = Some(a);
            }
        }
        // Name it unless it answers exactly as before.
        let after_view = now_rec
            .as_ref()
            .and_then(|r| machine::effective(r.clone(), now))
            .and_then(machine::into_view);
        let before_view = match &before {
            Ok(b) => Some(
                b.as_ref()
                    .and_then(|r| machine::effective(r.clone(), now))
                    .and_then(machine::into_view),
            ),
            Err(_) => None,
        };
        let after_result = match &action {
            Some(Action::Retire { .. }) | Some(Action::Salvage { .. }) => false,
            _ => match now_rec.as_ref().map(|r| &r.state) {
                Some(ExecRecord::Done(d)) => d.result_seq.is_some(),
                _ => false,
            },
        };
        let lost_to_damage = matches!(action, Some(Action::Retire { lost: true, .. }));
        let same = match &before_view {
            Some(bv) => *bv == after_view && before_result == after_result,
            // The file's receipt could not be read: the rebuilt one is exact when its whole
            // history is, and its result is too unless it was lost (its history says it kept
            // a result, and no copy of it survives).
            None => complete && !in_log_drop && !lost_to_damage,
        };
        if same && complete && !in_log_drop {
            return Ok(action);
        }
        let now_name = match (&action, &after_view) {
            (Some(Action::Salvage { .. }), _) => "in_doubt",
            (Some(Action::Retire { .. }), _) => "expired",
            (None, None) => "unknown",
            (None, Some(_)) if !complete => "kept",
            (None, Some(_)) => "restored",
        };
        let mut why = Vec::new();
        if lost_events > 0 {
            why.push(format!(
                "{lost_events} of its events could not be read or did not fit its history"
            ));
        }
        if !index_readable {
            why.push("the index of its events could not be read".to_string());
        }
        if uncertain {
            why.push(
                "some of its events were salvaged from the raw bytes without their index"
                    .to_string(),
            );
        }
        if in_log_drop {
            why.push("some of its changes were in log records that were dropped".to_string());
        }
        if copy.is_some() {
            why.push(if in_log_drop {
                "all it left is a receipt in the log records that were dropped".to_string()
            } else {
                "none of its events and not its stored receipt could be read; an intact copy \
                 of its receipt was found in the file's raw bytes"
                    .to_string()
            });
        }
        if matches!(action, Some(Action::Retire { .. })) {
            let was_retired = matches!(
                &before,
                Ok(Some(r)) if machine::effective(r.clone(), now).is_some_and(|e| {
                    matches!(&e.state, ExecRecord::Done(d) if d.retired_at.is_some())
                })
            );
            why.push(if was_retired {
                "the event that retired it was lost; it stays retired (its dropped payload is \
                 not revived)"
                    .to_string()
            } else if lost_to_damage {
                "its result payload was lost to damage (damaged or missing, no intact copy in \
                 the file) before its retention passed; the outcome is kept, the result is not"
                    .to_string()
            } else {
                "its result payload was damaged or missing, after its retention had passed"
                    .to_string()
            });
        }
        if why.is_empty() {
            why.push("its stored receipt disagreed with its events".to_string());
        }
        let now_text = match &action {
            Some(Action::Salvage { .. }) => {
                "in doubt: its outcome is not known for sure, so it is held until resolved"
                    .to_string()
            }
            _ => describe_view(now_rec.as_ref()),
        };
        self.report.lost.push(LostOperation {
            operation_id: id.to_string(),
            now: now_name.to_string(),
            was,
            detail: format!("{}; now {now_text}", why.join("; ")),
        });
        Ok(action)
    }

    /// Phase 4: a scope revision never moves back.
    pub(super) fn compare_scopes(&mut self) -> Result<Vec<(String, u64)>> {
        let mut stored: Vec<ScopeRecord> = Vec::new();
        let _ = self.src.read_table::<index::Scopes>(|k, v| {
            if let Ok(s) = index::decode_scope(&k, &v) {
                stored.push(s);
            }
            Ok(())
        })?;
        let mut out = Vec::new();
        for s in stored {
            let now_rev = self.out.view(|snap| snap.scope_revision(&s.scope))?;
            if now_rev < s.revision {
                self.report.scopes.push(Finding::new(
                    "scopes",
                    &s.scope,
                    format!(
                        "the events that moved it to revision {} were lost (they give {now_rev}); \
                         a checkpoint event keeps it at {}",
                        s.revision, s.revision
                    ),
                ));
                out.push((s.scope, s.revision));
            } else if now_rev > s.revision {
                self.report.scopes.push(Finding::new(
                    "scopes",
                    &s.scope,
                    format!(
                        "recorded at revision {}, its events give {now_rev}",
                        s.revision
                    ),
                ));
            }
        }
        Ok(out)
    }

    pub(super) fn apply_actions(
        &mut self,
        actions: Vec<Action>,
        scopes: Vec<(String, u64)>,
    ) -> Result<()> {
        let now = self.now.max(self.max_at);
        self.now = now;
        self.state.next_seq = self.state.next_seq.max(self.max_seq + 1);
        self.state.clock_high_water = self.state.clock_high_water.max(now);
        for chunk in actions.chunks(1024) {
            let cfg = self.cfg.clone();
            let mut state = self.state.clone();
            self.batch(|t| {
                let mut ctx = Ctx {
                    t,
                    now,
                    cfg: &cfg,
                    state: &mut state,
                    fired: Default::default(),
                };
                for a in chunk {
                    match a {
                        Action::Salvage { op, .. } => {
                            ctx.append(Some(op), a.event_kind())?;
                        }
                        Action::Retire { op, seq, .. } => {
                            ctx.t.delete_result(*seq)?;
                            ctx.append(Some(op), a.event_kind())?;
                        }
                    }
                }
                Ok(())
            })?;
            self.state = state;
            self.out.maybe_flush()?;
        }
        if !scopes.is_empty() {
            let cfg = self.cfg.clone();
            let mut state = self.state.clone();
            let purge_at = now.saturating_add(cfg.audit_retention);
            self.batch(|t| {
                let mut ctx = Ctx {
                    t,
                    now,
                    cfg: &cfg,
                    state: &mut state,
                    fired: Default::default(),
                };
                for (scope, revision) in &scopes {
                    ctx.append(
                        None,
                        EventKind::RevisionAdvanced {
                            scope: scope.clone(),
                            revision: *revision,
                            cause: RevisionCause::Checkpoint,
                            purge_at,
                        },
                    )?;
                }
                Ok(())
            })?;
            self.state = state;
        }
        Ok(())
    }
}

/// An event appended to settle an operation.
pub(super) enum Action {
    /// Its events were lost: in doubt until resolved.
    Salvage {
        op: String,
        info: Option<Box<ReceiptRecord>>,
        lost: u32,
    },
    /// Its result payload is gone: retired (answers expired). `lost` when damage took it
    /// before its retention passed (a `ResultLost` event, so its history and answers say
    /// so); otherwise retention had dropped it and only the `Retired` event was missing.
    Retire { op: String, seq: u64, lost: bool },
}

impl Action {
    pub(super) fn op(&self) -> &str {
        match self {
            Action::Salvage { op, .. } | Action::Retire { op, .. } => op,
        }
    }

    /// The receipt after this action, as the fold will give it.
    /// The event that settles the operation.
    pub(super) fn event_kind(&self) -> EventKind {
        match self {
            Action::Salvage { info, lost, .. } => {
                let (attempt, intent_name, intent_hash, scope, session) = match info {
                    Some(r) => (
                        r.attempt,
                        r.intent_name.clone(),
                        r.intent_hash,
                        r.scope.clone(),
                        r.session.clone(),
                    ),
                    None => (1, "(lost)".to_string(), IntentDigest::LOST, None, None),
                };
                EventKind::Salvaged {
                    attempt,
                    intent_name,
                    intent_hash,
                    scope,
                    session,
                    lost_events: *lost,
                }
            }
            Action::Retire { lost: true, .. } => EventKind::ResultLost,
            Action::Retire { lost: false, .. } => EventKind::Retired,
        }
    }

    /// The receipt after this action, as the fold will give it.
    pub(super) fn simulate(
        &self,
        after: Option<&ReceiptRecord>,
        now: Timestamp,
    ) -> Option<ReceiptRecord> {
        let kind = self.event_kind();
        let ev = Event {
            seq: u64::MAX,
            at: now,
            operation_id: Some(self.op().to_string()),
            kind,
        };
        machine::transition(after, &ev).ok()
    }
}

/// A one-line description of a public receipt's state.
pub(super) fn status_text(r: &crate::types::Receipt) -> String {
    let name = |v: serde_json::Value| v.as_str().unwrap_or("?").to_string();
    let mut s = name(serde_json::to_value(r.status).unwrap_or_default());
    if let Some(rev) = r.result_revision {
        s.push_str(&format!(" at revision {rev}"));
    }
    if let Some(crate::types::RetireCause::Damage { repaired_at }) = r.retire_cause {
        s.push_str(&format!(
            " (its result lost to damage, found by the repair at {repaired_at})"
        ));
    }
    if let Some(d) = &r.delivery {
        s.push_str(&format!(
            ", {}",
            name(serde_json::to_value(d).unwrap_or_default())
        ));
        if r.delivery_count > 0 {
            s.push_str(&format!(
                " ({} {})",
                r.delivery_count,
                if r.delivery_count == 1 {
                    "delivery"
                } else {
                    "deliveries"
                }
            ));
        }
    }
    s
}
