//! `opjournal ls FILE` (or `--postgres URL NAME`): receipts, filtered by status, delivery,
//! scope, session, intent and submission time.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

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

/// The rows `ls` prints: every matching receipt, or with `--limit N` only the last N in
/// the chosen order, so that `ls --limit 20` holds 20 receipts in memory, not the journal.
enum Rows {
    /// Every matching receipt, and whether to order them by submission.
    All(Vec<Receipt>, SortArg),
    /// The receipts come in id order: the last N seen are the last N.
    LastById(VecDeque<Receipt>, usize),
    /// The N latest submissions seen so far, the earliest on top.
    LastSubmitted(BinaryHeap<Reverse<BySubmission>>, usize),
}

/// A receipt ordered by submission time, then id (the order of `--sort submitted`).
struct BySubmission(Receipt);

impl BySubmission {
    fn key(&self) -> (Timestamp, &str) {
        (self.0.submitted_at, &self.0.operation_id)
    }
}

impl PartialEq for BySubmission {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for BySubmission {}

impl PartialOrd for BySubmission {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for BySubmission {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

impl Rows {
    fn new(sort: SortArg, limit: Option<usize>) -> Rows {
        match (sort, limit) {
            (sort, None) => Rows::All(Vec::new(), sort),
            (SortArg::Id, Some(n)) => Rows::LastById(Default::default(), n),
            (SortArg::Submitted, Some(n)) => Rows::LastSubmitted(BinaryHeap::new(), n),
        }
    }

    /// Takes the next receipt in id order.
    fn push(&mut self, r: Receipt) {
        match self {
            Rows::All(rows, _) => rows.push(r),
            Rows::LastById(rows, n) => {
                rows.push_back(r);
                if rows.len() > *n {
                    rows.pop_front();
                }
            }
            Rows::LastSubmitted(heap, n) => {
                heap.push(Reverse(BySubmission(r)));
                if heap.len() > *n {
                    heap.pop();
                }
            }
        }
    }

    /// The rows in the chosen order (`sort`: by id, or by submission time).
    fn into_sorted(self) -> Vec<Receipt> {
        match self {
            Rows::All(rows, SortArg::Id) => rows,
            Rows::All(rows, SortArg::Submitted) => {
                let mut rows: Vec<BySubmission> = rows.into_iter().map(BySubmission).collect();
                rows.sort();
                rows.into_iter().map(|BySubmission(r)| r).collect()
            }
            Rows::LastById(rows, _) => rows.into(),
            Rows::LastSubmitted(heap, _) => {
                // Ascending `Reverse` is descending submission: read it backwards.
                heap.into_sorted_vec()
                    .into_iter()
                    .rev()
                    .map(|Reverse(BySubmission(r))| r)
                    .collect()
            }
        }
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
    let mut matched = 0usize;
    let mut rows = Rows::new(args.sort, args.limit);
    insp.for_each_receipt(|r| {
        total += 1;
        if filter.admits(&r) {
            matched += 1;
            rows.push(r);
        }
        Ok(true)
    })
    .map_err(target.err())?;
    let rows = rows.into_sorted();
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
