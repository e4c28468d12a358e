//! Pass 2: every receipt, in id order, against the fold of its operation's events (read
//! through `op_events` by point lookups): the stored receipt, the index entries the fold
//! implies, and its result (inline or in `results`), which must match the length, CRC and
//! asset count its completion recorded.

use smol_str::SmolStr;

use crate::error::Result;
use crate::index::{self, IndexEntry, Layered, Table, TableKey, View};
use crate::machine;
use crate::record::ExecRecord;

use super::digest::{Cross, Digests};
use super::events::fold;
use super::{Findings, VerifyReport, corrupt_detail, describe};

fn index_key(op: &str, e: &IndexEntry) -> (&'static str, String) {
    let op = SmolStr::new(op);
    match e {
        IndexEntry::Timer(kind, due) => ("timers", (*kind as u8, *due, op).show()),
        IndexEntry::Window(s, d) => ("windows", (SmolStr::new(s), *d, op).show()),
        IndexEntry::Hold(scope) => ("scope_holds", (SmolStr::new(scope), op).show()),
        IndexEntry::InDoubt => ("in_doubt", op.to_string()),
    }
}

fn index_present<V: Layered>(t: &V, op: &str, e: &IndexEntry) -> Result<bool> {
    let op = SmolStr::new(op);
    Ok(match e {
        IndexEntry::Timer(kind, due) => t.get::<index::Timers>(&(*kind as u8, *due, op))?,
        IndexEntry::Window(s, d) => t.get::<index::Windows>(&(SmolStr::new(s), *d, op))?,
        IndexEntry::Hold(scope) => t.get::<index::Holds>(&(SmolStr::new(scope), op))?,
        IndexEntry::InDoubt => t.get::<index::InDoubt>(&op)?,
    }
    .is_some())
}

/// Counts the index entry `e` of `op` as implied, keyed as its table stores it (the keys
/// [`index_present`] looks up; the reverse passes count each table's keys as stored).
fn imply_entry(d: &mut Digests, op: &str, e: &IndexEntry) {
    let op = SmolStr::new(op);
    match e {
        IndexEntry::Timer(kind, due) => d.implied(
            Cross::Index,
            (<index::Timers as Table>::ID, (*kind as u8, *due, op)),
        ),
        IndexEntry::Window(s, dl) => d.implied(
            Cross::Index,
            (<index::Windows as Table>::ID, (SmolStr::new(s), *dl, op)),
        ),
        IndexEntry::Hold(scope) => d.implied(
            Cross::Index,
            (<index::Holds as Table>::ID, (SmolStr::new(scope), op)),
        ),
        IndexEntry::InDoubt => d.implied(Cross::Index, (<index::InDoubt as Table>::ID, op)),
    }
}

pub(super) fn check_receipts<V: View>(
    t: &V,
    report: &mut VerifyReport,
    findings: &mut Findings,
    mut fast: Option<&mut Digests>,
) -> Result<()> {
    for entry in t.all::<index::Receipts>()? {
        let (id, raw) = entry?;
        report.receipts += 1;
        let stored = match index::decode_receipt(&id, &raw) {
            Ok(r) => Some(r),
            Err(e) => {
                findings.add("receipts", &id, corrupt_detail(&e));
                None
            }
        };
        let folded = match fold(t, &id, u64::MAX)? {
            Ok(Some(rec)) => rec,
            Ok(None) => {
                findings.add(
                    "receipts",
                    &id,
                    "no event of the journal creates this receipt",
                );
                continue;
            }
            Err((seq, m)) => {
                findings.add("events", seq, m);
                continue;
            }
        };
        if let Some(stored) = &stored
            && *stored != folded
        {
            findings.add(
                "receipts",
                &id,
                format!(
                    "stored receipt ({}) differs from the fold of its events ({})",
                    describe(stored),
                    describe(&folded)
                ),
            );
        }
        for e in machine::index_entries(&folded) {
            if let Some(d) = fast.as_deref_mut() {
                imply_entry(d, &id, &e);
            } else if !index_present(t, &id, &e)? {
                let (table, key) = index_key(&id, &e);
                findings.add(
                    table,
                    key,
                    "missing index entry implied by the journal's events",
                );
            }
        }
        let kept = match &folded.state {
            ExecRecord::Done(d) => d.result_seq.map(|seq| (d, seq)),
            _ => None,
        };
        let tail = index::split_receipt_value(&raw).1;
        // A result inline in the receipt's value (format 3) must be the one it keeps;
        // decoded once, for this check and the comparison with the completion below.
        let inline = match (tail, kept) {
            (None, _) => None,
            (Some(_), None) => {
                findings.add(
                    "receipts",
                    &id,
                    "a result is stored inline, but the receipt keeps none",
                );
                None
            }
            (Some(tail), Some((_, seq))) => match index::decode_inline_result(&id, seq, tail) {
                Ok(r) => {
                    report.results += 1;
                    Some(r)
                }
                Err(e) => {
                    findings.add("receipts", &id, corrupt_detail(&e));
                    None
                }
            },
        };
        if let Some((d, seq)) = kept {
            let stored_result = match tail {
                Some(_) => inline.map(|r| (id.to_string(), r.changed_assets, r.bytes)),
                None if fast.is_some() => {
                    if let Some(dg) = fast.as_deref_mut() {
                        dg.implied(
                            Cross::Results,
                            (
                                seq,
                                id.as_str(),
                                d.result.len,
                                d.result.crc32,
                                d.result.assets,
                            ),
                        );
                    }
                    None
                }
                None => match t.get::<index::Results>(&seq)? {
                    None => {
                        findings.add(
                            "results",
                            seq,
                            format!("missing: the result of `{id}` is not stored"),
                        );
                        None
                    }
                    // A damaged result is reported by the results pass.
                    Some(raw) => index::decode_result(seq, &raw)
                        .ok()
                        .map(|(h, bytes)| (h.operation_id, h.changed_assets, bytes)),
                },
            };
            if let Some((owner, changed_assets, bytes)) = stored_result
                && owner == id
                && (bytes.len() as u64 != d.result.len
                    || crc32fast::hash(&bytes) != d.result.crc32
                    || changed_assets.len() as u32 != d.result.assets)
            {
                let (table, key) = match tail {
                    Some(_) => ("receipts", id.to_string()),
                    None => ("results", seq.to_string()),
                };
                findings.add(
                    table,
                    key,
                    format!(
                        "payload of `{id}` does not match its completion event ({} \
                         bytes, crc {:08x}; expected {} bytes, crc {:08x})",
                        bytes.len(),
                        crc32fast::hash(&bytes),
                        d.result.len,
                        d.result.crc32
                    ),
                );
            }
        }
    }
    Ok(())
}
