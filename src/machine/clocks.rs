//! The clocks: which transitions are due at a time, the effective record, and the
//! delivery backoff.

use std::time::Duration;

use super::fold::transition;

use crate::clock::{Timestamp, duration_ms};
use crate::config::Config;
use crate::record::DeliveryState;
use crate::record::{Event, EventKind, ExecRecord, InDoubtCause, ReceiptRecord};

/// The clock transitions due for `rec` at `now`, in the order they happened, and whether
/// the record is due for purging after them.
pub(crate) fn due_transitions(rec: &ReceiptRecord, now: Timestamp) -> (Vec<EventKind>, bool) {
    match &rec.state {
        ExecRecord::Running { lease_until } if now >= *lease_until => (
            vec![EventKind::LeaseExpired {
                epoch: rec.epoch,
                cause: InDoubtCause::LeaseTimeout,
            }],
            false,
        ),
        ExecRecord::Done(d) => {
            let mut out = Vec::new();
            let mut delivery = d.delivery.state;
            if matches!(delivery, DeliveryState::Pending | DeliveryState::Delivered)
                && d.delivery.final_attempt
                && now >= d.delivery.next_due
                && d.delivery.next_due < d.deadlines.ack
            {
                out.push(EventKind::Exhausted);
                delivery = DeliveryState::Exhausted;
            }
            if delivery.is_open() && now >= d.deadlines.ack {
                out.push(EventKind::AckExpired);
            }
            if d.retired_at.is_none() && now >= d.deadlines.retain {
                out.push(EventKind::Retired);
            }
            (out, now >= d.deadlines.purge)
        }
        ExecRecord::Vacant { purge_at, .. } => (Vec::new(), now >= *purge_at),
        _ => (Vec::new(), false),
    }
}

/// The record as it stands at `now` with every clock applied, without writing anything.
/// `None` when the audit retention has passed (the id is unknown).
pub(crate) fn effective(rec: ReceiptRecord, now: Timestamp) -> Option<ReceiptRecord> {
    let (events, purge) = due_transitions(&rec, now);
    if purge {
        return None;
    }
    let mut cur = rec;
    for kind in events {
        let ev = Event {
            seq: 0,
            at: now,
            operation_id: Some(cur.operation_id.clone()),
            kind,
        };
        match transition(Some(&cur), &ev) {
            Ok(next) => cur = next,
            Err(_) => {
                // due_transitions only yields transitions that fit; keep the last good state.
                debug_assert!(false, "due transition did not apply");
                break;
            }
        }
    }
    Some(cur)
}

/// Whether the (effective) record holds its scope's lock.
pub(crate) fn holds_lock(rec: &ReceiptRecord) -> bool {
    match &rec.state {
        ExecRecord::Running { .. } => true,
        ExecRecord::Done(d) => {
            rec.hold_until_ack && d.retired_at.is_none() && d.delivery.state.is_open()
        }
        _ => false,
    }
}

/// The delay before the push after delivery `n` (1-based): `min(initial · 2^(n-1), max)`.
pub(crate) fn backoff(cfg: &Config, n: u32) -> Duration {
    let initial = cfg.retry.initial_backoff;
    let factor = 1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX);
    initial
        .checked_mul(factor)
        .unwrap_or(cfg.retry.max_backoff)
        .min(cfg.retry.max_backoff)
}

/// Full jitter: a delay in `[0, cap]`, deterministic per operation, epoch and attempt.
pub(crate) fn jitter(operation_id: &str, epoch: u64, attempt: u32, cap: Duration) -> Duration {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"opjournal.jitter.v1\0");
    h.update(operation_id.as_bytes());
    h.update(epoch.to_le_bytes());
    h.update(attempt.to_le_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let cap_ms = duration_ms(cap);
    let r = u64::from_le_bytes(first);
    Duration::from_millis(if cap_ms == u64::MAX {
        r
    } else {
        r % (cap_ms + 1)
    })
}
