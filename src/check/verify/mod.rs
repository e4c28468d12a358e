//! `verify`: every record checked, every index checked against the events, in passes that
//! stream the tables, with memory bounded by the number of scopes.
//!
//! # The passes
//!
//! One read snapshot (redb as of the last checkpoint, with the log's records of the same
//! cycle over it), then:
//!
//! 1. **events**, in seq order: each decodes under its own key, times never go backwards,
//!    each operation event has its `op_events` entry (a point lookup). The scopes' revisions
//!    are followed as the writer follows them (one entry per scope in memory), and each
//!    revision event that stops anchoring its scope must have its `scope_timers` entry.
//! 2. **receipts**, in id order: each operation's events (found through `op_events`, read by
//!    point lookups) are folded with the writer's own transition function and compared with
//!    the stored receipt; the index entries the fold implies must exist (point lookups), and
//!    so must its result, matching the length, CRC and asset count its completion recorded.
//! 3. **reverse passes** over each index table: every `op_events` entry names an event of its
//!    operation and an operation with a receipt; every result belongs to a live receipt that
//!    refers to it; every timer, window, lock and in-doubt entry is implied by its receipt;
//!    every scope timer is a superseded revision event; every scope record is the one the
//!    events give.
//!
//! The checks that match two tables entry for entry (an event and its `op_events` entry, a
//! kept result and its `results` entry, an implied index entry and its table's) are first
//! counted as keyed digests, each table read in its own order, without the point lookups
//! named above; only when that run finds anything, or a pair of tables does not match, do
//! the passes run again with the lookups, which name each problem (see `digest`).
//!
//! Findings are capped at [`MAX_FINDINGS`] (the rest are counted). Besides the records, the
//! log beside the file is checked ([`LogCheck`]), bytes appended after the journal are a
//! finding (a writer refuses such a file; `repair` trims them), and redb's page
//! checksums are checked on a scratch in memory, never on a copy of the file.

mod digest;
mod events;
mod integrity;
mod log;
mod receipts;
mod reverse;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::error::{Error, ErrorKind, Result};
use crate::index::{self, IndexEntry, TimerKind, View};
use crate::inspect::{Access, Inspector};
use crate::preflight::guarded;
use crate::record::{ExecRecord, ReceiptRecord};

pub(crate) use integrity::page_check;
pub(crate) use log::and_after;

use digest::Digests;
use events::{ScopeState, check_events, check_meta};
use integrity::integrity_in_place;
use log::check_log;
use receipts::check_receipts;
use reverse::{check_index, check_op_events, check_results, check_scope_timers, check_scopes};

/// The most findings a report keeps; the others are counted in
/// [`VerifyReport::more_findings`].
pub const MAX_FINDINGS: usize = 1000;

/// The most memory redb's page check may write to (it runs on a scratch in
/// memory over the file, which is never written). A check that needs more is skipped.
pub const INTEGRITY_SCRATCH_BYTES: u64 = 64 << 20;

/// One problem found in the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// The table (or `(redb)` for redb's own structures, `(file)` for the file,
    /// `log` for the log beside it).
    pub table: String,
    /// The key or sequence number.
    pub key: String,
    /// What is wrong.
    pub problem: String,
}

impl Finding {
    pub(crate) fn new(table: &str, key: impl ToString, problem: impl Into<String>) -> Finding {
        Finding {
            table: table.to_string(),
            key: key.to_string(),
            problem: problem.into(),
        }
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} `{}`: {}", self.table, self.key, self.problem)
    }
}

/// redb's page-level check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "result", content = "detail", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Integrity {
    /// Every page checksum verified.
    Passed,
    /// The check failed (the detail says how).
    Failed(String),
    /// Not run (the detail says why).
    Skipped(String),
}

