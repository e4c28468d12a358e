//! One compaction batch: firing due timers.

use super::Ctx;

use crate::error::Result;
use crate::index::{TimerKind, View};

/// The timer kinds compaction fires, in order.
const FIRED_KINDS: [TimerKind; 5] = [
    TimerKind::Lease,
    TimerKind::Exhaust,
    TimerKind::AckTimeout,
    TimerKind::Retain,
    TimerKind::Purge,
];

/// Where a compaction run's next batch starts reading each timer kind: past the last
/// timer its batches fired. Timers a batch fired are deleted, and a deletion of what the
/// file holds stays a tombstone in memory until the next checkpoint; without this, every
/// batch stepped again over all the tombstones of the batches before it.
///
/// A timer due at or before `now` that appears behind the position meanwhile (a deadline
/// already past when it was set) waits for the next run; reads apply the clocks anyway.
#[derive(Clone, Debug, Default)]
pub(crate) struct Resume {
    timers: [Option<(u64, String)>; FIRED_KINDS.len()],
    scope: Option<(u64, u64)>,
}

/// One compaction batch: fires up to `limit` due timers, from `resume` on. Returns whether
/// more may be due, and where the next batch starts. `yield_now` says a foreground call is
/// waiting: the batch then ends after the operation in hand (it still commits what it did)
/// and reports that more may be due, without moving `resume`.
pub(crate) fn compact_batch(
    ctx: &mut Ctx<'_, '_>,
    limit: usize,
    resume: &Resume,
    yield_now: &dyn Fn() -> bool,
) -> Result<(bool, Resume)> {
    let mut ops: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut next = resume.clone();
    for (i, kind) in FIRED_KINDS.into_iter().enumerate() {
        let room = limit.saturating_sub(ops.len());
        let due = ctx
            .t
            .timers_due_after(kind, resume.timers[i].as_ref(), ctx.now.0, room)?;
        if let Some(last) = due.last() {
            next.timers[i] = Some(last.clone());
        }
        for (_, id) in due {
            if seen.insert(id.clone()) {
                ops.push(id);
            }
        }
    }
    let before = ctx.fired;
    for id in &ops {
        ctx.materialize(id)?;
        if yield_now() {
            return Ok((true, resume.clone()));
        }
    }
    let room = limit.saturating_sub(ops.len());
    let scope_due = ctx
        .t
        .scope_timers_due_after(resume.scope, ctx.now.0, room)?;
    for (due, seq) in &scope_due {
        ctx.purge_revision_event(*due, *seq)?;
    }
    if let Some(last) = scope_due.last() {
        next.scope = Some(*last);
    }
    let handled = ops.len() + scope_due.len();
    let progressed = ctx.fired != before || !scope_due.is_empty();
    Ok((handled >= limit && progressed, next))
}
