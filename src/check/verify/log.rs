//! The log beside the file, as `verify` checks it: damage that recovery would drop or a
//! writer's open would refuse is a finding naming the operations it changed; a log of
//! another cycle or journal is not damage.

use std::path::Path;

use crate::error::{Error, Result};
use crate::inspect::LogRead;
use crate::log::{Cursor, FileLog};

use super::{Findings, LogCheck};

/// What the log holds, as findings: a damaged record with valid records after it (which
/// recovery drops), a damaged header with records after it (which a writer's open
/// discards), records whose changes do not decode (a writer's open refuses them). A log of
/// another cycle or journal is not damage.
pub(super) fn check_log(
    journal: &Path,
    log: &LogRead,
    findings: &mut Findings,
) -> Result<LogCheck> {
    let (cycles, records, header_problem, undecodable, len) = match log {
        LogRead::Absent => return Ok(LogCheck::Absent),
        LogRead::NoCycle => {
            return Ok(LogCheck::Ignored {
                reason: "the journal is of format 1, which keeps no log".into(),
            });
        }
        LogRead::Read {
            cycles,
            records,
            header_problem,
            undecodable,
            len,
            ..
        } => (cycles, *records, header_problem, undecodable, *len),
    };
    // Each cycle read is checked in its own file: the writer keeps the zero-past-the-end
    // invariant per file, so the torn-or-damaged rules apply to each as to one log.
    let mut header_damaged_first = false;
    let mut damaged = false;
    for (n, (file_index, cursor)) in cycles.iter().enumerate() {
        let log_path = &FileLog::paths_for(journal)[(*file_index).min(1)];
        let found = check_file(log_path, *cursor, findings)?;
        if n == 0 {
            header_damaged_first = found.header_damaged;
        }
        damaged |= found.damaged;
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
        && !header_damaged_first
    {
        return Ok(LogCheck::Ignored {
            reason: format!("{problem}: it is not this journal's current log"),
        });
    }
    if records == 0 && undecodable.is_none() && !damaged {
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

/// What [`check_file`] found in one log file.
struct FileCheck {
    /// Its header is damaged, with records of the cycle after it.
    header_damaged: bool,
    /// A damaged record.
    damaged: bool,
}

/// Checks one log file's records of `cursor`'s cycle for what recovery drops although no
/// crash can have left it so, as findings.
fn check_file(log_path: &Path, cursor: Cursor, findings: &mut Findings) -> Result<FileCheck> {
    let key = log_path.display().to_string();
    let Some(file) = FileLog::open_read_only(log_path)
        .map_err(|e| Error::io_while("open the journal's log", "nothing was read or changed", e))?
    else {
        return Ok(FileCheck {
            header_damaged: false,
            damaged: false,
        });
    };
    let read = |ops: &mut std::collections::BTreeSet<String>| {
        crate::log::dropped(&file, cursor, |r| -> Result<()> {
            crate::check::ops_of_log_record(r.payload, ops, None);
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
    Ok(FileCheck {
        header_damaged: dropped.header_damaged,
        damaged: dropped.damaged.is_some(),
    })
}

/// " and the N valid record(s) after it", or nothing when none follow.
pub(crate) fn and_after(records: u64) -> String {
    match records {
        0 => String::new(),
        1 => " and the valid record after it".into(),
        n => format!(" and the {n} valid records after it"),
    }
}
