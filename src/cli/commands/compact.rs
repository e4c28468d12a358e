//! `opjournal compact FILE [--reclaim]`: fire every due timer now, and optionally shrink the
//! file.

use std::path::Path;

use opjournal::{Journal, Stats};
use serde_json::json;

use super::{Outcome, Run, Summary, inspect_before_writing, note, read_err, write_err};
use crate::cli::CompactArgs;
use crate::cli::failure::Failure;
use crate::cli::format::{count, short_size};
use crate::cli::output::Out;
use crate::cli::progress::Progress;

/// Checks that `path` is a journal (without creating or changing anything: opening a
/// `Journal` would create a missing file) and returns its stats.
pub(crate) fn existing_journal(path: &Path) -> Result<Stats, Failure> {
    let insp = inspect_before_writing(path)?;
    insp.stats().map_err(read_err(path))
}

/// Opens the journal for writing, saying when running operations become in doubt: their
/// process is gone, since it no longer holds the file.
pub(crate) fn open_for_writing(path: &Path, before: &Stats) -> Result<Journal, Failure> {
    let journal = Journal::builder().open(path).map_err(write_err(path))?;
    if before.running > 0 {
        note(format!(
            "{} had no live writer and {} now in doubt (the process that ran {} is gone)",
            count(before.running, "running operation", "running operations"),
            if before.running == 1 { "is" } else { "are" },
            if before.running == 1 { "it" } else { "them" },
        ));
    }
    Ok(journal)
}

pub(super) fn run(args: &CompactArgs, out: &mut Out) -> Run {
    let summary = Summary::start("compact", &args.file);
    let before = existing_journal(&args.file)?;
    let mut journal = open_for_writing(&args.file, &before)?;
    let spinner = Progress::spinner("compacting");
    let report = journal.compact().map_err(write_err(&args.file))?;
    if args.reclaim {
        journal.reclaim_space().map_err(write_err(&args.file))?;
    }
    // The sizes are the file as the command found it and as it leaves it (closing the
    // journal writes redb's allocator state). A failure to close cleanly is
    // an error: the file would be left "not closed cleanly".
    journal.close().map_err(write_err(&args.file))?;
    let reclaimed = if args.reclaim {
        let after = std::fs::metadata(&args.file)
            .map(|m| m.len())
            .map_err(|e| write_err(&args.file)(opjournal::Error::from(e)))?;
        Some((before.file_bytes, after))
    } else {
        None
    };
    drop(spinner);
    let counts = json!({
        "fired": report.total(),
        "batches": report.batches,
        "file_bytes_before": reclaimed.map(|r| r.0),
        "file_bytes_after": reclaimed.map(|r| r.1),
    });
    if out.json() {
        out.record(
            "compaction",
            &serde_json::to_value(&report).unwrap_or_default(),
        )?;
        if let Some((b, a)) = reclaimed {
            out.record(
                "reclaim",
                &json!({"file_bytes_before": b, "file_bytes_after": a}),
            )?;
        }
        return summary.write(out, Outcome::Clean, counts);
    }
    if report.batches == 0 {
        out.line(format!(
            "compacted {}: no timer was due",
            args.file.display()
        ))?;
    } else {
        out.line(format!(
            "compacted {} in {} ({} ms): {} fired",
            args.file.display(),
            count(u64::from(report.batches), "batch", "batches"),
            super::elapsed_ms(report.elapsed),
            count(report.total(), "transition", "transitions"),
        ))?;
    }
    let n = |v: u64, what: &str| format!("{v:>6}  {what}");
    out.pairs(&[
        (
            "  lease expired",
            n(report.lease_expired, "running → in doubt"),
        ),
        ("  exhausted", n(report.exhausted, "retry budget spent")),
        (
            "  ack expired",
            n(report.ack_expired, "acknowledgement timeout passed"),
        ),
        (
            "  retired",
            n(report.retired, "result payload dropped, audit record kept"),
        ),
        (
            "  purged",
            n(report.purged, "operations removed with their events"),
        ),
        (
            "  revision events",
            n(
                report.revision_events_purged,
                "superseded scope revisions removed",
            ),
        ),
    ])?;
    if let Some((b, a)) = reclaimed {
        out.line("")?;
        out.line(format!(
            "reclaimed: file {} → {} ({} bytes → {} bytes, {} freed)",
            short_size(b),
            short_size(a),
            b,
            a,
            short_size(b.saturating_sub(a))
        ))?;
    }
    summary.write(out, Outcome::Clean, counts)
}
