//! `repair`: rebuild the journal from its event journal into a new file beside it, with an
//! exact report of every operation that does not answer as before.
//!
//! # How
//!
//! The damaged file is read in place and never written ([`super::source`]): the storage
//! engine reads what it can, around damaged pages, and the log's records of the current
//! cycle are laid over it. The repaired journal is built into a new file beside it
//! (`.<name>.repair-<pid>`), streaming:
//!
//! 1. **events**, in seq order, each checked (CRC, decode, its own seq, times that never go
//!    backwards) and applied with the writer's own code (`machine::apply`) into batches that
//!    are written to the new file every few MiB. An event that does not fit its operation's
//!    history, or does not decode, is quarantined (kept as found in the `quarantine` table).
//!    Where the engine could not read the events table, intact event records are salvaged
//!    from the raw bytes, but only with evidence that they are live (the `op_events` index
//!    lists them, or cannot be read): an event of a purged operation never comes back.
//! 2. **results**: a payload is copied only if the rebuilt receipt refers to it; one
//!    salvaged from the raw bytes only if the file's own receipt (not a stale copy) refers to
//!    it and is not retired. A payload that retention dropped is never revived.
//! 3. **every operation**, in id order, is compared with what the damaged file answered
//!    (its receipt, clocks applied, and whether its result could be read), and with the
//!    events its `op_events` entries list. Lost events make an operation in doubt (unless
//!    its outcome survived, which is kept); a lost result makes it answer expired, recorded
//!    by a `result_lost` event (retired by damage, never said to have aged out) unless its
//!    retention had passed; a scope revision never moves back. Every operation that does
//!    not answer exactly as before is named in [`RepairReport::lost`] with what it was, what
//!    it is and why. Where the file's receipt cannot be read, what it answered is what its
//!    events say, with its result if its retention had not passed: a result that is then
//!    not found was lost, and is named. An operation whose receipt cannot be read and none
//!    of whose events survive is known only from an intact copy of its receipt in the raw
//!    bytes, if one is left: it is named and held in doubt (the copy may predate its last
//!    changes), never forgotten, so that a resubmission does not run it again.
//! 4. the new file is committed durably, then, unless this is a dry run, linked as the
//!    backup's name's original is kept (`FILE.<time>.bak`, unless `--no-backup`) and renamed
//!    over the journal; the log (its records are in the new file) moves with the backup.
//!
//! Memory holds a batch (a few MiB), the storage engines' caches, one entry per damaged
//! operation and the report, whatever the journal's size; records salvaged from raw bytes
//! (only where the engine cannot read) are held until they are written.
//!
//! An I/O error (reading the journal, writing or syncing the new file) stops the repair and
//! is returned naming the operation: the journal is left as it was. Only damage (CRC and
//! decode failures, the engine's `Corrupted`, its panics) leads to quarantine and salvage.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase};
use serde::Serialize;

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::codec::{self, FORMAT_VERSION, RecordKind};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::index::{self, Base, Layered, Layers, Memtable, Table, TableKey, View, WriteTables};
use crate::log::{self, FileLog};
use crate::machine::{self, Ctx};
use crate::preflight::file::check_redb_magic;
use crate::preflight::reading::{Extent, existing_journal_file};
use crate::record::{
    CheckpointRecord, Event, EventKind, ExecRecord, FormatRecord, IntentDigest, ReceiptRecord,
    RetireCause, RevisionCause, ScopeRecord, StateRecord,
};

use super::salvage::scan_file;
use super::source::{Gap, Rung, Source};
use super::verify::{Finding, corrupt_detail};

/// How [`repair`] runs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RepairOptions {
    /// Build the repaired journal and report, without replacing the file (the repaired copy
    /// is deleted).
    pub dry_run: bool,
    /// Keep the file as it was under a backup name (default `true`).
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

/// An operation that does not answer after the repair exactly as it did before.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LostOperation {
    /// The operation id.
    pub operation_id: String,
    /// What it answers now: `in_doubt`, `expired`, `kept` (its outcome survived, something
    /// else changed), `restored` (its receipt was missing or wrong and now answers as its
    /// events say), `unknown` (nothing of it could be kept).
    pub now: String,
    /// What it answered before (its state, or why it could not be read).
    pub was: String,
    /// What was lost or changed, and why.
    pub detail: String,
}

/// How redb read the damaged file.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EngineAccess {
    /// Read-only, in place.
    InPlace,
    /// The file was not closed cleanly (or its allocator state is damaged): the engine
    /// recovered it in memory, the file untouched.
    RecoveredInMemory,
    /// The file is shorter than its header says: read at its full length, the missing
    /// pages zero.
    Truncated,
    /// The first bytes of its header were damaged and were rebuilt in memory.
    HeaderRebuilt,
    /// The engine could not read the file: every record was salvaged from its raw bytes.
    Refused,
}

/// What [`repair`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RepairReport {
    /// Where the file as it was is kept (`None`: no backup, or a dry run).
    pub backup: Option<PathBuf>,
    /// Whether this was a dry run (the file was not replaced).
    pub dry_run: bool,
    /// How redb read the file.
    pub engine: EngineAccess,
    /// Whether records were salvaged from the raw bytes (where the engine could not read).
    pub salvaged: bool,
    /// Always `false`: repair no longer rolls redb back (kept for
    /// compatibility).
    pub storage_rolled_back: bool,
    /// Always `false` (kept for compatibility): page damage shows as
    /// [`RepairReport::unreadable`] ranges.
    pub page_checksums_failed: bool,
    /// Records moved to the quarantine table (they failed CRC/decode, or did not fit the
    /// history).
    pub quarantined: Vec<Finding>,
    /// Every operation that does not answer exactly as before, with what changed.
    pub lost: Vec<LostOperation>,
    /// Key ranges of the file's tables redb could not read. An operation whose
    /// every record lay there leaves no trace to name it by: these ranges are where such
    /// operations were.
    pub unreadable: Vec<Finding>,
    /// Scopes whose revision differs from what the file recorded (a revision never moves
    /// back: a lost one is kept by a checkpoint event).
    pub scopes: Vec<Finding>,
    /// Records of the log (what a writer logged and never checkpointed) taken into the
    /// repaired journal.
    pub log_records: u64,
    /// Records of the log dropped: after a damaged one, or behind a damaged header.
    pub log_records_dropped: u64,
    /// Bytes that followed the journal's data, not copied into the repaired journal.
    pub trailing_bytes_trimmed: u64,
    /// Events replayed.
    pub events_replayed: u64,
    /// Receipts rebuilt.
    pub receipts_rebuilt: u64,
    /// Scopes rebuilt.
    pub scopes_rebuilt: u64,
    /// Result payloads without a live receipt, not copied.
    pub orphan_results_removed: u64,
}

impl Default for RepairReport {
    fn default() -> Self {
        RepairReport {
            backup: None,
            dry_run: false,
            engine: EngineAccess::InPlace,
            salvaged: false,
            storage_rolled_back: false,
            page_checksums_failed: false,
            quarantined: Vec::new(),
            lost: Vec::new(),
            unreadable: Vec::new(),
            scopes: Vec::new(),
            log_records: 0,
            log_records_dropped: 0,
            trailing_bytes_trimmed: 0,
            events_replayed: 0,
            receipts_rebuilt: 0,
            scopes_rebuilt: 0,
            orphan_results_removed: 0,
        }
    }
}

impl RepairReport {
    /// Whether repair found anything to repair (a dry run that finds something exits 1).
    pub fn found_damage(&self) -> bool {
        !self.quarantined.is_empty()
            || !self.lost.is_empty()
            || !self.unreadable.is_empty()
            || !self.scopes.is_empty()
            || self.salvaged
            || self.log_records_dropped > 0
            || self.trailing_bytes_trimmed > 0
            || self.engine != EngineAccess::InPlace
                && self.engine != EngineAccess::RecoveredInMemory
    }
}

