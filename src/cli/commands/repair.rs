//! `opjournal repair FILE`: backup, rebuild every index from the event journal, quarantine
//! damaged records, report what was lost; salvage when the storage engine refuses the file.

use opjournal::{ErrorKind, Inspector};
use opjournal::{RepairOptions, RepairReport};
use serde_json::{Value, json};

use super::verify::{findings_table, intact_frames};
use super::{Outcome, Run, Summary, write_err};
use crate::cli::RepairArgs;
use crate::cli::failure::{CliError, Failure, Mode, explain};
use crate::cli::format::{clean, count};
use crate::cli::output::{Align, Out, Table};
use crate::cli::progress::Progress;

/// The first bytes of every redb file.
const REDB_SIGNATURE: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

fn starts_with_signature(path: &std::path::Path) -> std::io::Result<bool> {
    use std::io::Read as _;
    let mut head = Vec::with_capacity(REDB_SIGNATURE.len());
    std::fs::File::open(path)?
        .take(REDB_SIGNATURE.len() as u64)
        .read_to_end(&mut head)?;
    Ok(head == REDB_SIGNATURE)
}

pub(super) fn run(args: &RepairArgs, out: &mut Out) -> Run {
    let summary = Summary::start("repair", &args.file);
    let file = &args.file;
    let io_err =
        |e: std::io::Error| Failure::Error(explain(&opjournal::Error::from(e), file, Mode::Write));
    // Refused before a backup of it is written: a newer journal, and a file that does not
    // read as a journal and holds no intact journal event (another redb database, any other
    // file). A damaged journal goes on to repair.
    let meta = std::fs::metadata(file).map_err(io_err)?;
    if meta.len() > 0 {
        if starts_with_signature(file).map_err(io_err)? {
            if let Err(e) = Inspector::open(file)
                && (matches!(e.kind(), ErrorKind::UnsupportedFormat { .. })
                    || (matches!(e.kind(), ErrorKind::NotAJournal { .. })
                        && intact_frames(file).map_err(io_err)?.events == 0))
            {
                return Err(explain(&e, file, Mode::Write).into());
            }
        } else if intact_frames(file).map_err(io_err)?.events == 0 {
            return Err(CliError::new(format!(
                "`{}` is not an opjournal journal: it does not start with the redb file signature and holds no intact journal event",
                file.display()
            ))
            .hint("check the path; if this file was a journal, it is damaged beyond salvage: restore it from a backup")
            .into());
        }
    }
    let mut options = RepairOptions::default();
    options.dry_run = args.dry_run;
    options.backup = !args.no_backup;
    let bar = Progress::bar("repairing", "events");
    let report = opjournal::repair(file, &options, &mut |done, total| bar.set(done, total));
    drop(bar);
    let report = match report {
        Ok(r) => r,
        Err(e) if matches!(e.kind(), ErrorKind::Corrupt { .. }) => {
            return Err(CliError::new(format!(
                "`{}` is damaged beyond salvage: the storage engine refuses it and no intact journal event was found in its bytes",
                file.display()
            ))
            .hint("restore the journal from a backup; the file was left as it was")
            .into());
        }
        Err(e) => return Err(write_err(file)(e)),
    };
    let damaged = !report.quarantined.is_empty()
        || !report.lost.is_empty()
        || report.salvaged
        || report.storage_rolled_back
        || report.page_checksums_failed;
    // A dry run that finds damage reports problems (exit 1), like verify; a repair that ran
    // has fixed what it reports.
    let outcome = if args.dry_run && damaged {
        Outcome::Problems
    } else {
        Outcome::Clean
    };
    let counts = json!({
        "dry_run": report.dry_run,
        "backup": report.backup,
        "salvaged": report.salvaged,
        "storage_rolled_back": report.storage_rolled_back,
        "page_checksums_failed": report.page_checksums_failed,
        "quarantined": report.quarantined.len(),
        "lost": report.lost.len(),
        "events_replayed": report.events_replayed,
        "receipts_rebuilt": report.receipts_rebuilt,
        "scopes_rebuilt": report.scopes_rebuilt,
        "orphan_results_removed": report.orphan_results_removed,
    });
    if out.json() {
        for q in &report.quarantined {
            out.record(
                "quarantined",
                &serde_json::to_value(q).unwrap_or(Value::Null),
            )?;
        }
        for l in &report.lost {
            out.record("lost", &serde_json::to_value(l).unwrap_or(Value::Null))?;
        }
        return summary.write(out, outcome, counts);
    }
    human(out, args, &report)?;
    summary.write(out, outcome, counts)
}

