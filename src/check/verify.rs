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
//! Findings are capped at [`MAX_FINDINGS`] (the rest are counted). Besides the records, the
//! log beside the file is checked ([`LogCheck`]), bytes appended after the journal are a
//! finding (a writer refuses such a file; `repair` trims them), and redb's page
//! checksums are checked on a scratch in memory, never on a copy of the file.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::error::{Error, ErrorKind, Result};
use crate::index::{self, IndexEntry, Layered, Table, TableKey, TimerKind, View};
use crate::inspect::{Access, Inspector, LogRead};
use crate::log::FileLog;
use crate::machine::{self};
use crate::preflight::guarded;
use crate::preflight::reading::Locks;
use crate::record::{Event, EventKind, ExecRecord, OutcomeKind, ReceiptRecord, ResolvedAs};

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

/// Runs redb's page checksum check on a scratch over the file (its writes kept
/// in memory, the file untouched and never copied).
fn integrity_in_place(insp: &Inspector) -> Integrity {
    let path = insp.path();
    let len = insp.extent().journal_len();
    let r = guarded("integrity", || {
        // This process already holds the file through the inspector, which excludes writers:
        // the scratch takes no locks of its own.
        let mut db = crate::inspect::open_scratch(path, len, INTEGRITY_SCRATCH_BYTES, Locks::Skip)
            .map_err(|e| scratch_error(e.into()))?;
        let ok = db.check_integrity().map_err(|e| scratch_error(e.into()));
        crate::preflight::close_unwritten(db);
        ok
    });
    match r {
        Ok(true) => Integrity::Passed,
        Ok(false) => Integrity::Failed(
            "page checksums failed; the storage engine can roll back to the last intact commit \
             (run `opjournal repair`)"
                .into(),
        ),
        Err(e) if is_scratch_limit(&e) => Integrity::Skipped(format!(
            "checking the page checksums in place needs more than {} MiB of memory (every \
             record's CRC is still checked)",
            INTEGRITY_SCRATCH_BYTES >> 20
        )),
        Err(e) if matches!(e.kind(), ErrorKind::Io) => {
            Integrity::Skipped(format!("{e} (every record's CRC is still checked)"))
        }
        Err(e) => Integrity::Failed(corrupt_detail(&e)),
    }
}

fn scratch_error(e: redb::Error) -> Error {
    match e {
        redb::Error::Io(io) if io.kind() == std::io::ErrorKind::OutOfMemory => Error::io_while(
            "check the page checksums in memory",
            "nothing was changed",
            io,
        ),
        other => Error::from(other),
    }
}

fn is_scratch_limit(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Io)
        && std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|io| io.kind() == std::io::ErrorKind::OutOfMemory)
}

