//! The index: redb's tables, and how the journal reads and changes them.
//!
//! Everything that knows about redb's tables lives here, so mapping the receipt model onto
//! another store is a port of this module. Changes are made in a batch ([`WriteTables`])
//! over the layers not yet in redb; the committer logs each batch and then lays it on the
//! memtable; a checkpoint ([`checkpoint`]) writes the memtable into redb in one large
//! transaction. Every value read is checked (magic, CRC, decode, embedded key) and a
//! failure is a typed `Corrupt { table, key }` error, never a panic.

mod layers;
mod tables;

pub(crate) use layers::{Base, Layered, Layers, Snapshot};
pub(crate) use tables::{
    Events, Holds, InDoubt, Memtable, Meta, OpEvents, Quarantine, Receipts, Results, ScopeTimers,
    Scopes, Table, TableKey, TableValue, Timers, Windows,
};

use std::ops::Bound;

use redb::WriteTransaction;

use crate::codec::{self, RecordKind};
use crate::error::{Error, Result};
use crate::record::{
    CheckpointRecord, Event, FormatRecord, ReceiptRecord, ResultHeader, ScopeRecord, StateRecord,
};
use crate::types::OpResult;

/// Names of every table, for `verify` and for recognizing a journal.
pub(crate) const TABLE_NAMES: [&str; 12] = [
    "meta",
    "events",
    "receipts",
    "results",
    "scopes",
    "op_events",
    "timers",
    "scope_timers",
    "windows",
    "scope_holds",
    "in_doubt",
    "quarantine",
];

/// Timer kinds: the first element of a `timers` key.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub(crate) enum TimerKind {
    /// A `Running` operation's lease expiry.
    Lease = 1,
    /// An open delivery's next push (a queue, not fired by compaction).
    Redeliver = 2,
    /// The retry budget is spent when the last attempt's wait passes.
    Exhaust = 3,
    /// The acknowledgement timeout.
    AckTimeout = 4,
    /// Result retention.
    Retain = 5,
    /// Audit retention (retired or vacant records).
    Purge = 6,
}

impl TimerKind {
    pub(crate) const ALL: [TimerKind; 6] = [
        TimerKind::Lease,
        TimerKind::Redeliver,
        TimerKind::Exhaust,
        TimerKind::AckTimeout,
        TimerKind::Retain,
        TimerKind::Purge,
    ];

    pub(crate) fn from_byte(b: u8) -> Option<TimerKind> {
        TimerKind::ALL.into_iter().find(|k| *k as u8 == b)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            TimerKind::Lease => "lease",
            TimerKind::Redeliver => "redeliver",
            TimerKind::Exhaust => "exhaust",
            TimerKind::AckTimeout => "ack_timeout",
            TimerKind::Retain => "retain",
            TimerKind::Purge => "purge",
        }
    }
}

fn corrupt(table: &str, key: impl std::fmt::Display, e: impl std::fmt::Display) -> Error {
    Error::corrupt(table, key, e.to_string())
}

/// An event record of this format or of format 1, without checking where it was found.
pub(crate) fn decode_event_frame(bytes: &[u8]) -> std::result::Result<Event, codec::FrameError> {
    match codec::unframe_versioned(RecordKind::Event, bytes)? {
        (1, payload) => codec::decode_payload(1, payload).map(Event::from_v1),
        (v, payload) => codec::decode_payload(v, payload),
    }
}

/// The largest result record (framed, with its header) stored inline in its receipt's
/// value (format 3): a replay of such a result reads one value, found in one B-tree
/// descent. Larger results, and those of files written before format 3, are in `results`.
/// 2 KiB keeps a receipt with its result well inside one 4 KiB page.
pub(crate) const INLINE_RESULT_MAX: usize = 2048;

/// Splits a `receipts` value into its receipt record and the result record stored inline
/// after it (format 3), if there is one. The receipt record's length field says where it
/// ends; a value whose length field points past its end is left whole (and then fails to
/// unframe as a receipt, naming the lengths).
pub(crate) fn split_receipt_value(bytes: &[u8]) -> (&[u8], Option<&[u8]>) {
    if bytes.len() < codec::HEADER_LEN {
        return (bytes, None);
    }
    let declared = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
    match codec::HEADER_LEN.checked_add(declared) {
        Some(end) if end < bytes.len() => (&bytes[..end], Some(&bytes[end..])),
        _ => (bytes, None),
    }
}

