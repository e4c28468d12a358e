//! `verify`: every record checked, every index compared with a replay of the events.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::engine::{self};
use crate::error::{Error, ErrorKind, Result};
use crate::index::{self, Layered, Layers, Table, TableKey, View, WriteTables, guarded};
use crate::inspect::{Access, Inspector};
use crate::record::{ExecRecord, ReceiptRecord, StateRecord};

/// One problem found in the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// The table (or `(redb)` for the storage engine's own structures).
    pub table: String,
    /// The key or sequence number.
    pub key: String,
    /// What is wrong.
    pub problem: String,
}

impl Finding {
    fn new(table: &str, key: impl ToString, problem: impl Into<String>) -> Finding {
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

/// The storage engine's page-level check.
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

/// What `verify` found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct VerifyReport {
    /// The storage engine's page checksums.
    pub integrity: Integrity,
    /// Every problem, naming table and key.
    pub findings: Vec<Finding>,
    /// Events checked.
    pub events: u64,
    /// Receipts checked.
    pub receipts: u64,
    /// Result payloads checked.
    pub results: u64,
    /// Scopes checked.
    pub scopes: u64,
    /// Index entries compared.
    pub index_entries: u64,
    /// Records that an earlier `repair` moved to the quarantine table.
    pub quarantined: u64,
}

impl VerifyReport {
    /// Whether nothing is wrong (a skipped page check is not a problem).
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty() && !matches!(self.integrity, Integrity::Failed(_))
    }
}

/// Runs redb's page checksum check on a copy of `path`.
fn integrity_of_copy(path: &Path) -> Integrity {
    let r = guarded("integrity", || {
        let dir = tempfile::Builder::new()
            .prefix("opjournal-verify-")
            .tempdir()
            .map_err(Error::io)?;
        let copy = dir.path().join("journal.opj");
        std::fs::copy(path, &copy).map_err(Error::io)?;
        let mut db = redb::Builder::new().create(&copy).map_err(Error::from)?;
        db.check_integrity().map_err(Error::from)
    });
    match r {
        Ok(true) => Integrity::Passed,
        Ok(false) => Integrity::Failed(
            "page checksums failed; the storage engine can roll back to the last intact commit (run `opjournal repair`)".into(),
        ),
        Err(e) => Integrity::Failed(e.to_string()),
    }
}

