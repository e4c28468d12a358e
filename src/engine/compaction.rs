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

/// One compaction batch: fires up to `limit` due timers. Returns whether more may be due.
/// `yield_now` says a foreground call is waiting: the batch then ends after the operation
/// in hand (it still commits what it did) and reports that more may be due.
pub(crate) fn compact_batch(
    ctx: &mut Ctx<'_, '_>,
    limit: usize,
    yield_now: &dyn Fn() -> bool,
) -> Result<bool> {
    let mut ops: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for kind in FIRED_KINDS {
        let room = limit.saturating_sub(ops.len());
        for (_, id) in ctx.t.timers_due(kind, ctx.now.0, room)? {
            if seen.insert(id.clone()) {
                ops.push(id);
            }
        }
    }
    let before = ctx.fired;
    for id in &ops {
        ctx.materialize(id)?;
        if yield_now() {
            return Ok(true);
        }
    }
    let room = limit.saturating_sub(ops.len());
    let scope_due = ctx.t.scope_timers_due(ctx.now.0, room)?;
    for (due, seq) in &scope_due {
        ctx.purge_revision_event(*due, *seq)?;
    }
    let handled = ops.len() + scope_due.len();
    let progressed = ctx.fired != before || !scope_due.is_empty();
    Ok(handled >= limit && progressed)
}