/// The completing seq a result record names, read without decoding its payload (`None`:
/// not a result record this build reads).
fn result_record_seq(bytes: &[u8]) -> Option<u64> {
    let (version, payload) = codec::unframe_versioned(RecordKind::Result, bytes).ok()?;
    let (header, _): (ResultHeader, usize) = codec::decode_prefix(version, payload).ok()?;
    Some(header.completed_seq)
}

/// The result seq of a terminal record whose result is kept.
fn kept_result_seq(rec: &ReceiptRecord) -> Option<u64> {
    match &rec.state {
        crate::record::ExecRecord::Done(d) => d.result_seq,
        _ => None,
    }
}

/// Decodes the result stored inline in the receipt of `id`, which must be the one its
/// receipt names (completed at `seq`, by `id`).
pub(crate) fn decode_inline_result(id: &str, seq: u64, bytes: &[u8]) -> Result<OpResult> {
    let bad = |e: &dyn std::fmt::Display| corrupt("receipts", id, format!("inline result: {e}"));
    let (version, payload) =
        codec::unframe_versioned(RecordKind::Result, bytes).map_err(|e| bad(&e))?;
    let (header, used): (ResultHeader, usize) =
        codec::decode_prefix(version, payload).map_err(|e| bad(&e))?;
    if header.completed_seq != seq || header.operation_id != id {
        return Err(bad(&format!(
            "it is the result of `{}` completed at seq {}, and the receipt names seq {seq}",
            header.operation_id, header.completed_seq
        )));
    }
    Ok(OpResult {
        bytes: payload[used..].to_vec(),
        changed_assets: header.changed_assets,
    })
}

/// A receipt record of this format or of format 1, without checking where it was found.
/// A result stored inline after it is ignored (see [`split_receipt_value`]).
pub(crate) fn decode_receipt_frame(
    bytes: &[u8],
) -> std::result::Result<ReceiptRecord, codec::FrameError> {
    let bytes = split_receipt_value(bytes).0;
    match codec::unframe_versioned(RecordKind::Receipt, bytes)? {
        (1, payload) => codec::decode_payload(1, payload).map(ReceiptRecord::from_v1),
        (v, payload) => ReceiptRecord::decode(v, payload),
    }
}

pub(crate) fn decode_event(key: u64, bytes: &[u8]) -> Result<Event> {
    let ev = decode_event_frame(bytes).map_err(|e| corrupt("events", key, e))?;
    if ev.seq != key {
        return Err(corrupt(
            "events",
            key,
            format!("record carries seq {} under key {key}", ev.seq),
        ));
    }
    Ok(ev)
}

pub(crate) fn decode_receipt(key: &str, bytes: &[u8]) -> Result<ReceiptRecord> {
    let rec = decode_receipt_frame(bytes).map_err(|e| corrupt("receipts", key, e))?;
    if rec.operation_id != key {
        return Err(corrupt(
            "receipts",
            key,
            format!("record carries operation id `{}`", rec.operation_id),
        ));
    }
    Ok(rec)
}

pub(crate) fn decode_scope(key: &str, bytes: &[u8]) -> Result<ScopeRecord> {
    let rec: ScopeRecord =
        codec::decode(RecordKind::Scope, bytes).map_err(|e| corrupt("scopes", key, e))?;
    if rec.scope != key {
        return Err(corrupt(
            "scopes",
            key,
            format!("record carries scope `{}`", rec.scope),
        ));
    }
    Ok(rec)
}

/// Decodes a `results` value into its header and payload.
pub(crate) fn decode_result(key: u64, bytes: &[u8]) -> Result<(ResultHeader, Vec<u8>)> {
    let (version, payload) = codec::unframe_versioned(RecordKind::Result, bytes)
        .map_err(|e| corrupt("results", key, e))?;
    let (header, used): (ResultHeader, usize) =
        codec::decode_prefix(version, payload).map_err(|e| corrupt("results", key, e))?;
    if header.completed_seq != key {
        return Err(corrupt(
            "results",
            key,
            format!(
                "record carries seq {} under key {key}",
                header.completed_seq
            ),
        ));
    }
    Ok((header, payload[used..].to_vec()))
}

