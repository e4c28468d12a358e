//! `opjournal log FILE` (or `--postgres URL NAME`): the event journal, filtered, optionally
//! following new events.
//!
//! Events stream in constant memory (a `--tail` keeps only the last N), so the columns have
//! fixed widths rather than widths measured over every row.

use std::collections::VecDeque;
use std::time::Duration;

use opjournal::{Event, Inspector, Timestamp};
use serde_json::json;

use super::{Outcome, Run, Summary, Target, open};
use crate::cli::failure::{Failure, Mode, explain};
use crate::cli::format::{event_detail, event_json, event_subject, utc_millis};
use crate::cli::output::Out;
use crate::cli::{KindArg, LogArgs};

/// How often `--follow` looks for new commits.
const POLL: Duration = Duration::from_millis(250);

fn kind_name(k: KindArg) -> &'static str {
    match k {
        KindArg::Submitted => "submitted",
        KindArg::LeaseExtended => "lease_extended",
        KindArg::Completed => "completed",
        KindArg::Released => "released",
        KindArg::LeaseExpired => "lease_expired",
        KindArg::Resolved => "resolved",
        KindArg::Delivered => "delivered",
        KindArg::Acknowledged => "acknowledged",
        KindArg::AckExpired => "ack_expired",
        KindArg::Exhausted => "exhausted",
        KindArg::Retired => "retired",
        KindArg::Salvaged => "salvaged",
        KindArg::RevisionAdvanced => "revision_advanced",
        KindArg::FormatUpgraded => "format_upgraded",
        KindArg::ResultLost => "result_lost",
    }
}

struct Printer<'a> {
    args: &'a LogArgs,
    target: Target<'a>,
    kinds: Vec<&'static str>,
    since: Option<Timestamp>,
    /// The next seq to read.
    next: u64,
    printed: u64,
    header: bool,
}

impl Printer<'_> {
    fn admits(&self, ev: &Event) -> bool {
        (self.kinds.is_empty() || self.kinds.contains(&ev.kind.name()))
            && self
                .args
                .op
                .as_ref()
                .is_none_or(|op| ev.operation_id.as_ref() == Some(op))
            && self.since.is_none_or(|t| ev.at >= t)
    }

    fn print(&mut self, out: &mut Out, ev: &Event) -> Result<(), Failure> {
        self.printed += 1;
        if out.json() {
            return out.record("event", &event_json(ev));
        }
        if !self.header {
            self.header = true;
            out.line(format!(
                "{:>7}  {:<23}  {:<16}  {:<17}  DETAIL",
                "SEQ", "AT (UTC)", "OPERATION", "EVENT"
            ))?;
        }
        out.line(format!(
            "{:>7}  {:<23}  {:<16}  {:<17}  {}",
            ev.seq,
            utc_millis(ev.at),
            event_subject(ev),
            ev.kind.name(),
            event_detail(ev)
        ))
    }

    /// Reads every event from `self.next` on, printing those that match (or keeping the
    /// last N of them in `tail`).
    fn pass(
        &mut self,
        insp: &Inspector,
        out: &mut Out,
        mut tail: Option<&mut VecDeque<Event>>,
    ) -> Result<(), Failure> {
        let mut failure = None;
        let r = insp.for_each_event(self.next, |ev| {
            self.next = ev.seq + 1;
            if !self.admits(&ev) {
                return Ok(true);
            }
            match tail.as_deref_mut() {
                Some(ring) => {
                    ring.push_back(ev);
                    if ring.len() > self.args.tail.unwrap_or(0) {
                        ring.pop_front();
                    }
                    Ok(true)
                }
                None => match self.print(out, &ev) {
                    Ok(()) => Ok(true),
                    Err(f) => {
                        failure = Some(f);
                        Ok(false)
                    }
                },
            }
        });
        if let Some(f) = failure {
            return Err(f);
        }
        r.map_err(self.target.err())
    }
}

pub(super) fn run(args: &LogArgs, out: &mut Out) -> Run {
    let target = Target::new(&args.file, args.postgres.as_deref());
    let mut summary = Summary::start("log", &args.file);
    let insp = open(target)?;
    summary.inspected(&insp);
    let now = insp.now().map_err(target.err())?;
    let mut p = Printer {
        args,
        target,
        kinds: args.kind.iter().copied().map(kind_name).collect(),
        since: args.since.as_ref().map(|t| t.resolve(now)),
        next: args.from,
        printed: 0,
        header: false,
    };
    if args.tail.is_some() {
        let mut ring = VecDeque::new();
        p.pass(&insp, out, Some(&mut ring))?;
        for ev in ring {
            p.print(out, &ev)?;
        }
    } else {
        p.pass(&insp, out, None)?;
    }
    if !args.follow {
        if p.printed == 0 && !out.json() {
            out.line("no event matches")?;
        }
        return summary.write(out, Outcome::Clean, json!({"events": p.printed}));
    }
    // Following: hold the file only while reading. A reader that found no writer excludes
    // writers while it is open, so an editor starting between polls is not locked out. A
    // journal in a database excludes no one: each pass reads a new snapshot.
    let kept = target.is_database().then_some(insp);
    loop {
        out.flush()?;
        std::thread::sleep(POLL);
        match &kept {
            Some(insp) => p.pass(insp, out, None)?,
            None => {
                let insp =
                    Inspector::open(&args.file).map_err(|e| explain(&e, &args.file, Mode::Read))?;
                p.pass(&insp, out, None)?;
            }
        }
    }
}
