//! Phase 0: the log beside the file. Its records of the file's current cycle are laid over
//! the file as recovery would lay them (up to a damaged or undecodable record), and the
//! operations changed by the records recovery drops are named, so that the comparison can
//! report them.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{Error, Result};
use crate::index::{self, Memtable, Table, View};
use crate::log::{self, FileLog};
use crate::record::{CheckpointRecord, ReceiptRecord};

use super::RepairReport;
use crate::check::source::Source;
use crate::check::verify::Finding;

/// Reads the log's records of the file's current cycle into the source (as recovery would:
/// up to a damaged or undecodable record), and names the operations whose changes are in
/// the records recovery drops.
///
/// `salvaged` is the latest checkpoint found in the file's raw bytes, used when the
/// engine cannot read the file's own: a crash before the first checkpoint leaves every
/// event in the log, and the salvage would otherwise have none.
pub(super) fn absorb_log(
    src: &mut Source,
    salvaged: Option<CheckpointRecord>,
    report: &mut RepairReport,
) -> Result<Dropped> {
    let mut dropped_ops = Dropped::default();
    let open = |p: &std::path::Path| {
        FileLog::open_read_only(p).map_err(|e| {
            Error::io_while(
                "open the journal's log",
                "the repair stopped and nothing was changed",
                e,
            )
        })
    };
    let paths = FileLog::paths_for(&src.path);
    // The second file alone (its first is gone) is read as the first would be.
    let logs: Vec<(FileLog, &std::path::Path)> = [open(&paths[0])?, open(&paths[1])?]
        .into_iter()
        .zip(paths.iter())
        .filter_map(|(log, path)| log.map(|l| (l, path.as_path())))
        .collect();
    if logs.is_empty() {
        return Ok(dropped_ops);
    }
    let cp = match src.view(|v| v.checkpoint()) {
        Ok(Some(cp)) => Some(cp),
        Ok(None) => None,
        Err(_) => salvaged,
    };
    let Some(cp) = cp else {
        // The file's checkpoint (which names the log's current cycle) cannot be read, so
        // the log cannot be laid over the file: its records are not taken. They may hold
        // the only trace of recent operations, so every operation they touch is named as
        // dropped (the sweep in tests/corruption_sweep.rs found such operations vanishing
        // from the report). Each log file's own first record tells which cycle to read.
        for (log, path) in &logs {
            let Some(cursor) = log::own_cursor(log).map_err(|e| {
                Error::io_while(
                    "read the journal's log",
                    "the repair stopped and nothing was changed",
                    e,
                )
            })?
            else {
                continue;
            };
            let mut records = 0u64;
            log::scan_storage(log, cursor, |r| -> Result<()> {
                dropped_ops.note(r.payload);
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
                    path.display().to_string(),
                    format!(
                        "the journal's checkpoint could not be read, so the log's {records} \
                         record(s) could not be laid over it and were not taken"
                    ),
                ));
            }
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
    let files: Vec<&dyn log::LogStorage> = logs.iter().map(|(l, _)| l as _).collect();
    let Laid {
        mem,
        records,
        bad,
        cycles,
    } = lay(&files, cursor).map_err(io)?;
    src.mem = mem;
    report.log_records = records;
    if let Some((lsn, detail)) = &bad {
        let lsn = *lsn;
        // The records from this one on were not absorbed: a writer's open refuses them.
        let after = log::scan_cycles(&files, cursor, |r| -> Result<()> {
            if r.lsn >= lsn {
                dropped_ops.note(r.payload);
            }
            Ok(())
        })
        .map_err(io)?;
        let scanned: u64 = after.iter().map(|c| c.scan.records).sum();
        let n = scanned.saturating_sub(lsn - cursor.first_lsn);
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
    // Each cycle read is checked in its own file (the writer keeps each file's records
    // followed by zeros), as `verify` does.
    for cycle in &cycles {
        let (log, path) = &logs[cycle.file];
        let log_key = path.display().to_string();
        let cursor = cycle.cursor;
        let dropped = log::dropped(log, cursor, |r| -> Result<()> {
            dropped_ops.note(r.payload);
            Ok(())
        })
        .map_err(io)?;
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
                    crate::check::verify::and_after(dropped.records),
                    if dropped.records == 0 { "was" } else { "were" }
                ),
            ));
        }
        if let Some(problem) = &dropped.length {
            // What lay past the cut is gone: the operations it changed cannot be named, only
            // where they were (as for a table range the engine cannot read).
            report.unreadable.push(Finding::new(
                "log",
                format!(
                    "records from {}",
                    cursor.first_lsn.saturating_add(cycle.scan.records)
                ),
                format!(
                    "{problem}: the operations those records changed cannot be named, and answer \
                     as before their changes"
                ),
            ));
        }
    }
    Ok(dropped_ops)
}

/// The operations changed by log records that a repair does not take, with the latest
/// receipt those records hold for each: the evidence that holds an operation in doubt when
/// nothing else of it is left (forgotten, it would run again when resubmitted).
#[derive(Default)]
pub(super) struct Dropped {
    pub(super) ops: BTreeSet<String>,
    pub(super) receipts: BTreeMap<String, ReceiptRecord>,
}

impl Dropped {
    /// Notes what one dropped record changed (see [`crate::check::ops_of_log_record`]).
    fn note(&mut self, payload: &[u8]) {
        crate::check::ops_of_log_record(payload, &mut self.ops, Some(&mut self.receipts));
    }
}

/// The log's records from a cycle on, as recovery takes them.
struct Laid {
    /// Their changes, in order.
    mem: Memtable,
    /// How many were taken.
    records: u64,
    /// The first that could not be (its number and why): it and every one after it are
    /// left out, as a writer's open refuses them.
    bad: Option<(u64, String)>,
    cycles: Vec<log::Cycle>,
}

fn lay(files: &[&dyn log::LogStorage], cursor: log::Cursor) -> Result<Laid> {
    let mut mem = Memtable::default();
    let mut bad: Option<(u64, String)> = None;
    let mut records = 0u64;
    let cycles = log::scan_cycles(files, cursor, |r| -> Result<()> {
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
    })?;
    Ok(Laid {
        mem,
        records,
        bad,
        cycles,
    })
}

/// How many records of the log beside the journal at `path` a repair would lay over the
/// checkpoint `cp` (salvaged from the file's bytes), and how many events their changes
/// hold. `(0, 0)` without a log.
///
/// # Errors
///
/// An I/O error reading the log.
pub(crate) fn log_over(path: &std::path::Path, cp: &CheckpointRecord) -> Result<(u64, u64)> {
    let io =
        |e: std::io::Error| Error::io_while("read the journal's log", "nothing was changed", e);
    let mut logs = Vec::new();
    for p in FileLog::paths_for(path) {
        if let Some(log) = FileLog::open_read_only(&p).map_err(io)? {
            logs.push(log);
        }
    }
    if logs.is_empty() {
        return Ok((0, 0));
    }
    let files: Vec<&dyn log::LogStorage> = logs.iter().map(|l| l as _).collect();
    let cursor = log::Cursor {
        journal_id: cp.journal_id,
        generation: cp.generation,
        first_lsn: cp.next_lsn,
    };
    let laid = lay(&files, cursor)?;
    let events = index::Events::map(&laid.mem)
        .values()
        .filter(|v| v.is_some());
    Ok((laid.records, events.count() as u64))
}
