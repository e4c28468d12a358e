//! A batch of changes being written ([`WriteTables`]): the state machine's writes, kept in
//! a memtable of their own over the layers below until the committer logs them. Reads of
//! the batch see its own changes first. A result small enough is stored inline after its
//! receipt (format 3); the batch keeps such a result with its receipt while the receipt
//! still names it.

use std::cell::RefCell;

use smol_str::SmolStr;

use super::TimerKind;
use super::layers::{Base, Layered, Layers};
use super::tables::{
    Events, Holds, InDoubt, Memtable, Meta, OpEvents, Receipts, Results, ScopeTimers, Scopes,
    Table, Timers, Windows,
};
use super::values::{
    INLINE_RESULT_MAX, decode_receipt, encode_result, kept_result_seq, result_record_seq,
    split_receipt_value,
};
use super::view::View;
use crate::codec::{self, RecordKind};
use crate::error::Result;
use crate::record::{
    CheckpointRecord, Event, FormatRecord, ReceiptRecord, ScopeRecord, StateRecord,
};
use crate::types::OpResult;

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
    base: Option<&'a Base<'a>>,
    below: Layers<'a>,
    own: Memtable,
    /// The last receipt read or written in this batch (see [`ReceiptMemo`]).
    memo: ReceiptMemo,
    /// Whether anything was written: a batch that wrote nothing is not committed.
    pub(crate) dirty: bool,
}

impl Layered for WriteTables<'_> {
    fn base(&self) -> Option<&Base<'_>> {
        self.base
    }
    fn layers(&self) -> Layers<'_> {
        self.below.under(&self.own)
    }
    fn receipt_memo(&self) -> Option<&ReceiptMemo> {
        Some(&self.memo)
    }
}

/// The receipt of one operation as a batch last read or wrote it, or that it has none: a
/// command reads the receipt it works on several times (its checks, the clocks, each
/// event's `apply`, the answer), and each read would otherwise look the id up through
/// every layer and decode the record again.
///
/// It stays true because every change to `receipts` in a batch goes through
/// [`WriteTables::put_receipt`] or [`WriteTables::delete_receipt`], which set it, and the
/// layers under a batch do not change while it lives. An inline result stored after the
/// receipt ([`WriteTables::put_result`]) leaves the record as it is. The writes set it
/// through `&mut` (no borrow that could fail); a read that finds it borrowed (it never is
/// across a call) only goes without it.
#[derive(Default)]
pub(crate) struct ReceiptMemo(RefCell<Memo>);

// One per batch; boxing the record would add an allocation to every read that fills it.
#[allow(clippy::large_enum_variant)]
#[derive(Default)]
enum Memo {
    #[default]
    Empty,
    /// The id has no receipt.
    Absent(String),
    Present(ReceiptRecord),
}

impl ReceiptMemo {
    /// The receipt of `id` if it is the one remembered: `Some(None)` for an id known to
    /// have none, `None` for an id not remembered.
    pub(crate) fn get(&self, id: &str) -> Option<Option<ReceiptRecord>> {
        self.peek(id, |r| r.cloned())
    }

    /// `f` of the receipt of `id` (`None`: it has none) if it is the one remembered,
    /// without cloning it.
    fn peek<R>(&self, id: &str, f: impl FnOnce(Option<&ReceiptRecord>) -> R) -> Option<R> {
        match &*self.0.try_borrow().ok()? {
            Memo::Present(r) if r.operation_id == id => Some(f(Some(r))),
            Memo::Absent(k) if k == id => Some(f(None)),
            _ => None,
        }
    }

    /// Remembers what a read of `id` found.
    pub(crate) fn read(&self, id: &str, found: Option<&ReceiptRecord>) {
        if let Ok(mut memo) = self.0.try_borrow_mut() {
            *memo = match found {
                Some(r) => Memo::Present(r.clone()),
                None => Memo::Absent(id.to_string()),
            };
        }
    }

    /// Remembers what a write of the batch left.
    fn set(&mut self, memo: Memo) {
        *self.0.get_mut() = memo;
    }
}