/// The most memory a batch of changes takes before it is written to the new file.
const BATCH_BYTES: usize = 8 << 20;
/// redb's cache for the new file.
const NEW_FILE_CACHE: usize = 32 << 20;
/// Events are checked for time order in windows of this many (twice this many are held).
const TIME_WINDOW: usize = 16_384;

/// Rebuilds the journal at `path` from its event journal, into a new file that replaces it.
///
/// The file is read in place and never written; the repaired journal is built beside it and
/// renamed over it once it is durable, the original kept as the backup (`FILE.<time>.bak`,
/// unless `backup` is off) together with its log. Records that fail CRC or decode, and
/// events that do not fit the history, move to the `quarantine` table. Operations whose
/// events were lost become `InDoubt` (unless their outcome survived, which is kept), and
/// terminal operations whose result payload was lost answer `Expired`, with
/// [`RetireCause::Damage`](crate::RetireCause::Damage) (a `result_lost` event in their
/// history), not as if the result had aged out; every operation that does not answer
/// exactly as before is named in [`RepairReport::lost`]. A payload that
/// retention dropped is never revived, and a scope revision never moves back. Where the
/// redb cannot read, intact records are salvaged from the raw bytes. Bytes after
/// the journal's data are not copied. After a repair that returns `Ok`, [`verify`] finds
/// the journal clean.
///
/// Memory is bounded by a batch of a few MiB, the storage engines' caches and the report
/// (see the module documentation of `check::repair` for the one exception: records salvaged
/// from raw bytes).
///
/// [`verify`]: crate::verify
///
/// # Errors
///
/// - [`ErrorKind::Locked`] if a writer has the file open;
/// - [`ErrorKind::NotAJournal`] for what is not a journal (not a regular file, empty, not a
///   redb file and no intact journal record in it, another redb database);
/// - [`ErrorKind::UnsupportedFormat`] for a journal of a newer format (never rewritten);
/// - [`ErrorKind::Corrupt`] when redb refuses the file and no intact event
///   can be salvaged from its bytes;
/// - [`ErrorKind::Io`] for an I/O error, naming the operation (read, write, sync, rename):
///   the journal is left as it was.
///
/// Nothing is written before these refusals.
///
/// # Example
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("project.opj");
/// drop(opjournal::Journal::open(&path)?);
/// let report = opjournal::repair(&path, &Default::default(), &mut |_, _| {})?;
/// assert!(report.lost.is_empty());
/// assert!(opjournal::verify(&path)?.is_clean());
/// # Ok::<(), opjournal::Error>(())
/// ```
pub fn repair(
    path: impl AsRef<Path>,
    options: &RepairOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<RepairReport> {
    let path = path.as_ref();
    let meta = existing_journal_file(path)?;
    let file = File::open(path).map_err(|e| {
        Error::io_while(
            "open the journal file",
            "the repair stopped and nothing was changed",
            e,
        )
    })?;
    let extent = Extent::of(&file, meta.len()).map_err(|e| {
        Error::io_while(
            "read the journal file",
            "the repair stopped and nothing was changed",
            e,
        )
    })?;
    let is_redb = check_redb_magic(path).is_ok();
    // Not redb's file and no journal event near its start: not a journal,
    // answered before anything reads the rest of it.
    if !is_redb && !super::salvage::probe_for_events(&file, extent.journal_len())? {
        return Err(Error::new(ErrorKind::NotAJournal {
            path: path.to_path_buf(),
            detail: "it does not start with the redb file signature, and its first 64 MiB \
                     hold no intact journal record"
                .into(),
        }));
    }
    let mut src = Source::open(path, extent)?;
    let mut report = RepairReport {
        dry_run: options.dry_run,
        trailing_bytes_trimmed: extent.trailing(),
        ..RepairReport::default()
    };
    report.engine = match src.rung {
        Some(Rung::InPlace) => EngineAccess::InPlace,
        Some(Rung::Recovered) => EngineAccess::RecoveredInMemory,
        Some(Rung::Padded) => EngineAccess::Truncated,
        Some(Rung::Patched | Rung::PatchedDefaults) => EngineAccess::HeaderRebuilt,
        None => EngineAccess::Refused,
    };
    refuse_foreign(&src, path)?;
    if !src.readable() {
        // Only raw bytes: refuse what holds no intact journal event (nothing to salvage),
        // and a newer build's records, before anything is written.
        let summary = scan_file(&file, extent.journal_len(), |_, _, _| Ok(()))?;
        if let Some(v) = summary.newer {
            return Err(Error::new(ErrorKind::UnsupportedFormat {
                found: u32::from(v),
                supported: u32::from(FORMAT_VERSION),
            }));
        }
        if summary.events == 0 {
            if !is_redb {
                return Err(Error::new(ErrorKind::NotAJournal {
                    path: path.to_path_buf(),
                    detail: "it does not start with the redb file signature".into(),
                }));
            }
            let mut e = Error::corrupt(
                "(file)",
                path.display(),
                "the storage engine refuses the file and no intact event could be salvaged \
                 from its bytes",
            );
            if let Some(refused) = src.refused.take() {
                e = Error::with_source(e.kind().clone(), refused);
            }
            return Err(e);
        }
    }
    let dropped_ops = absorb_log(&mut src, &mut report)?;
    let target = Target::create(path, options.dry_run)?;
    let mut candidates: Option<Candidates> = if src.readable() {
        None
    } else {
        Some(Candidates::scan(&file, &src, &TableGaps::all())?)
    };
    let rebuilt = loop {
        let db = target.database()?;
        let mut b = Build::new(db, &mut src, &mut report, candidates.as_ref())?;
        b.events(progress)?;
        match b.finish(&dropped_ops)? {
            Finished::Done(db) => break db,
            Finished::Again(wanted) => {
                // Records redb could not read (unreadable ranges, damaged
                // values, events and results the indexes list that are not there): look
                // for intact copies in the raw bytes, and rebuild with them.
                candidates = Some(Candidates::scan(&file, &src, &wanted)?);
            }
        }
    };
    rebuilt.close().map_err(|e| {
        Error::from(e).while_doing(
            "close the repaired journal",
            "the repair stopped and the journal is unchanged (the repaired copy was removed)",
        )
    })?;
    drop(src);
    target.install(path, options, &mut report)?;
    Ok(report)
}

/// Refuses, before anything is written, a redb database that is not a journal and a
/// journal of a newer format.
fn refuse_foreign(src: &Source, path: &Path) -> Result<()> {
    if !src.readable() {
        return Ok(());
    }
    let names = match src.table_names() {
        Ok(n) => n,
        // Damage for repair itself to deal with.
        Err(_) => return Ok(()),
    };
    if !names.iter().any(|n| n == "meta") {
        return Err(Error::new(ErrorKind::NotAJournal {
            path: path.to_path_buf(),
            detail: if names.is_empty() {
                "it is an empty redb database".into()
            } else {
                "it is a redb database without the journal's `meta` table".into()
            },
        }));
    }
    match src.view(|v| v.format()) {
        Err(e) if matches!(e.kind(), ErrorKind::UnsupportedFormat { .. }) => Err(e),
        // A damaged format record is left to repair.
        _ => Ok(()),
    }
}

/// Reads the log's records of the file's current cycle into the source (as recovery would:
/// up to a damaged or undecodable record), and names the operations whose changes are in
/// the records recovery drops.
fn absorb_log(src: &mut Source, report: &mut RepairReport) -> Result<BTreeSet<String>> {
    let mut dropped_ops = BTreeSet::new();
    let Some(log) = FileLog::open_read_only(&FileLog::path_for(&src.path)).map_err(|e| {
        Error::io_while(
            "open the journal's log",
            "the repair stopped and nothing was changed",
            e,
        )
    })?
    else {
        return Ok(dropped_ops);
    };
    let Ok(Some(cp)) = src.view(|v| v.checkpoint()) else {
        // The file's checkpoint (which names the log's current cycle) cannot be read, so
        // the log cannot be laid over the file: its records are not taken. They may hold
        // the only trace of recent operations, so every operation they touch is named as
        // dropped (the sweep in tests/corruption_sweep.rs found such operations vanishing
        // from the report). The log's own first record tells which cycle to read.
        let Some(cursor) = log::own_cursor(&log).map_err(|e| {
            Error::io_while(
                "read the journal's log",
                "the repair stopped and nothing was changed",
                e,
            )
        })?
        else {
            return Ok(dropped_ops);
        };
        let mut records = 0u64;
        log::scan_storage(&log, cursor, |r| -> Result<()> {
            let mut m = Memtable::default();
            if m.apply_encoded(r.payload).is_ok() {
                for op in index::Receipts::map(&m).keys() {
                    dropped_ops.insert(op.clone());
                }
                for (op, _) in index::OpEvents::map(&m).keys() {
                    dropped_ops.insert(op.clone());
                }
            }
            records += 1;
            Ok(())
        })
        .map_err(|e: Error| {
            e.while_doing(
                "read the journal's log",
                "the repair stopped and nothing was changed",
            )
        })?;
        if records > 0 {
            report.log_records_dropped += records;
            report.quarantined.push(Finding::new(
                "log",
                FileLog::path_for(&src.path).display().to_string(),
                format!(
                    "the journal's checkpoint could not be read, so the log's {records} \
                     record(s) could not be laid over it and were not taken"
                ),
            ));
        }
        return Ok(dropped_ops);
    };
    let cursor = log::Cursor {
        journal_id: cp.journal_id,
        generation: cp.generation,
        first_lsn: cp.next_lsn,
    };
    let io = |e: Error| {
        e.while_doing(
            "read the journal's log",
            "the repair stopped and nothing was changed",
        )
    };
    let mut mem = Memtable::default();
    let mut bad: Option<(u64, String)> = None;
    let mut records = 0u64;
    log::scan_storage(&log, cursor, |r| -> Result<()> {
        if bad.is_some() {
            return Ok(());
        }
        let mut next = Memtable::default();
        let applied = if r.kind == log::KIND_BATCH {
            next.apply_encoded(r.payload)
        } else {
            Err(format!(
                "record kind {} is not one this build writes",
                r.kind
            ))
        };
        match applied {
            Ok(()) => {
                mem.absorb(next);
                records += 1;
            }
            Err(detail) => bad = Some((r.lsn, detail)),
        }
        Ok(())
    })
    .map_err(io)?;
    src.mem = mem;
    report.log_records = records;
    let note_ops = |m: &Memtable, ops: &mut BTreeSet<String>| {
        for op in index::Receipts::map(m).keys() {
            ops.insert(op.clone());
        }
        for (op, _) in index::OpEvents::map(m).keys() {
            ops.insert(op.clone());
        }
    };
    let log_key = FileLog::path_for(&src.path).display().to_string();
    let dropped = log::dropped(&log, cursor, |r| -> Result<()> {
        super::ops_of_log_record(r.payload, &mut dropped_ops);
        Ok(())
    })
    .map_err(io)?;
    if let Some((lsn, detail)) = bad {
        // The records from this one on were not absorbed: a writer's open refuses them.
        let after = log::scan_storage(&log, cursor, |r| -> Result<()> {
            if r.lsn >= lsn {
                let mut m = Memtable::default();
                if m.apply_encoded(r.payload).is_ok() {
                    note_ops(&m, &mut dropped_ops);
                }
            }
            Ok(())
        })
        .map_err(io)?;
        let n = after.records.saturating_sub(lsn - cursor.first_lsn);
        report.log_records_dropped += n;
        report.quarantined.push(Finding::new(
            "log",
            format!("record {lsn}"),
            format!(
                "its changes do not decode ({detail}): it and the {} record(s) after it were \
                 not taken",
                n.saturating_sub(1)
            ),
        ));
    }
    if dropped.header_damaged {
        report.log_records_dropped += dropped.records;
        report.quarantined.push(Finding::new(
            "log",
            log_key.clone(),
            format!(
                "the log's header is damaged: the {} record(s) after it were not taken",
                dropped.records
            ),
        ));
    }
    if let Some((lsn, why)) = &dropped.damaged {
        // The damaged record and the valid ones after it (a crash cannot leave a log so:
        // they were synced, and their operations are named in the report).
        report.log_records_dropped += dropped.records + 1;
        report.quarantined.push(Finding::new(
            "log",
            format!("record {lsn}"),
            format!(
                "damaged: {why}; it{} {} not taken",
                super::verify::and_after(dropped.records),
                if dropped.records == 0 { "was" } else { "were" }
            ),
        ));
    }
    if let Some(problem) = &dropped.length {
        // What lay past the cut is gone: the operations it changed cannot be named, only
        // where they were (as for a table range the engine cannot read).
        report.unreadable.push(Finding::new(
            "log",
            format!("records from {}", cursor.first_lsn + records),
            format!(
                "{problem}: the operations those records changed cannot be named, and answer \
                 as before their changes"
            ),
        ));
    }
    Ok(dropped_ops)
}

/// Records found in the raw bytes where redb could not read the events,
/// results, receipts or meta tables, waiting to be taken with evidence.
#[derive(Default)]
struct Candidates {
    events: BTreeMap<u64, Event>,
    results: BTreeMap<u64, Vec<u8>>,
    /// Receipts in the receipts table's unreadable ranges, the latest found of each
    /// operation ([`later_receipt`]). Never taken as they are (a copy may predate the
    /// operation's last changes): they are the evidence that an operation existed when
    /// its events were lost with its receipt, so that it is named and held in doubt rather
    /// than forgotten (a resubmission would run it again).
    receipts: BTreeMap<String, ReceiptRecord>,
    /// The latest checkpoint and state records found (largest generation, largest
    /// sequence), for a meta table that cannot be read.
    checkpoint: Option<CheckpointRecord>,
    state: Option<StateRecord>,
}

impl Candidates {
    /// Scans the file for the records of the tables' unreadable ranges.
    fn scan(file: &File, src: &Source, gaps: &TableGaps) -> Result<Candidates> {
        let mut c = Candidates::default();
        scan_file(file, src.extent.journal_len(), |_, kind, frame| {
            match kind {
                RecordKind::Event => {
                    if let Ok(ev) = index::decode_event_frame(frame)
                        && (gaps.events.iter().any(|g| g.contains(&ev.seq))
                            || gaps.event_keys.contains(&ev.seq))
                    {
                        c.events.entry(ev.seq).or_insert(ev);
                    }
                }
                RecordKind::Receipt => {
                    if let Ok(rec) = index::decode_receipt_frame(frame)
                        && gaps.receipts.iter().any(|g| g.contains(&rec.operation_id))
                    {
                        match c.receipts.get_mut(&rec.operation_id) {
                            Some(old) if later_receipt(&rec, old) => *old = rec,
                            Some(_) => {}
                            None => {
                                c.receipts.insert(rec.operation_id.clone(), rec);
                            }
                        }
                    }
                }
                RecordKind::Result => {
                    if let Ok((h, _)) = decode_result_frame(frame)
                        && (gaps.results.iter().any(|g| g.contains(&h.completed_seq))
                            || gaps.result_keys.contains(&h.completed_seq))
                    {
                        c.results
                            .entry(h.completed_seq)
                            .or_insert_with(|| frame.to_vec());
                    }
                }
                RecordKind::Meta if gaps.meta => {
                    // A meta record does not name its key: it is a checkpoint or state
                    // record if it decodes as exactly one of them (each decode consumes
                    // every byte, so their field counts tell them apart).
                    if let Ok((version, payload)) =
                        codec::unframe_versioned(RecordKind::Meta, frame)
                    {
                        let cp = codec::decode_payload::<CheckpointRecord>(version, payload).ok();
                        let st = codec::decode_payload::<StateRecord>(version, payload).ok();
                        match (cp, st) {
                            (Some(cp), None)
                                if c.checkpoint
                                    .as_ref()
                                    .is_none_or(|old| old.generation < cp.generation) =>
                            {
                                c.checkpoint = Some(cp);
                            }
                            (None, Some(s))
                                if c.state.as_ref().is_none_or(|old| old.next_seq < s.next_seq) =>
                            {
                                c.state = Some(s);
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
            Ok(())
        })?;
        Ok(c)
    }
}

/// Whether receipt `a` records a later state of its operation than `b` (copies of one
/// operation's receipt found in the raw bytes): a later attempt, then a later state
/// (running, in doubt, then terminal or released), then retired, then more deliveries.
fn later_receipt(a: &ReceiptRecord, b: &ReceiptRecord) -> bool {
    let key = |r: &ReceiptRecord| {
        let (rank, retired, deliveries) = match &r.state {
            ExecRecord::Running { .. } => (0, false, 0),
            ExecRecord::InDoubt { .. } => (1, false, 0),
            ExecRecord::Vacant { .. } => (2, false, 0),
            ExecRecord::Done(d) => (2, d.retired_at.is_some(), d.delivery.count),
        };
        (r.epoch, rank, retired, deliveries)
    };
    key(a) > key(b)
}

/// One gap covering every key.
fn every_key<K>() -> Vec<Gap<K>> {
    vec![Gap {
        after: None,
        before: None,
        why: String::new(),
    }]
}

/// The unreadable ranges of the tables whose records a raw scan may find.
#[derive(Default, Clone)]
struct TableGaps {
    events: Vec<Gap<u64>>,
    /// Events whose key is in the table but whose stored value is damaged: an intact copy
    /// elsewhere in the file (the key proves it live) replaces it.
    event_keys: BTreeSet<u64>,
    results: Vec<Gap<u64>>,
    result_keys: BTreeSet<u64>,
    /// The receipts table's unreadable ranges.
    receipts: Vec<Gap<String>>,
    meta: bool,
}

impl TableGaps {
    /// Every table unreadable (the engine refuses the file).
    fn all() -> TableGaps {
        TableGaps {
            events: every_key(),
            event_keys: BTreeSet::new(),
            results: every_key(),
            result_keys: BTreeSet::new(),
            receipts: every_key(),
            meta: true,
        }
    }
}

/// How a build ended.
enum Finished {
    /// The repaired journal, committed.
    Done(Database),
    /// Records to look for in the raw bytes before building again.
    Again(TableGaps),
}

impl TableGaps {
    fn is_empty(&self) -> bool {
        self.events.is_empty()
            && self.event_keys.is_empty()
            && self.results.is_empty()
            && self.result_keys.is_empty()
            && self.receipts.is_empty()
            && !self.meta
    }
}

/// What is known of an operation's damage while rebuilding.
#[derive(Default, Debug)]
struct OpDamage {
    /// Its events that were quarantined (damaged, out of order, not fitting).
    quarantined: u32,
    /// Some of its events were salvaged without the evidence of its index.
    uncertain: bool,
}

/// The repaired journal being built.
struct Build<'s> {
    db: Database,
    base: Base,
    pending: Memtable,
    src: &'s mut Source,
    report: &'s mut RepairReport,
    candidates: Option<&'s Candidates>,
    damaged: BTreeMap<String, OpDamage>,
    quarantine_next: u64,
    state: StateRecord,
    now: Timestamp,
    max_seq: u64,
    max_at: Timestamp,
    /// Event keys whose record is intact but carries another seq (the key was damaged).
    misfiled: bool,
    /// What to look for in the raw bytes if this build is not given candidates.
    wanted: TableGaps,
    /// The ranges of the file's `op_events` index that could not be read (known when raw
    /// candidates are weighed: an entry there is not evidence either way).
    op_event_gaps: Vec<Gap<(String, u64)>>,
    cfg: Config,
}

fn write_err(e: Error) -> Error {
    e.while_doing(
        "write the repaired journal",
        "the repair stopped and the journal is unchanged (the partial copy was removed)",
    )
}

impl<'s> Build<'s> {
    fn new(
        db: Database,
        src: &'s mut Source,
        report: &'s mut RepairReport,
        candidates: Option<&'s Candidates>,
    ) -> Result<Build<'s>> {
        report.quarantined.retain(|f| f.table == "log");
        report.lost.clear();
        report.unreadable.retain(|f| f.table == "log");
        report.scopes.clear();
        report.events_replayed = 0;
        report.orphan_results_removed = 0;
        report.salvaged = !src.readable();
        {
            let txn = db.begin_write().map_err(|e| write_err(e.into()))?;
            index::create_tables(&txn).map_err(write_err)?;
            txn.commit().map_err(|e| write_err(e.into()))?;
        }
        let base = Base::new(db.begin_read().map_err(|e| write_err(e.into()))?);
        let old_state = src
            .view(|v| v.state())
            .ok()
            .or_else(|| candidates.and_then(|c| c.state.clone()));
        let now = SystemClock.now().max(
            old_state
                .as_ref()
                .map_or(Timestamp(0), |s| s.clock_high_water),
        );
        Ok(Build {
            db,
            base,
            pending: Memtable::default(),
            src,
            report,
            candidates,
            damaged: BTreeMap::new(),
            quarantine_next: 1,
            state: old_state.unwrap_or(StateRecord {
                clock_high_water: Timestamp(0),
                next_seq: 1,
            }),
            now,
            max_seq: 0,
            max_at: Timestamp(0),
            misfiled: false,
            wanted: TableGaps::default(),
            op_event_gaps: Vec::new(),
            cfg: Config::default(),
        })
    }

    /// Writes the batch into the new file (not yet durably) once it has grown.
    fn maybe_flush(&mut self) -> Result<()> {
        if self.pending.bytes() >= BATCH_BYTES {
            self.flush(false)?;
        }
        Ok(())
    }

    fn flush(&mut self, durable: bool) -> Result<()> {
        let mut txn = self.db.begin_write().map_err(|e| write_err(e.into()))?;
        if !durable {
            txn.set_durability(redb::Durability::None)
                .map_err(|e| write_err(e.into()))?;
        }
        index::checkpoint(&txn, &self.pending).map_err(write_err)?;
        txn.commit().map_err(|e| {
            Error::from(e).while_doing(
                "sync the repaired journal",
                "the repair stopped and the journal is unchanged (the partial copy was removed)",
            )
        })?;
        self.pending = Memtable::default();
        self.base = Base::new(self.db.begin_read().map_err(|e| write_err(e.into()))?);
        Ok(())
    }

    /// Runs `f` on a batch over the new file's changes so far; its changes are kept if it
    /// returns `Ok`.
    fn batch<R>(&mut self, f: impl FnOnce(&mut WriteTables<'_>) -> Result<R>) -> Result<R> {
        let mut t = WriteTables::over(Some(&self.base), Layers::new(&[&self.pending]));
        let r = f(&mut t)?;
        let changes = t.into_changes();
        self.pending.absorb(changes);
        Ok(r)
    }

    fn quarantine(&mut self, table: &str, key: String, problem: String, raw: &[u8]) {
        // A quarantined value: a framed record whose payload is (table, key, problem) in
        // the codec's encoding, followed by the raw bytes as they were found (like a result payload, so
        // the decode limit does not apply to them).
        let mut payload = codec::encode_payload(&(table, key.as_str(), problem.as_str()));
        payload.extend_from_slice(raw);
        let n = self.quarantine_next;
        self.quarantine_next += 1;
        self.pending
            .set::<index::Quarantine>(n, Some(codec::frame(RecordKind::Quarantine, &payload)));
        self.report
            .quarantined
            .push(Finding::new(table, key, problem));
    }

    fn damage(&mut self, op: &str) -> &mut OpDamage {
        self.damaged.entry(op.to_string()).or_default()
    }

    fn unreadable<K: TableKey>(&mut self, table: &str, gaps: &[Gap<K>]) {
        for g in gaps {
            self.report.unreadable.push(Finding::new(
                table,
                g.describe(),
                format!("the storage engine could not read these entries: {}", g.why),
            ));
        }
    }

    /// Phase 1: every event, in seq order. What could not be read is noted in `wanted`.
    fn events(&mut self, progress: &mut dyn FnMut(u64, u64)) -> Result<()> {
        let total = self
            .src
            .view(|v| v.count::<index::Events>())
            .unwrap_or_default();
        // The old quarantine first: its entries keep their order.
        let mut old_q: Vec<(u64, Vec<u8>)> = Vec::new();
        let q_gaps = self.src.read_table::<index::Quarantine>(|k, v| {
            old_q.push((k, v));
            Ok(())
        })?;
        self.unreadable("quarantine", &q_gaps);
        for (_, v) in old_q {
            let n = self.quarantine_next;
            self.quarantine_next += 1;
            self.pending.set::<index::Quarantine>(n, Some(v));
        }
        let cands: Vec<Event> = self
            .candidates
            .map(|c| c.events.values().cloned().collect())
            .unwrap_or_default();
        if !cands.is_empty() && self.src.readable() {
            self.op_event_gaps = self.src.read_table::<index::OpEvents>(|_, ()| Ok(()))?;
        }
        let mut cands = cands.into_iter().peekable();
        let mut window: Vec<Pending> = Vec::new();
        let mut floor = Timestamp(0);
        let mut seen = 0u64;
        let mut gaps: Vec<Gap<u64>> = Vec::new();
        let mut after: Option<u64> = None;
        let mut buffer: Vec<(u64, Vec<u8>)> = Vec::new();
        // The tree's events and the raw candidates merge in seq order; the tree's copy wins.
        loop {
            let chunk = self
                .src
                .read_range::<index::Events>(after.as_ref(), 4096, &mut buffer)?;
            let mut items = Vec::with_capacity(buffer.len());
            for (seq, raw) in buffer.drain(..) {
                seen += 1;
                if seen.is_multiple_of(4096) {
                    progress(seen, total);
                }
                while cands.peek().is_some_and(|c| c.seq < seq) {
                    if let Some(ev) = cands.next()
                        && let Some(item) = self.candidate(ev)?
                    {
                        items.push(item);
                    }
                }
                if cands.peek().is_some_and(|c| c.seq == seq) {
                    cands.next();
                }
                if let Some(item) = self.tree_event(seq, raw) {
                    items.push(item);
                }
            }
            for item in items {
                window.push(item);
                if window.len() >= 2 * TIME_WINDOW {
                    self.decide(&mut window, TIME_WINDOW, &mut floor)?;
                }
            }
            gaps.extend(chunk.gaps);
            match chunk.resume {
                Some(k) => after = Some(k),
                None => break,
            }
        }
        for ev in cands {
            if let Some(item) = self.candidate(ev)? {
                window.push(item);
            }
        }
        let n = window.len();
        self.decide(&mut window, n, &mut floor)?;
        progress(seen, total);
        if self.misfiled {
            self.wanted.events.push(Gap {
                after: None,
                before: None,
                why: String::new(),
            });
        }
        self.wanted.events.extend(gaps.iter().cloned());
        self.wanted.meta = self.src.view(|v| v.state()).is_err();
        self.unreadable("events", &gaps);
        Ok(())
    }

    /// An event read from the tree, checked; `None` when it was quarantined.
    fn tree_event(&mut self, seq: u64, raw: Vec<u8>) -> Option<Pending> {
        match index::decode_event(seq, &raw) {
            Ok(ev) => Some(Pending { ev, raw }),
            Err(e)
                if self.candidates.is_some_and(|c| c.events.contains_key(&seq))
                    && index::decode_event_frame(&raw).is_err() =>
            {
                // The stored value is damaged, but an intact copy of the event is elsewhere
                // in the file, and the key proves it live: the copy is used.
                let ev = self.candidates.and_then(|c| c.events.get(&seq).cloned())?;
                self.quarantine(
                    "events",
                    seq.to_string(),
                    format!(
                        "{}; an intact copy of the event was found in the file and used",
                        corrupt_detail(&e)
                    ),
                    &raw,
                );
                self.report.salvaged = true;
                let raw = codec::encode(RecordKind::Event, &ev);
                Some(Pending { ev, raw })
            }
            Err(e) => {
                if index::decode_event_frame(&raw).is_err() {
                    self.wanted.event_keys.insert(seq);
                }
                let intact = index::decode_event_frame(&raw).ok();
                if let Some(ev) = &intact
                    && ev.seq != seq
                {
                    // An intact record under a damaged key: it goes back under its own seq
                    // (a raw candidate), unless the table has it there.
                    self.misfiled = true;
                    if let Some(c) = self.candidates
                        && c.events.contains_key(&ev.seq)
                    {
                        return None;
                    }
                }
                let owner = intact.and_then(|ev| ev.operation_id).or_else(|| {
                    self.src
                        .view(|v| {
                            let mut owner = None;
                            for entry in v.all::<index::OpEvents>()? {
                                let ((op, s), ()) = entry?;
                                if s == seq {
                                    owner = Some(op);
                                    break;
                                }
                            }
                            Ok(owner)
                        })
                        .ok()
                        .flatten()
                });
                let problem = match &owner {
                    Some(op) => format!("{} (an event of `{op}`)", corrupt_detail(&e)),
                    None => corrupt_detail(&e),
                };
                self.quarantine("events", seq.to_string(), problem, &raw);
                if let Some(op) = owner {
                    self.damage(&op).quarantined += 1;
                }
                None
            }
        }
    }

    /// A raw candidate event, taken only with evidence that it is live.
    fn candidate(&mut self, ev: Event) -> Result<Option<Pending>> {
        let evidence: std::result::Result<bool, ()> = match (&ev.operation_id, &ev.kind) {
            (Some(op), _) => {
                let key = (op.clone(), ev.seq);
                match self.src.view(|v| v.get::<index::OpEvents>(&key)) {
                    Ok(Some(())) => Ok(true),
                    // Absent where the index could not be read proves nothing.
                    Ok(None) if self.op_event_gaps.iter().any(|g| g.contains(&key)) => Err(()),
                    Ok(None) => Ok(false),
                    Err(_) => Err(()),
                }
            }
            (
                None,
                EventKind::RevisionAdvanced {
                    scope, purge_at, ..
                },
            ) => self
                .src
                .view(|v| {
                    Ok(v.get::<index::ScopeTimers>(&(purge_at.0, ev.seq))?
                        .is_some()
                        || v.scope(scope)?.is_some_and(|s| s.anchor_seq == ev.seq))
                })
                .map_err(|_| ()),
            (None, _) => Ok(true),
        };
        match evidence {
            Ok(false) => Ok(None),
            live => {
                self.report.salvaged = true;
                if live.is_err()
                    && let Some(op) = &ev.operation_id
                {
                    self.damage(op).uncertain = true;
                }
                let raw = codec::encode(RecordKind::Event, &ev);
                Ok(Some(Pending { ev, raw }))
            }
        }
    }

    /// Decides the first `n` events of `window`: those in the longest run whose times never
    /// go backwards (from `floor` on) are applied, the others quarantined.
    fn decide(&mut self, window: &mut Vec<Pending>, n: usize, floor: &mut Timestamp) -> Result<()> {
        let times: Vec<(usize, Timestamp)> = window
            .iter()
            .enumerate()
            .filter(|(_, p)| p.ev.at >= *floor)
            .map(|(i, p)| (i, p.ev.at))
            .collect();
        let keep = time_ordered(&times);
        let n = n.min(window.len());
        for (i, p) in window.drain(..n).enumerate() {
            if keep.contains(&i) {
                *floor = p.ev.at;
                self.apply(p)?;
            } else {
                let problem = format!(
                    "recorded at {} out of time order with the events around it",
                    p.ev.at
                );
                if let Some(op) = &p.ev.operation_id {
                    self.damage(op).quarantined += 1;
                }
                self.quarantine("events", p.ev.seq.to_string(), problem, &p.raw);
            }
        }
        Ok(())
    }

    fn apply(&mut self, p: Pending) -> Result<()> {
        let ev = p.ev;
        let r = {
            let mut t = WriteTables::over(Some(&self.base), Layers::new(&[&self.pending]));
            t.put_event(&ev)?;
            match machine::apply(&mut t, &ev) {
                Ok(()) => Ok(t.into_changes()),
                Err(e) => Err(e),
            }
        };
        match r {
            Ok(changes) => {
                self.pending.absorb(changes);
                self.report.events_replayed += 1;
                self.max_seq = self.max_seq.max(ev.seq);
                self.max_at = self.max_at.max(ev.at);
                self.maybe_flush()
            }
            Err(e) if matches!(e.kind(), ErrorKind::Corrupt { .. }) => {
                if let Some(op) = &ev.operation_id {
                    self.damage(op).quarantined += 1;
                }
                self.quarantine("events", ev.seq.to_string(), corrupt_detail(&e), &p.raw);
                Ok(())
            }
            Err(e) => Err(write_err(e)),
        }
    }

    /// The new file's receipt of `op`.
    fn new_receipt(&self, op: &str) -> Result<Option<ReceiptRecord>> {
        let snap = index::Snapshot {
            base: Some(&self.base),
            layers: Layers::new(&[&self.pending]),
        };
        snap.receipt(op)
    }

    /// Phase 2: the result payloads that a rebuilt receipt refers to.
    fn results(&mut self) -> Result<()> {
        let mut found: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut after = None;
        let mut gaps = Vec::new();
        let mut damaged: Vec<(u64, Vec<u8>)> = Vec::new();
        loop {
            let chunk = self
                .src
                .read_range::<index::Results>(after.as_ref(), 64, &mut found)?;
            for (seq, raw) in std::mem::take(&mut found) {
                match decode_result_frame(&raw) {
                    Ok((h, _)) if h.completed_seq == seq => {
                        self.take_result(seq, &raw, Provenance::Tree)?;
                    }
                    _ => damaged.push((seq, raw)),
                }
            }
            gaps.extend(chunk.gaps);
            match chunk.resume {
                Some(k) => after = Some(k),
                None => break,
            }
        }
        // Results stored inline in the source's receipts (format 3). A damaged receipt's
        // result is looked for in the raw bytes, as any damaged value's is.
        let mut after_id: Option<String> = None;
        let mut receipts: Vec<(String, Vec<u8>)> = Vec::new();
        loop {
            let chunk =
                self.src
                    .read_range::<index::Receipts>(after_id.as_ref(), 64, &mut receipts)?;
            for (_, value) in std::mem::take(&mut receipts) {
                if let Some(tail) = index::split_receipt_value(&value).1
                    && let Ok((h, _)) = decode_result_frame(tail)
                {
                    self.take_result(h.completed_seq, tail, Provenance::Tree)?;
                }
            }
            match chunk.resume {
                Some(k) => after_id = Some(k),
                None => break,
            }
        }
        // Intact copies elsewhere in the file: of a damaged value (its key proves it live),
        // of the unreadable ranges, and of payloads a rebuilt receipt refers to that are not
        // in the table (looked for when the build is given candidates).
        self.wanted.results.extend(gaps.iter().cloned());
        self.wanted
            .result_keys
            .extend(damaged.iter().map(|(k, _)| *k));
        let mut cands: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        if let Some(c) = self.candidates {
            cands.extend(c.results.iter().map(|(k, v)| (*k, v.clone())));
        }
        for (seq, raw) in damaged {
            let detail = match index::decode_result(seq, &raw) {
                Err(e) => corrupt_detail(&e),
                Ok(_) => "unreadable".into(),
            };
            match cands.remove(&seq) {
                Some(copy) => {
                    self.quarantine(
                        "results",
                        seq.to_string(),
                        format!(
                            "{detail}; an intact copy of the payload was found in the file and used"
                        ),
                        &raw,
                    );
                    self.take_result(seq, &copy, Provenance::KeyCopy)?;
                }
                None => self.quarantine("results", seq.to_string(), detail, &raw),
            }
        }
        for (seq, raw) in cands {
            let present = {
                let snap = index::Snapshot {
                    base: Some(&self.base),
                    layers: Layers::new(&[&self.pending]),
                };
                match decode_result_frame(&raw) {
                    Ok((h, _)) => snap.result_stored(&h.operation_id, seq)?,
                    Err(_) => snap.get::<index::Results>(&seq)?.is_some(),
                }
            };
            if !present {
                self.take_result(seq, &raw, Provenance::Raw)?;
            }
        }
        self.unreadable("results", &gaps);
        Ok(())
    }

    fn take_result(&mut self, seq: u64, raw: &[u8], from: Provenance) -> Result<()> {
        let Ok((header, bytes)) = decode_result_frame(raw) else {
            return Ok(());
        };
        if header.completed_seq != seq {
            return Ok(());
        }
        let op = header.operation_id.clone();
        let matches = |rec: &ReceiptRecord| match &rec.state {
            ExecRecord::Done(d) => {
                d.result_seq == Some(seq)
                    && d.retired_at.is_none()
                    && bytes.len() as u64 == d.result.len
                    && crc32fast::hash(&bytes) == d.result.crc32
                    && header.changed_assets.len() as u32 == d.result.assets
            }
            _ => false,
        };
        let rebuilt = self.new_receipt(&op)?;
        let referenced = rebuilt.as_ref().is_some_and(matches);
        // A payload found only in the raw bytes may be a stale copy of one that retention
        // dropped: it is taken only while its retention has not passed (retention is the only
        // thing that drops a live operation's payload), and only if the file's own receipt,
        // where it can be read, does not say otherwise.
        let evidence = from != Provenance::Raw || {
            let retained = rebuilt.as_ref().is_some_and(|r| match &r.state {
                ExecRecord::Done(d) => d.deadlines.retain > self.now,
                _ => false,
            });
            let contradicted = match self.src.view(|v| v.receipt(&op)) {
                Ok(Some(stored)) => !matches(&stored),
                Ok(None) => true,
                Err(_) => false,
            };
            retained && !contradicted
        };
        if referenced && evidence {
            if from != Provenance::Tree {
                self.report.salvaged = true;
            }
            let result = crate::types::OpResult {
                bytes,
                changed_assets: header.changed_assets,
            };
            self.batch(|t| t.put_result(seq, &op, &result))?;
            self.maybe_flush()?;
        } else if from == Provenance::Tree {
            let live_but_different = rebuilt.as_ref().is_some_and(|r| {
                matches!(&r.state, ExecRecord::Done(d) if d.result_seq == Some(seq) && d.retired_at.is_none())
            });
            if live_but_different {
                self.quarantine(
                    "results",
                    seq.to_string(),
                    format!("payload of `{op}` does not match its completion event"),
                    raw,
                );
            } else {
                self.report.orphan_results_removed += 1;
            }
        }
        Ok(())
    }

    /// Phases 3 and 4, then the meta records and a durable commit.
    fn finish(mut self, dropped_ops: &BTreeSet<String>) -> Result<Finished> {
        self.results()?;
        // The other tables are rebuilt from the events; their damaged values are
        // quarantined and their unreadable ranges reported.
        self.check_other_tables()?;
        let actions = self.compare_operations(dropped_ops)?;
        if self.candidates.is_none() && !self.wanted.is_empty() {
            return Ok(Finished::Again(std::mem::take(&mut self.wanted)));
        }
        let scope_actions = self.compare_scopes()?;
        self.apply_actions(actions, scope_actions)?;
        self.write_meta()?;
        self.flush(true)?;
        self.report.receipts_rebuilt = self.count_new::<index::Receipts>()?;
        self.report.scopes_rebuilt = self.count_new::<index::Scopes>()?;
        Ok(Finished::Done(self.db))
    }

    fn count_new<T: Table>(&self) -> Result<u64> {
        index::Snapshot {
            base: Some(&self.base),
            layers: Layers::default(),
        }
        .count::<T>()
    }

    /// Damaged values and unreadable ranges of the index tables (rebuilt from the events).
    fn check_other_tables(&mut self) -> Result<()> {
        let receipts = self.check_values::<index::Receipts>("receipts", |k, v| {
            index::decode_receipt(k, v).map(|_| ())
        })?;
        // Intact copies of the receipts there are looked for in the raw bytes: the evidence
        // of an operation whose events were lost too.
        self.wanted.receipts.extend(receipts);
        self.check_values::<index::Scopes>("scopes", |k, v| index::decode_scope(k, v).map(|_| ()))?;
        self.check_values::<index::Meta>("meta", |k, v| match k {
            "format" => index::decode_format(v).map(|_| ()),
            "state" => index::decode_meta::<StateRecord>("state", v).map(|_| ()),
            "checkpoint" => index::decode_meta::<CheckpointRecord>("checkpoint", v).map(|_| ()),
            _ => Err(Error::corrupt("meta", k, "not an entry of the meta table")),
        })?;
        let g = self.src.read_table::<index::OpEvents>(|_, ()| Ok(()))?;
        self.unreadable("op_events", &g);
        Ok(())
    }

    /// Quarantines the values of a table keyed by name that `check` refuses, and reports
    /// its unreadable ranges (which it returns).
    fn check_values<T: Table<K = String, V = Vec<u8>>>(
        &mut self,
        table: &str,
        check: impl Fn(&str, &[u8]) -> Result<()>,
    ) -> Result<Vec<Gap<String>>> {
        let mut bad: Vec<(String, String, Vec<u8>)> = Vec::new();
        let gaps = self.src.read_table::<T>(|k, v| {
            if let Err(e) = check(&k, &v) {
                bad.push((k, corrupt_detail(&e), v));
            }
            Ok(())
        })?;
        for (k, d, v) in bad {
            self.quarantine(table, k, d, &v);
        }
        self.unreadable(table, &gaps);
        Ok(gaps)
    }

    /// Phase 3: every operation compared with what the file answered. Returns the events
    /// to append (in id order).
    fn compare_operations(&mut self, dropped_ops: &BTreeSet<String>) -> Result<Vec<Action>> {
        let mut actions = Vec::new();
        // Every operation of the new file, in id order (a snapshot of what phase 1 built).
        self.flush(false)?;
        let ids_of_new = |b: &Build<'_>, from: Option<&String>, n: usize| -> Result<Vec<String>> {
            let snap = index::Snapshot {
                base: Some(&b.base),
                layers: Layers::default(),
            };
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
        };
        let mut checked: BTreeSet<String> = BTreeSet::new();
        let mut last: Option<String> = None;
        loop {
            let ids = ids_of_new(self, last.as_ref(), 1024)?;
            let Some(l) = ids.last().cloned() else { break };
            for id in ids {
                if let Some(a) = self.compare_one(&id, dropped_ops, None)? {
                    actions.push(a);
                }
                if self.damaged.contains_key(&id) || dropped_ops.contains(&id) {
                    checked.insert(id);
                }
            }
            last = Some(l);
        }
        // Operations the file knew (a receipt, or events its index lists) that the new file
        // does not have. Only those are kept (memory follows what was lost, not the
        // journal's size: collecting every id took ~140 bytes per operation).
        let mut known: BTreeSet<String> = BTreeSet::new();
        {
            let (src, base, pending) = (&mut *self.src, &self.base, &self.pending);
            let missing = |op: &str| -> Result<bool> {
                let snap = index::Snapshot {
                    base: Some(base),
                    layers: Layers::new(&[pending]),
                };
                Ok(snap.receipt(op)?.is_none())
            };
            let g1 = src.read_table::<index::Receipts>(|k, _| {
                if missing(&k)? {
                    known.insert(k);
                }
                Ok(())
            })?;
            let mut last_op: Option<String> = None;
            let g2 = src.read_table::<index::OpEvents>(|(op, _), ()| {
                if last_op.as_deref() != Some(op.as_str()) {
                    if missing(&op)? {
                        known.insert(op.clone());
                    }
                    last_op = Some(op);
                }
                Ok(())
            })?;
            let _ = (g1, g2);
        }
        for id in &known {
            if self.new_receipt(id)?.is_none()
                && let Some(a) = self.compare_one(id, dropped_ops, None)?
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
            .chain(dropped_ops.iter())
            .filter(|k| !checked.contains(*k))
            .cloned()
            .collect::<BTreeSet<String>>()
            .into_iter()
            .collect();
        for id in rest {
            if self.new_receipt(&id)?.is_none()
                && !actions.iter().any(|a| a.op() == id)
                && let Some(a) = self.compare_one(&id, dropped_ops, None)?
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
                && let Some(a) = self.compare_one(&id, dropped_ops, Some(&rec))?
            {
                actions.push(a);
            }
        }
        Ok(actions)
    }

    /// Compares one operation; names it in the report if it does not answer as before, and
    /// returns the event that settles it, if one is needed. `copy` is an intact copy of its
    /// receipt found in the raw bytes, for an operation that left nothing else.
    fn compare_one(
        &mut self,
        id: &str,
        dropped_ops: &BTreeSet<String>,
        copy: Option<&ReceiptRecord>,
    ) -> Result<Option<Action>> {
        let now = self.now;
        let after = self.new_receipt(id)?;
        let new_seqs: BTreeSet<u64> = {
            let snap = index::Snapshot {
                base: Some(&self.base),
                layers: Layers::new(&[&self.pending]),
            };
            snap.op_event_seqs(id)?.into_iter().collect()
        };
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
        let in_log_drop = dropped_ops.contains(id);
        // Only an intact copy of its receipt is left: its history is not complete.
        let copy = copy.filter(|_| after.is_none() && !matches!(before, Ok(Some(_))));
        let complete = index_readable && lost_events == 0 && !uncertain && copy.is_none();

        let describe_view = |rec: Option<&ReceiptRecord>| -> String {
            match rec.and_then(|r| machine::effective(r.clone(), now)) {
                None => "unknown".into(),
                Some(r) => match machine::view(&r) {
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
            Ok(None) => "unknown (no receipt)".into(),
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
            let has = {
                let snap = index::Snapshot {
                    base: Some(&self.base),
                    layers: Layers::new(&[&self.pending]),
                };
                snap.result_stored(id, seq)?
            };
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
            .and_then(|r| machine::view(&r));
        let before_view = match &before {
            Ok(b) => Some(
                b.as_ref()
                    .and_then(|r| machine::effective(r.clone(), now))
                    .and_then(|r| machine::view(&r)),
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
            why.push(
                "none of its events and not its stored receipt could be read; an intact copy \
                 of its receipt was found in the file's raw bytes"
                    .to_string(),
            );
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
    fn compare_scopes(&mut self) -> Result<Vec<(String, u64)>> {
        let mut stored: Vec<ScopeRecord> = Vec::new();
        let _ = self.src.read_table::<index::Scopes>(|k, v| {
            if let Ok(s) = index::decode_scope(&k, &v) {
                stored.push(s);
            }
            Ok(())
        })?;
        let mut out = Vec::new();
        for s in stored {
            let snap = index::Snapshot {
                base: Some(&self.base),
                layers: Layers::new(&[&self.pending]),
            };
            let now_rev = snap.scope_revision(&s.scope)?;
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

    fn apply_actions(&mut self, actions: Vec<Action>, scopes: Vec<(String, u64)>) -> Result<()> {
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
            self.maybe_flush()?;
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

    /// The meta records: the format (upgraded to this one), the state, and a checkpoint
    /// that keeps the journal id and starts a new log cycle (a log left from the old one is
    /// then recognized as stale).
    fn write_meta(&mut self) -> Result<()> {
        let old_format = self.src.view(|v| v.format()).ok().flatten();
        let old_cp = self
            .src
            .view(|v| v.checkpoint())
            .ok()
            .flatten()
            .or_else(|| self.candidates.and_then(|c| c.checkpoint.clone()));
        let now = self.now;
        let format = match old_format {
            Some(f) if f.format_version == u32::from(FORMAT_VERSION) => f,
            Some(old) => {
                let mut state = self.state.clone();
                let cfg = self.cfg.clone();
                self.batch(|t| {
                    let mut ctx = Ctx {
                        t,
                        now,
                        cfg: &cfg,
                        state: &mut state,
                        fired: Default::default(),
                    };
                    ctx.append(
                        None,
                        EventKind::FormatUpgraded {
                            from: old.format_version,
                            to: u32::from(FORMAT_VERSION),
                        },
                    )
                    .map(drop)
                })?;
                self.state = state;
                FormatRecord {
                    format_version: u32::from(FORMAT_VERSION),
                    upgraded: Some(crate::record::Upgrade {
                        from: old.format_version,
                        at: now,
                    }),
                    ..old
                }
            }
            None => FormatRecord {
                format_version: u32::from(FORMAT_VERSION),
                created_at: Timestamp(0),
                created_by: format!("opjournal {} repair", env!("CARGO_PKG_VERSION")),
                upgraded: None,
            },
        };
        let cp = match old_cp {
            Some(cp) => CheckpointRecord {
                journal_id: cp.journal_id,
                generation: cp.generation + 1,
                next_lsn: cp.next_lsn
                    + self.report.log_records
                    + self.report.log_records_dropped
                    + 1,
            },
            None => CheckpointRecord {
                journal_id: crate::log::new_journal_id(),
                generation: 1,
                next_lsn: 1,
            },
        };
        let state = self.state.clone();
        self.batch(|t| {
            t.put_format(&format)?;
            t.put_state(&state)?;
            t.put_checkpoint(&cp)
        })
    }
}

/// A result record's header and payload, wherever it was found (its key unchecked).
fn decode_result_frame(
    bytes: &[u8],
) -> std::result::Result<(crate::record::ResultHeader, Vec<u8>), codec::FrameError> {
    let (version, payload) = codec::unframe_versioned(RecordKind::Result, bytes)?;
    let (header, used): (crate::record::ResultHeader, usize) =
        codec::decode_prefix(version, payload)?;
    Ok((header, payload[used..].to_vec()))
}

/// An event appended to settle an operation.
enum Action {
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
    fn op(&self) -> &str {
        match self {
            Action::Salvage { op, .. } | Action::Retire { op, .. } => op,
        }
    }

    /// The receipt after this action, as the fold will give it.
    /// The event that settles the operation.
    fn event_kind(&self) -> EventKind {
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
    fn simulate(&self, after: Option<&ReceiptRecord>, now: Timestamp) -> Option<ReceiptRecord> {
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

/// Where a result payload was found.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Provenance {
    /// In the results table.
    Tree,
    /// An intact copy in the raw bytes, of a key whose stored value is damaged.
    KeyCopy,
    /// In the raw bytes, in a range of the table that could not be read.
    Raw,
}

/// An event waiting for its time-order decision, with the bytes it was found as.
struct Pending {
    ev: Event,
    raw: Vec<u8>,
}

/// A one-line description of a public receipt's state.
fn status_text(r: &crate::types::Receipt) -> String {
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

/// The new file, beside the journal, removed unless installed.
struct Target {
    path: PathBuf,
    /// For a dry run outside the journal's directory (not writable): the file in the
    /// system's temporary directory, removed when dropped.
    _scratch: Option<crate::fsutil::TempFile>,
    keep: bool,
}

impl Target {
    fn create(journal: &Path, dry_run: bool) -> Result<Target> {
        let dir = crate::fsutil::parent_dir(journal);
        let name = journal
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "journal".into());
        let path = dir.join(format!(".{name}.repair-{}", std::process::id()));
        let create = |p: &Path| {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(p)
                .map(drop)
        };
        match create(&path) {
            Ok(()) => Ok(Target {
                path,
                _scratch: None,
                keep: false,
            }),
            Err(e) if dry_run => {
                // A dry run in a directory it cannot write to builds its copy elsewhere.
                let tmp =
                    crate::fsutil::TempFile::create(&std::env::temp_dir(), "opjournal-repair")
                        .map_err(|_| {
                            Error::io_while(
                                "create the repaired journal beside the file",
                                "nothing was changed",
                                e,
                            )
                        })?;
                Ok(Target {
                    path: tmp.path.clone(),
                    _scratch: Some(tmp),
                    keep: false,
                })
            }
            Err(e) => Err(Error::io_while(
                "create the repaired journal beside the file",
                "the repair stopped and nothing was changed",
                e,
            )),
        }
    }

    /// A new, empty database at the target (again empty on every call).
    fn database(&self) -> Result<Database> {
        let _ = std::fs::remove_file(&self.path);
        redb::Builder::new()
            .set_cache_size(NEW_FILE_CACHE)
            .create(&self.path)
            .map_err(|e| {
                Error::from(e).while_doing(
                    "create the repaired journal beside the file",
                    "the repair stopped and nothing was changed",
                )
            })
    }

    /// Puts the repaired journal in place of the file (not for a dry run): the file is kept
    /// under the backup name first (a hard link, so the journal's name never goes missing),
    /// then the new file is renamed over it and the directory synced. The log moves with the
    /// backup (its records are in the new file).
    fn install(
        mut self,
        journal: &Path,
        options: &RepairOptions,
        report: &mut RepairReport,
    ) -> Result<()> {
        if options.dry_run {
            return Ok(());
        }
        let failed = |what: &'static str| {
            move |e: std::io::Error| {
                Error::io_while(
                    what,
                    "the repair stopped and the journal is unchanged (the repaired copy was removed)",
                    e,
                )
            }
        };
        if let Ok(meta) = std::fs::metadata(journal) {
            std::fs::set_permissions(&self.path, meta.permissions())
                .map_err(failed("give the repaired journal the file's permissions"))?;
        }
        File::open(&self.path)
            .and_then(|f| f.sync_all())
            .map_err(failed("sync the repaired journal"))?;
        let log = FileLog::path_for(journal);
        if options.backup {
            let backup = backup_path(journal);
            match std::fs::hard_link(journal, &backup) {
                Ok(()) => {}
                Err(_) => {
                    std::fs::copy(journal, &backup)
                        .map_err(failed("write the backup of the journal"))?;
                }
            }
            if log.exists() {
                std::fs::copy(&log, FileLog::path_for(&backup))
                    .map_err(failed("write the backup of the journal's log"))?;
            }
            report.backup = Some(backup);
        }
        std::fs::rename(&self.path, journal)
            .map_err(failed("rename the repaired journal over the file"))?;
        self.keep = true;
        // The repaired journal holds everything the log held: a log left now would be of an
        // older cycle (ignored), but it goes.
        if log.exists() {
            std::fs::remove_file(&log).map_err(|e| {
                Error::io_while(
                    "remove the journal's old log",
                    "the journal was repaired; the old log beside it is of an earlier cycle and is ignored",
                    e,
                )
            })?;
        }
        crate::fsutil::sync_parent(journal).map_err(|e| {
            Error::io_while(
                "sync the journal's directory",
                "the journal was repaired, but a power loss now could bring back the file as it was",
                e,
            )
        })?;
        Ok(())
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
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

/// The indexes of the longest run of `events` (in order) whose times never decrease
/// (patience sorting, `O(n log n)`).
fn time_ordered(events: &[(usize, Timestamp)]) -> BTreeSet<usize> {
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
