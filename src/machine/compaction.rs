//! One compaction batch: firing due timers, after a scan of every receipt in id order when
//! most of them are due (see [`scan_pays`]).

use smol_str::SmolStr;

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

/// Where a compaction run's next batch starts: in its scan of the receipts, if it is
/// scanning, and in each timer kind, past the last timer its batches fired. Timers a batch
/// fired are deleted, and a deletion of what the file holds stays a tombstone in memory
/// until the next checkpoint; without this, every batch stepped again over all the
/// tombstones of the batches before it.
///
/// A timer due at or before `now` that appears behind the position meanwhile (a deadline
/// already past when it was set) waits for the next run; reads apply the clocks anyway.
#[derive(Clone, Debug, Default)]
pub(crate) struct Resume {
    timers: [Option<(u64, SmolStr)>; FIRED_KINDS.len()],
    scope: Option<(u64, u64)>,
    scan: Scan,
}

/// A run's scan of every receipt, in operation id order, before it fires due timers.
#[derive(Clone, Debug, Default)]
enum Scan {
    /// No scan: each due timer's operation is looked up.
    #[default]
    Off,
    /// Scanning, past this operation id (from the first with `None`).
    Past(Option<String>),
}

impl Resume {
    /// Where a run that scans every receipt first starts (see [`scan_pays`]).
    fn scanning() -> Resume {
        Resume {
            scan: Scan::Past(None),
            ..Resume::default()
        }
    }
}

/// Where a compaction run starts, if any timer it fires is due at `now`: with a scan of
/// every receipt first when `scan` says so, or (`None`) when [`scan_pays`].
pub(crate) fn first_resume(t: &impl View, now: u64, scan: Option<bool>) -> Result<Option<Resume>> {
    let mut due = !t.scope_timers_due(now, 1)?.is_empty();
    for kind in FIRED_KINDS {
        due = due || !t.timers_due(kind, now, 1)?.is_empty();
    }
    if !due {
        return Ok(None);
    }
    let scan = match scan {
        Some(scan) => scan,
        None => scan_pays(t, now)?,
    };
    Ok(Some(if scan {
        Resume::scanning()
    } else {
        Resume::default()
    }))
}

/// Receipts below which a run never scans (a small journal's lookups are cheap).
const SCAN_MIN_RECEIPTS: u64 = 4096;

/// A scan pays when more than one receipt in this many is due for retiring or purging.
///
/// Measured with callgrind over 100,000 receipts: purging an operation found by its timer
/// costs two B-tree descents (its receipt, then the range of its `op_events` entries),
/// about 29,000 instructions (retiring one, the first descent: about 11,500); visiting a
/// receipt in a scan costs copying it out of redb, decoding it and stepping over its
/// `op_events` entries, about 13,600, whether or not it is due. So in instructions a scan
/// breaks even when about half of the receipts are due for purging; it also reads each
/// page once, in order, where the lookups miss the page cache for most due operations.
const SCAN_SHARE: u64 = 2;

/// Whether a compaction run at `now` should scan every receipt in id order (one pass over
/// `receipts` and `op_events`, each page read once) instead of looking up each operation
/// whose timer is due: when more than one receipt in [`SCAN_SHARE`] is due for retiring or
/// purging (a receipt has one timer of the two kinds at a time), as in a journal opened
/// after its retention passed for most of its history. A journal compacted regularly has a
/// small share due at each pass and looks each one up. Counts the due timers in bounded
/// reads, stopping past the share.
fn scan_pays(t: &impl View, now: u64) -> Result<bool> {
    const READ: usize = 1024;
    let Some(base) = t.base() else {
        return Ok(false);
    };
    let receipts = base.len::<crate::index::Receipts>()?;
    if receipts < SCAN_MIN_RECEIPTS {
        return Ok(false);
    }
    let share = usize::try_from(receipts / SCAN_SHARE).unwrap_or(usize::MAX);
    let mut due = 0usize;
    for kind in [TimerKind::Retain, TimerKind::Purge] {
        let mut after = None;
        loop {
            let read = t.timers_due_after(kind, after.as_ref(), now, READ)?;
            due = due.saturating_add(read.len());
            if due > share {
                return Ok(true);
            }
            match read.last() {
                Some(last) if read.len() == READ => after = Some(last.clone()),
                _ => break,
            }
        }
    }
    Ok(false)
}

/// Due timers read at a time. A batch reads, fires, and checks for a waiting foreground
/// call after each timer, so a call waits for at most one read of this many timers and
/// one operation's firing (reading all of a batch's timers up front made a call that
/// arrived then wait for the whole read: milliseconds for a batch of 1,000).
const CHUNK: usize = 64;

/// Receipts a scan reads first in each batch (see [`compact_batch`]).
const SCAN_FIRST_CHUNK: usize = 4;

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
    // A scan reads receipts whole, which costs more than reading timers: its first read in
    // a batch is small and each next one twice as large, up to `CHUNK`. A batch that a
    // foreground call ends early (after one receipt, when calls keep coming) has then read
    // few receipts for nothing, and the call waited for a short read.
    let mut scan_chunk = SCAN_FIRST_CHUNK;
    // What a batch deletes it read from the index (receipts, their timers and events).
    ctx.t.deletes_stored_keys();
    while let Scan::Past(after) = &next.scan {
        let room = limit.saturating_sub(handled).min(scan_chunk);
        scan_chunk = (scan_chunk * 2).min(CHUNK);
        if room == 0 {
            return Ok((true, next));
        }
        let receipts = ctx.t.receipts_after(after.as_deref(), room)?;
        let (Some(first), Some(last)) = (receipts.first(), receipts.last()) else {
            next.scan = Scan::Off;
            break;
        };
        // The chunk's receipts are adjacent in id order, so one range holds all their
        // operations' `op_events` entries, sorted the same way.
        let entries = ctx
            .t
            .op_events_between(&first.operation_id, &last.operation_id)?;
        let mut entries = entries.into_iter().peekable();
        let last_chunk = receipts.len() < room;
        for rec in receipts {
            handled += 1;
            ctx.fired.scanned += 1;
            let id = rec.operation_id.clone();
            let mut seqs = Vec::new();
            while let Some((op, seq)) = entries.peek() {
                match op.as_str().cmp(id.as_str()) {
                    std::cmp::Ordering::Less => {}
                    std::cmp::Ordering::Equal => seqs.push(*seq),
                    std::cmp::Ordering::Greater => break,
                }
                entries.next();
            }
            ctx.materialize_read(rec, Some(&seqs))?;
            next.scan = Scan::Past(Some(id));
            if yield_now() {
                return Ok((true, next));
            }
        }
        if last_chunk {
            next.scan = Scan::Off;
        }
    }
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
