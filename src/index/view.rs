//! The journal's reads ([`View`]): the records and index entries the state machine asks
//! for, on any layering of the tables (a batch being written, the memtable, a redb
//! snapshot). Every read goes through [`Layered`], so a change not yet checkpointed is seen
//! exactly as one in redb, and every value through the decoders of `values`, so damage is
//! a `Corrupt` error naming the table and key.

use std::ops::Bound;

use smol_str::SmolStr;

use super::TimerKind;
use super::layers::Layered;
use super::tables::{
    Events, Holds, Meta, OpEvents, Receipts, Results, ScopeTimers, Scopes, Timers, Windows,
};
use super::values::{
    corrupt, decode_event, decode_format, decode_inline_result, decode_meta, decode_receipt,
    decode_result, decode_scope, kept_result_seq, result_record_seq, split_receipt_value,
};
use crate::error::{Error, Result};
use crate::record::{
    CheckpointRecord, Event, FormatRecord, ReceiptRecord, ScopeRecord, StateRecord,
};
use crate::types::OpResult;

/// The journal's reads, on any layering of its tables (a batch being written, the
/// memtable, a redb snapshot).
pub(crate) trait View: Layered {
    fn format(&self) -> Result<Option<FormatRecord>> {
        match self.get::<Meta>(&SmolStr::new_static("format"))? {
            Some(v) => Ok(Some(decode_format(&v)?)),
            None => Ok(None),
        }
    }

    fn state(&self) -> Result<StateRecord> {
        match self.get::<Meta>(&SmolStr::new_static("state"))? {
            Some(v) => decode_meta("state", &v),
            None => Err(Error::corrupt(
                "meta",
                "state",
                "the state entry is missing",
            )),
        }
    }

    /// Where the log's current cycle starts (`None` for a journal of format 1, which has
    /// no log).
    fn checkpoint(&self) -> Result<Option<CheckpointRecord>> {
        match self.get::<Meta>(&SmolStr::new_static("checkpoint"))? {
            Some(v) => Ok(Some(decode_meta("checkpoint", &v)?)),
            None => Ok(None),
        }
    }

    fn receipt(&self, id: &str) -> Result<Option<ReceiptRecord>> {
        let memo = self.receipt_memo();
        if let Some(hit) = memo.and_then(|m| m.get(id)) {
            return Ok(hit);
        }
        let found = self.stored_receipt(id)?;
        if let Some(m) = memo {
            m.read(id, found.as_ref());
        }
        Ok(found)
    }

    /// The receipt of `id` as the layers hold it, read and decoded without a batch's memo.
    fn stored_receipt(&self, id: &str) -> Result<Option<ReceiptRecord>> {
        self.with_str::<Receipts, _>(id, |v| decode_receipt(id, v))?
            .transpose()
    }

    fn scope(&self, scope: &str) -> Result<Option<ScopeRecord>> {
        self.with_str::<Scopes, _>(scope, |v| decode_scope(scope, v))?
            .transpose()
    }

    fn scope_revision(&self, scope: &str) -> Result<u64> {
        Ok(self.scope(scope)?.map_or(0, |s| s.revision))
    }

    fn event(&self, seq: u64) -> Result<Option<Event>> {
        self.with_seq::<Events, _>(seq, |v| decode_event(seq, v))?
            .transpose()
    }

    /// The receipt of `id` and, when it is stored inline with it, its result: one read.
    /// A kept result not inline (a large one, or one written before format 3) is `None`
    /// here and read with [`View::result`].
    fn receipt_and_inline_result(
        &self,
        id: &str,
    ) -> Result<Option<(ReceiptRecord, Option<OpResult>)>> {
        self.with_str::<Receipts, _>(id, |v| {
            let (head, tail) = split_receipt_value(v);
            let rec = decode_receipt(id, head)?;
            let inline = match (tail, kept_result_seq(&rec)) {
                (Some(tail), Some(seq)) => Some(decode_inline_result(id, seq, tail)?),
                _ => None,
            };
            Ok((rec, inline))
        })?
        .transpose()
    }