/// What was found beside the file: the log a writer keeps while it has the journal open.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
#[non_exhaustive]
pub enum LogCheck {
    /// No log: the journal was closed cleanly.
    Absent,
    /// The log's records of the current cycle, checked and laid over the file.
    Current {
        /// Records laid over the file.
        records: u64,
        /// The log's length in bytes.
        bytes: u64,
    },
    /// A log that does not belong to the file's current cycle (left by an earlier cycle or
    /// by another journal): not damage; every reader and writer ignores it.
    Ignored {
        /// Why it is not this cycle's.
        reason: String,
    },
}

/// What `verify` found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct VerifyReport {
    /// redb's page checksums.
    pub integrity: Integrity,
    /// Problems, naming table and key (at most [`MAX_FINDINGS`]).
    pub findings: Vec<Finding>,
    /// Problems found beyond [`MAX_FINDINGS`], not listed.
    pub more_findings: u64,
    /// Events checked.
    pub events: u64,
    /// Receipts checked.
    pub receipts: u64,
    /// Result payloads checked.
    pub results: u64,
    /// Scopes checked.
    pub scopes: u64,
    /// Index entries checked.
    pub index_entries: u64,
    /// Records that an earlier `repair` moved to the quarantine table.
    pub quarantined: u64,
    /// The log beside the file.
    pub log: LogCheck,
    /// Bytes after the journal's data, which are not part of it.
    pub trailing_bytes: u64,
}

impl VerifyReport {
    /// A report before any pass has run: nothing found, nothing counted.
    fn started(integrity: Integrity, trailing_bytes: u64) -> VerifyReport {
        VerifyReport {
            integrity,
            findings: Vec::new(),
            more_findings: 0,
            events: 0,
            receipts: 0,
            results: 0,
            scopes: 0,
            index_entries: 0,
            quarantined: 0,
            log: LogCheck::Absent,
            trailing_bytes,
        }
    }

    /// Whether nothing is wrong (a skipped page check is not a problem).
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty() && !matches!(self.integrity, Integrity::Failed(_))
    }

    /// Every problem: the findings, those beyond the cap, and a failed page check.
    pub fn problems(&self) -> u64 {
        self.findings.len() as u64
            + self.more_findings
            + u64::from(matches!(self.integrity, Integrity::Failed(_)))
    }
}

/// Findings, capped.
pub(crate) struct Findings {
    kept: Vec<Finding>,
    more: u64,
}

impl Findings {
    pub(crate) fn new() -> Findings {
        Findings {
            kept: Vec::new(),
            more: 0,
        }
    }

    pub(crate) fn push(&mut self, f: Finding) {
        if self.kept.len() < MAX_FINDINGS {
            self.kept.push(f);
        } else {
            self.more += 1;
        }
    }

    fn add(&mut self, table: &str, key: impl ToString, problem: impl Into<String>) {
        self.push(Finding::new(table, key, problem));
    }
}

/// Verifies the journal at `path` without modifying it: redb's page
/// checksums (when no writer has the file open), every record's CRC and decode, every index
/// against the events, the log beside the file, and what follows the journal's data. Damage
/// is reported as findings, not errors.
///
/// Memory is bounded: the tables are streamed and checked with digests or point lookups
/// (one entry per scope is held), findings are capped at [`MAX_FINDINGS`], and the page
/// check runs on a scratch of at most [`INTEGRITY_SCRATCH_BYTES`] (or is skipped, saying
/// why).
///
/// # Errors
///
/// As [`Inspector::open`] when the file cannot be opened at all (missing, not a regular file,
/// not a journal, locked, a newer format).
///
/// # Example
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("project.opj");
/// drop(opjournal::Journal::open(&path)?);
/// let report = opjournal::verify(&path)?;
/// assert!(report.is_clean(), "{report:?}");
/// # Ok::<(), opjournal::Error>(())
/// ```
pub fn verify(path: impl AsRef<Path>) -> Result<VerifyReport> {
    verify_inspected(&Inspector::open(path)?, &mut |_, _| {})
}