impl<'a> WriteTables<'a> {
    /// An empty batch over `base` and `below`.
    pub(crate) fn over(base: Option<&'a Base<'a>>, below: Layers<'a>) -> WriteTables<'a> {
        WriteTables {
            base,
            below,
            own: Memtable::default(),
            memo: ReceiptMemo::default(),
            dirty: false,
        }
    }

    /// Notes that the deletions are of keys the index mostly holds (see
    /// [`Memtable::deletes_stored_keys`]).
    pub(crate) fn deletes_stored_keys(&mut self) {
        self.own.deletes_stored_keys();
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
            self.set::<OpEvents>((SmolStr::new(op), ev.seq), Some(()));
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
        self.drop_op_events(op, &seqs);
        Ok(seqs)
    }

    /// Deletes the `op_events` entries `(op, seq)` for each of `seqs` (the caller read them:
    /// [`WriteTables::take_op_events`], or a compaction scan that read many operations'
    /// entries in one range).
    pub(crate) fn drop_op_events(&mut self, op: &str, seqs: &[u64]) {
        for seq in seqs {
            self.set::<OpEvents>((SmolStr::new(op), *seq), None);
        }
    }

    /// Writes a receipt. A result stored inline in the value it replaces stays with it
    /// while the receipt still keeps that result (deliveries and acknowledgements rewrite
    /// a terminal receipt); retiring or purging drops it.
    pub(crate) fn put_receipt(&mut self, rec: ReceiptRecord) -> Result<()> {
        // Built where the value it replaces is read, so that its result is copied once.
        let value = match kept_result_seq(&rec) {
            Some(seq) => self.with_str::<Receipts, _>(&rec.operation_id, |v| {
                let tail = split_receipt_value(v)
                    .1
                    .filter(|tail| result_record_seq(tail) == Some(seq))
                    .unwrap_or_default();
                let mut value = codec::encode_with_tail(RecordKind::Receipt, &rec, &[], tail.len());
                value.extend_from_slice(tail);
                value
            })?,
            None => None,
        }
        .unwrap_or_else(|| codec::encode(RecordKind::Receipt, &rec));
        // The memo hands out `rec` for what a read would decode from `value`: the two
        // must agree (every receipt has one encoding; see `ReceiptRecord::decode`).
        debug_assert_eq!(
            decode_receipt(&rec.operation_id, split_receipt_value(&value).0)
                .ok()
                .as_ref(),
            Some(&rec),
            "a receipt must decode to the record that was encoded"
        );
        self.set::<Receipts>(SmolStr::new(&rec.operation_id), Some(value));
        self.memo.set(Memo::Present(rec));
        Ok(())
    }

    /// The receipt of `id`, for a caller that writes it back in this batch (`apply`): the
    /// memo's record is moved out, not cloned, and a record read from the layers is not
    /// remembered, since the write that follows sets the memo.
    pub(crate) fn take_receipt(&mut self, id: &str) -> Result<Option<ReceiptRecord>> {
        match std::mem::take(self.memo.0.get_mut()) {
            Memo::Present(r) if r.operation_id == id => return Ok(Some(r)),
            Memo::Absent(k) if k == id => return Ok(None),
            other => self.memo.set(other),
        }
        self.stored_receipt(id)
    }

    pub(crate) fn delete_receipt(&mut self, id: &str) -> Result<()> {
        self.set::<Receipts>(SmolStr::new(id), None);
        self.memo.set(Memo::Absent(id.to_string()));
        Ok(())
    }

    pub(crate) fn put_scope(&mut self, rec: &ScopeRecord) -> Result<()> {
        self.set::<Scopes>(
            SmolStr::new(&rec.scope),
            Some(codec::encode(RecordKind::Scope, rec)),
        );
        Ok(())
    }

    /// Stores the result of `id` completed at `seq`, after its receipt names it: inline in
    /// the receipt's value when it is small (see [`INLINE_RESULT_MAX`]), else in `results`.
    pub(crate) fn put_result(&mut self, seq: u64, id: &str, result: &OpResult) -> Result<()> {
        let frame = encode_result(seq, id, result);
        if frame.len() <= INLINE_RESULT_MAX {
            // Whether the receipt names this result: the memo knows when this batch just
            // wrote the receipt (a completion does), else the stored receipt is decoded (a
            // damaged one keeps the result out of line).
            let named = self
                .memo
                .peek(id, |r| r.and_then(kept_result_seq) == Some(seq));
            if let Some(Some(value)) = self.with_str::<Receipts, _>(id, |v| {
                let head = split_receipt_value(v).0;
                let named = named.unwrap_or_else(|| {
                    decode_receipt(id, head).is_ok_and(|r| kept_result_seq(&r) == Some(seq))
                });
                named.then(|| [head, &frame].concat())
            })? {
                self.set::<Receipts>(SmolStr::new(id), Some(value));
                return Ok(());
            }
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
        let op = SmolStr::new(op);
        match entry {
            IndexEntry::Timer(kind, due) => self.set::<Timers>((*kind as u8, *due, op), value),
            IndexEntry::Window(session, deadline) => {
                self.set::<Windows>((SmolStr::new(session), *deadline, op), value)
            }
            IndexEntry::Hold(scope) => self.set::<Holds>((SmolStr::new(scope), op), value),
            IndexEntry::InDoubt => self.set::<InDoubt>(op, value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Timestamp;
    use crate::record::{ExecRecord, IntentDigest};

    fn running(id: &str, attempt: u32) -> ReceiptRecord {
        ReceiptRecord {
            operation_id: id.into(),
            attempt,
            intent_name: "edit".into(),
            intent_hash: IntentDigest::LOST,
            scope: Some("doc".into()),
            session: None,
            base_revision: Some(3),
            epoch: u64::from(attempt),
            hold_until_ack: false,
            submitted_at: Timestamp(5),
            state: ExecRecord::Running {
                lease_until: Timestamp(9),
            },
        }
    }

    /// What a batch's reads answer must be what its tables hold, memo or not: a read
    /// through a snapshot of the same layers (which has no memo) is the reference.
    fn check(t: &WriteTables<'_>, id: &str, want: Option<&ReceiptRecord>) -> Result<()> {
        let plain = super::super::layers::Snapshot {
            base: None,
            layers: t.layers(),
        };
        assert_eq!(plain.receipt(id)?.as_ref(), want, "{id} in the tables");
        assert_eq!(t.receipt(id)?.as_ref(), want, "{id} read by the batch");
        assert_eq!(t.receipt(id)?.as_ref(), want, "{id} read again");
        Ok(())
    }

    #[test]
    fn a_batch_reads_each_receipt_as_its_last_write_or_deletion_left_it() -> Result<()> {
        let mut below = Memtable::default();
        let stored = running("op-b", 1);
        below.set::<Receipts>(
            "op-b".into(),
            Some(codec::encode(RecordKind::Receipt, &stored)),
        );
        let mut t = WriteTables::over(None, Layers::new(&[&below]));
        check(&t, "op-a", None)?;
        check(&t, "op-b", Some(&stored))?;

        // Remembered as absent, then written.
        check(&t, "op-a", None)?;
        let first = running("op-a", 1);
        t.put_receipt(first.clone())?;
        check(&t, "op-a", Some(&first))?;
        // Another id read in between, then the first one rewritten and read back.
        check(&t, "op-b", Some(&stored))?;
        let second = running("op-a", 2);
        t.put_receipt(second.clone())?;
        check(&t, "op-a", Some(&second))?;
        // Taken for a write back (as `apply` does): moved out of the memo, and the tables
        // still answer with it; taken again without the memo, and for an id it lacks.
        assert_eq!(t.take_receipt("op-a")?.as_ref(), Some(&second));
        check(&t, "op-a", Some(&second))?;
        assert_eq!(t.take_receipt("op-b")?.as_ref(), Some(&stored));
        assert_eq!(t.take_receipt("op-a")?.as_ref(), Some(&second));
        check(&t, "op-z", None)?;
        assert_eq!(t.take_receipt("op-z")?, None);
        check(&t, "op-z", None)?;
        // A deletion of the receipt just read, and of one held below.
        t.delete_receipt("op-a")?;
        check(&t, "op-a", None)?;
        check(&t, "op-b", Some(&stored))?;
        t.delete_receipt("op-b")?;
        check(&t, "op-b", None)?;
        // Written again after its deletion.
        let third = running("op-b", 2);
        t.put_receipt(third.clone())?;
        check(&t, "op-b", Some(&third))?;
        Ok(())
    }
}
