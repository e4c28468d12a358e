//! `opjournal stats FILE` (or `--postgres URL NAME`): counts by status and delivery state,
//! the oldest unacknowledged result, file size and format version.

use serde_json::{Value, json};

use super::{Outcome, Run, Summary, Target, open};
use crate::cli::FileArgs;
use crate::cli::format::{clean, size, utc, when};
use crate::cli::output::Out;

pub(super) fn run(args: &FileArgs, out: &mut Out) -> Run {
    let target = Target::new(&args.file, args.postgres.as_deref());
    let mut summary = Summary::start("stats", &args.file);
    let insp = open(target)?;
    summary.inspected(&insp);
    let s = insp.stats().map_err(target.err())?;
    if out.json() {
        // The library's `Stats` as it serializes (`oldest_unacked` is an object or null).
        let data = serde_json::to_value(&s).unwrap_or(Value::Null);
        out.record("stats", &data)?;
        return summary.write(out, Outcome::Clean, json!({}));
    }
    let now = s.now;
    let n = |v: u64| v.to_string();
    let mut rows: Vec<(&str, String)> = vec![
        ("journal", insp.path().display().to_string()),
        (
            "format",
            match (s.upgraded_from, s.upgraded_at) {
                (Some(from), Some(at)) => format!(
                    "version {} (upgraded from version {from} {}), created {}",
                    s.format_version,
                    when(at, now),
                    when(s.created_at, now)
                ),
                _ => format!(
                    "version {}, created {}",
                    s.format_version,
                    when(s.created_at, now)
                ),
            },
        ),
        (
            "now",
            if target.is_database() {
                format!(
                    "{} (the database server's time; clocks applied as of this time)",
                    utc(now)
                )
            } else {
                format!("{} (clocks applied as of this time)", utc(now))
            },
        ),
        (
            "file size",
            if target.is_database() {
                "none (the journal is in PostgreSQL)".to_string()
            } else if s.log_bytes > 0 {
                format!(
                    "{} and a log of {} (changes not yet checkpointed into the file)",
                    size(s.file_bytes),
                    size(s.log_bytes)
                )
            } else {
                size(s.file_bytes)
            },
        ),
        ("", String::new()),
        ("operations", n(s.operations)),
        ("  running", n(s.running)),
        ("  in_doubt", n(s.in_doubt)),
        ("  applied", n(s.applied)),
        ("  failed", n(s.failed)),
        ("  retired", n(s.retired)),
        (
            "released ids",
            format!("{} (given back; history kept until purged)", s.released),
        ),
        ("", String::new()),
        ("delivery", String::new()),
        ("  pending", n(s.pending)),
        ("  delivered", n(s.delivered)),
        ("  acknowledged", n(s.acknowledged)),
        ("  exhausted", n(s.exhausted)),
        ("  ack_expired", n(s.ack_expired)),
        (
            "oldest unacked",
            match &s.oldest_unacked {
                Some(o) => format!(
                    "{}, completed {}",
                    clean(&o.operation_id),
                    when(o.completed_at, now)
                ),
                None => "none".into(),
            },
        ),
        ("", String::new()),
        ("storage", String::new()),
        ("  events", n(s.events)),
        ("  results", n(s.results)),
        ("  scopes", n(s.scopes)),
        ("  timers", n(s.timers)),
        ("  quarantined", n(s.quarantined)),
    ];
    if s.in_doubt > 0 {
        rows.push(("", String::new()));
        rows.push((
            "next",
            if target.is_database() {
                format!(
                    "{} in doubt: `{} --status in_doubt`, then `Journal::resolve` in the library",
                    s.in_doubt,
                    target.command("ls")
                )
            } else {
                format!(
                    "{} in doubt: `{} --status in_doubt`, then `opjournal resolve`",
                    s.in_doubt,
                    target.command("ls")
                )
            },
        ));
    }
    out.pairs(&rows)?;
    summary.write(out, Outcome::Clean, json!({}))
}
