//! `opjournal ls FILE` (or `--postgres URL NAME`): receipts, filtered by status, delivery,
//! scope, session, intent and submission time.

use opjournal::{DeliveryState, ExecutionStatus, Receipt, Timestamp};
use serde_json::json;

use super::{Outcome, Run, Summary, Target, open};
use crate::cli::format::{cut, delivery, receipt_json, revisions, status, when};
use crate::cli::output::{Align, Out, Table};
use crate::cli::{DeliveryArg, LsArgs, SortArg, StatusArg};

fn status_of(a: StatusArg) -> ExecutionStatus {
    match a {
        StatusArg::Running => ExecutionStatus::Running,
        StatusArg::InDoubt => ExecutionStatus::InDoubt,
        StatusArg::Applied => ExecutionStatus::Applied,
        StatusArg::Failed => ExecutionStatus::Failed,
        StatusArg::Retired => ExecutionStatus::Retired,
    }
}

fn delivery_of(a: DeliveryArg) -> DeliveryState {
    match a {
        DeliveryArg::Pending => DeliveryState::Pending,
        DeliveryArg::Delivered => DeliveryState::Delivered,
        DeliveryArg::Acknowledged => DeliveryState::Acknowledged,
        DeliveryArg::Exhausted => DeliveryState::Exhausted,
        DeliveryArg::AckExpired => DeliveryState::AckExpired,
    }
}

struct Filter {
    status: Vec<ExecutionStatus>,
    delivery: Vec<DeliveryState>,
    scope: Option<String>,
    session: Option<String>,
    intent: Option<String>,
    since: Option<Timestamp>,
    until: Option<Timestamp>,
}

impl Filter {
    fn new(args: &LsArgs, now: Timestamp) -> Filter {
        Filter {
            status: args.status.iter().copied().map(status_of).collect(),
            delivery: args.delivery.iter().copied().map(delivery_of).collect(),
            scope: args.scope.clone(),
            session: args.session.clone(),
            intent: args.intent.clone(),
            since: args.since.as_ref().map(|t| t.resolve(now)),
            until: args.until.as_ref().map(|t| t.resolve(now)),
        }
    }

    fn admits(&self, r: &Receipt) -> bool {
        (self.status.is_empty() || self.status.contains(&r.status))
            && (self.delivery.is_empty() || r.delivery.is_some_and(|d| self.delivery.contains(&d)))
            && self
                .scope
                .as_ref()
                .is_none_or(|s| r.scope.as_ref() == Some(s))
            && self
                .session
                .as_ref()
                .is_none_or(|s| r.session.as_ref() == Some(s))
            && self.intent.as_ref().is_none_or(|i| &r.intent_name == i)
            && self.since.is_none_or(|t| r.submitted_at >= t)
            && self.until.is_none_or(|t| r.submitted_at < t)
    }
}

pub(super) fn run(args: &LsArgs, out: &mut Out) -> Run {
    let target = Target::new(&args.file, args.postgres.as_deref());
    let mut summary = Summary::start("ls", &args.file);
    let insp = open(target)?;
    summary.inspected(&insp);
    let now = insp.now().map_err(target.err())?;
    let filter = Filter::new(args, now);
    let mut total = 0u64;
    let mut rows: Vec<Receipt> = Vec::new();
    insp.for_each_receipt(|r| {
        total += 1;
        if filter.admits(&r) {
            rows.push(r);
        }
        Ok(true)
    })
    .map_err(target.err())?;
    if args.sort == SortArg::Submitted {
        rows.sort_by(|a, b| {
            (a.submitted_at, &a.operation_id).cmp(&(b.submitted_at, &b.operation_id))
        });
    }
    let matched = rows.len();
    if let Some(limit) = args.limit {
        rows.drain(..rows.len().saturating_sub(limit));
    }
    let counts = json!({"operations": total, "matched": matched, "shown": rows.len()});
    if out.json() {
        for r in &rows {
            out.record("receipt", &receipt_json(r))?;
        }
        return summary.write(out, Outcome::Clean, counts);
    }
    if total == 0 {
        out.line("the journal records no operations")?;
        return summary.write(out, Outcome::Clean, counts);
    }
    if rows.is_empty() {
        out.line(format!("no operation matches (of {total})"))?;
        return summary.write(out, Outcome::Clean, counts);
    }
    let mut table = Table::new(&[
        ("ID", Align::Left),
        ("STATUS", Align::Left),
        ("DELIVERY", Align::Left),
        ("SCOPE", Align::Left),
        ("REV", Align::Left),
        ("SESSION", Align::Left),
        ("INTENT", Align::Left),
        ("SUBMITTED", Align::Left),
    ]);
    for r in &rows {
        table.push(vec![
            cut(&r.operation_id, 64),
            status(r).to_string(),
            delivery(r),
            r.scope
                .as_deref()
                .map_or_else(|| "-".into(), |s| cut(s, 32)),
            revisions(r),
            r.session
                .as_deref()
                .map_or_else(|| "-".into(), |s| cut(s, 24)),
            cut(&r.intent_name, 32),
            when(r.submitted_at, now),
        ]);
    }
    out.table(&table)?;
    out.line("")?;
    out.line(if rows.len() == matched && matched as u64 == total {
        format!("{} operation{}", total, if total == 1 { "" } else { "s" })
    } else {
        format!(
            "{} shown of {matched} matching ({total} operation{} in the journal)",
            rows.len(),
            if total == 1 { "" } else { "s" }
        )
    })?;
    summary.write(out, Outcome::Clean, counts)
}
