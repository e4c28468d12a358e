//! Pass 1: the meta records, then every event in seq order (its decode under its own key,
//! times that never go backwards, its `op_events` entry), following the scopes' revisions
//! as the writer does (one entry per scope in memory) and checking the scope timers of the
//! revision events that stop anchoring their scope.

use std::collections::BTreeMap;

use smol_str::SmolStr;

use crate::clock::Timestamp;
use crate::error::{ErrorKind, Result};
use crate::index::{self, TableKey, View};
use crate::machine;
use crate::record::{Event, EventKind, OutcomeKind, ReceiptRecord, ResolvedAs};

use super::digest::{Cross, Digests};
use super::{Findings, VerifyReport, corrupt_detail, finding_of};

/// How the scopes' revisions stand while the events are followed in order.
pub(super) struct ScopeState {
    pub(super) record: crate::record::ScopeRecord,
    /// The anchor's purge time, when the anchor is a revision event (which gets a scope timer
    /// when another event takes over).
    pub(super) anchor_purge: Option<Timestamp>,
}

pub(super) fn check_meta<V: View>(
    t: &V,
    findings: &mut Findings,
) -> Option<crate::record::StateRecord> {
    let mut state = None;
    for key in ["format", "state", "checkpoint"] {
        let got = match t.get::<index::Meta>(&SmolStr::new(key)) {
            Ok(v) => v,
            Err(e) => {
                findings.push(finding_of(&e, "meta", key));
                continue;
            }
        };
        match (key, got) {
            // A journal of format 1 has no checkpoint entry (and no log).
            ("checkpoint", None) => {}
            (_, None) => findings.add("meta", key, "missing"),
            ("format", Some(v)) => {
                if let Err(e) = index::decode_format(&v) {
                    findings.add("meta", key, corrupt_detail(&e));
                }
            }
            ("state", Some(v)) => match index::decode_meta::<crate::record::StateRecord>(key, &v) {
                Ok(s) => state = Some(s),
                Err(e) => findings.add("meta", key, corrupt_detail(&e)),
            },
            (_, Some(v)) => {
                if let Err(e) = index::decode_meta::<crate::record::CheckpointRecord>(key, &v) {
                    findings.add("meta", key, corrupt_detail(&e));
                }
            }
        }
    }
    // Deferred purges (see `index::purged`): a damaged entry leaves purged events and
    // results indistinguishable from live ones.
    match t.get::<index::Meta>(&SmolStr::new_static(index::purged::KEY)) {
        Ok(Some(v)) => {
            if let Err(e) = index::purged::Purged::decode(&v) {
                findings.add("meta", index::purged::KEY, corrupt_detail(&e));
            }
        }
        Ok(None) => {}
        Err(e) => findings.push(finding_of(&e, "meta", index::purged::KEY)),
    }
    state
}

/// The receipt an operation's events fold into, up to and including `upto`; the error names
/// the event that does not fit.
pub(super) fn fold<V: View>(
    t: &V,
    id: &str,
    upto: u64,
) -> Result<std::result::Result<Option<ReceiptRecord>, (u64, String)>> {
    let mut rec: Option<ReceiptRecord> = None;
    for seq in t.op_event_seqs(id)? {
        if seq > upto {
            break;
        }
        let Some(ev) = t.event(seq).or_else(|e| {
            if matches!(e.kind(), ErrorKind::Corrupt { .. }) {
                // Reported by the events pass.
                Ok(None)
            } else {
                Err(e)
            }
        })?
        else {
            continue;
        };
        if ev.operation_id.as_deref() != Some(id) {
            continue;
        }
        match machine::transition(rec.as_ref(), &ev) {
            Ok(next) => rec = Some(next),
            Err(m) => return Ok(Err((seq, m))),
        }
    }
    Ok(Ok(rec))
}

fn applied_revision(ev: &Event) -> Option<u64> {
    match &ev.kind {
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
    }
}