fn human(out: &mut Out, args: &RepairArgs, report: &RepairReport) -> Result<(), Failure> {
    let file = args.file.display();
    if report.dry_run {
        out.line(format!(
            "dry run: repaired a temporary copy of {file}; the file itself was not touched"
        ))?;
    } else {
        out.line(format!("repaired {file}"))?;
    }
    let mut rows: Vec<(&str, String)> = Vec::new();
    if let Some(b) = &report.backup {
        rows.push(("  backup", b.display().to_string()));
    } else if !report.dry_run {
        rows.push(("  backup", "none (--no-backup)".into()));
    }
    if report.salvaged {
        rows.push((
            "  storage",
            "the storage engine refused the file: every intact record was salvaged from its bytes into a new file".into(),
        ));
    } else if report.page_checksums_failed {
        rows.push((
            "  storage",
            "page checksums failed in the last commit: every record was read as it is, checked by its CRC, and the damaged ones set aside".into(),
        ));
    } else if report.storage_rolled_back {
        rows.push((
            "  storage",
            "page checksums failed: the storage engine rolled back to its last intact commit (later commits are lost)".into(),
        ));
    } else {
        rows.push(("  storage", "page checksums passed".into()));
    }
    rows.push((
        "  rebuilt",
        format!(
            "{} and {} from {} replayed",
            count(report.receipts_rebuilt, "receipt", "receipts"),
            count(report.scopes_rebuilt, "scope", "scopes"),
            count(report.events_replayed, "event", "events"),
        ),
    ));
    if report.orphan_results_removed > 0 {
        rows.push((
            "  removed",
            format!(
                "{} that no operation refers to",
                count(
                    report.orphan_results_removed,
                    "result payload",
                    "result payloads"
                )
            ),
        ));
    }
    out.pairs(&rows)?;
    out.line("")?;
    if report.quarantined.is_empty() {
        out.line("quarantined: nothing (every record passed its CRC and decoded)")?;
    } else {
        out.line(format!(
            "quarantined {} (moved to the `quarantine` table, kept as found):",
            count(report.quarantined.len() as u64, "record", "records")
        ))?;
        findings_table(out, &report.quarantined)?;
    }
    out.line("")?;
    if report.lost.is_empty() {
        out.line("lost: nothing; every operation was restored as it was")?;
    } else {
        out.line(format!(
            "lost: {} not restored as they were:",
            count(report.lost.len() as u64, "operation", "operations")
        ))?;
        let mut table = Table::new(&[
            ("OPERATION", Align::Left),
            ("NOW", Align::Left),
            ("WHAT WAS LOST", Align::Left),
        ])
        .indent(2);
        for l in &report.lost {
            table.push(vec![
                clean(&l.operation_id),
                clean(&l.now),
                clean(&l.detail),
            ]);
        }
        out.table(&table)?;
        if report.lost.iter().any(|l| l.now == "in_doubt") {
            out.line("")?;
            out.line(format!(
                "next: check the project, then `opjournal resolve {file} ID --applied REV | --failed MSG | --not-applied` for each in-doubt operation"
            ))?;
        }
    }
    if report.dry_run {
        out.line("")?;
        out.line(format!(
            "run `opjournal repair {file}` to apply this (a backup is written first)"
        ))?;
    }
    Ok(())
}