    /// The result stored inline in the receipt of `id`, if it is the one completed at
    /// `seq`.
    fn inline_result(&self, id: &str, seq: u64) -> Result<Option<OpResult>> {
        self.with_str::<Receipts, _>(id, |v| match split_receipt_value(v).1 {
            // Another result (not the one asked for) is not this one; a damaged one is
            // named as such, not taken for a missing one.
            Some(tail) => match result_record_seq(tail) {
                Some(s) if s != seq => Ok(None),
                _ => decode_inline_result(id, seq, tail).map(Some),
            },
            None => Ok(None),
        })?
        .transpose()
        .map(Option::flatten)
    }

    /// Whether the result of `id` completed at `seq` is stored (inline or in `results`),
    /// without decoding it.
    fn result_stored(&self, id: &str, seq: u64) -> Result<bool> {
        let inline = self
            .with_str::<Receipts, _>(id, |v| {
                split_receipt_value(v)
                    .1
                    .is_some_and(|tail| result_record_seq(tail) == Some(seq))
            })?
            .unwrap_or(false);
        Ok(inline || self.get::<Results>(&seq)?.is_some())
    }

    /// The result of `operation_id` completed at `seq`: inline in its receipt, or stored
    /// under `seq` in `results` (checked against the operation id).
    fn result(&self, seq: u64, operation_id: &str) -> Result<Option<OpResult>> {
        if let Some(r) = self.inline_result(operation_id, seq)? {
            return Ok(Some(r));
        }
        self.stored_result(seq, operation_id)
    }

    /// The result of `operation_id` completed at `seq` as stored under `seq` in `results`
    /// (checked against the operation id), without looking for it inline: for a caller
    /// that read the receipt's value and found no result in it.
    fn stored_result(&self, seq: u64, operation_id: &str) -> Result<Option<OpResult>> {
        match self
            .with_seq::<Results, _>(seq, |v| decode_result(seq, v))?
            .transpose()?
        {
            Some((header, bytes)) => {
                if header.operation_id != operation_id {
                    return Err(corrupt(
                        "results",
                        seq,
                        format!(
                            "result belongs to `{}`, not `{operation_id}`",
                            header.operation_id
                        ),
                    ));
                }
                Ok(Some(OpResult {
                    bytes,
                    changed_assets: header.changed_assets,
                }))
            }
            None => Ok(None),
        }
    }

    /// The seqs of an operation's events, in order.
    fn op_event_seqs(&self, id: &str) -> Result<Vec<u64>> {
        let entries = self.op_events_between(id, id)?;
        Ok(entries.into_iter().map(|(_, seq)| seq).collect())
    }

    /// Up to `limit` receipts in operation id order, from the first id after `after` (from
    /// the first id with `None`): a compaction that scans every receipt instead of looking
    /// each due one up (see `machine::compaction`).
    fn receipts_after(&self, after: Option<&str>, limit: usize) -> Result<Vec<ReceiptRecord>> {
        let after = after.map(SmolStr::new);
        let lo = match &after {
            Some(id) => Bound::Excluded(id),
            None => Bound::Unbounded,
        };
        let mut out = Vec::new();
        for entry in self.range::<Receipts>(lo, Bound::Unbounded)?.take(limit) {
            let (id, value) = entry?;
            out.push(decode_receipt(&id, &value)?);
        }
        Ok(out)
    }

    /// The `op_events` entries of the operations with ids from `first` to `last` (both
    /// included), in key order: one range for a run of operations adjacent in id order.
    fn op_events_between(&self, first: &str, last: &str) -> Result<Vec<(SmolStr, u64)>> {
        let lo = (SmolStr::new(first), 0u64);
        let hi = (SmolStr::new(last), u64::MAX);
        let mut out = Vec::new();
        for entry in self.range::<OpEvents>(Bound::Included(&lo), Bound::Included(&hi))? {
            out.push(entry?.0);
        }
        Ok(out)
    }