/// Verifies the journal an [`Inspector`] has open, as [`verify`] does, calling `progress`
/// with the events checked so far and their total.
///
/// For a journal in a database (`Inspector::open_postgres`, feature `postgres`) the
/// records and every index are checked as for a file, from one snapshot; there are no file
/// pages, log or trailing bytes to check ([`Integrity::Skipped`], [`LogCheck::Absent`]).
///
/// # Errors
///
/// [`ErrorKind::Io`] when the file cannot be read (the message names the operation);
/// [`ErrorKind::Unavailable`] when the database cannot be read to the end; damage is
/// reported as findings.
pub fn verify_inspected(
    insp: &Inspector,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<VerifyReport> {
    let integrity = match insp.access() {
        Access::Live => Integrity::Skipped(
            "a writer has the journal open; page checksums are checked when no writer has it open"
                .into(),
        ),
        // The database keeps its own pages; the records' own checks all run below.
        Access::Database => Integrity::Skipped(
            "the journal is in a database: there are no journal file pages to check (every \
             record's CRC and decode, and every index, are still checked)"
                .into(),
        ),
        _ => integrity_in_place(insp),
    };
    let mut report = VerifyReport::started(integrity, insp.trailing_bytes());
    let mut findings = Findings::new();
    if report.trailing_bytes > 0 {
        let e = insp.extent();
        findings.add(
            "(file)",
            format!("bytes {}..{}", e.journal_len(), e.file_len),
            format!(
                "{} bytes follow the journal's data: they are not part of it (readers ignore \
                 them), but a writer refuses the file until `opjournal repair` trims them",
                report.trailing_bytes
            ),
        );
    }
    let r = guarded("records", || {
        insp.with_snapshot_and_log(false, |tables, now, log| {
            report.log = check_log(insp.path(), log, &mut findings)?;

            check_tables(tables, now, &mut report, &mut findings, progress)
        })
    });
    if let Err(e) = r {
        if ends_verify(&e) {
            return Err(e);
        }
        findings.push(finding_of(&e, "(redb)", "(file)"));
    }
    report.findings = findings.kept;
    report.more_findings = findings.more;
    Ok(report)
}

/// Whether an error met while reading is not damage but the reading failing (an I/O
/// error; a database that became unreachable or dropped the snapshot): it ends `verify`
/// with that error rather than being reported as a finding.
fn ends_verify(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Io | ErrorKind::Unavailable { .. })
}

/// A finding for an error met while reading: its table and key for a damaged record, or
/// `table`/`key` for redb's own failure.
fn finding_of(e: &Error, table: &str, key: &str) -> Finding {
    match e.kind() {
        ErrorKind::Corrupt {
            table: t,
            key: k,
            detail,
        } if !t.starts_with('(') => Finding::new(t, k, detail.clone()),
        _ => Finding::new(table, key, corrupt_detail(e)),
    }
}

/// Runs the passes once with the cross-checks counted in [`Digests`] (no point lookups);
/// when that run finds anything, or a pair of tables does not match, runs them again with
/// the point lookups, which name each problem (see `digest`).
fn check_tables<V: View>(
    t: &V,
    _now: Timestamp,
    report: &mut VerifyReport,
    findings: &mut Findings,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let mut digests = Digests::new();
    let mut quick = report.clone();
    let mut quick_findings = Findings::new();
    run_passes(
        t,
        &mut quick,
        &mut quick_findings,
        progress,
        Some(&mut digests),
    )?;
    if quick_findings.kept.is_empty() && quick_findings.more == 0 && digests.balanced() {
        *report = quick;
        return Ok(());
    }
    run_passes(t, report, findings, progress, None)
}

