//! `opjournal repair FILE`: backup, rebuild every index from the event journal, quarantine
//! damaged records, report what was lost; salvage when redb refuses the file.

use std::path::{Path, PathBuf};

use opjournal::{EngineAccess, RepairOptions, RepairReport};
use opjournal::{ErrorKind, FileLog};
use serde_json::{Value, json};

use super::verify::findings_table;
use super::{Outcome, Run, Summary, note, read_err, write_err};
use crate::cli::RepairArgs;
use crate::cli::failure::{CliError, Failure};
use crate::cli::format::{clean, count};
use crate::cli::output::{Align, Out, Table};
use crate::cli::progress::Progress;

pub(super) fn run(args: &RepairArgs, out: &mut Out) -> Run {
    let summary = Summary::start("repair", &args.file);
    let file = &args.file;
    let mut options = RepairOptions::default();
    options.dry_run = args.dry_run;
    options.backup = !args.no_backup;
    // The library refuses, before writing anything, what is not a journal (not a regular
    // file, empty, no intact journal record), a newer format, and a file a writer holds.
    let bar = Progress::bar("repairing", "events");
    let mut report = opjournal::repair(file, &options, &mut |done, total| bar.set(done, total));
    // A dry run writes nothing, so a writer having the journal open does not stop it: it
    // repairs a consistent copy of the journal's files instead (kept until it ends).
    let _copy;
    if let Err(e) = &report
        && args.dry_run
        && matches!(e.kind(), ErrorKind::Locked { .. })
    {
        let (dir, copy) = live_copy(file)?;
        note(format!(
            "`{}` is open in another process: this dry run repairs a consistent copy of the \
             journal and its log, taken now (repairing the file itself needs that process \
             closed)",
            file.display()
        ));
        report = opjournal::repair(&copy, &options, &mut |done, total| bar.set(done, total));
        _copy = dir;
    }
    drop(bar);
    let report = match report {
        Ok(r) => r,
        Err(e) if matches!(e.kind(), ErrorKind::Corrupt { table, .. } if table == "(file)") => {
            return Err(CliError::new(format!(
                "`{}` is damaged beyond salvage: the storage engine refuses it and no intact journal event was found in its bytes or its log",
                file.display()
            ))
            .hint("restore the journal from a backup; the file was left as it was")
            .into());
        }
        // A dry run only reads the file (its writes go to a temporary copy).
        Err(e) if args.dry_run => return Err(read_err(file)(e)),
        Err(e) => return Err(write_err(file)(e)),
    };
    // A dry run that finds damage reports problems (exit 1), like verify; a repair that ran
    // has fixed what it reports.
    let outcome = if args.dry_run && report.found_damage() {
        Outcome::Problems
    } else {
        Outcome::Clean
    };
    let counts = json!({
        "dry_run": report.dry_run,
        // As text: a path that is not UTF-8 has no JSON string (serializing it fails).
        "backup": report.backup.as_ref().map(|p| p.display().to_string()),
        "engine": report.engine,
        "salvaged": report.salvaged,
        "storage_rolled_back": report.storage_rolled_back,
        "page_checksums_failed": report.page_checksums_failed,
        "quarantined": report.quarantined.len(),
        "lost": report.lost.len(),
        "unreadable": report.unreadable.len(),
        "scopes_changed": report.scopes.len(),
        "log_records": report.log_records,
        "log_records_dropped": report.log_records_dropped,
        "trailing_bytes_trimmed": report.trailing_bytes_trimmed,
        "events_replayed": report.events_replayed,
        "receipts_rebuilt": report.receipts_rebuilt,
        "scopes_rebuilt": report.scopes_rebuilt,
        "orphan_results_removed": report.orphan_results_removed,
        "index_entries_changed": report.index_entries_changed(),
        "index_changes": report
            .index_changes
            .iter()
            .map(|c| {
                (
                    c.table.clone(),
                    json!({"added": c.added, "removed": c.removed, "changed": c.changed}),
                )
            })
            .collect::<serde_json::Map<String, Value>>(),
    });
    if out.json() {
        for q in &report.quarantined {
            out.record(
                "quarantined",
                &serde_json::to_value(q).unwrap_or(Value::Null),
            )?;
        }
        for u in &report.unreadable {
            out.record(
                "unreadable",
                &serde_json::to_value(u).unwrap_or(Value::Null),
            )?;
        }
        for sc in &report.scopes {
            out.record("scope", &serde_json::to_value(sc).unwrap_or(Value::Null))?;
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
    rows.push((
        "  storage",
        match report.engine {
            EngineAccess::InPlace => "read in place".to_string(),
            EngineAccess::RecoveredInMemory => {
                "not closed cleanly: recovered in memory and read in place".into()
            }
            EngineAccess::Truncated => {
                "the file is shorter than its header says: read at its full length, the missing pages unreadable".into()
            }
            EngineAccess::HeaderRebuilt => {
                "the file's header was damaged: rebuilt in memory".into()
            }
            EngineAccess::Refused => {
                "the storage engine refused the file: every intact record was salvaged from its bytes".into()
            }
            _ => "read".into(),
        },
    ));
    if report.page_checksums_failed {
        rows.push((
            "  pages",
            "the storage engine's page check failed (as `verify` reports it); the repaired file is written anew from the records, without the damaged pages".into(),
        ));
    }
    if report.salvaged && report.engine != EngineAccess::Refused {
        rows.push((
            "  salvaged",
            "records of the parts the storage engine could not read were taken from the raw bytes, where their index shows them live".into(),
        ));
    }
    if report.log_records > 0 || report.log_records_dropped > 0 {
        rows.push((
            "  log",
            format!(
                "{} taken from the log{}",
                count(report.log_records, "record", "records"),
                if report.log_records_dropped > 0 {
                    format!(", {} dropped (see below)", report.log_records_dropped)
                } else {
                    String::new()
                }
            ),
        ));
    }
    if report.trailing_bytes_trimmed > 0 {
        rows.push((
            "  trimmed",
            format!(
                "{} bytes that followed the journal's data",
                report.trailing_bytes_trimmed
            ),
        ));
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
    if !report.unreadable.is_empty() {
        out.line("")?;
        out.line(format!(
            "unreadable: {} the storage engine could not read (an operation whose every record lay there left nothing to name it by):",
            count(report.unreadable.len() as u64, "range", "ranges")
        ))?;
        findings_table(out, &report.unreadable)?;
    }
    if !report.scopes.is_empty() {
        out.line("")?;
        out.line(format!(
            "scopes: {} whose revision differs from what the file recorded:",
            count(report.scopes.len() as u64, "scope", "scopes")
        ))?;
        findings_table(out, &report.scopes)?;
    }
    if !report.index_changes.is_empty() {
        out.line("")?;
        let n = report.index_entries_changed();
        out.line(format!(
            "index: {} {} from what the events give (rebuilt from them):",
            count(n, "entry", "entries"),
            if n == 1 { "differs" } else { "differ" }
        ))?;
        let mut table = Table::new(&[
            ("TABLE", Align::Left),
            ("ADDED", Align::Right),
            ("REMOVED", Align::Right),
            ("CHANGED", Align::Right),
        ])
        .indent(2);
        for c in &report.index_changes {
            table.push(vec![
                clean(&c.table),
                c.added.to_string(),
                c.removed.to_string(),
                c.changed.to_string(),
            ]);
        }
        out.table(&table)?;
    }
    out.line("")?;
    if report.lost.is_empty() && report.unreadable.is_empty() && report.log_records_dropped == 0 {
        out.line("lost: nothing; every operation was restored as it was")?;
    } else if report.lost.is_empty() {
        // What the unreadable parts held cannot be compared with anything: say so rather
        // than that nothing was lost.
        out.line(
            "lost: every operation that could be read was restored as it was; what the \
             unreadable parts above recorded is not in the journal (the operations they \
             changed are as they were before it, or missing)",
        )?;
    } else {
        out.line(format!(
            "lost: {} not restored as they were:",
            count(report.lost.len() as u64, "operation", "operations")
        ))?;
        let mut table = Table::new(&[
            ("OPERATION", Align::Left),
            ("NOW", Align::Left),
            ("WAS", Align::Left),
            ("WHAT CHANGED", Align::Left),
        ])
        .indent(2);
        for l in &report.lost {
            table.push(vec![
                clean(&l.operation_id),
                clean(&l.now),
                clean(&l.was),
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

/// Copies the journal at `file` and its log, which a writer in another process has open,
/// into a new temporary directory, and returns it with the copy's path. The copy is
/// consistent: redb never overwrites a page its latest commit can reach, and
/// every commit rewrites the file's header, so a copy made while the header read the same
/// before and after holds one commit and the log records written since (a torn last record
/// reads as the log's end, as after a crash). The log is copied after the journal: a
/// checkpoint that restarts the log commits first, which changes the header.
fn live_copy(file: &Path) -> Result<(tempfile::TempDir, PathBuf), Failure> {
    const TRIES: usize = 20;
    let failed = |what: &str, e: std::io::Error| -> Failure {
        CliError::new(format!(
            "could not {what} for a dry run beside the writer: {e}"
        ))
        .hint("check the space in the temporary directory ($TMPDIR), or close the editor and run the dry run again")
        .into()
    };
    let header = |f: &Path| -> std::io::Result<Vec<u8>> {
        use std::io::Read as _;
        let mut head = Vec::with_capacity(HEADER_BYTES);
        std::fs::File::open(f)?
            .take(HEADER_BYTES as u64)
            .read_to_end(&mut head)?;
        Ok(head)
    };
    let dir = tempfile::Builder::new()
        .prefix("opjournal-dry-run-")
        .tempdir()
        .map_err(|e| failed("create a temporary directory", e))?;
    let copy = dir.path().join(
        file.file_name()
            .unwrap_or(std::ffi::OsStr::new("journal.opj")),
    );
    let logs = FileLog::paths_for(file)
        .into_iter()
        .zip(FileLog::paths_for(&copy));
    for _ in 0..TRIES {
        let before = header(file).map_err(|e| failed("read the journal", e))?;
        std::fs::copy(file, &copy).map_err(|e| failed("copy the journal", e))?;
        for (log, log_copy) in logs.clone() {
            match std::fs::copy(&log, &log_copy) {
                Ok(_) => {}
                // Closed meanwhile: the journal's header changed too, and the copy is
                // retried.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let _ = std::fs::remove_file(&log_copy);
                }
                Err(e) => return Err(failed("copy the journal's log", e)),
            }
        }
        if header(file).map_err(|e| failed("read the journal", e))? == before {
            return Ok((dir, copy));
        }
    }
    Err(CliError::new(format!(
        "`{}` changed during each of {TRIES} copies for a dry run beside its writer",
        file.display()
    ))
    .hint("run the dry run again when the editor is idle, or close it first")
    .into())
}

/// redb's header: its commit slots, which every commit rewrites.
const HEADER_BYTES: usize = 512;