    /// The operations recorded as holding `scope`'s lock.
    fn holders(&self, scope: &str) -> Result<Vec<SmolStr>> {
        let lo = (SmolStr::new(scope), SmolStr::default());
        let hi = (successor(scope), SmolStr::default());
        let mut out = Vec::new();
        for entry in self.range::<Holds>(Bound::Included(&lo), Bound::Excluded(&hi))? {
            let ((s, op), ()) = entry?;
            if s != scope {
                break;
            }
            out.push(op);
        }
        Ok(out)
    }

    /// Window entries of `session` whose ack deadline is after `after`, oldest deadline
    /// first, at most `limit`.
    fn window_after(&self, session: &str, after: u64, limit: usize) -> Result<Vec<(u64, SmolStr)>> {
        let mut out = Vec::new();
        if after == u64::MAX || limit == 0 {
            return Ok(out);
        }
        let lo = (SmolStr::new(session), after + 1, SmolStr::default());
        let hi = (successor(session), 0, SmolStr::default());
        for entry in self.range::<Windows>(Bound::Included(&lo), Bound::Excluded(&hi))? {
            let ((s, deadline, op), ()) = entry?;
            if s != session {
                break;
            }
            out.push((deadline, op));
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// Timers of `kind` due at or before `now`, earliest first, at most `limit`.
    fn timers_due(&self, kind: TimerKind, now: u64, limit: usize) -> Result<Vec<(u64, SmolStr)>> {
        self.timers_due_after(kind, None, now, limit)
    }

    /// As [`View::timers_due`], for timers past `after` (a `(due, operation id)` of this
    /// kind): compaction resumes where its last batch ended, instead of stepping again over
    /// the deletions of the timers it fired (each a tombstone until the next checkpoint).
    fn timers_due_after(
        &self,
        kind: TimerKind,
        after: Option<&(u64, SmolStr)>,
        now: u64,
        limit: usize,
    ) -> Result<Vec<(u64, SmolStr)>> {
        let k = kind as u8;
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let (lo, lo_bound) = match after {
            Some((due, op)) => ((k, *due, op.clone()), true),
            None => ((k, 0u64, SmolStr::default()), false),
        };
        let lower = if lo_bound {
            Bound::Excluded(&lo)
        } else {
            Bound::Included(&lo)
        };
        // Bounded above, not only cut short by the loop: a range's deletions (tombstones
        // until the next checkpoint) past the last entry it yields are stepped over before
        // the loop sees a key past it, and compaction deletes timers of the other kinds and
        // of later dues as it goes, which each of its batches stepped over again.
        let hi = match (now.checked_add(1), k.checked_add(1)) {
            (Some(next_due), _) => Some((k, next_due, SmolStr::default())),
            (None, Some(next_kind)) => Some((next_kind, 0, SmolStr::default())),
            (None, None) => None,
        };
        let upper = hi.as_ref().map_or(Bound::Unbounded, Bound::Excluded);
        for entry in self.range::<Timers>(lower, upper)? {
            let ((kk, due, op), ()) = entry?;
            if kk != k || due > now {
                break;
            }
            out.push((due, op));
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// Superseded revision events due for purging at or before `now`.
    fn scope_timers_due(&self, now: u64, limit: usize) -> Result<Vec<(u64, u64)>> {
        self.scope_timers_due_after(None, now, limit)
    }

    /// As [`View::scope_timers_due`], past `after` (see [`View::timers_due_after`]).
    fn scope_timers_due_after(
        &self,
        after: Option<(u64, u64)>,
        now: u64,
        limit: usize,
    ) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let hi = (now, u64::MAX);
        let lower = match &after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        for entry in self.range::<ScopeTimers>(lower, Bound::Included(&hi))? {
            out.push(entry?.0);
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }
}

impl<L: Layered> View for L {}

/// The least string greater than `s`: `s` followed by a NUL. As the first field of an
/// exclusive upper bound it ends the keys whose first field is `s`, so that a range read
/// stops there instead of stepping over the next keys' deletions.
fn successor(s: &str) -> SmolStr {
    let mut out = String::with_capacity(s.len() + 1);
    out.push_str(s);
    out.push('\0');
    SmolStr::from(out)
}