/// The passes, in order; with `fast`, the cross-checks between tables are counted in it
/// instead of looked up.
fn run_passes<V: View>(
    t: &V,
    report: &mut VerifyReport,
    findings: &mut Findings,
    progress: &mut dyn FnMut(u64, u64),
    mut fast: Option<&mut Digests>,
) -> Result<()> {
    report.quarantined =
        pass("quarantine", findings, |_| t.count::<index::Quarantine>())?.unwrap_or_default();
    let state = check_meta(t, findings);
    let mut scopes: BTreeMap<String, ScopeState> = BTreeMap::new();
    pass("events", findings, |findings| {
        check_events(
            t,
            state.as_ref(),
            &mut scopes,
            report,
            findings,
            progress,
            fast.as_deref_mut(),
        )
    })?;
    pass("receipts", findings, |findings| {
        check_receipts(t, report, findings, fast.as_deref_mut())
    })?;
    pass("op_events", findings, |findings| {
        check_op_events(t, report, findings, fast.as_deref_mut())
    })?;
    pass("results", findings, |findings| {
        check_results(t, report, findings, fast.as_deref_mut())
    })?;
    pass("timers", findings, |findings| {
        check_index::<index::Timers>(t, report, findings, fast.as_deref_mut(), |(k, due, op)| {
            Some((
                op.to_string(),
                IndexEntry::Timer(TimerKind::from_byte(*k)?, *due),
            ))
        })
    })?;
    pass("windows", findings, |findings| {
        check_index::<index::Windows>(
            t,
            report,
            findings,
            fast.as_deref_mut(),
            |(s, deadline, op)| {
                Some((op.to_string(), IndexEntry::Window(s.to_string(), *deadline)))
            },
        )
    })?;
    pass("scope_holds", findings, |findings| {
        check_index::<index::Holds>(t, report, findings, fast.as_deref_mut(), |(scope, op)| {
            Some((op.to_string(), IndexEntry::Hold(scope.to_string())))
        })
    })?;
    pass("in_doubt", findings, |findings| {
        check_index::<index::InDoubt>(t, report, findings, fast, |op| {
            Some((op.to_string(), IndexEntry::InDoubt))
        })
    })?;
    pass("scope_timers", findings, |findings| {
        check_scope_timers(t, &scopes, report, findings)
    })?;
    pass("scopes", findings, |findings| {
        check_scopes(t, &scopes, report, findings)
    })?;
    Ok(())
}

/// Runs one pass; an error that ends it (a damaged page, a redb panic) is a
/// finding naming the table, and the next pass runs. An I/O error is not damage: it ends
/// `verify` with that error.
fn pass<T>(
    table: &str,
    findings: &mut Findings,
    f: impl FnOnce(&mut Findings) -> Result<T>,
) -> Result<Option<T>> {
    match guarded(table, || f(findings)) {
        Ok(v) => Ok(Some(v)),
        Err(e) if ends_verify(&e) || matches!(e.kind(), ErrorKind::Poisoned) => Err(e),
        Err(e) => {
            let finding = match e.kind() {
                ErrorKind::Corrupt {
                    table: t,
                    key,
                    detail,
                } if !t.starts_with('(') => Finding::new(t, key, detail.clone()),
                _ => Finding::new(
                    table,
                    "(table)",
                    format!(
                        "the table cannot be read to its end: {}",
                        corrupt_detail(&e)
                    ),
                ),
            };
            findings.push(finding);
            Ok(None)
        }
    }
}

pub(crate) fn corrupt_detail(e: &Error) -> String {
    match e.kind() {
        ErrorKind::Corrupt { detail, .. } => detail.clone(),
        _ => e.to_string(),
    }
}

