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
//! Each phase is a file: [`log`] lays the log over the file, [`candidates`] gathers
//! records from the raw bytes where redb cannot read, [`rebuild`] holds the new file
//! (written through the batched writer that backup and import use) and writes the meta
//! records, [`events`] is phase 1, [`results`] phase 2, [`compare`] phase 3 (and the
//! scopes), [`indexes`] compares the rebuilt index tables with the file's, [`install`]
//! phase 4.
//!
//! Memory holds a batch (a few MiB), the storage engines' caches, one entry per damaged
//! operation and the report, whatever the journal's size; records salvaged from raw bytes
//! (only where the engine cannot read) are held until they are written.
//!
//! An I/O error (reading the journal, writing or syncing the new file) stops the repair and
//! is returned naming the operation: the journal is left as it was. Only damage (CRC and
//! decode failures, the engine's `Corrupted`, its panics) leads to quarantine and salvage.

mod candidates;
mod compare;
mod events;
mod indexes;
mod install;
mod log;
mod rebuild;
mod results;

use std::fs::File;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::codec::FORMAT_VERSION;
use crate::error::{Error, ErrorKind, Result};
use crate::index::{self, Table, View};
use crate::preflight::file::check_redb_magic;
use crate::preflight::reading::{Extent, existing_journal_file};

use super::salvage::scan_file;
use super::source::{Rung, Source};
use super::verify::Finding;

use candidates::{Candidates, TableGaps};
use install::Target;
pub(crate) use log::log_over;
use log::{Dropped, absorb_log};
use rebuild::{Build, Finished};

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
    /// redb's page check failed on the file, as `verify` reports it (a damaged page of an
    /// index, which the rebuild never reads, shows only here). The repaired file is written
    /// anew, without it. Damage where records lay also shows as
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
    /// The index tables whose entries the rebuild changes (only those with a change), in
    /// table order. Entries in [`RepairReport::unreadable`] ranges are not counted.
    pub index_changes: Vec<IndexChanges>,
}

/// Entries of one index table of the file (`receipts`, `scopes`, `op_events`, `timers`,
/// `scope_timers`, `windows`, `scope_holds`, `in_doubt`) that differ from the index the
/// events give, which the repaired journal holds instead.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct IndexChanges {
    /// The table.
    pub table: String,
    /// Entries the events imply that the file did not hold.
    pub added: u64,
    /// Entries the file held that the events do not imply.
    pub removed: u64,
    /// Entries under the same key whose value differs.
    pub changed: u64,
}

impl IndexChanges {
    /// Every entry changed: added, removed or changed.
    pub fn entries(&self) -> u64 {
        self.added + self.removed + self.changed
    }
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
            index_changes: Vec::new(),
        }
    }
}

impl RepairReport {
    /// Index entries the rebuild changes, every table together.
    pub fn index_entries_changed(&self) -> u64 {
        self.index_changes.iter().map(IndexChanges::entries).sum()
    }

    /// Whether repair found anything to repair (a dry run that finds something exits 1):
    /// damage, a salvage, or a change to the journal's tables (an index entry, an orphan
    /// result), even when every operation answers as before.
    pub fn found_damage(&self) -> bool {
        self.page_checksums_failed
            || !self.quarantined.is_empty()
            || !self.index_changes.is_empty()
            || self.orphan_results_removed > 0
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
/// - [`ErrorKind::InvalidInput`] when the file is read-only, unless `dry_run` is set
///   (opening it for writing is refused too);
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
    // redb's page check, as `verify` runs it: a damaged page of a table the rebuild does
    // not read (an index) changes nothing it compares, but the repaired file no longer
    // has it, so a dry run must say it would change the file.
    if matches!(src.rung, Some(Rung::InPlace | Rung::Recovered)) {
        report.page_checksums_failed = matches!(
            super::verify::page_check(path, extent.journal_len()),
            super::verify::Integrity::Failed(_)
        );
    }
    // A file with no intact event is beyond salvage unless its log holds events to lay
    // over what the file's bytes give (a journal that crashed before its first
    // checkpoint keeps every event in the log): decided once the log is read.
    let mut no_event_in_file = None;
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
                 from its bytes or its log",
            );
            if let Some(refused) = src.refused.take() {
                e = Error::with_source(e.kind().clone(), refused);
            }
            no_event_in_file = Some(e);
        }
    }
    // Opening for writing refuses a read-only file; so does a repair, which would replace
    // it (a dry run writes only a temporary copy).
    if !options.dry_run && meta.permissions().readonly() {
        return Err(Error::invalid(
            "journal file",
            &path.display().to_string(),
            "the file is read-only: make it writable to repair it (`repair --dry-run` shows \
             what the repair would do without writing)",
        ));
    }
    let mut candidates: Option<Candidates> = if src.readable() {
        None
    } else {
        Some(Candidates::scan(&file, &src, &TableGaps::all())?)
    };
    // The log is laid over the checkpoint the file names; over the latest one salvaged from
    // its bytes when the engine refuses the file.
    let salvaged_cp = candidates.as_ref().and_then(|c| c.checkpoint.clone());
    let dropped_ops = absorb_log(&mut src, salvaged_cp, &mut report)?;
    if let Some(e) = no_event_in_file
        && index::Events::map(&src.mem).is_empty()
    {
        return Err(e);
    }
    let target = Target::create(path, options.dry_run)?;
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