pub(super) fn check_events<V: View>(
    t: &V,
    state: Option<&crate::record::StateRecord>,
    scopes: &mut BTreeMap<String, ScopeState>,
    report: &mut VerifyReport,
    findings: &mut Findings,
    progress: &mut dyn FnMut(u64, u64),
    mut fast: Option<&mut Digests>,
) -> Result<()> {
    let total = t.count::<index::Events>().unwrap_or_default();
    let mut max_seq = 0u64;
    let mut max_at = Timestamp(0);
    let mut last_at = Timestamp(0);
    let expect_scope_timer = |findings: &mut Findings, purge: Timestamp, seq: u64| {
        match t.get::<index::ScopeTimers>(&(purge.0, seq)) {
            Ok(Some(())) => {}
            Ok(None) => findings.add(
                "scope_timers",
                (purge.0, seq).show(),
                format!("missing: revision event {seq} no longer anchors its scope and needs its purge timer"),
            ),
            Err(e) => findings.push(finding_of(&e, "scope_timers", &(purge.0, seq).show())),
        }
    };
    for entry in t.all::<index::Events>()? {
        let (seq, raw) = entry?;
        report.events += 1;
        if report.events.is_multiple_of(4096) {
            progress(report.events, total);
        }
        let ev = match index::decode_event(seq, &raw) {
            Ok(ev) => ev,
            Err(e) => {
                findings.add("events", seq, corrupt_detail(&e));
                continue;
            }
        };
        max_seq = max_seq.max(seq);
        max_at = max_at.max(ev.at);
        if ev.at < last_at {
            findings.add(
                "events",
                seq,
                format!(
                    "recorded at {} before the previous event ({last_at})",
                    ev.at
                ),
            );
        }
        last_at = ev.at;
        if let Some(op) = &ev.operation_id {
            if let Some(d) = fast.as_deref_mut() {
                d.implied(Cross::OpEvents, (op.as_str(), seq));
            } else {
                let key = (SmolStr::new(op), seq);
                match t.get::<index::OpEvents>(&key)? {
                    Some(()) => {}
                    None => findings.add(
                        "op_events",
                        key.show(),
                        format!("missing index entry: event {seq} of `{op}`"),
                    ),
                }
            }
        }
        // The scopes, as the writer moves them.
        let (scope, revision, is_revision_event, purge) = match &ev.kind {
            EventKind::RevisionAdvanced {
                scope,
                revision,
                purge_at,
                ..
            } => (scope.clone(), *revision, true, Some(*purge_at)),
            _ => {
                let Some(rev) = applied_revision(&ev) else {
                    continue;
                };
                let Some(op) = &ev.operation_id else { continue };
                match fold(t, op, seq)? {
                    Ok(Some(rec)) => match rec.scope {
                        Some(scope) => (scope, rev, false, None),
                        None => continue,
                    },
                    // An operation whose events do not fold: the receipts pass says so.
                    _ => continue,
                }
            }
        };
        let current = scopes.get(&scope);
        let cur_rev = current.map_or(0, |s| s.record.revision);
        let takes_over = revision > cur_rev || (is_revision_event && revision == cur_rev);
        if !takes_over {
            if let Some(p) = purge {
                expect_scope_timer(findings, p, seq);
            }
            continue;
        }
        if let Some(old) = current
            && let Some(p) = old.anchor_purge
        {
            expect_scope_timer(findings, p, old.record.anchor_seq);
        }
        scopes.insert(
            scope.clone(),
            ScopeState {
                record: crate::record::ScopeRecord {
                    scope,
                    revision,
                    anchor_seq: seq,
                    updated_at: ev.at,
                },
                anchor_purge: purge,
            },
        );
    }
    progress(report.events, total);
    if let Some(s) = state {
        if report.events > 0 && s.next_seq <= max_seq {
            findings.add(
                "meta",
                "state",
                format!(
                    "next sequence {} is not after the last event {max_seq}",
                    s.next_seq
                ),
            );
        }
        if s.clock_high_water < max_at {
            findings.add(
                "meta",
                "state",
                format!(
                    "clock high-water mark {} is before the last event ({max_at})",
                    s.clock_high_water
                ),
            );
        }
    }
    Ok(())
}