pub(crate) fn encode_result(seq: u64, operation_id: &str, result: &OpResult) -> Vec<u8> {
    let mut payload = codec::encode_payload(&ResultHeader {
        operation_id: operation_id.to_string(),
        completed_seq: seq,
        changed_assets: result.changed_assets.clone(),
    });
    payload.extend_from_slice(&result.bytes);
    codec::frame(RecordKind::Result, &payload)
}

/// Decodes the `format` record, of this format or of format 1. A newer one is refused with
/// both versions named: a file a newer build wrote is never read (or rewritten) as if it
/// were of this format.
pub(crate) fn decode_format(bytes: &[u8]) -> Result<FormatRecord> {
    let unsupported = |found: u32| {
        Error::new(crate::error::ErrorKind::UnsupportedFormat {
            found,
            supported: u32::from(codec::FORMAT_VERSION),
        })
    };
    match codec::unframe_versioned(RecordKind::Meta, bytes) {
        Ok((1, payload)) => codec::decode_payload::<crate::record::FormatRecordV1>(1, payload)
            .map(FormatRecord::from)
            .map_err(|e| corrupt("meta", "format", e)),
        Ok((v, payload)) => {
            let f: FormatRecord =
                codec::decode_payload(v, payload).map_err(|e| corrupt("meta", "format", e))?;
            if f.format_version > u32::from(codec::FORMAT_VERSION) {
                return Err(unsupported(f.format_version));
            }
            Ok(f)
        }
        Err(codec::FrameError::NewerVersion(v)) => Err(unsupported(u32::from(v))),
        Err(e) => Err(corrupt("meta", "format", e)),
    }
}

pub(crate) fn decode_meta<T: serde::de::DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T> {
    codec::decode(RecordKind::Meta, bytes).map_err(|e| corrupt("meta", key, e))
}

/// The journal's reads, on any layering of its tables (a batch being written, the
/// memtable, a redb snapshot).
pub(crate) trait View: Layered {
    fn format(&self) -> Result<Option<FormatRecord>> {
        match self.get::<Meta>(&"format".to_string())? {
            Some(v) => Ok(Some(decode_format(&v)?)),
            None => Ok(None),
        }
    }

