//! `opjournal verify FILE`: page checksums, every record's CRC and decode, and every index
//! against a replay of the event journal. Exit 1 names every problem. With `--postgres URL
//! NAME`, the same record and index checks on the journal's rows, from one snapshot (no
//! file pages, log or trailing bytes to check).

use std::path::Path;

use opjournal::{ErrorKind, Inspector};
use opjournal::{Finding, Integrity, LogCheck, VerifyReport};
use serde_json::json;

use super::{Outcome, Run, Summary, Target, note, read_err};
use crate::cli::FileArgs;
use crate::cli::failure::{Failure, Mode, explain};
use crate::cli::format::{clean, count};
use crate::cli::output::{Align, Out, Table};
use crate::cli::progress::Progress;

/// Whether an error opening the file means it cannot be inspected at all (exit 2), rather
/// than that it is a damaged journal (a finding, exit 1).
fn cannot_inspect(e: &opjournal::Error) -> bool {
    match e.kind() {
        ErrorKind::Io => {
            let io = std::error::Error::source(e).and_then(|s| s.downcast_ref::<std::io::Error>());
            !matches!(
                io.map(std::io::Error::kind),
                Some(std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData)
            )
        }
        ErrorKind::Locked { .. } | ErrorKind::UnsupportedFormat { .. } => true,
        // Not a file to look inside (a FIFO, a device, a directory), or an empty one.
        ErrorKind::NotAJournal { detail, .. } => {
            detail.contains("not a regular file") || detail == "the file is empty"
        }
        _ => false,
    }
}

pub(super) fn run(args: &FileArgs, out: &mut Out) -> Run {
    let target = Target::new(&args.file, args.postgres.as_deref());
    let mut summary = Summary::start("verify", &args.file);
    let insp = if target.is_database() {
        // A journal in a database that cannot be opened (unreachable, no such journal, a
        // newer schema) is not one to look inside: exit 2.
        super::open(target)?
    } else {
        let insp = match Inspector::open(&args.file) {
            Ok(insp) => insp,
            Err(e) if cannot_inspect(&e) => {
                return Err(explain(&e, &args.file, Mode::Read).into());
            }
            Err(e) => return refused(args, out, &summary, &e),
        };
        if insp.access() != opjournal::Access::Idle {
            note(insp.access().describe());
        }
        super::note_trailing(&insp);
        insp
    };
    summary.inspected(&insp);
    let bar = Progress::bar("verifying", "events");
    let report = opjournal::verify_inspected(&insp, &mut |done, total| bar.set(done, total))
        .map_err(target.err())?;
    drop(bar);
    let outcome = if report.is_clean() {
        Outcome::Clean
    } else {
        Outcome::Problems
    };
    let problems = report.problems();
    let counts = json!({
        "problems": problems,
        "events": report.events,
        "receipts": report.receipts,
        "results": report.results,
        "scopes": report.scopes,
        "index_entries": report.index_entries,
        "quarantined": report.quarantined,
        "trailing_bytes": report.trailing_bytes,
        "more_findings": report.more_findings,
    });
    if out.json() {
        out.record(
            "integrity",
            &serde_json::to_value(&report.integrity).unwrap_or_default(),
        )?;
        out.record(
            "log",
            &serde_json::to_value(&report.log).unwrap_or_default(),
        )?;
        for f in &rows(&report) {
            out.record("finding", &serde_json::to_value(f).unwrap_or_default())?;
        }
        return summary.write(out, outcome, counts);
    }
    let recovered = insp.access() == opjournal::Access::Recovered;
    human(out, target, insp.path(), recovered, &report, problems)?;
    summary.write(out, outcome, counts)
}

fn human(
    out: &mut Out,
    target: Target<'_>,
    shown: &Path,
    recovered: bool,
    report: &VerifyReport,
    problems: u64,
) -> Result<(), Failure> {
    out.line(format!("verified {}", shown.display()))?;
    out.pairs(&[
        (
            "  storage engine",
            match &report.integrity {
                Integrity::Passed => "page checksums passed".to_string(),
                Integrity::Failed(d) => format!("FAILED: {}", clean(d)),
                Integrity::Skipped(d) => format!("not checked: {}", clean(d)),
                _ => "unknown".into(),
            },
        ),
        (
            "  records",
            format!(
                "{}, {}, {}, {}; {} checked against the events",
                count(report.events, "event", "events"),
                count(report.receipts, "receipt", "receipts"),
                count(report.results, "result", "results"),
                count(report.scopes, "scope", "scopes"),
                count(report.index_entries, "index entry", "index entries"),
            ),
        ),
        (
            "  quarantine",
            format!(
                "{} set aside by earlier repairs",
                count(report.quarantined, "record", "records")
            ),
        ),
        (
            "  log",
            if target.is_database() {
                "none (a journal in a database keeps no log file)".to_string()
            } else {
                log_line(&report.log, recovered, shown)
            },
        ),
    ])?;
    out.line("")?;
    if problems == 0 {
        out.line("no problems found")?;
        return Ok(());
    }
    out.line(format!("{} found:", count(problems, "problem", "problems")))?;
    findings_table(out, &rows(report))?;
    if report.more_findings > 0 {
        out.line(format!(
            "  ... and {} more (the first {} are listed)",
            count(report.more_findings, "problem", "problems"),
            report.findings.len()
        ))?;
    }
    out.line("")?;
    match target {
        Target::File(file) => out.line(format!(
            "`opjournal repair {0} --dry-run` shows what repair would rebuild and what would be lost; `opjournal repair {0}` does it (after a backup)",
            file.display()
        )),
        Target::Postgres { name, .. } => out.line(format!(
            "repair works on journal files only: when the events and results are intact, `opjournal export --postgres URL {} --dump | opjournal import - FILE` rebuilds every index into a journal file; otherwise restore the rows named above from a backup of the database",
            name.display()
        )),
    }
}

