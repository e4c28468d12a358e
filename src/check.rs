//! `verify` and `repair`: the file is input, so every record is checked, every index is
//! compared with what replaying the event journal gives, and damage is reported by table
//! and key, never by a panic.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::codec::{self, FORMAT_VERSION, RecordKind};
use crate::config::Config;
use crate::engine::{self, Ctx};
use crate::error::{Error, ErrorKind, Result};
use crate::inspect::{Access, Inspector};
use crate::intent::IntentHash;
use crate::journal::check_redb_magic;
use crate::record::{Event, EventKind, ExecRecord, FormatRecord, ReceiptRecord, StateRecord};
use crate::store::{self, ReadTables, TimerKind, View, WriteTables};

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

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Runs `f`, turning a panic inside the storage engine (which may trust a damaged file)
/// into a `Corrupt` error.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(Error::corrupt(
            "(redb)",
            what,
            format!(
                "the storage engine failed on damaged data: {}",
                panic_message(p)
            ),
        )),
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

pub(crate) fn verify_inspector(
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
        let tables = ReadTables::new(insp.handle.begin_read()?);
        let quarantined = match tables.txn().open_table(store::QUARANTINE) {
            Ok(q) => q.len()?,
            Err(_) => 0,
        };
        let mut r = verify_tables(&tables, progress)?;
        r.quarantined = quarantined;
        Ok(r)
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

fn in_memory_db() -> Result<Database> {
    Ok(redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new())?)
}