/// Verifies the journal at `path` without modifying it: redb's page
/// checksums (when no writer has the file open), every record's CRC and decode, every index
/// against the events, the log beside the file, and what follows the journal's data. Damage
/// is reported as findings, not errors.
///
/// Memory is bounded: the tables are streamed and checked with point lookups (one entry per
/// scope is held), findings are capped at [`MAX_FINDINGS`], and the page check runs on a
/// scratch of at most [`INTEGRITY_SCRATCH_BYTES`] (or is skipped, saying why).
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
/// # Errors
///
/// [`ErrorKind::Io`] when the file cannot be read (the message names the operation); damage
/// is reported as findings.
pub fn verify_inspected(
    insp: &Inspector,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<VerifyReport> {
    let integrity = match insp.access() {
        Access::Live => Integrity::Skipped(
            "a writer has the journal open; page checksums are checked when no writer has it open"
                .into(),
        ),
        _ => integrity_in_place(insp),
    };
    let mut report = VerifyReport {
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
        trailing_bytes: insp.trailing_bytes(),
    };
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
        if matches!(e.kind(), ErrorKind::Io) {
            return Err(e);
        }
        findings.push(finding_of(&e, "(redb)", "(file)"));
    }
    report.findings = findings.kept;
    report.more_findings = findings.more;
    Ok(report)
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

/// What the log holds, as findings: a damaged record with valid records after it (which
/// recovery drops), a damaged header with records after it (which a writer's open
/// discards), records whose changes do not decode (a writer's open refuses them). A log of
/// another cycle or journal is not damage.
fn check_log(journal: &Path, log: &LogRead, findings: &mut Findings) -> Result<LogCheck> {
    let log_path = FileLog::path_for(journal);
    let key = log_path.display().to_string();
    let (cursor, records, header_problem, undecodable, len) = match log {
        LogRead::Absent => return Ok(LogCheck::Absent),
        LogRead::NoCycle => {
            return Ok(LogCheck::Ignored {
                reason: "the journal is of format 1, which keeps no log".into(),
            });
        }
        LogRead::Read {
            cursor,
            records,
            header_problem,
            undecodable,
            len,
            ..
        } => (*cursor, *records, header_problem, undecodable, *len),
    };
    let Some(file) = FileLog::open_read_only(&log_path)
        .map_err(|e| Error::io_while("open the journal's log", "nothing was read or changed", e))?
    else {
        return Ok(LogCheck::Absent);
    };
    let read = |ops: &mut std::collections::BTreeSet<String>| {
        crate::log::dropped(&file, cursor, |r| -> Result<()> {
            super::ops_of_log_record(r.payload, ops);
            Ok(())
        })
        .map_err(|e| {
            e.while_doing(
                "read the journal's log",
                "nothing was changed: check the disk and try again",
            )
        })
    };
    let mut dropped_ops = std::collections::BTreeSet::new();
    let mut dropped = read(&mut dropped_ops)?;
    if dropped.damaged.is_some() || dropped.length.is_some() {
        // A writer may be in the middle of writing the record (or growing the file): damage
        // is what reads the same a moment later.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut again_ops = std::collections::BTreeSet::new();
        let again = read(&mut again_ops)?;
        if again != dropped {
            dropped = again;
            dropped_ops = again_ops;
        }
    }
    let named = |ops: &std::collections::BTreeSet<String>| {
        if ops.is_empty() {
            String::new()
        } else {
            let mut list: Vec<String> = ops.iter().take(20).map(|o| format!("`{o}`")).collect();
            if ops.len() > 20 {
                list.push(format!("and {} more", ops.len() - 20));
            }
            format!(" (changes to {})", list.join(", "))
        }
    };
    if dropped.header_damaged {
        findings.add(
            "log",
            &key,
            format!(
                "the log's header is damaged, and {} record(s) of the current cycle follow it{}: \
                 a writer's open would discard them; run `opjournal repair`",
                dropped.records,
                named(&dropped_ops)
            ),
        );
    } else if let Some((lsn, why)) = &dropped.damaged {
        findings.add(
            "log",
            format!("record {lsn}"),
            format!(
                "damaged: {why}. A crash cannot leave a record so: it was synced, and \
                 recovery drops it{}{}; run `opjournal repair`, which names the operations \
                 they changed",
                and_after(dropped.records),
                named(&dropped_ops)
            ),
        );
    }
    if let Some(problem) = &dropped.length {
        findings.add("log", &key, format!("{problem}; run `opjournal repair`"));
    }
    if let Some((lsn, detail)) = undecodable {
        findings.add(
            "log",
            format!("record {lsn}"),
            format!(
                "its changes do not decode ({detail}): a writer cannot open the journal; run \
                 `opjournal repair`"
            ),
        );
    }
    if let Some(problem) = header_problem
        && !dropped.header_damaged
    {
        return Ok(LogCheck::Ignored {
            reason: format!("{problem}: it is not this journal's current log"),
        });
    }
    if records == 0 && undecodable.is_none() && dropped.damaged.is_none() {
        return Ok(LogCheck::Ignored {
            reason: "it holds no record of the current cycle (left by an earlier one, whose \
                     records are in the file)"
                .into(),
        });
    }
    Ok(LogCheck::Current {
        records,
        bytes: len,
    })
}

/// " and the N valid record(s) after it", or nothing when none follow.
pub(super) fn and_after(records: u64) -> String {
    match records {
        0 => String::new(),
        1 => " and the valid record after it".into(),
        n => format!(" and the {n} valid records after it"),
    }
}

/// How the scopes' revisions stand while the events are followed in order.
struct ScopeState {
    record: crate::record::ScopeRecord,
    /// The anchor's purge time, when the anchor is a revision event (which gets a scope timer
    /// when another event takes over).
    anchor_purge: Option<Timestamp>,
}

fn check_tables<V: View>(
    t: &V,
    _now: Timestamp,
    report: &mut VerifyReport,
    findings: &mut Findings,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    report.quarantined =
        pass("quarantine", findings, |_| t.count::<index::Quarantine>())?.unwrap_or_default();
    let state = check_meta(t, findings);
    let total = t.count::<index::Events>().unwrap_or_default();
    let mut scopes: BTreeMap<String, ScopeState> = BTreeMap::new();
    pass("events", findings, |findings| {
        check_events(
            t,
            state.as_ref(),
            &mut scopes,
            report,
            findings,
            total,
            progress,
        )
    })?;
    pass("receipts", findings, |findings| {
        check_receipts(t, report, findings)
    })?;
    pass("op_events", findings, |findings| {
        check_op_events(t, report, findings)
    })?;
    pass("results", findings, |findings| {
        check_results(t, report, findings)
    })?;
    pass("timers", findings, |findings| {
        check_index::<index::Timers>(t, report, findings, |(k, due, op)| {
            Some((
                op.clone(),
                IndexEntry::Timer(TimerKind::from_byte(*k)?, *due),
            ))
        })
    })?;
    pass("windows", findings, |findings| {
        check_index::<index::Windows>(t, report, findings, |(s, deadline, op)| {
            Some((op.clone(), IndexEntry::Window(s.clone(), *deadline)))
        })
    })?;
    pass("scope_holds", findings, |findings| {
        check_index::<index::Holds>(t, report, findings, |(scope, op)| {
            Some((op.clone(), IndexEntry::Hold(scope.clone())))
        })
    })?;
    pass("in_doubt", findings, |findings| {
        check_index::<index::InDoubt>(t, report, findings, |op| {
            Some((op.clone(), IndexEntry::InDoubt))
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
        Err(e) if matches!(e.kind(), ErrorKind::Io | ErrorKind::Poisoned) => Err(e),
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

fn check_meta<V: View>(t: &V, findings: &mut Findings) -> Option<crate::record::StateRecord> {
    let mut state = None;
    for key in ["format", "state", "checkpoint"] {
        let got = match t.get::<index::Meta>(&key.to_string()) {
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
    state
}

/// The receipt an operation's events fold into, up to and including `upto`; the error names
/// the event that does not fit.
fn fold<V: View>(
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

fn check_events<V: View>(
    t: &V,
    state: Option<&crate::record::StateRecord>,
    scopes: &mut BTreeMap<String, ScopeState>,
    report: &mut VerifyReport,
    findings: &mut Findings,
    total: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
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
            let key = (op.clone(), seq);
            match t.get::<index::OpEvents>(&key)? {
                Some(()) => {}
                None => findings.add(
                    "op_events",
                    key.show(),
                    format!("missing index entry: event {seq} of `{op}`"),
                ),
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

pub(crate) fn index_key(op: &str, e: &IndexEntry) -> (&'static str, String) {
    let op = op.to_string();
    match e {
        IndexEntry::Timer(kind, due) => ("timers", (*kind as u8, *due, op).show()),
        IndexEntry::Window(s, d) => ("windows", (s.clone(), *d, op).show()),
        IndexEntry::Hold(scope) => ("scope_holds", (scope.clone(), op).show()),
        IndexEntry::InDoubt => ("in_doubt", op),
    }
}

fn index_present<V: Layered>(t: &V, op: &str, e: &IndexEntry) -> Result<bool> {
    let op = op.to_string();
    Ok(match e {
        IndexEntry::Timer(kind, due) => t.get::<index::Timers>(&(*kind as u8, *due, op))?,
        IndexEntry::Window(s, d) => t.get::<index::Windows>(&(s.clone(), *d, op))?,
        IndexEntry::Hold(scope) => t.get::<index::Holds>(&(scope.clone(), op))?,
        IndexEntry::InDoubt => t.get::<index::InDoubt>(&op)?,
    }
    .is_some())
}

fn check_receipts<V: View>(
    t: &V,
    report: &mut VerifyReport,
    findings: &mut Findings,
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
            if !index_present(t, &id, &e)? {
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
                Some(_) => inline.map(|r| (id.clone(), r.changed_assets, r.bytes)),
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
                    Some(_) => ("receipts", id.clone()),
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

fn check_op_events<V: View>(
    t: &V,
    report: &mut VerifyReport,
    findings: &mut Findings,
) -> Result<()> {
    let mut last_op: Option<String> = None;
    for entry in t.all::<index::OpEvents>()? {
        let ((op, seq), ()) = entry?;
        report.index_entries += 1;
        let implied = match t.get::<index::Events>(&seq)? {
            Some(raw) => match index::decode_event(seq, &raw) {
                Ok(ev) => ev.operation_id.as_deref() == Some(op.as_str()),
                // Reported by the events pass.
                Err(_) => true,
            },
            None => false,
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

fn check_results<V: View>(t: &V, report: &mut VerifyReport, findings: &mut Findings) -> Result<()> {
    for entry in t.all::<index::Results>()? {
        let (seq, raw) = entry?;
        report.results += 1;
        let header = match index::decode_result(seq, &raw) {
            Ok((h, _)) => h,
            Err(e) => {
                findings.add("results", seq, corrupt_detail(&e));
                continue;
            }
        };
        let op = &header.operation_id;
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
fn check_index<T: Table<V = ()>>(
    t: &impl View,
    report: &mut VerifyReport,
    findings: &mut Findings,
    entry_of: impl Fn(&T::K) -> Option<(String, IndexEntry)>,
) -> Result<()> {
    for entry in t.all::<T>()? {
        let (key, ()) = entry?;
        report.index_entries += 1;
        let implied = match entry_of(&key) {
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

fn check_scope_timers<V: View>(
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

fn check_scopes<V: View>(
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