/// The findings as listed, both outputs alike: a failed page check first, as a finding of
/// the storage engine's own structures, then the report's findings.
fn rows(report: &VerifyReport) -> Vec<Finding> {
    let mut rows = Vec::with_capacity(report.findings.len() + 1);
    if let Integrity::Failed(detail) = &report.integrity {
        rows.push(Finding {
            table: "(redb)".into(),
            key: "(pages)".into(),
            problem: detail.clone(),
        });
    }
    rows.extend(report.findings.iter().cloned());
    rows
}

fn log_line(log: &LogCheck, recovered: bool, journal: &Path) -> String {
    match log {
        // Not a finding: a power cut just after a clean close leaves the same (the log
        // removed, the file's clean mark not yet on the disk), with nothing missing.
        LogCheck::Absent if recovered => format!(
            "none, though the journal was not closed cleanly: if it was copied or moved \
             without its log ({}), what its writer committed after its last checkpoint is \
             not here; put the log beside it and verify again",
            opjournal::FileLog::paths_for(journal)[0].display()
        ),
        LogCheck::Absent => "none (the journal was closed cleanly)".into(),
        LogCheck::Current { records, bytes } => format!(
            "{} of the current cycle laid over the file ({} bytes)",
            count(*records, "record", "records"),
            bytes
        ),
        LogCheck::Ignored { reason } => format!("ignored: {}", clean(reason)),
        _ => "unknown".into(),
    }
}

pub(crate) fn findings_table(out: &mut Out, findings: &[Finding]) -> Result<(), Failure> {
    let mut table = Table::new(&[
        ("TABLE", Align::Left),
        ("KEY", Align::Left),
        ("PROBLEM", Align::Left),
    ])
    .indent(2);
    for f in findings {
        table.push(vec![clean(&f.table), clean(&f.key), clean(&f.problem)]);
    }
    if !table.is_empty() {
        out.table(&table)?;
    }
    Ok(())
}

/// redb (or the journal's own meta records) refused the file: report that as
/// the problem, with what a salvage could recover.
fn refused(args: &FileArgs, out: &mut Out, summary: &Summary, e: &opjournal::Error) -> Run {
    let frames = opjournal::intact_records(&args.file).map_err(read_err(&args.file))?;
    if matches!(e.kind(), ErrorKind::NotAJournal { .. }) && frames.events == 0 {
        return Err(explain(e, &args.file, Mode::Read).into());
    }
    let finding = match e.kind() {
        ErrorKind::Corrupt { table, key, detail } => Finding {
            table: table.clone(),
            key: key.clone(),
            problem: detail.clone(),
        },
        ErrorKind::NotAJournal { detail, .. } => Finding {
            table: "(file)".into(),
            key: "(tables)".into(),
            problem: format!(
                "the file does not read as a journal ({detail}), but it holds intact journal records"
            ),
        },
        _ => {
            let mut problem = format!("the storage engine refuses the file: {e}");
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                problem.push_str(&format!(": {s}"));
                source = s.source();
            }
            Finding {
                table: "(redb)".into(),
                key: "(file)".into(),
                problem,
            }
        }
    };
    let log = if frames.log_records > 0 {
        format!(
            ", and {} of its log ({}) to lay over them",
            count(frames.log_records, "record", "records"),
            count(frames.log_events, "event", "events"),
        )
    } else {
        String::new()
    };
    let salvage = if frames.events + frames.log_events > 0 {
        format!(
            "{} ({}) found in the raw bytes{log}; `opjournal repair {}` salvages them into a new file",
            count(frames.records, "intact record", "intact records"),
            count(frames.events, "event", "events"),
            args.file.display()
        )
    } else {
        "no intact event found in the raw bytes or the log: nothing can be salvaged; restore the file from a backup".to_string()
    };
    let counts = json!({
        "problems": 1,
        "salvageable_records": frames.records,
        "salvageable_events": frames.events,
        "salvageable_log_records": frames.log_records,
        "salvageable_log_events": frames.log_events,
    });
    if out.json() {
        out.record(
            "integrity",
            &json!({"result": "failed", "detail": format!("the file cannot be opened: {e}")}),
        )?;
        out.record(
            "finding",
            &serde_json::to_value(&finding).unwrap_or_default(),
        )?;
        return summary.write(out, Outcome::Problems, counts);
    }
    out.line(format!("verified {}", args.file.display()))?;
    out.pairs(&[(
        "  storage engine",
        "FAILED: the file cannot be opened".to_string(),
    )])?;
    out.line("")?;
    out.line("1 problem found:")?;
    findings_table(out, std::slice::from_ref(&finding))?;
    out.line("")?;
    out.line(salvage)?;
    summary.write(out, Outcome::Problems, counts)
}