/// Verifies the journal at `path` without modifying it: the storage engine's page
/// checksums (when no writer has the file open), every record's CRC and decode, and every
/// index against a replay of the event journal. Damage is reported as findings, not errors.
///
/// # Errors
///
/// As [`Inspector::open`] when the file cannot be opened at all (missing, not a journal,
/// locked, a newer format).
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
/// [`ErrorKind::Io`] when the file cannot be read at all; damage is reported as findings.
pub fn verify_inspected(
    insp: &Inspector,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<VerifyReport> {
    let integrity = match insp.access() {
        Access::Live => Integrity::Skipped(
            "a writer has the journal open; page checksums are checked when no writer has it open"
                .into(),
        ),
        Access::Idle | Access::RecoveredCopy => integrity_of_copy(insp.path()),
    };
    let mut report = match guarded("records", || {
        insp.with_snapshot(|tables, _| {
            let mut r = verify_tables(tables, progress)?;
            r.quarantined = tables.count::<index::Quarantine>()?;
            Ok(r)
        })
    }) {
        Ok(r) => r,
        Err(e) => VerifyReport {
            integrity: Integrity::Skipped(String::new()),
            findings: vec![Finding::new("(redb)", "(file)", e.to_string())],
            events: 0,
            receipts: 0,
            results: 0,
            scopes: 0,
            index_entries: 0,
            quarantined: 0,
        },
    };
    report.integrity = integrity;
    Ok(report)
}

/// Checks every record of `src` and compares every index with a replay of its events.
pub(crate) fn verify_tables<V: View>(
    src: &V,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<VerifyReport> {
    let mut findings = Vec::new();
    let total = src.count::<index::Events>()?;
    // Meta.
    let mut state: Option<StateRecord> = None;
    for key in ["format", "state"] {
        match src.get::<index::Meta>(&key.to_string())? {
            None => findings.push(Finding::new("meta", key, "missing")),
            Some(v) => {
                if key == "format" {
                    if let Err(e) = index::decode_format(&v) {
                        findings.push(Finding::new("meta", key, e.to_string()));
                    }
                } else {
                    match index::decode_meta::<StateRecord>(key, &v) {
                        Ok(s) => state = Some(s),
                        Err(e) => findings.push(Finding::new("meta", key, e.to_string())),
                    }
                }
            }
        }
    }
    // Replay the events in memory with the same code the writer uses.
    let mut rebuilt = WriteTables::over(None, Layers::default());
    let mut events = 0u64;
    let mut max_seq = 0u64;
    let mut max_at = Timestamp(0);
    let mut last_at = Timestamp(0);
    {
        {
            let t = &mut rebuilt;
            for entry in src.all::<index::Events>()? {
                let (seq, v) = entry?;
                events += 1;
                if events.is_multiple_of(4096) {
                    progress(events, total);
                }
                let ev = match index::decode_event(seq, &v) {
                    Ok(ev) => ev,
                    Err(e) => {
                        findings.push(Finding::new("events", seq, corrupt_detail(&e)));
                        continue;
                    }
                };
                max_seq = max_seq.max(seq);
                max_at = max_at.max(ev.at);
                if ev.at < last_at {
                    findings.push(Finding::new(
                        "events",
                        seq,
                        format!(
                            "recorded at {} before the previous event ({last_at})",
                            ev.at
                        ),
                    ));
                }
                last_at = ev.at;
                t.put_event(&ev)?;
                if let Err(e) = engine::apply(t, &ev) {
                    findings.push(Finding::new("events", seq, corrupt_detail(&e)));
                }
            }
        }
    }
    progress(events, total);
    if let Some(s) = &state {
        if events > 0 && s.next_seq <= max_seq {
            findings.push(Finding::new(
                "meta",
                "state",
                format!(
                    "next sequence {} is not after the last event {max_seq}",
                    s.next_seq
                ),
            ));
        }
        if s.clock_high_water < max_at {
            findings.push(Finding::new(
                "meta",
                "state",
                format!(
                    "clock high-water mark {} is before the last event ({max_at})",
                    s.clock_high_water
                ),
            ));
        }
    }

    // Receipts.
    let mut receipts = 0u64;
    let mut stored_ids = BTreeSet::new();
    for entry in src.all::<index::Receipts>()? {
        let (k, v) = entry?;
        let id = k.clone();
        receipts += 1;
        let stored = match index::decode_receipt(&id, &v) {
            Ok(r) => r,
            Err(e) => {
                findings.push(Finding::new("receipts", &id, corrupt_detail(&e)));
                stored_ids.insert(id);
                continue;
            }
        };
        match rebuilt.receipt(&id)? {
            None => findings.push(Finding::new(
                "receipts",
                &id,
                "no event of the journal creates this receipt",
            )),
            Some(expected) if expected != stored => findings.push(Finding::new(
                "receipts",
                &id,
                format!(
                    "stored receipt ({}) differs from the journal's replay ({})",
                    describe(&stored),
                    describe(&expected)
                ),
            )),
            Some(_) => {}
        }
        stored_ids.insert(id);
    }
    for entry in rebuilt.all::<index::Receipts>()? {
        let (k, _) = entry?;
        if !stored_ids.contains(&k) {
            findings.push(Finding::new(
                "receipts",
                &k,
                "missing: the journal's events record this operation",
            ));
        }
    }

    // Scopes.
    let mut scopes = 0u64;
    let mut stored_scopes = BTreeSet::new();
    for entry in src.all::<index::Scopes>()? {
        let (k, v) = entry?;
        let name = k.clone();
        scopes += 1;
        match index::decode_scope(&name, &v) {
            Err(e) => findings.push(Finding::new("scopes", &name, corrupt_detail(&e))),
            Ok(stored) => match rebuilt.scope(&name)? {
                None => findings.push(Finding::new("scopes", &name, "no event records this scope")),
                Some(exp) if exp != stored => findings.push(Finding::new(
                    "scopes",
                    &name,
                    format!(
                        "stored revision {} (event {}) differs from the journal's replay: revision {} (event {})",
                        stored.revision, stored.anchor_seq, exp.revision, exp.anchor_seq
                    ),
                )),
                Some(_) => {}
            },
        }
        stored_scopes.insert(name);
    }
    for entry in rebuilt.all::<index::Scopes>()? {
        let (k, _) = entry?;
        if !stored_scopes.contains(&k) {
            findings.push(Finding::new(
                "scopes",
                &k,
                "missing: the journal's events record this scope",
            ));
        }
    }

    // Results: each referenced payload present and matching; no orphans.
    let mut referenced: BTreeMap<u64, (String, crate::record::ResultInfo)> = BTreeMap::new();
    for entry in rebuilt.all::<index::Receipts>()? {
        let (k, v) = entry?;
        let rec = index::decode_receipt(&k, &v)?;
        if let ExecRecord::Done(d) = &rec.state
            && let Some(seq) = d.result_seq
        {
            referenced.insert(seq, (rec.operation_id.clone(), d.result));
        }
    }
    let mut results = 0u64;
    let mut seen_results = BTreeSet::new();
    for entry in src.all::<index::Results>()? {
        let (k, v) = entry?;
        let seq = k;
        results += 1;
        seen_results.insert(seq);
        let (header, bytes) = match index::decode_result(seq, &v) {
            Ok(r) => r,
            Err(e) => {
                findings.push(Finding::new("results", seq, corrupt_detail(&e)));
                continue;
            }
        };
        match referenced.get(&seq) {
            None => findings.push(Finding::new(
                "results",
                seq,
                format!(
                    "orphan result of `{}`: no live receipt refers to it",
                    header.operation_id
                ),
            )),
            Some((op, info)) => {
                if &header.operation_id != op {
                    findings.push(Finding::new(
                        "results",
                        seq,
                        format!(
                            "belongs to `{}` but `{op}` refers to it",
                            header.operation_id
                        ),
                    ));
                } else if bytes.len() as u64 != info.len
                    || crc32fast::hash(&bytes) != info.crc32
                    || header.changed_assets.len() as u32 != info.assets
                {
                    findings.push(Finding::new(
                        "results",
                        seq,
                        format!(
                            "payload of `{op}` does not match its completion event ({} bytes, crc {:08x}; expected {} bytes, crc {:08x})",
                            bytes.len(),
                            crc32fast::hash(&bytes),
                            info.len,
                            info.crc32
                        ),
                    ));
                }
            }
        }
    }
    for (seq, (op, _)) in &referenced {
        if !seen_results.contains(seq) {
            findings.push(Finding::new(
                "results",
                seq,
                format!("missing: the result of `{op}` is not stored"),
            ));
        }
    }

    // Pure indexes: exactly the entries the replay implies.
    let mut index_entries = 0u64;
    index_entries += compare_keys::<index::OpEvents>(src, &rebuilt, &mut findings)?;
    index_entries += compare_keys::<index::Timers>(src, &rebuilt, &mut findings)?;
    index_entries += compare_keys::<index::ScopeTimers>(src, &rebuilt, &mut findings)?;
    index_entries += compare_keys::<index::Windows>(src, &rebuilt, &mut findings)?;
    index_entries += compare_keys::<index::Holds>(src, &rebuilt, &mut findings)?;
    index_entries += compare_keys::<index::InDoubt>(src, &rebuilt, &mut findings)?;

    Ok(VerifyReport {
        integrity: Integrity::Skipped("not run".into()),
        findings,
        events,
        receipts,
        results,
        scopes,
        index_entries,
        quarantined: 0,
    })
}

pub(crate) fn corrupt_detail(e: &Error) -> String {
    match e.kind() {
        ErrorKind::Corrupt { detail, .. } => detail.clone(),
        _ => e.to_string(),
    }
}

fn describe(rec: &ReceiptRecord) -> String {
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

fn keys<T: Table<V = ()>>(v: &impl Layered) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for entry in v.all::<T>()? {
        out.insert(entry?.0.show());
    }
    Ok(out)
}

/// Compares a set-like index table of `stored` with the replay's; returns the entries
/// stored.
fn compare_keys<T: Table<V = ()>>(
    stored: &impl Layered,
    expected: &impl Layered,
    findings: &mut Vec<Finding>,
) -> Result<u64> {
    let table = T::NAME;
    let stored = keys::<T>(stored)?;
    let expected = keys::<T>(expected)?;
    for extra in stored.difference(&expected) {
        findings.push(Finding::new(
            table,
            extra,
            "index entry not implied by the journal's events",
        ));
    }
    for missing in expected.difference(&stored) {
        findings.push(Finding::new(
            table,
            missing,
            "missing index entry implied by the journal's events",
        ));
    }
    Ok(stored.len() as u64)
}
