//! `opjournal resolve FILE ID --applied REV | --failed MSG | --not-applied`: record how an
//! in-doubt operation ended, through the library's `Journal::resolve`.

use opjournal::{ExecutionStatus, Outcome as OpOutcome, Resolution};
use serde_json::{Value, json};

use super::compact::open_for_writing;
use super::{Outcome, Run, Summary, inspect_before_writing, read_err, write_err};
use crate::cli::ResolveArgs;
use crate::cli::failure::CliError;
use crate::cli::format::{clean, receipt_json, status_sentence};
use crate::cli::output::Out;

pub(super) fn run(args: &ResolveArgs, out: &mut Out) -> Run {
    let summary = Summary::start("resolve", &args.file);
    let payload = args.result.clone().unwrap_or_default().into_bytes();
    let (resolution, said) = match (args.applied, &args.failed, args.not_applied) {
        (Some(rev), None, false) => (
            Resolution::applied(rev, payload),
            format!("applied at revision {rev}"),
        ),
        (None, Some(msg), false) => (
            Resolution::Completed(OpOutcome::failed(msg.clone()).with_result(payload)),
            format!("failed: {}", clean(msg)),
        ),
        (None, None, true) => (Resolution::not_applied(), "not applied".to_string()),
        // clap's argument group makes exactly one of them present.
        _ => {
            return Err(CliError::new(
                "give exactly one of --applied REV, --failed MSG or --not-applied",
            )
            .into());
        }
    };
    // Refuse an unknown or settled operation before opening the journal for writing, which
    // would commit (and mark running operations in doubt).
    let before = {
        let insp = inspect_before_writing(&args.file)?;
        let current = insp.lookup(&args.id).map_err(read_err(&args.file))?;
        match current {
            None => {
                return Err(CliError::new(format!(
                    "no operation `{}` is recorded in `{}` (never submitted, released, resolved as not applied, or purged)",
                    clean(&args.id),
                    args.file.display()
                ))
                .hint(format!(
                    "list the in-doubt operations with `opjournal ls {} --status in_doubt`",
                    args.file.display()
                ))
                .into());
            }
            Some(r)
                if !matches!(
                    r.status,
                    ExecutionStatus::InDoubt | ExecutionStatus::Running
                ) =>
            {
                let now = insp.now().map_err(read_err(&args.file))?;
                return Err(CliError::new(format!(
                    "cannot resolve `{}`: it is {}",
                    clean(&args.id),
                    status_sentence(&r, now)
                ))
                .hint("only in-doubt operations are resolved: their outcome is unknown to the journal")
                .into());
            }
            Some(_) => {}
        }
        insp.stats().map_err(read_err(&args.file))?
    };
    let journal = open_for_writing(&args.file, &before)?;
    let receipt = journal
        .resolve(&args.id, resolution)
        .map_err(write_err(&args.file))?;
    let now = journal.now();
    journal.close().map_err(write_err(&args.file))?;
    let counts = json!({"operation_id": args.id});
    if out.json() {
        out.record(
            "resolved",
            &json!({
                "operation_id": args.id,
                "as": match (args.applied, &args.failed) {
                    (Some(_), _) => "applied",
                    (_, Some(_)) => "failed",
                    _ => "not_applied",
                },
                "receipt": receipt.as_ref().map_or(Value::Null, receipt_json),
            }),
        )?;
        return summary.write(out, Outcome::Clean, counts);
    }
    out.line(format!("resolved `{}` as {said}", clean(&args.id)))?;
    match &receipt {
        Some(r) => out.line(format!("  status: {}", status_sentence(r, now)))?,
        None => out.line(format!(
            "  the id is free again: resubmitting `{}` starts its next attempt",
            clean(&args.id)
        ))?,
    }
    summary.write(out, Outcome::Clean, counts)
}
