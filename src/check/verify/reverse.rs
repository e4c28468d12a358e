//! Pass 3: the reverse passes over each index table. Every `op_events` entry names an
//! event of its operation and an operation with a receipt; every result belongs to a live
//! receipt that refers to it; every timer, window, lock and in-doubt entry is implied by
//! its receipt; every scope timer is a superseded revision event; every scope record is
//! the one the events give.

use std::collections::BTreeMap;

use crate::error::{ErrorKind, Result};
use crate::index::{self, IndexEntry, Table, TableKey, View};
use crate::machine;
use crate::record::{EventKind, ExecRecord};

use super::digest::{Cross, Digests};
use super::events::ScopeState;
use super::{Findings, VerifyReport, corrupt_detail};

pub(super) fn check_op_events<V: View>(
    t: &V,
    report: &mut VerifyReport,
    findings: &mut Findings,
    mut fast: Option<&mut Digests>,
) -> Result<()> {
    let mut last_op: Option<smol_str::SmolStr> = None;
    for entry in t.all::<index::OpEvents>()? {
        let ((op, seq), ()) = entry?;
        report.index_entries += 1;
        let implied = match fast.as_deref_mut() {
            Some(d) => {
                d.stored(Cross::OpEvents, (op.as_str(), seq));
                true
            }
            None => match t.get::<index::Events>(&seq)? {
                Some(raw) => match index::decode_event(seq, &raw) {
                    Ok(ev) => ev.operation_id.as_deref() == Some(op.as_str()),
                    // Reported by the events pass.
                    Err(_) => true,
                },
                None => false,
            },
        };
        if !implied {
            findings.add(
                "op_events",
                (op.clone(), seq).show(),
                "index entry not implied by the journal's events",
            );
        }
        if last_op.as_deref() != Some(op.as_str()) {
            if t.get::<index::Receipts>(&op)?.is_none() {
                findings.add(
                    "receipts",
                    &op,
                    "missing: the journal's events record this operation",
                );
            }
            last_op = Some(op);
        }
    }
    Ok(())
}

pub(super) fn check_results<V: View>(
    t: &V,
    report: &mut VerifyReport,
    findings: &mut Findings,
    mut fast: Option<&mut Digests>,
) -> Result<()> {
    for entry in t.all::<index::Results>()? {
        let (seq, raw) = entry?;
        report.results += 1;
        let (header, bytes) = match index::decode_result(seq, &raw) {
            Ok(r) => r,
            Err(e) => {
                findings.add("results", seq, corrupt_detail(&e));
                continue;
            }
        };
        let op = &header.operation_id;
        if let Some(d) = fast.as_deref_mut() {
            // As the receipts pass counts what each receipt's completion recorded.
            d.stored(
                Cross::Results,
                (
                    seq,
                    op.as_str(),
                    bytes.len() as u64,
                    crc32fast::hash(&bytes),
                    header.changed_assets.len() as u32,
                ),
            );
            continue;
        }
        // A receipt keeping its result inline does not refer to a copy in `results`.
        let inline = t
            .with_str::<index::Receipts, _>(op, |v| index::split_receipt_value(v).1.is_some())?
            .unwrap_or(false);
        let referenced = match t.receipt(op) {
            Ok(Some(r)) => match &r.state {
                ExecRecord::Done(d) => d.result_seq == Some(seq) && !inline,
                _ => false,
            },
            Ok(None) => false,
            // A damaged receipt is reported by the receipts pass.
            Err(e) if matches!(e.kind(), ErrorKind::Corrupt { .. }) => true,
            Err(e) => return Err(e),
        };
        if !referenced {
            findings.add(
                "results",
                seq,
                format!("orphan result of `{op}`: no live receipt refers to it"),
            );
        }
    }
    Ok(())
}

/// A reverse pass over a set-like index: every entry is implied by its operation's receipt.
pub(super) fn check_index<T: Table<V = ()>>(
    t: &impl View,
    report: &mut VerifyReport,
    findings: &mut Findings,
    mut fast: Option<&mut Digests>,
    entry_of: impl Fn(&T::K) -> Option<(String, IndexEntry)>,
) -> Result<()>
where
    T::K: std::hash::Hash,
{
    for entry in t.all::<T>()? {
        let (key, ()) = entry?;
        report.index_entries += 1;
        let implied = match entry_of(&key) {
            Some(_) if fast.is_some() => {
                if let Some(d) = fast.as_deref_mut() {
                    d.stored(Cross::Index, (T::ID, &key));
                }
                true
            }
            Some((op, e)) => match t.receipt(&op) {
                Ok(Some(rec)) => machine::index_entries(&rec).contains(&e),
                Ok(None) => false,
                // A damaged receipt is reported by the receipts pass.
                Err(err) if matches!(err.kind(), ErrorKind::Corrupt { .. }) => true,
                Err(err) => return Err(err),
            },
            None => false,
        };
        if !implied {
            findings.add(
                T::NAME,
                key.show(),
                "index entry not implied by the journal's events",
            );
        }
    }
    Ok(())
}

pub(super) fn check_scope_timers<V: View>(
    t: &V,
    scopes: &BTreeMap<String, ScopeState>,
    report: &mut VerifyReport,
    findings: &mut Findings,
) -> Result<()> {
    for entry in t.all::<index::ScopeTimers>()? {
        let ((due, seq), ()) = entry?;
        report.index_entries += 1;
        let implied = match t.event(seq) {
            Ok(Some(ev)) => match &ev.kind {
                EventKind::RevisionAdvanced {
                    scope, purge_at, ..
                } => {
                    purge_at.0 == due
                        && scopes.get(scope).is_none_or(|s| s.record.anchor_seq != seq)
                }
                _ => false,
            },
            Ok(None) => false,
            Err(e) if matches!(e.kind(), ErrorKind::Corrupt { .. }) => true,
            Err(e) => return Err(e),
        };
        if !implied {
            findings.add(
                "scope_timers",
                (due, seq).show(),
                "index entry not implied by the journal's events",
            );
        }
    }
    Ok(())
}

pub(super) fn check_scopes<V: View>(
    t: &V,
    scopes: &BTreeMap<String, ScopeState>,
    report: &mut VerifyReport,
    findings: &mut Findings,
) -> Result<()> {
    let mut expected = scopes.iter().peekable();
    let missing = |findings: &mut Findings, name: &str| {
        findings.add(
            "scopes",
            name,
            "missing: the journal's events record this scope",
        );
    };
    for entry in t.all::<index::Scopes>()? {
        let (name, raw) = entry?;
        report.scopes += 1;
        while let Some((k, _)) = expected.peek()
            && k.as_str() < name.as_str()
        {
            missing(findings, k);
            expected.next();
        }
        let exp = match expected.peek() {
            Some((k, s)) if k.as_str() == name.as_str() => {
                let s = &s.record;
                expected.next();
                Some(s)
            }
            _ => None,
        };
        match (index::decode_scope(&name, &raw), exp) {
            (Err(e), _) => findings.add("scopes", &name, corrupt_detail(&e)),
            (Ok(_), None) => findings.add("scopes", &name, "no event records this scope"),
            (Ok(stored), Some(exp)) if stored != *exp => findings.add(
                "scopes",
                &name,
                format!(
                    "stored revision {} (event {}) differs from the journal's events: revision {} (event {})",
                    stored.revision, stored.anchor_seq, exp.revision, exp.anchor_seq
                ),
            ),
            _ => {}
        }
    }
    for (k, _) in expected {
        missing(findings, k);
    }
    Ok(())
}