    fn state(&self) -> Result<StateRecord> {
        match self.get::<Meta>(&"state".to_string())? {
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
        match self.get::<Meta>(&"checkpoint".to_string())? {
            Some(v) => Ok(Some(decode_meta("checkpoint", &v)?)),
            None => Ok(None),
        }
    }

    fn receipt(&self, id: &str) -> Result<Option<ReceiptRecord>> {
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
        let lo = (id.to_string(), 0u64);
        let hi = (id.to_string(), u64::MAX);
        let mut out = Vec::new();
        for entry in self.range::<OpEvents>(Bound::Included(&lo), Bound::Included(&hi))? {
            out.push(entry?.0.1);
        }
        Ok(out)
    }

    /// The operations recorded as holding `scope`'s lock.
    fn holders(&self, scope: &str) -> Result<Vec<String>> {
        let lo = (scope.to_string(), String::new());
        let mut out = Vec::new();
        for entry in self.range::<Holds>(Bound::Included(&lo), Bound::Unbounded)? {
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
    fn window_after(&self, session: &str, after: u64, limit: usize) -> Result<Vec<(u64, String)>> {
        let mut out = Vec::new();
        if after == u64::MAX || limit == 0 {
            return Ok(out);
        }
        let lo = (session.to_string(), after + 1, String::new());
        for entry in self.range::<Windows>(Bound::Included(&lo), Bound::Unbounded)? {
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
    fn timers_due(&self, kind: TimerKind, now: u64, limit: usize) -> Result<Vec<(u64, String)>> {
        self.timers_due_after(kind, None, now, limit)
    }

    /// As [`View::timers_due`], for timers past `after` (a `(due, operation id)` of this
    /// kind): compaction resumes where its last batch ended, instead of stepping again over
    /// the deletions of the timers it fired (each a tombstone until the next checkpoint).
    fn timers_due_after(
        &self,
        kind: TimerKind,
        after: Option<&(u64, String)>,
        now: u64,
        limit: usize,
    ) -> Result<Vec<(u64, String)>> {
        let k = kind as u8;
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let (lo, lo_bound) = match after {
            Some((due, op)) => ((k, *due, op.clone()), true),
            None => ((k, 0u64, String::new()), false),
        };
        let lower = if lo_bound {
            Bound::Excluded(&lo)
        } else {
            Bound::Included(&lo)
        };
        for entry in self.range::<Timers>(lower, Bound::Unbounded)? {
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

/// One index entry implied by a receipt (see `machine::index_entries`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum IndexEntry {
    Timer(TimerKind, u64),
    Window(String, u64),
    Hold(String),
    InDoubt,
}

/// A batch of changes being written, over the layers below it. Reads see the batch's own
/// changes first. Nothing reaches the log or redb until the committer takes the changes
/// ([`WriteTables::into_changes`]); a batch that fails is dropped with everything in it.
pub(crate) struct WriteTables<'a> {
    base: Option<&'a Base>,
    below: Layers<'a>,
    own: Memtable,
    /// Whether anything was written: a batch that wrote nothing is not committed.
    pub(crate) dirty: bool,
}

impl Layered for WriteTables<'_> {
    fn base(&self) -> Option<&Base> {
        self.base
    }
    fn layers(&self) -> Layers<'_> {
        self.below.under(&self.own)
    }
}

impl<'a> WriteTables<'a> {
    /// An empty batch over `base` and `below`.
    pub(crate) fn over(base: Option<&'a Base>, below: Layers<'a>) -> WriteTables<'a> {
        WriteTables {
            base,
            below,
            own: Memtable::default(),
            dirty: false,
        }
    }

    /// The batch's changes.
    pub(crate) fn into_changes(self) -> Memtable {
        self.own
    }

    fn set<T: Table>(&mut self, key: T::K, value: Option<T::V>) {
        self.dirty = true;
        self.own.set::<T>(key, value);
    }

    pub(crate) fn put_format(&mut self, f: &FormatRecord) -> Result<()> {
        self.set::<Meta>("format".into(), Some(codec::encode(RecordKind::Meta, f)));
        Ok(())
    }

    pub(crate) fn put_state(&mut self, s: &StateRecord) -> Result<()> {
        self.set::<Meta>("state".into(), Some(codec::encode(RecordKind::Meta, s)));
        Ok(())
    }

    pub(crate) fn put_checkpoint(&mut self, c: &CheckpointRecord) -> Result<()> {
        self.set::<Meta>(
            "checkpoint".into(),
            Some(codec::encode(RecordKind::Meta, c)),
        );
        Ok(())
    }

    pub(crate) fn put_event(&mut self, ev: &Event) -> Result<()> {
        self.set::<Events>(ev.seq, Some(codec::encode(RecordKind::Event, ev)));
        if let Some(op) = &ev.operation_id {
            self.set::<OpEvents>((op.clone(), ev.seq), Some(()));
        }
        Ok(())
    }

    /// Deletes the event `seq`; the caller removes its `op_events` entry (see
    /// [`WriteTables::take_op_events`]).
    pub(crate) fn delete_event(&mut self, seq: u64) -> Result<()> {
        self.set::<Events>(seq, None);
        Ok(())
    }

    /// Deletes every `op_events` entry of operation `op` and returns the sequence numbers
    /// of its events, in order.
    pub(crate) fn take_op_events(&mut self, op: &str) -> Result<Vec<u64>> {
        let seqs = self.op_event_seqs(op)?;
        for seq in &seqs {
            self.set::<OpEvents>((op.to_string(), *seq), None);
        }
        Ok(seqs)
    }

    /// Writes a receipt. A result stored inline in the value it replaces stays with it
    /// while the receipt still keeps that result (deliveries and acknowledgements rewrite
    /// a terminal receipt); retiring or purging drops it.
    pub(crate) fn put_receipt(&mut self, rec: &ReceiptRecord) -> Result<()> {
        let mut value = codec::encode(RecordKind::Receipt, rec);
        if let Some(seq) = kept_result_seq(rec)
            && let Some(Some(tail)) = self.with_str::<Receipts, _>(&rec.operation_id, |v| {
                split_receipt_value(v)
                    .1
                    .filter(|tail| result_record_seq(tail) == Some(seq))
                    .map(<[u8]>::to_vec)
            })?
        {
            value.extend_from_slice(&tail);
        }
        self.set::<Receipts>(rec.operation_id.clone(), Some(value));
        Ok(())
    }

    pub(crate) fn delete_receipt(&mut self, id: &str) -> Result<()> {
        self.set::<Receipts>(id.to_string(), None);
        Ok(())
    }

    pub(crate) fn put_scope(&mut self, rec: &ScopeRecord) -> Result<()> {
        self.set::<Scopes>(
            rec.scope.clone(),
            Some(codec::encode(RecordKind::Scope, rec)),
        );
        Ok(())
    }

    /// Stores the result of `id` completed at `seq`, after its receipt names it: inline in
    /// the receipt's value when it is small (see [`INLINE_RESULT_MAX`]), else in `results`.
    pub(crate) fn put_result(&mut self, seq: u64, id: &str, result: &OpResult) -> Result<()> {
        let frame = encode_result(seq, id, result);
        if frame.len() <= INLINE_RESULT_MAX
            && let Some(Some(mut value)) = self.with_str::<Receipts, _>(id, |v| {
                let head = split_receipt_value(v).0;
                decode_receipt(id, head)
                    .ok()
                    .filter(|r| kept_result_seq(r) == Some(seq))
                    .map(|_| head.to_vec())
            })?
        {
            value.extend_from_slice(&frame);
            self.set::<Receipts>(id.to_string(), Some(value));
            return Ok(());
        }
        self.set::<Results>(seq, Some(frame));
        Ok(())
    }

    pub(crate) fn delete_result(&mut self, seq: u64) -> Result<()> {
        self.set::<Results>(seq, None);
        Ok(())
    }

    pub(crate) fn put_scope_timer(&mut self, due: u64, seq: u64) -> Result<()> {
        self.set::<ScopeTimers>((due, seq), Some(()));
        Ok(())
    }

    pub(crate) fn delete_scope_timer(&mut self, due: u64, seq: u64) -> Result<()> {
        self.set::<ScopeTimers>((due, seq), None);
        Ok(())
    }

    pub(crate) fn insert_index(&mut self, op: &str, entry: &IndexEntry) -> Result<()> {
        self.index_entry(op, entry, Some(()));
        Ok(())
    }

    pub(crate) fn remove_index(&mut self, op: &str, entry: &IndexEntry) -> Result<()> {
        self.index_entry(op, entry, None);
        Ok(())
    }

    fn index_entry(&mut self, op: &str, entry: &IndexEntry, value: Option<()>) {
        let op = op.to_string();
        match entry {
            IndexEntry::Timer(kind, due) => self.set::<Timers>((*kind as u8, *due, op), value),
            IndexEntry::Window(session, deadline) => {
                self.set::<Windows>((session.clone(), *deadline, op), value)
            }
            IndexEntry::Hold(scope) => self.set::<Holds>((scope.clone(), op), value),
            IndexEntry::InDoubt => self.set::<InDoubt>(op, value),
        }
    }
}

/// Creates every table that does not exist yet.
pub(crate) fn create_tables(txn: &WriteTransaction) -> Result<()> {
    macro_rules! create {
        ($t:ident) => {
            txn.open_table(<$t as Table>::def())?;
        };
    }
    tables::each_table!(create);
    Ok(())
}

/// Writes `changes` into redb's tables in `txn`: each table's changes in key order (how
/// B-trees like them). Deleted events and results come in runs of neighbouring keys (a
/// compaction purges operations in completion order, so their events and results sit side
/// by side), and so do fired timers: each run is removed in one cursor pass, which
/// rebuilds each B-tree leaf once instead of once per key.
pub(crate) fn checkpoint(txn: &WriteTransaction, changes: &Memtable) -> Result<()> {
    write_table::<Meta>(txn, changes, remove_each::<Meta>)?;
    write_table::<Events>(txn, changes, remove_in_runs)?;
    write_table::<Receipts>(txn, changes, remove_each::<Receipts>)?;
    write_table::<Results>(txn, changes, remove_in_runs)?;
    write_table::<Scopes>(txn, changes, remove_each::<Scopes>)?;
    write_table::<OpEvents>(txn, changes, remove_each::<OpEvents>)?;
    write_table::<Timers>(txn, changes, remove_timers)?;
    write_table::<ScopeTimers>(txn, changes, remove_each::<ScopeTimers>)?;
    write_table::<Windows>(txn, changes, remove_each::<Windows>)?;
    write_table::<Holds>(txn, changes, remove_each::<Holds>)?;
    write_table::<InDoubt>(txn, changes, remove_each::<InDoubt>)?;
    write_table::<Quarantine>(txn, changes, remove_in_runs)?;
    Ok(())
}

/// A table of `T` open in a write transaction.
type WriteTable<'t, T> = redb::Table<
    't,
    <<T as Table>::K as TableKey>::Redb,
    <<T as Table>::V as tables::TableValue>::Redb,
>;

/// Writes one table's changes: deletions, then puts among the existing keys, then the puts
/// past the table's last key (events, results, and any key that only grows) as one run
/// through a cursor at the table's end. redb packs such a run into full leaves; inserted
/// one by one, keys that only grow would leave every leaf half full (each split leaves a
/// left half that no later key falls into), doubling the file.
fn write_table<T: Table>(
    txn: &WriteTransaction,
    changes: &Memtable,
    remove: impl FnOnce(&mut WriteTable<'_, T>, &mut Vec<T::K>) -> Result<()>,
) -> Result<()> {
    use redb::ReadableTable as _;
    let map = T::map(changes);
    if map.is_empty() {
        return Ok(());
    }
    let mut table = txn.open_table(T::def())?;
    let mut deleted: Vec<T::K> = map
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k.clone())
        .collect();
    remove(&mut table, &mut deleted)?;
    let last: Option<T::K> = table.last()?.map(|(k, _)| T::K::own(k.value()));
    let puts = map.iter().filter_map(|(k, v)| v.as_ref().map(|v| (k, v)));
    let mut run = Vec::new();
    for (k, v) in puts {
        if last.as_ref().is_some_and(|last| k <= last) {
            table.insert(k.borrow(), tables::TableValue::borrow(v))?;
        } else {
            run.push((k, v));
        }
    }
    if !run.is_empty() {
        let mut cursor = table.upper_bound_mut(
            std::ops::Bound::<<<T::K as TableKey>::Redb as redb::Value>::SelfType<'_>>::Unbounded,
        )?;
        for (k, v) in run {
            cursor
                .insert_before(k.borrow(), tables::TableValue::borrow(v))
                .map_err(redb::Error::from)?;
        }
        cursor.close()?;
    }
    Ok(())
}

fn remove_each<T: Table>(table: &mut WriteTable<'_, T>, keys: &mut Vec<T::K>) -> Result<()> {
    for k in keys.drain(..) {
        table.remove(k.borrow())?;
    }
    Ok(())
}

/// Keys at most this far apart are removed in the same pass; the pass steps over the
/// live keys between them, which costs far less than a leaf rebuild.
const RUN_GAP: u64 = 64;

/// Removes `keys` from `table`: each run of nearby keys with one `retain_in` pass, a lone
/// key with `remove`. Leaves `keys` empty.
fn remove_in_runs(
    table: &mut redb::Table<'_, u64, &'static [u8]>,
    keys: &mut Vec<u64>,
) -> Result<()> {
    keys.sort_unstable();
    keys.dedup();
    let mut start = 0;
    while start < keys.len() {
        let mut end = start + 1;
        while end < keys.len() && keys[end] - keys[end - 1] <= RUN_GAP {
            end += 1;
        }
        let run = &keys[start..end];
        if let [key] = run {
            table.remove(*key)?;
        } else {
            let (first, last) = (run[0], run[run.len() - 1]);
            let mut next = 0;
            table.retain_in(first..=last, |key, _| {
                while next < run.len() && run[next] < key {
                    next += 1;
                }
                !(next < run.len() && run[next] == key)
            })?;
        }
        start = end;
    }
    keys.clear();
    Ok(())
}

/// Removes the held timers `keys`, one `retain_in` pass per timer kind from the first to
/// the last key. A compaction batch fires a prefix of each kind's due timers, so the keys
/// between are due timers of the same batch: the pass steps over at most a batch.
fn remove_timers(
    table: &mut redb::Table<'_, (u8, u64, &'static str), ()>,
    keys: &mut Vec<(u8, u64, String)>,
) -> Result<()> {
    keys.sort_unstable();
    keys.dedup();
    let mut start = 0;
    while start < keys.len() {
        let kind = keys[start].0;
        let end = start + keys[start..].iter().take_while(|k| k.0 == kind).count();
        let run = &keys[start..end];
        if let [(kind, due, op)] = run {
            table.remove((*kind, *due, op.as_str()))?;
        } else {
            let (first, last) = (&run[0], &run[run.len() - 1]);
            let mut next = 0;
            table.retain_in(
                (first.0, first.1, first.2.as_str())..=(last.0, last.1, last.2.as_str()),
                |(kind, due, op), ()| {
                    let key = (kind, due, op);
                    while next < run.len() && (run[next].0, run[next].1, run[next].2.as_str()) < key
                    {
                        next += 1;
                    }
                    !(next < run.len() && (run[next].0, run[next].1, run[next].2.as_str()) == key)
                },
            )?;
        }
        start = end;
    }
    keys.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{ReadableDatabase as _, ReadableTable as _};

    #[test]
    fn a_deletion_of_a_key_the_base_lacks_leaves_no_tombstone_in_a_range_read_index() -> Result<()>
    {
        let db = redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new())?;
        let txn = db.begin_write()?;
        txn.open_table(<InDoubt as Table>::def())?.insert("a", ())?;
        txn.open_table(<Events as Table>::def())?
            .insert(1u64, [1u8].as_slice())?;
        txn.commit()?;
        let base = Base::new(db.begin_read()?);
        let mut mem = Memtable::default();
        let mut batch = Memtable::default();
        batch.set::<InDoubt>("b".to_string(), Some(()));
        batch.set::<Events>(2, Some(vec![2]));
        mem.absorb_over(batch, Some(&base));
        let mut batch = Memtable::default();
        for k in ["a", "b", "c"] {
            batch.set::<InDoubt>(k.to_string(), None);
        }
        for k in [1, 2, 3] {
            batch.set::<Events>(k, None);
        }
        mem.absorb_over(batch, Some(&base));
        // In the index read by range, only the base's key needs hiding; the memtable's own
        // and a never-seen key vanish.
        let held: Vec<(String, Option<()>)> = <InDoubt as Table>::map(&mem)
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        assert_eq!(held, vec![("a".to_string(), None)]);
        // Elsewhere the tombstones stay, without a lookup in the base per deletion.
        assert_eq!(<Events as Table>::map(&mem).len(), 3);
        let snap = Snapshot {
            base: Some(&base),
            layers: Layers::new(&[&mem]),
        };
        assert_eq!(snap.all::<InDoubt>()?.count(), 0, "every key is deleted");
        assert_eq!(snap.all::<Events>()?.count(), 0, "every key is deleted");
        Ok(())
    }

    #[test]
    fn a_range_over_layers_and_the_base_is_what_the_top_layer_says_for_each_key() -> Result<()> {
        // A base in redb and three layers with overlapping keys and tombstones, from a
        // small generator; every range is compared with a model where the upper layer wins.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let db = redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new())?;
        let mut model: std::collections::BTreeMap<u64, Vec<u8>> = Default::default();
        let txn = db.begin_write()?;
        {
            let mut t = txn.open_table(<Events as Table>::def())?;
            for k in 0..200u64 {
                if next(2) == 0 {
                    t.insert(k, [1u8, k as u8].as_slice())?;
                    model.insert(k, vec![1, k as u8]);
                }
            }
        }
        txn.commit()?;
        let mut layers = [
            Memtable::default(),
            Memtable::default(),
            Memtable::default(),
        ];
        // Applied bottom (index 2) to top (index 0), as commits would stack them.
        for (depth, m) in layers.iter_mut().enumerate().rev() {
            for _ in 0..80 {
                let k = next(220);
                if next(3) == 0 {
                    m.set::<Events>(k, None);
                    model.remove(&k);
                } else {
                    let v = vec![10 + depth as u8, k as u8];
                    m.set::<Events>(k, Some(v.clone()));
                    model.insert(k, v);
                }
            }
        }
        let base = Base::new(db.begin_read()?);
        let snap = Snapshot {
            base: Some(&base),
            layers: Layers::new(&[&layers[0], &layers[1], &layers[2]]),
        };
        for _ in 0..200 {
            let (a, b) = (next(230), next(230));
            let (lo, hi) = (a.min(b), a.max(b));
            let got: Vec<(u64, Vec<u8>)> = snap
                .range::<Events>(Bound::Included(&lo), Bound::Excluded(&hi))?
                .collect::<Result<_>>()?;
            let want: Vec<(u64, Vec<u8>)> =
                model.range(lo..hi).map(|(k, v)| (*k, v.clone())).collect();
            assert_eq!(got, want, "range {lo}..{hi}");
        }
        let all: Vec<u64> = snap
            .all::<Events>()?
            .map(|e| e.map(|(k, _)| k))
            .collect::<Result<_>>()?;
        assert_eq!(all, model.keys().copied().collect::<Vec<_>>());
        Ok(())
    }

    /// A table of keys `0..n` in memory, `remove_in_runs(doomed)` applied, and the keys
    /// that are left.
    fn left_after(n: u64, doomed: &[u64]) -> Result<Vec<u64>> {
        const T: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("t");
        let db = redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new())?;
        let txn = db.begin_write()?;
        {
            let mut table = txn.open_table(T)?;
            for k in 0..n {
                table.insert(k, [7u8; 100].as_slice())?;
            }
            let mut keys = doomed.to_vec();
            remove_in_runs(&mut table, &mut keys)?;
            assert!(keys.is_empty(), "the list is consumed");
        }
        txn.commit()?;
        let read = db.begin_read()?;
        let table = read.open_table(T)?;
        let mut out = Vec::new();
        for entry in table.iter()? {
            out.push(entry?.0.value());
        }
        Ok(out)
    }