/// Checks every record of `src` and compares every index with a replay of its events.
pub(crate) fn verify_tables<V: View>(
    src: &V,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<VerifyReport> {
    let mut findings = Vec::new();
    let total = src.events_t()?.len()?;
    // Meta.
    let mut state: Option<StateRecord> = None;
    for key in ["format", "state"] {
        match src.meta_t()?.get(key)? {
            None => findings.push(Finding::new("meta", key, "missing")),
            Some(v) => {
                if key == "format" {
                    if let Err(e) = store::decode_meta::<FormatRecord>(key, v.value()) {
                        findings.push(Finding::new("meta", key, e.to_string()));
                    }
                } else {
                    match store::decode_meta::<StateRecord>(key, v.value()) {
                        Ok(s) => state = Some(s),
                        Err(e) => findings.push(Finding::new("meta", key, e.to_string())),
                    }
                }
            }
        }
    }
    // Replay the events into an in-memory journal with the same code the writer uses.
    let mem = in_memory_db()?;
    let mut events = 0u64;
    let mut max_seq = 0u64;
    let mut max_at = Timestamp(0);
    let mut last_at = Timestamp(0);
    {
        let txn = mem.begin_write()?;
        {
            let mut t = WriteTables::open(&txn)?;
            for entry in src.events_t()?.iter()? {
                let (k, v) = entry?;
                let seq = k.value();
                events += 1;
                if events.is_multiple_of(4096) {
                    progress(events, total);
                }
                let ev = match store::decode_event(seq, v.value()) {
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
                if let Err(e) = engine::apply(&mut t, &ev) {
                    findings.push(Finding::new("events", seq, corrupt_detail(&e)));
                }
            }
        }
        txn.commit()?;
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
    let rebuilt = ReadTables::new(mem.begin_read()?);

    // Receipts.
    let mut receipts = 0u64;
    let mut stored_ids = BTreeSet::new();
    for entry in src.receipts_t()?.iter()? {
        let (k, v) = entry?;
        let id = k.value().to_string();
        receipts += 1;
        let stored = match store::decode_receipt(&id, v.value()) {
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
    for entry in rebuilt.receipts_t()?.iter()? {
        let (k, _) = entry?;
        if !stored_ids.contains(k.value()) {
            findings.push(Finding::new(
                "receipts",
                k.value(),
                "missing: the journal's events record this operation",
            ));
        }
    }

    // Scopes.
    let mut scopes = 0u64;
    let mut stored_scopes = BTreeSet::new();
    for entry in src.scopes_t()?.iter()? {
        let (k, v) = entry?;
        let name = k.value().to_string();
        scopes += 1;
        match store::decode_scope(&name, v.value()) {
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
    for entry in rebuilt.scopes_t()?.iter()? {
        let (k, _) = entry?;
        if !stored_scopes.contains(k.value()) {
            findings.push(Finding::new(
                "scopes",
                k.value(),
                "missing: the journal's events record this scope",
            ));
        }
    }

    // Results: each referenced payload present and matching; no orphans.
    let mut referenced: BTreeMap<u64, (String, crate::record::ResultInfo)> = BTreeMap::new();
    for entry in rebuilt.receipts_t()?.iter()? {
        let (k, v) = entry?;
        let rec = store::decode_receipt(k.value(), v.value())?;
        if let ExecRecord::Done(d) = &rec.state
            && let Some(seq) = d.result_seq
        {
            referenced.insert(seq, (rec.operation_id.clone(), d.result));
        }
    }
    let mut results = 0u64;
    let mut seen_results = BTreeSet::new();
    for entry in src.results_t()?.iter()? {
        let (k, v) = entry?;
        let seq = k.value();
        results += 1;
        seen_results.insert(seq);
        let (header, bytes) = match store::decode_result(seq, v.value()) {
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
    index_entries += compare_keys(
        "op_events",
        keys(src.op_events_t()?, |(op, seq): (&str, u64)| {
            format!("{op} @ {seq}")
        })?,
        keys(rebuilt.op_events_t()?, |(op, seq): (&str, u64)| {
            format!("{op} @ {seq}")
        })?,
        &mut findings,
    );
    let timer_key = |(kind, due, op): (u8, u64, &str)| {
        let name = TimerKind::from_byte(kind).map_or("?", TimerKind::name);
        format!("{name} {} {op}", Timestamp(due))
    };
    index_entries += compare_keys(
        "timers",
        keys(src.timers_t()?, timer_key)?,
        keys(rebuilt.timers_t()?, timer_key)?,
        &mut findings,
    );
    let scope_timer_key = |(due, seq): (u64, u64)| format!("{} event {seq}", Timestamp(due));
    index_entries += compare_keys(
        "scope_timers",
        keys(src.scope_timers_t()?, scope_timer_key)?,
        keys(rebuilt.scope_timers_t()?, scope_timer_key)?,
        &mut findings,
    );
    let window_key = |(s, due, op): (&str, u64, &str)| format!("{s} {} {op}", Timestamp(due));
    index_entries += compare_keys(
        "windows",
        keys(src.windows_t()?, window_key)?,
        keys(rebuilt.windows_t()?, window_key)?,
        &mut findings,
    );
    let hold_key = |(s, op): (&str, &str)| format!("{s} {op}");
    index_entries += compare_keys(
        "scope_holds",
        keys(src.holds_t()?, hold_key)?,
        keys(rebuilt.holds_t()?, hold_key)?,
        &mut findings,
    );
    index_entries += compare_keys(
        "in_doubt",
        keys(src.in_doubt_t()?, |op: &str| op.to_string())?,
        keys(rebuilt.in_doubt_t()?, |op: &str| op.to_string())?,
        &mut findings,
    );

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

fn corrupt_detail(e: &Error) -> String {
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

fn keys<K, T, F>(table: &T, show: F) -> Result<BTreeSet<String>>
where
    K: redb::Key + 'static,
    T: ReadableTable<K, ()>,
    F: for<'a> Fn(K::SelfType<'a>) -> String,
{
    let mut out = BTreeSet::new();
    for entry in table.iter()? {
        let (k, _) = entry?;
        out.insert(show(k.value()));
    }
    Ok(out)
}

fn compare_keys(
    table: &str,
    stored: BTreeSet<String>,
    expected: BTreeSet<String>,
    findings: &mut Vec<Finding>,
) -> u64 {
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
    stored.len() as u64
}

// ---------------------------------------------------------------------------------------
// Repair.
// ---------------------------------------------------------------------------------------

/// How [`repair`] runs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RepairOptions {
    /// Report what would be done, on a temporary copy, without touching the file.
    pub dry_run: bool,
    /// Copy the file to a backup before writing (default `true`).
    pub backup: bool,
}

impl Default for RepairOptions {
    fn default() -> Self {
        RepairOptions {
            dry_run: false,
            backup: true,
        }
    }
}

/// An operation that repair could not restore as it was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LostOperation {
    /// The operation id.
    pub operation_id: String,
    /// What it answers now (`in_doubt`, `expired`).
    pub now: String,
    /// What was lost.
    pub detail: String,
}

/// What [`repair`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RepairReport {
    /// Where the backup copy was written.
    pub backup: Option<PathBuf>,
    /// Whether this was a dry run (nothing written to the file).
    pub dry_run: bool,
    /// Whether the storage engine refused the file, so records were salvaged by scanning
    /// its bytes into a new file.
    pub salvaged: bool,
    /// Whether the storage engine's own check failed and it rolled back to its last intact
    /// commit.
    pub storage_rolled_back: bool,
    /// Whether the storage engine's page checksums failed with no intact commit to roll back
    /// to, so the records were read as they are (each still checked by its CRC) and repaired
    /// in place.
    pub page_checksums_failed: bool,
    /// Records moved to the quarantine table (they failed CRC/decode, or did not fit the
    /// history).
    pub quarantined: Vec<Finding>,
    /// Operations not restored as they were.
    pub lost: Vec<LostOperation>,
    /// Events replayed.
    pub events_replayed: u64,
    /// Receipts rebuilt.
    pub receipts_rebuilt: u64,
    /// Scopes rebuilt.
    pub scopes_rebuilt: u64,
    /// Result payloads without a receipt, removed.
    pub orphan_results_removed: u64,
}

/// Rebuilds every index of the journal at `path` from its event journal.
///
/// A backup copy is written first (unless `backup` is off). Records that fail CRC or
/// decode, and events that do not fit the history, move to the `quarantine` table.
/// Operations whose events were lost become `InDoubt` (unless their outcome survived), and
/// terminal operations whose result payload was lost answer `Expired`. When the storage
/// engine refuses the file, every CRC-valid record is salvaged by scanning the bytes into
/// a new file that replaces it (the original stays as the backup).
///
/// # Errors
///
/// [`ErrorKind::Locked`] if a writer has the file open; [`ErrorKind::NotAJournal`];
/// [`ErrorKind::Corrupt`] if nothing can be salvaged; [`ErrorKind::Io`].
pub fn repair(
    path: impl AsRef<Path>,
    options: &RepairOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<RepairReport> {
    let path = path.as_ref();
    let meta = std::fs::metadata(path).map_err(Error::io)?;
    if meta.len() == 0 {
        return Err(Error::new(ErrorKind::NotAJournal {
            path: path.to_path_buf(),
            detail: "the file is empty".into(),
        }));
    }
    let mut report = RepairReport {
        dry_run: options.dry_run,
        ..RepairReport::default()
    };
    // A dry run repairs a private copy.
    let _dry_dir;
    let target: PathBuf = if options.dry_run {
        let dir = tempfile::Builder::new()
            .prefix("opjournal-repair-")
            .tempdir()
            .map_err(Error::io)?;
        let copy = dir.path().join("journal.opj");
        std::fs::copy(path, &copy).map_err(Error::io)?;
        _dry_dir = Some(dir);
        copy
    } else {
        _dry_dir = None;
        path.to_path_buf()
    };
    let looks_like_redb = check_redb_magic(&target).is_ok();
    if looks_like_redb {
        refuse_foreign(path, &target)?;
    }
    if !options.dry_run && options.backup {
        // Refuse early if a writer holds the file, before copying it.
        if looks_like_redb {
            match redb::Builder::new()
                .set_concurrency_mode(redb::ConcurrencyMode::ExclusiveWriter)
                .open_read_only(&target)
            {
                Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                    return Err(Error::new(ErrorKind::Locked {
                        path: path.to_path_buf(),
                    }));
                }
                Ok(db) => drop(db),
                Err(_) => {}
            }
        }
        let backup = backup_path(path);
        std::fs::copy(path, &backup).map_err(Error::io)?;
        report.backup = Some(backup);
    }
    let open = |check: bool| {
        guarded("open", || {
            let mut db = redb::Builder::new().open(&target).map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => Error::new(ErrorKind::Locked {
                    path: path.to_path_buf(),
                }),
                other => Error::from(other),
            })?;
            let intact = !check || db.check_integrity().map_err(Error::from)?;
            Ok((db, intact))
        })
    };
    let mut opened = if looks_like_redb {
        open(true)
    } else {
        Err(Error::corrupt("(redb)", "(header)", "no redb signature"))
    };
    if looks_like_redb
        && let Err(e) = &opened
        && matches!(e.kind(), ErrorKind::Corrupt { .. })
        && let Ok(db) = open(false)
    {
        // The page check failed with no intact commit to roll back to (damaged pages in the
        // last commit). The records may still read one by one, each checked by its CRC:
        // repairing them in place names exactly what was damaged, which a salvage cannot.
        report.page_checksums_failed = true;
        opened = Ok(db);
    }
    match opened {
        Ok((db, intact)) => {
            report.storage_rolled_back = !intact;
            let done = guarded("repair", || repair_db(&db, &mut report, progress));
            // Close under the guard too (both found by fuzzing): a storage-engine panic
            // caught above leaves its locks poisoned, and closing a file with a damaged
            // allocator state panics on its own. The repair's commit is durable either
            // way; the next open rebuilds the allocator state from the trees.
            let _ = guarded("close", || {
                drop(db);
                Ok(())
            });
            match done {
                Ok(()) => Ok(report),
                Err(e) if matches!(e.kind(), ErrorKind::Corrupt { .. }) => {
                    salvage(path, &target, &mut report, progress)?;
                    Ok(report)
                }
                Err(e) => Err(e),
            }
        }
        Err(e) if matches!(e.kind(), ErrorKind::Locked { .. }) => Err(e),
        Err(_) => {
            salvage(path, &target, &mut report, progress)?;
            Ok(report)
        }
    }
}

/// Refuses, before anything is written, a redb database that is not a journal and a
/// journal of a newer format. A file the storage engine cannot read is left to repair.
fn refuse_foreign(path: &Path, target: &Path) -> Result<()> {
    let verdict = guarded("open", || {
        let db = match redb::Builder::new()
            .set_concurrency_mode(redb::ConcurrencyMode::ExclusiveWriter)
            .open_read_only(target)
        {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(Error::new(ErrorKind::Locked {
                    path: path.to_path_buf(),
                }));
            }
            Err(_) => return Ok(()),
        };
        let txn = db.begin_read()?;
        let names: Vec<String> = {
            use redb::TableHandle;
            txn.list_tables()?.map(|h| h.name().to_string()).collect()
        };
        if !names.iter().any(|n| n == "meta") {
            if names.is_empty() {
                return Ok(());
            }
            return Err(Error::new(ErrorKind::NotAJournal {
                path: path.to_path_buf(),
                detail: "it is a redb database without the journal's `meta` table".into(),
            }));
        }
        let meta = txn.open_table(store::META)?;
        let format = match meta.get("format")? {
            Some(v) => store::decode_meta::<FormatRecord>("format", v.value()).ok(),
            None => None,
        };
        if let Some(f) = format {
            crate::journal::check_format(path, Some(f), true)?;
        }
        Ok(())
    });
    match verdict {
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::NotAJournal { .. }
                    | ErrorKind::UnsupportedFormat { .. }
                    | ErrorKind::Locked { .. }
            ) =>
        {
            Err(e)
        }
        // Anything else is damage for repair itself to deal with.
        _ => Ok(()),
    }
}

fn backup_path(path: &Path) -> PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut n = 0u32;
    loop {
        let mut name = path.as_os_str().to_os_string();
        if n == 0 {
            name.push(format!(".{stamp}.bak"));
        } else {
            name.push(format!(".{stamp}-{n}.bak"));
        }
        let candidate = PathBuf::from(name);
        if !candidate.exists() {
            return candidate;
        }
        n += 1;
    }
}

fn quarantine(
    q: &mut redb::Table<'_, u64, &'static [u8]>,
    report: &mut RepairReport,
    table: &str,
    key: String,
    problem: String,
    raw: &[u8],
) -> Result<()> {
    let n = match q.last()? {
        Some((k, _)) => k.value() + 1,
        None => 1,
    };
    // A quarantined value: a framed record whose payload is (table, key, problem) in
    // bincode, followed by the raw bytes as they were found (like a result payload, so the
    // decode limit does not apply to them).
    let mut payload = codec::encode_payload(&(table, key.as_str(), problem.as_str()));
    payload.extend_from_slice(raw);
    q.insert(n, codec::frame(RecordKind::Quarantine, &payload).as_slice())?;
    report.quarantined.push(Finding {
        table: table.to_string(),
        key,
        problem,
    });
    Ok(())
}

fn collect_raw<K, T>(table: &T) -> Result<Vec<(K, Vec<u8>)>>
where
    K: redb::Key + 'static,
    for<'a> K::SelfType<'a>: ToOwnedKey<Owned = K>,
    T: ReadableTable<K, &'static [u8]>,
{
    let mut out = Vec::new();
    for entry in table.iter()? {
        let (k, v) = entry?;
        out.push((k.value().to_owned_key(), v.value().to_vec()));
    }
    Ok(out)
}

/// Owned forms of the key types used by the raw scans.
trait ToOwnedKey {
    type Owned;
    fn to_owned_key(&self) -> Self::Owned;
}
impl ToOwnedKey for u64 {
    type Owned = u64;
    fn to_owned_key(&self) -> u64 {
        *self
    }
}

/// Reads every raw entry of `def` and deletes the table (the caller recreates it).
fn take_table(
    txn: &redb::WriteTransaction,
    def: TableDefinition<u64, &'static [u8]>,
) -> Result<Vec<(u64, Vec<u8>)>> {
    let entries = {
        let t = txn.open_table(def)?;
        collect_raw(&t)?
    };
    txn.delete_table(def)?;
    Ok(entries)
}

fn string_keys(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    for entry in table.iter()? {
        let (k, v) = entry?;
        out.push((k.value().to_string(), v.value().to_vec()));
    }
    Ok(out)
}

const INDEX_TABLES: [&str; 8] = [
    "receipts",
    "scopes",
    "op_events",
    "timers",
    "scope_timers",
    "windows",
    "scope_holds",
    "in_doubt",
];

/// Repairs an open database in one write transaction.
fn repair_db(
    db: &Database,
    report: &mut RepairReport,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let txn = db.begin_write()?;
    let names: Vec<String> = {
        use redb::TableHandle;
        txn.list_tables()?.map(|h| h.name().to_string()).collect()
    };
    if !names.iter().any(|n| n == "meta") {
        return Err(Error::new(ErrorKind::NotAJournal {
            path: PathBuf::new(),
            detail: "it is a redb database without the journal's `meta` table".into(),
        }));
    }
    let cfg = Config::default();
    {
        // The kept tables are rewritten from their raw entries, so that no page of the old
        // tree survives: a damaged page (a flipped key, a broken page header) leaves the file
        // even when the values on it read fine.
        let old_quarantine = take_table(&txn, store::QUARANTINE)?;
        let old_events = take_table(&txn, store::EVENTS)?;
        let old_results = take_table(&txn, store::RESULTS)?;
        let old_meta = {
            let t = txn.open_table(store::META)?;
            string_keys(&t)?
        };
        txn.delete_table(store::META)?;
        let mut q = txn.open_table(store::QUARANTINE)?;
        for (n, raw) in &old_quarantine {
            q.insert(*n, raw.as_slice())?;
        }
        // What the old indexes knew, for naming operations whose events are damaged.
        let mut seq_owner: HashMap<u64, String> = HashMap::new();
        if let Ok(t) = txn.open_table(store::OP_EVENTS) {
            for entry in t.iter()? {
                let (k, _) = entry?;
                let (op, seq) = k.value();
                seq_owner.insert(seq, op.to_string());
            }
        }
        let mut stored_receipts: HashMap<String, ReceiptRecord> = HashMap::new();
        if let Ok(t) = txn.open_table(store::RECEIPTS) {
            for (id, raw) in string_keys(&t)? {
                match store::decode_receipt(&id, &raw) {
                    Ok(r) => {
                        stored_receipts.insert(id, r);
                    }
                    Err(e) => quarantine(&mut q, report, "receipts", id, corrupt_detail(&e), &raw)?,
                }
            }
        }
        if let Ok(t) = txn.open_table(store::SCOPES) {
            for (name, raw) in string_keys(&t)? {
                if let Err(e) = store::decode_scope(&name, &raw) {
                    quarantine(&mut q, report, "scopes", name, corrupt_detail(&e), &raw)?;
                }
            }
        }
        // Damaged events and results move to quarantine. A record whose key was damaged but
        // whose value is intact (its CRC covers the seq it carries) goes back under its seq.
        let mut damaged: BTreeMap<String, u32> = BTreeMap::new();
        {
            let mut events = txn.open_table(store::EVENTS)?;
            let mut misplaced = Vec::new();
            for (key, raw) in old_events {
                match store::decode_event(key, &raw) {
                    Ok(_) => {
                        events.insert(key, raw.as_slice())?;
                    }
                    Err(e) => misplaced.push((key, raw, e)),
                }
            }
            for (key, raw, e) in misplaced {
                let intact = codec::decode::<Event>(RecordKind::Event, &raw).ok();
                if let Some(ev) = &intact
                    && events.get(ev.seq)?.is_none()
                {
                    events.insert(ev.seq, raw.as_slice())?;
                    continue;
                }
                let owner = match &intact {
                    Some(ev) => ev.operation_id.clone(),
                    None => seq_owner.get(&key).cloned(),
                };
                let problem = match &owner {
                    Some(op) => format!("{} (an event of `{op}`)", corrupt_detail(&e)),
                    None => corrupt_detail(&e),
                };
                quarantine(&mut q, report, "events", key.to_string(), problem, &raw)?;
                if let Some(op) = owner {
                    *damaged.entry(op).or_default() += 1;
                }
            }
        }
        {
            let mut results = txn.open_table(store::RESULTS)?;
            let mut misplaced = Vec::new();
            for (key, raw) in old_results {
                match store::decode_result(key, &raw) {
                    Ok(_) => {
                        results.insert(key, raw.as_slice())?;
                    }
                    Err(e) => misplaced.push((key, raw, e)),
                }
            }
            for (key, raw, e) in misplaced {
                let seq = codec::unframe(RecordKind::Result, &raw)
                    .ok()
                    .and_then(|p| codec::decode_prefix::<crate::record::ResultHeader>(p).ok())
                    .map(|(h, _)| h.completed_seq);
                if let Some(seq) = seq
                    && results.get(seq)?.is_none()
                {
                    results.insert(seq, raw.as_slice())?;
                    continue;
                }
                quarantine(
                    &mut q,
                    report,
                    "results",
                    key.to_string(),
                    corrupt_detail(&e),
                    &raw,
                )?;
            }
        }
        // Meta: the format and state records, if they decode; anything else is set aside.
        {
            let mut meta = txn.open_table(store::META)?;
            let mut format_ok = false;
            for (key, raw) in old_meta {
                let checked = match key.as_str() {
                    "format" => store::decode_meta::<FormatRecord>("format", &raw).map(|_| ()),
                    "state" => store::decode_meta::<StateRecord>("state", &raw).map(|_| ()),
                    _ => Err(Error::corrupt(
                        "meta",
                        &key,
                        "not an entry of the meta table",
                    )),
                };
                match checked {
                    Ok(()) => {
                        format_ok |= key == "format";
                        meta.insert(key.as_str(), raw.as_slice())?;
                    }
                    Err(e) => quarantine(&mut q, report, "meta", key, corrupt_detail(&e), &raw)?,
                }
            }
            if !format_ok {
                meta.insert(
                    "format",
                    codec::encode(
                        RecordKind::Meta,
                        &FormatRecord {
                            format_version: u32::from(FORMAT_VERSION),
                            created_at: Timestamp(0),
                            created_by: format!("opjournal {} repair", env!("CARGO_PKG_VERSION")),
                        },
                    )
                    .as_slice(),
                )?;
            }
        }
        for name in INDEX_TABLES {
            // Deletion goes by name; the definition's types are not checked.
            txn.delete_table(TableDefinition::<&str, &[u8]>::new(name))?;
        }
        drop(q);
        let mut t = WriteTables::open(&txn)?;
        let old_state = match t.meta_t()?.get("state")? {
            Some(v) => store::decode_meta::<StateRecord>("state", v.value()).ok(),
            None => None,
        };
        // Replay.
        let events_raw = {
            use redb::ReadableTableMetadata as _;
            t.events_t()?.len()?
        };
        let mut replayed = 0u64;
        let mut max_seq = 0u64;
        let mut max_at = Timestamp(0);
        let seqs: Vec<u64> = {
            let mut v = Vec::new();
            for entry in t.events_t()?.iter()? {
                let (k, _) = entry?;
                v.push(k.value());
            }
            v
        };
        // The journal's clock never runs backwards, so an event recorded before the one
        // ahead of it does not belong to this history (verify reports it). Keep the longest
        // run of events in time order: one event with a wrong time costs that event only.
        let in_order = {
            let mut times = Vec::with_capacity(seqs.len());
            for &seq in &seqs {
                if let Some(ev) = t.event(seq)? {
                    times.push((seq, ev.at));
                }
            }
            time_ordered(&times)
        };
        let mut misfits: Vec<(u64, String, Vec<u8>, Option<String>)> = Vec::new();
        for seq in seqs {
            let Some(ev) = t.event(seq)? else { continue };
            max_seq = max_seq.max(seq);
            let owner = ev.operation_id.clone();
            if !in_order.contains(&seq) {
                let raw = codec::encode(RecordKind::Event, &ev);
                let problem = format!(
                    "recorded at {} out of time order with the events around it",
                    ev.at
                );
                misfits.push((seq, problem, raw, owner));
                continue;
            }
            max_at = max_at.max(ev.at);
            // Later events of an operation with a damaged event still apply when they fit;
            // those that do not are quarantined below.
            t.put_event(&ev)?;
            match engine::apply(&mut t, &ev) {
                Ok(()) => replayed += 1,
                Err(e) => {
                    let raw = codec::encode(RecordKind::Event, &ev);
                    misfits.push((seq, corrupt_detail(&e), raw, owner));
                }
            }
            if replayed.is_multiple_of(4096) {
                progress(replayed, events_raw);
            }
        }
        progress(replayed, events_raw);
        report.events_replayed = replayed;
        if !misfits.is_empty() {
            drop(t);
            let mut q = txn.open_table(store::QUARANTINE)?;
            {
                let mut events = txn.open_table(store::EVENTS)?;
                let mut op_events = txn.open_table(store::OP_EVENTS)?;
                for (seq, problem, raw, owner) in &misfits {
                    quarantine(
                        &mut q,
                        report,
                        "events",
                        seq.to_string(),
                        problem.clone(),
                        raw,
                    )?;
                    events.remove(*seq)?;
                    if let Some(op) = owner {
                        op_events.remove((op.as_str(), *seq))?;
                        *damaged.entry(op.clone()).or_default() += 1;
                    }
                }
            }
            drop(q);
            t = WriteTables::open(&txn)?;
        }
        let mut state = StateRecord {
            clock_high_water: old_state
                .as_ref()
                .map_or(max_at, |s| s.clock_high_water.max(max_at)),
            next_seq: old_state
                .as_ref()
                .map_or(max_seq + 1, |s| s.next_seq.max(max_seq + 1)),
        };
        let now = state.clock_high_water;
        let mut ctx = Ctx {
            t: &mut t,
            now,
            cfg: &cfg,
            state: &mut state,
            fired: Default::default(),
        };
        // Operations with damaged events: keep a surviving outcome, otherwise in doubt.
        for (op, lost) in &damaged {
            let rebuilt = ctx.t.receipt(op)?;
            if let Some(r) = &rebuilt
                && let ExecRecord::Done(_) = r.state
            {
                report.lost.push(LostOperation {
                    operation_id: op.clone(),
                    now: "kept".into(),
                    detail: format!(
                        "{lost} damaged event(s) quarantined; the recorded outcome survived, so it is kept (a delivery or acknowledgement may repeat)"
                    ),
                });
                continue;
            }
            let info = rebuilt.clone().or_else(|| stored_receipts.get(op).cloned());
            let (attempt, intent_name, intent_hash, scope, session) = match &info {
                Some(r) => (
                    r.attempt,
                    r.intent_name.clone(),
                    r.intent_hash,
                    r.scope.clone(),
                    r.session.clone(),
                ),
                None => (1, "(lost)".to_string(), IntentHash([0; 32]), None, None),
            };
            ctx.append(
                Some(op),
                EventKind::Salvaged {
                    attempt,
                    intent_name,
                    intent_hash,
                    scope,
                    session,
                    lost_events: *lost,
                },
            )?;
            report.lost.push(LostOperation {
                operation_id: op.clone(),
                now: "in_doubt".into(),
                detail: format!(
                    "{lost} damaged event(s) quarantined; its outcome is unknown, so it is in doubt until resolved"
                ),
            });
        }
        // Results: each live terminal receipt needs its payload; orphans go.
        let mut referenced = BTreeSet::new();
        let mut lost_results = Vec::new();
        let ids: Vec<String> = {
            let mut v = Vec::new();
            for entry in ctx.t.receipts_t()?.iter()? {
                let (k, _) = entry?;
                v.push(k.value().to_string());
            }
            v
        };
        for id in &ids {
            let Some(rec) = ctx.t.receipt(id)? else {
                continue;
            };
            if let ExecRecord::Done(d) = &rec.state
                && let Some(seq) = d.result_seq
            {
                let ok = match ctx.t.results_t()?.get(seq)? {
                    Some(v) => match store::decode_result(seq, v.value()) {
                        Ok((h, bytes)) => {
                            h.operation_id == *id
                                && bytes.len() as u64 == d.result.len
                                && crc32fast::hash(&bytes) == d.result.crc32
                        }
                        Err(_) => false,
                    },
                    None => false,
                };
                if ok {
                    referenced.insert(seq);
                } else {
                    lost_results.push((id.clone(), seq));
                }
            }
        }
        for (id, seq) in lost_results {
            ctx.t.delete_result(seq)?;
            ctx.append(Some(&id), EventKind::Retired)?;
            report.lost.push(LostOperation {
                operation_id: id,
                now: "expired".into(),
                detail: "its result payload was damaged or missing; the outcome and revisions are kept and it answers as expired".into(),
            });
        }
        let result_keys: Vec<u64> = {
            let mut v = Vec::new();
            for entry in ctx.t.results_t()?.iter()? {
                let (k, _) = entry?;
                v.push(k.value());
            }
            v
        };
        for seq in result_keys {
            if !referenced.contains(&seq) {
                ctx.t.delete_result(seq)?;
                report.orphan_results_removed += 1;
            }
        }
        let state = ctx.state.clone();
        t.put_state(&state)?;
        report.receipts_rebuilt = t.receipts_t()?.len()?;
        report.scopes_rebuilt = t.scopes_t()?.len()?;
    }
    txn.commit()?;
    Ok(())
}

/// The seqs of the longest run of `events` (in seq order) whose times never decrease
/// (patience sorting, `O(n log n)`).
fn time_ordered(events: &[(u64, Timestamp)]) -> BTreeSet<u64> {
    // tails[k]: the event ending the best run of length k + 1 found so far.
    let mut tails: Vec<usize> = Vec::new();
    let mut prev: Vec<Option<usize>> = vec![None; events.len()];
    for (i, &(_, at)) in events.iter().enumerate() {
        let k = tails.partition_point(|&j| events[j].1 <= at);
        if k > 0 {
            prev[i] = Some(tails[k - 1]);
        }
        if k == tails.len() {
            tails.push(i);
        } else {
            tails[k] = i;
        }
    }
    let mut keep = BTreeSet::new();
    let mut cur = tails.last().copied();
    while let Some(i) = cur {
        keep.insert(events[i].0);
        cur = prev[i];
    }
    keep
}

/// Scans raw bytes for framed records whose CRC holds.
pub(crate) fn scan_frames(bytes: &[u8]) -> Vec<(RecordKind, &[u8])> {
    let mut out = Vec::new();
    let mut i = 0usize;
    while i + codec::HEADER_LEN <= bytes.len() {
        if bytes[i] == codec::MAGIC[0]
            && bytes[i + 1] == codec::MAGIC[1]
            && bytes[i + 2] >= 1
            && bytes[i + 2] <= FORMAT_VERSION
            && let Some(kind) = RecordKind::from_byte(bytes[i + 3])
        {
            let len = u32::from_le_bytes([bytes[i + 4], bytes[i + 5], bytes[i + 6], bytes[i + 7]])
                as usize;
            let end = i + codec::HEADER_LEN + len;
            if end <= bytes.len() && codec::unframe(kind, &bytes[i..end]).is_ok() {
                out.push((kind, &bytes[i..end]));
                i = end;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// Salvages every CRC-valid event and result of `source` into a new journal that
/// replaces `dest` (`dest` is `source`, or its dry-run copy).
fn salvage(
    original: &Path,
    dest: &Path,
    report: &mut RepairReport,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let bytes = std::fs::read(dest).map_err(Error::io)?;
    let mut events: BTreeMap<u64, Event> = BTreeMap::new();
    let mut results: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for (kind, frame) in scan_frames(&bytes) {
        match kind {
            RecordKind::Event => {
                if let Ok(payload) = codec::unframe(kind, frame)
                    && let Ok(ev) = codec::decode_payload::<Event>(payload)
                {
                    events.entry(ev.seq).or_insert(ev);
                }
            }
            RecordKind::Result => {
                if let Ok(payload) = codec::unframe(kind, frame)
                    && let Ok((h, _)) = codec::decode_prefix::<crate::record::ResultHeader>(payload)
                {
                    results
                        .entry(h.completed_seq)
                        .or_insert_with(|| frame.to_vec());
                }
            }
            _ => {}
        }
    }
    if events.is_empty() {
        return Err(Error::corrupt(
            "(file)",
            original.display(),
            "the storage engine refuses the file and no intact event could be salvaged from its bytes",
        ));
    }
    report.salvaged = true;
    let mut tmp_name = dest.as_os_str().to_os_string();
    tmp_name.push(".salvage");
    let tmp = PathBuf::from(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    {
        let db = redb::Builder::new().create(&tmp)?;
        let txn = db.begin_write()?;
        {
            let mut t = WriteTables::open(&txn)?;
            t.put_format(&FormatRecord {
                format_version: u32::from(FORMAT_VERSION),
                created_at: Timestamp(0),
                created_by: format!("opjournal {} salvage", env!("CARGO_PKG_VERSION")),
            })?;
            let max_seq = events.keys().next_back().copied().unwrap_or(0);
            let max_at = events.values().map(|e| e.at).max().unwrap_or(Timestamp(0));
            t.put_state(&StateRecord {
                clock_high_water: max_at,
                next_seq: max_seq + 1,
            })?;
            for ev in events.values() {
                t.put_event(ev)?;
            }
            // `t` holds the results table open; redb refuses to open it twice.
            drop(t);
            let mut rt = txn.open_table(store::RESULTS)?;
            for (seq, frame) in &results {
                rt.insert(*seq, frame.as_slice())?;
            }
        }
        txn.commit()?;
        repair_db(&db, report, progress)?;
    }
    std::fs::rename(&tmp, dest).map_err(Error::io)?;
    Ok(())
}