pub(crate) fn describe(rec: &ReceiptRecord) -> String {
    let state = match &rec.state {
        ExecRecord::Running { lease_until } => format!("running until {lease_until}"),
        ExecRecord::InDoubt { cause, .. } => format!("in doubt ({cause:?})"),
        ExecRecord::Vacant { .. } => "released".into(),
        ExecRecord::Done(d) => format!(
            "{:?}, delivery {} x{}{}",
            d.outcome,
            d.delivery.state.name(),
            d.delivery.count,
            if d.retired_at.is_some() {
                ", retired"
            } else {
                ""
            }
        ),
    };
    format!("attempt {} epoch {}, {state}", rec.attempt, rec.epoch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Admission, Intent, Journal, Operation, Outcome};
    use redb::{ReadableTable, TableDefinition};

    const OP_EVENTS: TableDefinition<(&str, u64), ()> = TableDefinition::new("op_events");
    const RESULTS: TableDefinition<u64, &[u8]> = TableDefinition::new("results");
    const TIMERS: TableDefinition<(u8, u64, &str), ()> = TableDefinition::new("timers");
    const WINDOWS: TableDefinition<(&str, u64, &str), ()> = TableDefinition::new("windows");
    const IN_DOUBT: TableDefinition<&str, ()> = TableDefinition::new("in_doubt");

    /// A closed journal with operations in every state: results out of line and inline,
    /// acknowledged and not, released, and running when it closed (in doubt on reopen).
    fn varied(path: &Path) -> Result<()> {
        for round in 0..2 {
            let j = Journal::open(path)?;
            for i in 0..30u32 {
                let id = format!("op-{round}-{i}");
                let intent = Intent::from_json("edit", &serde_json::json!({ "i": i }))?;
                // A running operation holds its scope: those left running have their own.
                let scope = match i % 5 {
                    0 => format!("held-{id}"),
                    _ => format!("scope-{}", i % 3),
                };
                let op = Operation::new(id.as_str(), intent)
                    .scope(scope)
                    .session("tab");
                let Admission::Fresh(claim) = j.submit(op)? else {
                    panic!("{id} is new");
                };
                let big = vec![i as u8; 1024];
                match i % 5 {
                    0 => continue, // left running
                    1 => {
                        j.complete(
                            &claim,
                            Outcome::applied(u64::from(round * 100 + i) + 1, big),
                        )?;
                        j.acknowledge(&id, Some("tab"))?;
                    }
                    2 => {
                        j.complete(
                            &claim,
                            Outcome::applied(u64::from(round * 100 + i) + 1, vec![1, 2]),
                        )?;
                    }
                    3 => {
                        j.complete(
                            &claim,
                            Outcome::applied(u64::from(round * 100 + i) + 1, big),
                        )?;
                        j.delivered(&id)?;
                    }
                    _ => j.release(&claim)?,
                }
            }
        }
        // The second open marked the first round's running operations in doubt.
        drop(Journal::open(path)?);
        Ok(())
    }

    /// The first run of the passes (digests, no lookups) and the report `verify` gives.
    fn both_runs(path: &Path) -> Result<(bool, VerifyReport, VerifyReport)> {
        let insp = Inspector::open(path)?;
        // What `verify` reports before the passes run.
        let fresh = || -> Result<VerifyReport> {
            let v = verify(path)?;
            Ok(VerifyReport {
                log: v.log,
                ..VerifyReport::started(v.integrity, v.trailing_bytes)
            })
        };
        let quick = insp.with_snapshot_and_log(false, |t, _, _| {
            let mut digests = Digests::new();
            let mut report = fresh()?;
            let mut findings = Findings::new();
            run_passes(
                t,
                &mut report,
                &mut findings,
                &mut |_, _| {},
                Some(&mut digests),
            )?;
            Ok(findings.kept.is_empty() && digests.balanced())
        })?;
        let full = insp.with_snapshot_and_log(false, |t, _, _| {
            let mut report = fresh()?;
            let mut findings = Findings::new();
            run_passes(t, &mut report, &mut findings, &mut |_, _| {}, None)?;
            report.findings = findings.kept;
            Ok(report)
        })?;
        Ok((quick, verify(path)?, full))
    }

    type TimerEntry<'a> = (
        redb::AccessGuard<'a, (u8, u64, &'static str)>,
        redb::AccessGuard<'a, ()>,
    );

    /// The key of a `timers` entry, owned (the table holds some in the fixture).
    fn timer_key(entry: Option<TimerEntry<'_>>) -> (u8, u64, String) {
        let (k, _) = entry.expect("timers");
        let (kind, due, op) = k.value();
        (kind, due, op.to_string())
    }

    fn edit(path: &Path, f: impl FnOnce(&redb::WriteTransaction) -> Result<()>) -> Result<()> {
        let db = redb::Database::open(path)?;
        let txn = db.begin_write()?;
        f(&txn)?;
        txn.commit()?;
        Ok(())
    }

    #[test]
    fn verify_trusts_the_digests_only_when_the_lookups_would_find_nothing() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let clean = dir.path().join("clean.opj");
        varied(&clean)?;
        let (quick, report, full) = both_runs(&clean)?;
        assert!(quick, "a clean journal passes on the digests alone");
        assert!(report.is_clean(), "{report:?}");
        assert_eq!(report, full, "the same counts as the passes with lookups");
        assert!(report.results > 0 && report.index_entries > report.events);

        type Damage = fn(&redb::WriteTransaction) -> Result<()>;
        let damages: [(&str, Damage); 9] = [
            ("an op_events entry removed", |txn| {
                let mut t = txn.open_table(OP_EVENTS)?;
                let key = t
                    .first()?
                    .map(|(k, _)| (k.value().0.to_string(), k.value().1));
                let (op, seq) = key.expect("entries");
                t.remove((op.as_str(), seq))?;
                Ok(())
            }),
            (
                "an op_events entry naming another operation's event",
                |txn| {
                    let mut t = txn.open_table(OP_EVENTS)?;
                    let seq = t.first()?.map(|(k, _)| k.value().1).expect("entries");
                    t.insert(("op-0-1", seq), ())?;
                    Ok(())
                },
            ),
            ("an out-of-line result removed", |txn| {
                let mut t = txn.open_table(RESULTS)?;
                let seq = t.first()?.map(|(k, _)| k.value()).expect("results");
                t.remove(seq)?;
                Ok(())
            }),
            ("two results swapped between their keys", |txn| {
                let mut t = txn.open_table(RESULTS)?;
                let (a, b) = {
                    let mut it = t.iter()?;
                    let a = it.next().expect("two")?;
                    let b = it.next().expect("two")?;
                    (
                        (a.0.value(), a.1.value().to_vec()),
                        (b.0.value(), b.1.value().to_vec()),
                    )
                };
                t.insert(a.0, b.1.as_slice())?;
                t.insert(b.0, a.1.as_slice())?;
                Ok(())
            }),
            ("a timer removed", |txn| {
                let mut t = txn.open_table(TIMERS)?;
                let (kind, due, op) = timer_key(t.first()?);
                t.remove((kind, due, op.as_str()))?;
                Ok(())
            }),
            ("a timer no receipt implies", |txn| {
                txn.open_table(TIMERS)?.insert((1, 12345, "op-1-1"), ())?;
                Ok(())
            }),
            ("a timer moved to another due time", |txn| {
                let mut t = txn.open_table(TIMERS)?;
                let (kind, due, op) = timer_key(t.last()?);
                t.remove((kind, due, op.as_str()))?;
                t.insert((kind, due + 1, op.as_str()), ())?;
                Ok(())
            }),
            ("a window removed", |txn| {
                let mut t = txn.open_table(WINDOWS)?;
                let key = t.first()?.map(|(k, _)| {
                    let (s, d, op) = k.value();
                    (s.to_string(), d, op.to_string())
                });
                let (s, d, op) = key.expect("windows");
                t.remove((s.as_str(), d, op.as_str()))?;
                Ok(())
            }),
            ("an in-doubt entry for a completed operation", |txn| {
                txn.open_table(IN_DOUBT)?.insert("op-1-1", ())?;
                Ok(())
            }),
        ];
        for (i, (what, damage)) in damages.into_iter().enumerate() {
            let path = dir.path().join(format!("damaged-{i}.opj"));
            std::fs::copy(&clean, &path)?;
            edit(&path, damage)?;
            let (quick, report, full) = both_runs(&path)?;
            assert!(!quick, "{what}: the digests do not balance");
            assert!(!report.findings.is_empty(), "{what}: found");
            assert_eq!(report, full, "{what}: reported as the lookups find it");
        }
        Ok(())
    }
}
