//! `opjournal backup FILE DEST`: a consistent copy of a journal into a new file, also while
//! an editor has it open; `opjournal import DUMP DEST`: a new journal from a dump that
//! `export --dump` wrote.

use std::io::BufReader;
use std::path::Path;

use opjournal::{ErrorKind, Inspector};
use serde_json::json;

use super::{Outcome, Run, Summary, inspect, read_err};
use crate::cli::failure::{CliError, Failure};
use crate::cli::format::short_size;
use crate::cli::output::Out;
use crate::cli::progress::Progress;
use crate::cli::{BackupArgs, ImportArgs};

/// Whether `e` (or its cause) is a write to a closed pipe.
pub(super) fn is_broken_pipe(e: &opjournal::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::BrokenPipe
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// A library error while writing the new journal at `dest` (from `file`, for messages).
fn dest_err(dest: &Path) -> impl Fn(opjournal::Error) -> Failure + '_ {
    move |e| {
        let shown = dest.display();
        let cli = match e.kind() {
            ErrorKind::InvalidInput { what, .. } if *what == "destination" => {
                CliError::new(e.to_string())
                    .hint(format!("choose another path, or remove `{shown}` first"))
            }
            ErrorKind::InvalidDump { .. } => CliError::new(e.to_string()).hint(format!(
                "nothing was written to `{shown}`; check that the dump is a whole, unedited \
                 `opjournal export --dump` output"
            )),
            _ => CliError::new(e.to_string()).hint(format!(
                "nothing was left at `{shown}`; check the disk and try again"
            )),
        };
        Failure::Error(cli)
    }
}

pub(super) fn run_backup(args: &BackupArgs, out: &mut Out) -> Run {
    let mut summary = Summary::start("backup", &args.file);
    let insp: Inspector = inspect(&args.file)?;
    summary.access(insp.access());
    let spinner = Progress::spinner("copying");
    let report = insp.backup(&args.dest).map_err(|e| match e.kind() {
        ErrorKind::InvalidInput { .. } | ErrorKind::Io | ErrorKind::Storage => {
            dest_err(&args.dest)(e)
        }
        _ => read_err(&args.file)(e),
    })?;
    drop(spinner);
    let counts = json!({
        "dest": args.dest.display().to_string(),
        "events": report.events,
        "receipts": report.receipts,
        "results": report.results,
        "entries": report.entries,
        "log_records": report.log_records,
        "file_bytes": report.file_bytes,
    });
    if out.json() {
        return summary.write(out, Outcome::Clean, counts);
    }
    out.line(format!(
        "copied `{}` to `{}`: {} events, {} receipts, {} results ({} log records not yet checkpointed included), {}",
        args.file.display(),
        args.dest.display(),
        report.events,
        report.receipts,
        report.results,
        report.log_records,
        short_size(report.file_bytes),
    ))?;
    Ok(Outcome::Clean)
}

pub(super) fn run_import(args: &ImportArgs, out: &mut Out) -> Run {
    let summary = Summary::start("import", &args.dest);
    let spinner = Progress::spinner("importing");
    let report = if args.dump.as_os_str() == "-" {
        opjournal::import_dump(std::io::stdin().lock(), &args.dest)
    } else {
        let file = std::fs::File::open(&args.dump).map_err(|e| {
            Failure::Error(
                CliError::new(format!(
                    "cannot open the dump `{}`: {e}",
                    args.dump.display()
                ))
                .hint("name a file written by `opjournal export --dump`, or `-` for stdin"),
            )
        })?;
        opjournal::import_dump(BufReader::new(file), &args.dest)
    }
    .map_err(dest_err(&args.dest))?;
    drop(spinner);
    let counts = json!({
        "dump": args.dump.display().to_string(),
        "events": report.events,
        "receipts": report.receipts,
        "results": report.results,
        "file_bytes": report.file_bytes,
    });
    if out.json() {
        return summary.write(out, Outcome::Clean, counts);
    }
    out.line(format!(
        "imported `{}` into `{}`: {} events replayed, {} receipts rebuilt, {} results, {}",
        args.dump.display(),
        args.dest.display(),
        report.events,
        report.receipts,
        report.results,
        short_size(report.file_bytes),
    ))?;
    Ok(Outcome::Clean)
}
