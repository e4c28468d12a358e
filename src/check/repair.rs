//! `repair`: rebuild every index from the event journal, quarantine what is damaged.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;

use crate::clock::Timestamp;
use crate::codec::{self, FORMAT_VERSION, RecordKind};
use crate::config::Config;
use crate::engine::{self, Ctx};
use crate::error::{Error, ErrorKind, Result};
use crate::index::file::{check_format, check_redb_magic};
use crate::index::{self, Layered, Layers, Memtable, Table, View, WriteTables, guarded};
use crate::log::{self, FileLog};
use crate::record::Digest;
use crate::record::{
    CheckpointRecord, Event, EventKind, ExecRecord, FormatRecord, ReceiptRecord, StateRecord,
};
// ---------------------------------------------------------------------------------------
// Repair.
// ---------------------------------------------------------------------------------------

use super::salvage::salvage;
use super::verify::{Finding, corrupt_detail};

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
    /// Records of the journal's log (what was committed since the last checkpoint) written
    /// into the file before it was rebuilt. The log itself is left as it is; the repaired
    /// file starts a new cycle of it, so those records are not read again.
    pub log_records: u64,
    /// Why the log beside the file could not be used, if it holds records that could not
    /// be (their changes are then not in the repaired journal).
    pub log_not_used: Option<String>,
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
    // What was committed since the last checkpoint is in the log beside the file, not in
    // it: repair writes it in first (the log is only read).
    let log_bytes = match FileLog::open_read_only(&FileLog::path_for(path))
        .and_then(|l| l.map(|l| log::read_all(&l)).transpose())
    {
        Ok(b) => b,
        Err(e) => return Err(Error::io_during("read the journal's log", e)),
    };
    let log_bytes = log_bytes.as_deref();
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
            let done = guarded("repair", || {
                repair_db(&db, log_bytes, &mut report, progress)
            });
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
                    salvage(path, &target, log_bytes, &mut report, progress)?;
                    Ok(report)
                }
                Err(e) => Err(e),
            }
        }
        Err(e) if matches!(e.kind(), ErrorKind::Locked { .. }) => Err(e),
        Err(_) => {
            salvage(path, &target, log_bytes, &mut report, progress)?;
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
        let meta = txn.open_table(<index::Meta as Table>::def())?;
        let format = match meta.get("format")? {
            Some(v) => index::decode_meta::<FormatRecord>("format", v.value()).ok(),
            None => None,
        };
        if let Some(f) = format {
            check_format(path, Some(f), true)?;
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
pub(crate) fn repair_db(
    db: &Database,
    log_bytes: Option<&[u8]>,
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
    let next_cycle = fold_log(&txn, log_bytes, report)?;
    let cfg = Config::default();
    {
        // The kept tables are rewritten from their raw entries, so that no page of the old
        // tree survives: a damaged page (a flipped key, a broken page header) leaves the file
        // even when the values on it read fine.
        let old_quarantine = take_table(&txn, <index::Quarantine as Table>::def())?;
        let old_events = take_table(&txn, <index::Events as Table>::def())?;
        let old_results = take_table(&txn, <index::Results as Table>::def())?;
        let old_meta = {
            let t = txn.open_table(<index::Meta as Table>::def())?;
            string_keys(&t)?
        };
        txn.delete_table(<index::Meta as Table>::def())?;
        let mut q = txn.open_table(<index::Quarantine as Table>::def())?;
        for (n, raw) in &old_quarantine {
            q.insert(*n, raw.as_slice())?;
        }
        // What the old indexes knew, for naming operations whose events are damaged.
        let mut seq_owner: HashMap<u64, String> = HashMap::new();
        if let Ok(t) = txn.open_table(<index::OpEvents as Table>::def()) {
            for entry in t.iter()? {
                let (k, _) = entry?;
                let (op, seq) = k.value();
                seq_owner.insert(seq, op.to_string());
            }
        }
        let mut stored_receipts: HashMap<String, ReceiptRecord> = HashMap::new();
        if let Ok(t) = txn.open_table(<index::Receipts as Table>::def()) {
            for (id, raw) in string_keys(&t)? {
                match index::decode_receipt(&id, &raw) {
                    Ok(r) => {
                        stored_receipts.insert(id, r);
                    }
                    Err(e) => quarantine(&mut q, report, "receipts", id, corrupt_detail(&e), &raw)?,
                }
            }
        }
        if let Ok(t) = txn.open_table(<index::Scopes as Table>::def()) {
            for (name, raw) in string_keys(&t)? {
                if let Err(e) = index::decode_scope(&name, &raw) {
                    quarantine(&mut q, report, "scopes", name, corrupt_detail(&e), &raw)?;
                }
            }
        }
        // Damaged events and results move to quarantine. A record whose key was damaged but
        // whose value is intact (its CRC covers the seq it carries) goes back under its seq.
        let mut damaged: BTreeMap<String, u32> = BTreeMap::new();
        {
            let mut events = txn.open_table(<index::Events as Table>::def())?;
            let mut misplaced = Vec::new();
            for (key, raw) in old_events {
                match index::decode_event(key, &raw) {
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
            let mut results = txn.open_table(<index::Results as Table>::def())?;
            let mut misplaced = Vec::new();
            for (key, raw) in old_results {
                match index::decode_result(key, &raw) {
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
            let mut meta = txn.open_table(<index::Meta as Table>::def())?;
            let mut format_ok = false;
            for (key, raw) in old_meta {
                let checked = match key.as_str() {
                    // Of this format or of format 1 (upgraded when a writer opens it).
                    "format" => index::decode_format(&raw).map(|_| ()),
                    "state" => index::decode_meta::<StateRecord>("state", &raw).map(|_| ()),
                    // Rewritten below for the log's next cycle.
                    "checkpoint" => {
                        index::decode_meta::<CheckpointRecord>("checkpoint", &raw).map(|_| ())
                    }
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
                            upgraded: None,
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
        // The replay runs in a batch in memory, over the checked events and results; what
        // it changes is written into the transaction at the end.
        let mut t = WriteTables::over(None, Layers::default());
        let mut seqs: Vec<u64> = Vec::new();
        {
            let events = txn.open_table(<index::Events as Table>::def())?;
            for entry in events.iter()? {
                let (k, v) = entry?;
                seqs.push(k.value());
                t.put_raw::<index::Events>(k.value(), v.value().to_vec());
            }
            let results = txn.open_table(<index::Results as Table>::def())?;
            for entry in results.iter()? {
                let (k, v) = entry?;
                t.put_raw::<index::Results>(k.value(), v.value().to_vec());
            }
            let meta = txn.open_table(<index::Meta as Table>::def())?;
            for entry in meta.iter()? {
                let (k, v) = entry?;
                t.put_raw::<index::Meta>(k.value().to_string(), v.value().to_vec());
            }
        }
        let old_state = match t.get::<index::Meta>(&"state".to_string())? {
            Some(v) => index::decode_meta::<StateRecord>("state", &v).ok(),
            None => None,
        };
        // Replay.
        let events_raw = seqs.len() as u64;
        let mut replayed = 0u64;
        let mut max_seq = 0u64;
        let mut max_at = Timestamp(0);
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
            let mut q = txn.open_table(<index::Quarantine as Table>::def())?;
            for (seq, problem, raw, owner) in &misfits {
                quarantine(
                    &mut q,
                    report,
                    "events",
                    seq.to_string(),
                    problem.clone(),
                    raw,
                )?;
                t.delete_event(*seq)?;
                if let Some(op) = owner {
                    t.remove_op_event(op, *seq);
                    *damaged.entry(op.clone()).or_default() += 1;
                }
            }
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
                None => (1, "(lost)".to_string(), Digest([0; 32]), None, None),
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
            for entry in ctx.t.all::<index::Receipts>()? {
                v.push(entry?.0);
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
                let ok = match ctx.t.get::<index::Results>(&seq)? {
                    Some(v) => match index::decode_result(seq, &v) {
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
            for entry in ctx.t.all::<index::Results>()? {
                v.push(entry?.0);
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
        t.put_checkpoint(&next_cycle)?;
        report.receipts_rebuilt = t.count::<index::Receipts>()?;
        report.scopes_rebuilt = t.count::<index::Scopes>()?;
        index::checkpoint(&txn, &t.into_changes())?;
        index::create_tables(&txn)?;
    }
    txn.commit()?;
    Ok(())
}

/// Writes the log's records of the file's current cycle into `txn`, as a checkpoint
/// would, so that the repair rebuilds from everything that was committed; returns the
/// checkpoint record that starts the log's next cycle (those records are then never read
/// again). Without a readable checkpoint record the log cannot be tied to the file: it is
/// not used, and the repaired journal gets a new id (so the log is never read).
fn fold_log(
    txn: &redb::WriteTransaction,
    log_bytes: Option<&[u8]>,
    report: &mut RepairReport,
) -> Result<CheckpointRecord> {
    let current = {
        let meta = txn.open_table(<index::Meta as Table>::def())?;
        let raw = meta.get("checkpoint")?.map(|v| v.value().to_vec());
        raw.and_then(|raw| index::decode_meta::<CheckpointRecord>("checkpoint", &raw).ok())
    };
    let log_bytes = log_bytes.unwrap_or_default();
    let Some(current) = current else {
        if log_bytes.iter().any(|b| *b != 0) {
            report.log_not_used = Some(
                "the file's checkpoint record is missing or damaged, so the log beside it cannot be tied to it; what the log holds is not in the repaired journal".into(),
            );
        }
        return Ok(CheckpointRecord {
            journal_id: log::new_journal_id(),
            generation: 1,
            next_lsn: 1,
        });
    };
    let cursor = log::Cursor {
        journal_id: current.journal_id,
        generation: current.generation,
        first_lsn: current.next_lsn,
    };
    let mut mem = Memtable::default();
    let mut unusable = None;
    let mut used = 0;
    let _ = log::scan(log_bytes, cursor, |r| {
        // A record that does not decode ends what is used, as a torn one ends the log.
        let mut one = Memtable::default();
        let decoded = if r.kind == log::KIND_BATCH {
            one.apply_encoded(r.payload)
        } else {
            Err(format!(
                "record kind {} is not one this build reads",
                r.kind
            ))
        };
        match decoded {
            Ok(()) => {
                mem.absorb(one);
                used += 1;
                Ok(())
            }
            Err(e) => {
                unusable = Some(format!("log record {}: {e}", r.lsn));
                Err(())
            }
        }
    });
    if let Some(problem) = unusable {
        report.log_not_used = Some(format!(
            "{problem}; the records before it were used, it and those after it were not"
        ));
    }
    report.log_records = used;
    index::checkpoint(txn, &mem)?;
    Ok(CheckpointRecord {
        journal_id: current.journal_id,
        generation: current.generation + 1,
        next_lsn: current.next_lsn + used,
    })
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
