//! `opjournal show FILE ID` (or `--postgres URL NAME ID`): one receipt, a preview of its
//! result, its event history.

use std::io::Write as _;

use opjournal::{ErrorKind, Event, OpResult, Receipt, RetireCause, Timestamp};
use serde_json::json;

use super::{Outcome, Run, Summary, Target, open};
use crate::cli::ShowArgs;
use crate::cli::failure::Failure;
use crate::cli::format::{
    PREVIEW_BYTES, PREVIEW_LINES, clean, count, delivery_sentence, event_detail, event_json,
    preview, receipt_json, size, status_sentence, utc, when,
};
use crate::cli::output::{Align, Out, Table};

pub(super) fn run(args: &ShowArgs, out: &mut Out) -> Run {
    let target = Target::new(&args.file, args.postgres.as_deref());
    let mut summary = Summary::start("show", &args.file);
    let insp = open(target)?;
    summary.inspected(&insp);
    let err = target.err();
    let now = insp.now().map_err(&err)?;
    let receipt = insp.lookup(&args.id).map_err(&err)?;
    let history = insp.history(&args.id).map_err(&err)?;
    if receipt.is_none() && history.is_empty() {
        // Nothing to show is an answer, not a failure to run: exit 1, like a search that
        // found nothing, with the message on stderr (and a summary in JSON mode).
        let _ = writeln!(
            std::io::stderr(),
            "no operation `{}` is recorded in `{}` (never submitted, released, or purged \
             after its audit retention)\nhint: list the operations with `{}`",
            clean(&args.id),
            args.file.display(),
            target.command("ls"),
        );
        return summary.write(
            out,
            Outcome::Problems,
            json!({"events": 0, "live": false, "found": false, "result_damaged": null}),
        );
    }
    // A damaged result does not hide the rest: it is reported, and the exit status says so.
    let (result, damaged) = match &receipt {
        Some(r) if r.result_size.is_some() => match insp.result(&args.id) {
            Ok(res) => (res, None),
            Err(e) if matches!(e.kind(), ErrorKind::Corrupt { .. }) => (None, Some(e.to_string())),
            Err(e) => return Err(err(e)),
        },
        _ => (None, None),
    };
    let outcome = if damaged.is_some() {
        Outcome::Problems
    } else {
        Outcome::Clean
    };
    let counts = json!({
        "events": history.len(),
        "live": receipt.is_some(),
        "found": true,
        "result_damaged": damaged,
    });
    if out.json() {
        if let Some(r) = &receipt {
            out.record("receipt", &receipt_json(r))?;
        }
        if let Some(res) = &result {
            let p = preview(&res.bytes, args.full);
            out.record(
                "result",
                &json!({
                    "operation_id": args.id,
                    "len": res.bytes.len(),
                    "changed_assets": res.changed_assets,
                    "encoding": p.encoding,
                    "content": p.content(&res.bytes),
                    "shown_bytes": p.shown,
                    "truncated": p.truncated(),
                }),
            )?;
        }
        for ev in &history {
            out.record("event", &event_json(ev))?;
        }
        return summary.write(out, outcome, counts);
    }
    match &receipt {
        Some(r) => {
            receipt_block(out, r, now)?;
        }
        None => {
            out.pairs(&[
                ("operation", clean(&args.id)),
                (
                    "status",
                    "not live: released, or resolved as not applied; the id is free and a new submit starts the next attempt".into(),
                ),
            ])?;
        }
    }
    match (&receipt, &damaged) {
        (_, Some(why)) => {
            out.line("")?;
            out.line(format!("result: cannot be read: {}", clean(why)))?;
        }
        (Some(r), None) => result_block(out, r, result.as_ref(), args.full, now)?,
        (None, None) => {}
    }
    history_block(out, &history)?;
    summary.write(out, outcome, counts)
}

fn receipt_block(out: &mut Out, r: &Receipt, now: Timestamp) -> Result<(), Failure> {
    let mut rows: Vec<(&str, String)> = vec![
        ("operation", clean(&r.operation_id)),
        (
            "attempt",
            format!("{} (claim epoch {})", r.attempt, r.epoch),
        ),
        (
            "intent",
            format!("{}  {}", clean(&r.intent_name), r.intent_hash),
        ),
        ("status", status_sentence(r, now)),
    ];
    if let Some(d) = delivery_sentence(r, now) {
        rows.push(("delivery", d));
    }
    rows.push((
        "scope",
        match (&r.scope, r.base_revision) {
            (Some(s), Some(b)) => format!("{} (base revision {b})", clean(s)),
            (Some(s), None) => clean(s),
            (None, Some(b)) => format!("- (base revision {b})"),
            (None, None) => "-".into(),
        },
    ));
    rows.push((
        "session",
        r.session.as_deref().map_or_else(|| "-".into(), clean),
    ));
    rows.push(("submitted", when(r.submitted_at, now)));
    let mut time = |key: &'static str, t: Option<Timestamp>| {
        if let Some(t) = t {
            rows.push((key, when(t, now)));
        }
    };
    if r.completed_at.is_none() {
        time("lease until", r.lease_until);
    }
    time("completed", r.completed_at);
    time(
        "ack deadline",
        r.ack_deadline.filter(|_| r.acknowledged_at.is_none()),
    );
    time("retain until", r.retain_until);
    time("purge at", r.purge_at);
    out.pairs(&rows)
}

fn result_block(
    out: &mut Out,
    r: &Receipt,
    result: Option<&OpResult>,
    full: bool,
    now: Timestamp,
) -> Result<(), Failure> {
    let Some(res) = result else {
        if r.completed_at.is_some() {
            out.line("")?;
            out.line(match r.retire_cause {
                Some(RetireCause::Damage { repaired_at }) => format!(
                    "result: none stored (lost to damage (repair on {}): repair found the \
                     payload damaged or missing before its retention passed; the outcome \
                     above is kept)",
                    when(repaired_at, now)
                ),
                _ => "result: none stored (retired: the payload aged out; the outcome above is \
                      kept)"
                    .to_string(),
            })?;
        }
        return Ok(());
    };
    out.line("")?;
    if res.bytes.is_empty() && res.changed_assets.is_empty() {
        out.line("result: empty")?;
        return Ok(());
    }
    out.line(format!(
        "result ({}, {})",
        count(res.bytes.len() as u64, "byte", "bytes"),
        count(
            res.changed_assets.len() as u64,
            "changed asset",
            "changed assets"
        )
    ))?;
    for asset in &res.changed_assets {
        out.line(format!("  changed: {}", clean(asset)))?;
    }
    let p = preview(&res.bytes, full);
    for line in &p.lines {
        out.line(format!("  {line}"))?;
    }
    if p.truncated() {
        out.line(format!(
            "  … {} more not shown (the preview stops at {PREVIEW_BYTES} bytes or {PREVIEW_LINES} lines; --full prints everything)",
            size((p.total - p.shown) as u64)
        ))?;
    }
    Ok(())
}

fn history_block(out: &mut Out, history: &[Event]) -> Result<(), Failure> {
    out.line("")?;
    out.line(format!(
        "history ({})",
        count(history.len() as u64, "event", "events")
    ))?;
    let mut table = Table::new(&[
        ("SEQ", Align::Right),
        ("AT", Align::Left),
        ("EVENT", Align::Left),
        ("DETAIL", Align::Left),
    ])
    .indent(2);
    for ev in history {
        table.push(vec![
            ev.seq.to_string(),
            utc(ev.at),
            ev.kind.name().to_string(),
            event_detail(ev),
        ]);
    }
    if !table.is_empty() {
        out.table(&table)?;
    }
    Ok(())
}
