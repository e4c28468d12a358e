//! Counts by status and delivery state.

use serde::Serialize;

use crate::clock::Timestamp;
use crate::error::Result;
use crate::index::{self, Events, Quarantine, Receipts, Results, Scopes, Timers, View};
use crate::machine;
use crate::record::{ExecRecord, ReceiptRecord};
use crate::types::{DeliveryState, ExecutionStatus};

/// The oldest terminal result still waiting for its acknowledgement (see
/// [`Stats::oldest_unacked`]); serialized as `{"operation_id": ..., "completed_at": ...}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OldestUnacked {
    /// The operation id.
    pub operation_id: String,
    /// When its outcome was recorded.
    pub completed_at: Timestamp,
}

/// A summary of a journal, with every clock applied as of `now`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// The file format version.
    pub format_version: u32,
    /// When the journal was created.
    pub created_at: Timestamp,
    /// The format the file had before it was upgraded to this one, if it was.
    pub upgraded_from: Option<u32>,
    /// When it was upgraded.
    pub upgraded_at: Option<Timestamp>,
    /// The time the counts were taken at.
    pub now: Timestamp,
    /// The persisted clock high-water mark.
    pub clock_high_water: Timestamp,
    /// Known operations (all statuses).
    pub operations: u64,
    /// Operations `Running`.
    pub running: u64,
    /// Operations `InDoubt`.
    pub in_doubt: u64,
    /// Operations `Applied`.
    pub applied: u64,
    /// Operations `Failed`.
    pub failed: u64,
    /// Operations `Retired`.
    pub retired: u64,
    /// Released or not-applied ids whose history is kept until purged.
    pub released: u64,
    /// Delivery `Pending`.
    pub pending: u64,
    /// Delivery `Delivered`.
    pub delivered: u64,
    /// Delivery `Acknowledged`.
    pub acknowledged: u64,
    /// Delivery `Exhausted`.
    pub exhausted: u64,
    /// Delivery `AckExpired`.
    pub ack_expired: u64,
    /// The oldest terminal result still waiting for its acknowledgement.
    pub oldest_unacked: Option<OldestUnacked>,
    /// Events in the journal table.
    pub events: u64,
    /// Stored result payloads (inline in their receipts, or in the results table).
    pub results: u64,
    /// Scopes with a recorded revision.
    pub scopes: u64,
    /// Timer index entries.
    pub timers: u64,
    /// Records moved aside by `repair`.
    pub quarantined: u64,
    /// The redb file's size in bytes (0 if unknown).
    pub file_bytes: u64,
    /// The log files' size in bytes (`<journal>-log` and `<journal>-log2`): 0 after a
    /// clean close, when the journal is one file.
    pub log_bytes: u64,
    /// The replay cache of the handle that counted (0 for an [`Inspector`](crate::Inspector)):
    /// bytes held, entries, and answers served from it and not, since the journal opened.
    pub replay_cache: ReplayCacheStats,
}

/// The counts of `v` at `now`; `adjust` turns each effective record into the one to count
/// (a handle applies the lazy writes it has not committed yet).
/// What the replay cache holds and has served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ReplayCacheStats {
    /// Bytes held (at most the configured bound).
    pub bytes: u64,
    /// Answers held.
    pub entries: u64,
    /// Answers served from the cache.
    pub hits: u64,
    /// Lookups of known ids that read the index instead.
    pub misses: u64,
}

pub(crate) fn collect<V: View>(
    v: &V,
    now: Timestamp,
    adjust: impl Fn(ReceiptRecord) -> Option<ReceiptRecord>,
) -> Result<Stats> {
    let mut s = Stats {
        now,
        ..Stats::default()
    };
    if let Some(f) = v.format()? {
        s.format_version = f.format_version;
        s.created_at = f.created_at;
        s.upgraded_from = f.upgraded.map(|u| u.from);
        s.upgraded_at = f.upgraded.map(|u| u.at);
    }
    s.clock_high_water = v.state()?.clock_high_water;
    for entry in v.all::<Receipts>()? {
        let (k, val) = entry?;
        let rec = index::decode_receipt(&k, &val)?;
        // A result stored inline in its receipt (format 3) is a stored payload too.
        if index::split_receipt_value(&val).1.is_some() {
            s.results += 1;
        }
        let Some(rec) = machine::effective(rec, now).and_then(&adjust) else {
            continue;
        };
        if let ExecRecord::Vacant { .. } = rec.state {
            s.released += 1;
            continue;
        }
        let Some(r) = machine::into_view(rec) else {
            continue;
        };
        s.operations += 1;
        match r.status {
            ExecutionStatus::Running => s.running += 1,
            ExecutionStatus::InDoubt => s.in_doubt += 1,
            ExecutionStatus::Applied => s.applied += 1,
            ExecutionStatus::Failed => s.failed += 1,
            ExecutionStatus::Retired => s.retired += 1,
        }
        match r.delivery {
            Some(DeliveryState::Pending) => s.pending += 1,
            Some(DeliveryState::Delivered) => s.delivered += 1,
            Some(DeliveryState::Acknowledged) => s.acknowledged += 1,
            Some(DeliveryState::Exhausted) => s.exhausted += 1,
            Some(DeliveryState::AckExpired) => s.ack_expired += 1,
            None => {}
        }
        if r.delivery.is_some_and(|d| d.is_open())
            && r.status != ExecutionStatus::Retired
            && let Some(at) = r.completed_at
            && s.oldest_unacked
                .as_ref()
                .is_none_or(|o| at < o.completed_at)
        {
            s.oldest_unacked = Some(OldestUnacked {
                operation_id: r.operation_id.clone(),
                completed_at: at,
            });
        }
    }
    s.events = v.count::<Events>()?;
    s.results += v.count::<Results>()?;
    s.scopes = v.count::<Scopes>()?;
    s.timers = v.count::<Timers>()?;
    s.quarantined = v.count::<Quarantine>()?;
    Ok(s)
}
