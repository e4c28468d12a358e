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

/// Due timers read at a time. A batch reads, fires, and checks for a waiting foreground
/// call after each timer, so a call waits for at most one read of this many timers and
/// one operation's firing (reading all of a batch's timers up front made a call that
/// arrived then wait for the whole read: milliseconds for a batch of 1,000).
const CHUNK: usize = 64;

/// One compaction batch: fires up to `limit` due timers, from `resume` on. Returns whether
/// more may be due, and where the next batch starts. `yield_now` says a foreground call is
/// waiting: the batch then ends after the timer in hand (it still commits what it did),
/// reports that more may be due, and the next batch starts past that timer.
pub(crate) fn compact_batch(
    ctx: &mut Ctx<'_, '_>,
    limit: usize,
    resume: &Resume,
    yield_now: &dyn Fn() -> bool,
) -> Result<(bool, Resume)> {
    // Operations fired in this batch: firing one applies every clock due to it, so its
    // timers of later kinds are gone, and one met again needs no second look.
    let mut seen = std::collections::HashSet::new();
    let mut next = resume.clone();
    let mut handled = 0usize;
    let before = ctx.fired;
    for (i, kind) in FIRED_KINDS.into_iter().enumerate() {
        loop {
            let room = limit.saturating_sub(handled).min(CHUNK);
            if room == 0 {
                break;
            }
            let due = ctx
                .t
                .timers_due_after(kind, next.timers[i].as_ref(), ctx.now.0, room)?;
            let last_chunk = due.len() < room;
            for timer in due {
                handled += 1;
                if seen.insert(timer.1.clone()) {
                    ctx.materialize(&timer.1)?;
                }
                next.timers[i] = Some(timer);
                if yield_now() {
                    return Ok((true, next));
                }
            }
            if last_chunk {
                break;
            }
        }
    }
    let mut purged_revisions = false;
    loop {
        let room = limit.saturating_sub(handled).min(CHUNK);
        if room == 0 {
            break;
        }
        let due = ctx.t.scope_timers_due_after(next.scope, ctx.now.0, room)?;
        let last_chunk = due.len() < room;
        for (due, seq) in due {
            handled += 1;
            ctx.purge_revision_event(due, seq)?;
            purged_revisions = true;
            next.scope = Some((due, seq));
            if yield_now() {
                return Ok((true, next));
            }
        }
        if last_chunk {
            break;
        }
    }
    let progressed = ctx.fired != before || purged_revisions;
    Ok((handled >= limit && progressed, next))
}

#[cfg(test)]
mod tests {
    use super::super::Fired;
    use super::*;
    use crate::clock::Timestamp;
    use crate::config::Config;
    use crate::index::{Layers, WriteTables};
    use crate::intent::Intent;
    use crate::record::StateRecord;
    use crate::types::{Admission, Operation};

    /// `n` operations claimed at time 0 whose leases have all expired by `now`.
    fn running(t: &mut WriteTables<'_>, cfg: &Config, n: usize) -> (StateRecord, Timestamp) {
        let mut state = StateRecord {
            clock_high_water: Timestamp(0),
            next_seq: 1,
        };
        let intent = Intent::from_json("edit", &serde_json::json!({})).expect("an intent");
        for i in 0..n {
            let mut ctx = Ctx {
                t,
                now: Timestamp(0),
                cfg,
                state: &mut state,
                fired: Fired::default(),
            };
            let op = Operation::new(format!("op-{i:03}"), intent.clone()).scope(format!("s{i}"));
            let admission = super::super::submit(&mut ctx, &op).expect("submit");
            assert_eq!(admission.name(), "fresh", "operation {i}");
            assert!(matches!(admission, Admission::Fresh(_)), "operation {i}");
        }
        let now = Timestamp(u64::try_from(cfg.lease.as_millis()).expect("lease") * 2);
        (state, now)
    }

    /// One batch at `now`: what it fired, whether more may be due, where the next starts.
    fn batch(
        t: &mut WriteTables<'_>,
        state: &mut StateRecord,
        cfg: &Config,
        now: Timestamp,
        limit: usize,
        resume: &Resume,
        waiting: bool,
    ) -> (Fired, bool, Resume) {
        let mut ctx = Ctx {
            t,
            now,
            cfg,
            state,
            fired: Fired::default(),
        };
        let (more, next) = compact_batch(&mut ctx, limit, resume, &|| waiting).expect("batch");
        (ctx.fired, more, next)
    }

    #[test]
    fn a_batch_with_a_call_waiting_fires_one_timer_and_the_next_starts_past_it() {
        let cfg = Config::default();
        let mut t = WriteTables::over(None, Layers::default());
        let n = 150; // more than two chunks
        let (mut state, now) = running(&mut t, &cfg, n);
        let mut resume = Resume::default();
        let mut batches = 0;
        let mut total = 0;
        loop {
            let (fired, more, next) = batch(&mut t, &mut state, &cfg, now, 1000, &resume, true);
            batches += 1;
            total += fired.lease_expired;
            if !more {
                assert_eq!(fired, Fired::default(), "the last batch finds nothing");
                break;
            }
            assert_eq!(fired.lease_expired, 1, "batch {batches} fires one timer");
            // The next batch starts past the timer fired, not again from the start.
            assert!(
                next.timers[0].is_some() && next.timers[0] > resume.timers[0],
                "batch {batches}: the lease position moved from {:?} to {:?}",
                resume.timers[0],
                next.timers[0]
            );
            resume = next;
            assert!(batches <= n, "the batches do not end");
        }
        assert_eq!(total, n as u64);
        assert_eq!(
            batches,
            n + 1,
            "one batch per timer, and one that finds none left"
        );
    }

    #[test]
    fn a_batch_without_a_waiting_call_fires_every_due_timer_across_chunks() {
        let cfg = Config::default();
        let n = 3 * CHUNK + 5;
        let mut t = WriteTables::over(None, Layers::default());
        let (mut state, now) = running(&mut t, &cfg, n);
        let (fired, more, _) = batch(
            &mut t,
            &mut state,
            &cfg,
            now,
            1000,
            &Resume::default(),
            false,
        );
        assert_eq!(fired.lease_expired, n as u64);
        assert!(!more, "fewer timers than the limit: nothing more is due");

        // With a limit below the count, the batch stops at the limit and says more is due.
        let mut t = WriteTables::over(None, Layers::default());
        let (mut state, now) = running(&mut t, &cfg, n);
        let limit = CHUNK + 7;
        let (fired, more, next) = batch(
            &mut t,
            &mut state,
            &cfg,
            now,
            limit,
            &Resume::default(),
            false,
        );
        assert_eq!(fired.lease_expired, limit as u64);
        assert!(more);
        let (fired, more, _) = batch(&mut t, &mut state, &cfg, now, 1000, &next, false);
        assert_eq!(fired.lease_expired, (n - limit) as u64);
        assert!(!more);
    }
}