    #[test]
    fn held_deletes_remove_exactly_the_listed_keys_across_runs_gaps_and_duplicates() -> Result<()> {
        // Runs with live keys between them, a gap of exactly RUN_GAP and of RUN_GAP + 1,
        // lone keys, duplicates, unsorted input, the first and last keys.
        let mut doomed: Vec<u64> = vec![0, 999, 500, 500, 3, 5, 7, 9, 300];
        doomed.extend((100..200).step_by(2));
        doomed.extend([600, 600 + RUN_GAP, 700, 701 + RUN_GAP]);
        doomed.reverse();
        let expected: Vec<u64> = (0..1000).filter(|k| !doomed.contains(k)).collect();
        assert_eq!(left_after(1000, &doomed)?, expected);
        // Keys that are not in the table change nothing.
        assert_eq!(left_after(10, &[20, 21, 40])?, (0..10).collect::<Vec<_>>());
        assert_eq!(left_after(10, &[])?, (0..10).collect::<Vec<_>>());
        Ok(())
    }

    #[test]
    fn held_timer_deletes_remove_exactly_the_listed_timers_of_each_kind() -> Result<()> {
        let db = redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new())?;
        let all: Vec<(u8, u64, String)> = (0..3u8)
            .flat_map(|kind| (0..40u64).map(move |due| (kind, due, format!("op{}", due % 7))))
            .collect();
        let doomed: Vec<(u8, u64, String)> = all
            .iter()
            .filter(|(kind, due, _)| (*kind == 0 && due % 3 == 0) || (*kind == 2 && *due == 5))
            .cloned()
            .collect();
        let txn = db.begin_write()?;
        {
            let mut table = txn.open_table(Timers::def())?;
            for (kind, due, op) in &all {
                table.insert((*kind, *due, op.as_str()), ())?;
            }
            let mut keys: Vec<_> = doomed.iter().rev().cloned().collect();
            keys.push(doomed[0].clone());
            remove_timers(&mut table, &mut keys)?;
            assert!(keys.is_empty());
        }
        txn.commit()?;
        let read = db.begin_read()?;
        let table = read.open_table(Timers::def())?;
        let mut left = Vec::new();
        for entry in table.iter()? {
            let (key, _) = entry?;
            let (kind, due, op) = key.value();
            left.push((kind, due, op.to_string()));
        }
        let expected: Vec<_> = all.into_iter().filter(|k| !doomed.contains(k)).collect();
        assert_eq!(left, expected);
        Ok(())
    }
}
