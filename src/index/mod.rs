//! The storage layer: redb tables, framed values, typed reads and writes.
//!
//! Everything that knows about redb's tables lives here, so mapping the receipt model onto another store is a port of this
//! module. Every value read is checked (magic, CRC, decode, embedded key) and a failure is
//! a typed `Corrupt { table, key }` error, never a panic.

pub(crate) mod file;
mod guard;

pub(crate) use guard::guarded;

use std::sync::OnceLock;

use redb::{
    ReadOnlyTable, ReadTransaction, ReadableTable, Table, TableDefinition, WriteTransaction,
};

use crate::codec::{self, RecordKind};
use crate::error::{Error, Result};
use crate::record::{Event, FormatRecord, ReceiptRecord, ResultHeader, ScopeRecord, StateRecord};
use crate::types::OpResult;

/// `meta`: `"format"` → [`FormatRecord`], `"state"` → [`StateRecord`].
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// `events`: seq → [`Event`]. The source of truth.
pub(crate) const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
/// `receipts`: operation id → [`ReceiptRecord`] (index).
pub(crate) const RECEIPTS: TableDefinition<&str, &[u8]> = TableDefinition::new("receipts");
/// `results`: seq of the completing event → result header and payload.
pub(crate) const RESULTS: TableDefinition<u64, &[u8]> = TableDefinition::new("results");
/// `scopes`: scope → [`ScopeRecord`] (index).
pub(crate) const SCOPES: TableDefinition<&str, &[u8]> = TableDefinition::new("scopes");
/// `op_events`: (operation id, seq) → () (index).
pub(crate) const OP_EVENTS: TableDefinition<(&str, u64), ()> = TableDefinition::new("op_events");
/// `timers`: (timer kind, due ms, operation id) → () (index).
pub(crate) const TIMERS: TableDefinition<(u8, u64, &str), ()> = TableDefinition::new("timers");
/// `scope_timers`: (due ms, seq of a superseded revision event) → () (index).
pub(crate) const SCOPE_TIMERS: TableDefinition<(u64, u64), ()> =
    TableDefinition::new("scope_timers");
/// `windows`: (session, ack deadline ms, operation id) → () (index).
pub(crate) const WINDOWS: TableDefinition<(&str, u64, &str), ()> = TableDefinition::new("windows");
/// `scope_holds`: (scope, operation id) → () (index).
pub(crate) const HOLDS: TableDefinition<(&str, &str), ()> = TableDefinition::new("scope_holds");
/// `in_doubt`: operation id → () (index).
pub(crate) const IN_DOUBT: TableDefinition<&str, ()> = TableDefinition::new("in_doubt");
/// `quarantine`: n → the table name, key and raw value of a record `repair` could not use.
pub(crate) const QUARANTINE: TableDefinition<u64, &[u8]> = TableDefinition::new("quarantine");

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

pub(crate) fn decode_event(key: u64, bytes: &[u8]) -> Result<Event> {
    let ev: Event =
        codec::decode(RecordKind::Event, bytes).map_err(|e| corrupt("events", key, e))?;
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
    let rec: ReceiptRecord =
        codec::decode(RecordKind::Receipt, bytes).map_err(|e| corrupt("receipts", key, e))?;
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
    let payload =
        codec::unframe(RecordKind::Result, bytes).map_err(|e| corrupt("results", key, e))?;
    let (header, used): (ResultHeader, usize) =
        codec::decode_prefix(payload).map_err(|e| corrupt("results", key, e))?;
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

pub(crate) fn decode_meta<T: serde::de::DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T> {
    codec::decode(RecordKind::Meta, bytes).map_err(|e| corrupt("meta", key, e))
}

/// Read access shared by read transactions and write transactions.
pub(crate) trait View {
    type Meta: ReadableTable<&'static str, &'static [u8]>;
    type Events: ReadableTable<u64, &'static [u8]>;
    type Receipts: ReadableTable<&'static str, &'static [u8]>;
    type Results: ReadableTable<u64, &'static [u8]>;
    type Scopes: ReadableTable<&'static str, &'static [u8]>;
    type OpEvents: ReadableTable<(&'static str, u64), ()>;
    type Timers: ReadableTable<(u8, u64, &'static str), ()>;
    type ScopeTimers: ReadableTable<(u64, u64), ()>;
    type Windows: ReadableTable<(&'static str, u64, &'static str), ()>;
    type Holds: ReadableTable<(&'static str, &'static str), ()>;
    type InDoubt: ReadableTable<&'static str, ()>;

    fn meta_t(&self) -> Result<&Self::Meta>;
    fn events_t(&self) -> Result<&Self::Events>;
    fn receipts_t(&self) -> Result<&Self::Receipts>;
    fn results_t(&self) -> Result<&Self::Results>;
    fn scopes_t(&self) -> Result<&Self::Scopes>;
    fn op_events_t(&self) -> Result<&Self::OpEvents>;
    fn timers_t(&self) -> Result<&Self::Timers>;
    fn scope_timers_t(&self) -> Result<&Self::ScopeTimers>;
    fn windows_t(&self) -> Result<&Self::Windows>;
    fn holds_t(&self) -> Result<&Self::Holds>;
    fn in_doubt_t(&self) -> Result<&Self::InDoubt>;

    fn format(&self) -> Result<Option<FormatRecord>> {
        match self.meta_t()?.get("format")? {
            Some(v) => Ok(Some(decode_meta("format", v.value())?)),
            None => Ok(None),
        }
    }

    fn state(&self) -> Result<StateRecord> {
        match self.meta_t()?.get("state")? {
            Some(v) => decode_meta("state", v.value()),
            None => Err(Error::corrupt(
                "meta",
                "state",
                "the state entry is missing",
            )),
        }
    }

    fn receipt(&self, id: &str) -> Result<Option<ReceiptRecord>> {
        match self.receipts_t()?.get(id)? {
            Some(v) => Ok(Some(decode_receipt(id, v.value())?)),
            None => Ok(None),
        }
    }

    fn scope(&self, scope: &str) -> Result<Option<ScopeRecord>> {
        match self.scopes_t()?.get(scope)? {
            Some(v) => Ok(Some(decode_scope(scope, v.value())?)),
            None => Ok(None),
        }
    }

    fn scope_revision(&self, scope: &str) -> Result<u64> {
        Ok(self.scope(scope)?.map_or(0, |s| s.revision))
    }

    fn event(&self, seq: u64) -> Result<Option<Event>> {
        match self.events_t()?.get(seq)? {
            Some(v) => Ok(Some(decode_event(seq, v.value())?)),
            None => Ok(None),
        }
    }

    /// The result stored under `seq`, checked against the operation id.
    fn result(&self, seq: u64, operation_id: &str) -> Result<Option<OpResult>> {
        match self.results_t()?.get(seq)? {
            Some(v) => {
                let (header, bytes) = decode_result(seq, v.value())?;
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
        let mut out = Vec::new();
        for entry in self.op_events_t()?.range((id, 0u64)..=(id, u64::MAX))? {
            let (k, _) = entry?;
            out.push(k.value().1);
        }
        Ok(out)
    }

    /// The operations recorded as holding `scope`'s lock.
    fn holders(&self, scope: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in self.holds_t()?.range((scope, "")..)? {
            let (k, _) = entry?;
            let (s, op) = k.value();
            if s != scope {
                break;
            }
            out.push(op.to_string());
        }
        Ok(out)
    }

    /// Window entries of `session` whose ack deadline is after `after`, oldest deadline
    /// first, at most `limit`.
    fn window_after(&self, session: &str, after: u64, limit: usize) -> Result<Vec<(u64, String)>> {
        let mut out = Vec::new();
        if after == u64::MAX {
            return Ok(out);
        }
        for entry in self
            .windows_t()?
            .range((session, after + 1, "")..=(session, u64::MAX, "\u{10FFFF}\u{10FFFF}"))?
        {
            let (k, _) = entry?;
            let (s, deadline, op) = k.value();
            if s != session {
                break;
            }
            out.push((deadline, op.to_string()));
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// Timers of `kind` due at or before `now`, earliest first, at most `limit`.
    fn timers_due(&self, kind: TimerKind, now: u64, limit: usize) -> Result<Vec<(u64, String)>> {
        let k = kind as u8;
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        for entry in self.timers_t()?.range((k, 0u64, "")..)? {
            let (key, _) = entry?;
            let (kk, due, op) = key.value();
            if kk != k || due > now {
                break;
            }
            out.push((due, op.to_string()));
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// Superseded revision events due for purging at or before `now`.
    fn scope_timers_due(&self, now: u64, limit: usize) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        for entry in self
            .scope_timers_t()?
            .range((0u64, 0u64)..=(now, u64::MAX))?
        {
            let (key, _) = entry?;
            out.push(key.value());
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }
}

/// The tables as seen by a read transaction, each opened on first use (a lookup that
/// needs two tables does not pay for opening eleven). Shared between threads while it is
/// the latest snapshot (see `Inner::read_pending`).
pub(crate) struct ReadTables {
    txn: ReadTransaction,
    meta: OnceLock<ReadOnlyTable<&'static str, &'static [u8]>>,
    events: OnceLock<ReadOnlyTable<u64, &'static [u8]>>,
    receipts: OnceLock<ReadOnlyTable<&'static str, &'static [u8]>>,
    results: OnceLock<ReadOnlyTable<u64, &'static [u8]>>,
    scopes: OnceLock<ReadOnlyTable<&'static str, &'static [u8]>>,
    op_events: OnceLock<ReadOnlyTable<(&'static str, u64), ()>>,
    timers: OnceLock<ReadOnlyTable<(u8, u64, &'static str), ()>>,
    scope_timers: OnceLock<ReadOnlyTable<(u64, u64), ()>>,
    windows: OnceLock<ReadOnlyTable<(&'static str, u64, &'static str), ()>>,
    holds: OnceLock<ReadOnlyTable<(&'static str, &'static str), ()>>,
    in_doubt: OnceLock<ReadOnlyTable<&'static str, ()>>,
}

/// The table in `cell`, opened from `txn` on first use.
fn lazily<'c, K: redb::Key + 'static, V: redb::Value + 'static>(
    cell: &'c OnceLock<ReadOnlyTable<K, V>>,
    txn: &ReadTransaction,
    def: TableDefinition<K, V>,
) -> Result<&'c ReadOnlyTable<K, V>> {
    if let Some(t) = cell.get() {
        return Ok(t);
    }
    let table = txn.open_table(def)?;
    Ok(cell.get_or_init(|| table))
}

impl ReadTables {
    /// The tables of `txn`, which the value keeps alive.
    pub(crate) fn new(txn: ReadTransaction) -> ReadTables {
        ReadTables {
            txn,
            meta: OnceLock::new(),
            events: OnceLock::new(),
            receipts: OnceLock::new(),
            results: OnceLock::new(),
            scopes: OnceLock::new(),
            op_events: OnceLock::new(),
            timers: OnceLock::new(),
            scope_timers: OnceLock::new(),
            windows: OnceLock::new(),
            holds: OnceLock::new(),
            in_doubt: OnceLock::new(),
        }
    }

    /// The read transaction.
    pub(crate) fn txn(&self) -> &ReadTransaction {
        &self.txn
    }
}

impl View for ReadTables {
    type Meta = ReadOnlyTable<&'static str, &'static [u8]>;
    type Events = ReadOnlyTable<u64, &'static [u8]>;
    type Receipts = ReadOnlyTable<&'static str, &'static [u8]>;
    type Results = ReadOnlyTable<u64, &'static [u8]>;
    type Scopes = ReadOnlyTable<&'static str, &'static [u8]>;
    type OpEvents = ReadOnlyTable<(&'static str, u64), ()>;
    type Timers = ReadOnlyTable<(u8, u64, &'static str), ()>;
    type ScopeTimers = ReadOnlyTable<(u64, u64), ()>;
    type Windows = ReadOnlyTable<(&'static str, u64, &'static str), ()>;
    type Holds = ReadOnlyTable<(&'static str, &'static str), ()>;
    type InDoubt = ReadOnlyTable<&'static str, ()>;
    fn meta_t(&self) -> Result<&Self::Meta> {
        lazily(&self.meta, &self.txn, META)
    }
    fn events_t(&self) -> Result<&Self::Events> {
        lazily(&self.events, &self.txn, EVENTS)
    }
    fn receipts_t(&self) -> Result<&Self::Receipts> {
        lazily(&self.receipts, &self.txn, RECEIPTS)
    }
    fn results_t(&self) -> Result<&Self::Results> {
        lazily(&self.results, &self.txn, RESULTS)
    }
    fn scopes_t(&self) -> Result<&Self::Scopes> {
        lazily(&self.scopes, &self.txn, SCOPES)
    }
    fn op_events_t(&self) -> Result<&Self::OpEvents> {
        lazily(&self.op_events, &self.txn, OP_EVENTS)
    }
    fn timers_t(&self) -> Result<&Self::Timers> {
        lazily(&self.timers, &self.txn, TIMERS)
    }
    fn scope_timers_t(&self) -> Result<&Self::ScopeTimers> {
        lazily(&self.scope_timers, &self.txn, SCOPE_TIMERS)
    }
    fn windows_t(&self) -> Result<&Self::Windows> {
        lazily(&self.windows, &self.txn, WINDOWS)
    }
    fn holds_t(&self) -> Result<&Self::Holds> {
        lazily(&self.holds, &self.txn, HOLDS)
    }
    fn in_doubt_t(&self) -> Result<&Self::InDoubt> {
        lazily(&self.in_doubt, &self.txn, IN_DOUBT)
    }
}

/// The tables as seen (and written) by a write transaction.
pub(crate) struct WriteTables<'txn> {
    meta: Table<'txn, &'static str, &'static [u8]>,
    events: Table<'txn, u64, &'static [u8]>,
    receipts: Table<'txn, &'static str, &'static [u8]>,
    results: Table<'txn, u64, &'static [u8]>,
    scopes: Table<'txn, &'static str, &'static [u8]>,
    op_events: Table<'txn, (&'static str, u64), ()>,
    timers: Table<'txn, (u8, u64, &'static str), ()>,
    scope_timers: Table<'txn, (u64, u64), ()>,
    windows: Table<'txn, (&'static str, u64, &'static str), ()>,
    holds: Table<'txn, (&'static str, &'static str), ()>,
    in_doubt: Table<'txn, &'static str, ()>,
    /// Whether anything was written: a batch that wrote nothing is not committed.
    pub(crate) dirty: bool,
    /// Deletions of events and results held back by a compaction batch, see
    /// [`WriteTables::hold_deletes`].
    held: Option<HeldDeletes>,
}

/// Keys of `events` and `results` whose deletion a compaction batch holds back, to apply
/// them together in key order: a run of nearby keys is removed in one cursor pass, which
/// rebuilds each B-tree leaf once instead of once per key (purges come in completion
/// order, so their events and results sit side by side).
#[derive(Debug, Default)]
struct HeldDeletes {
    events: Vec<u64>,
    results: Vec<u64>,
    /// Timers of purged operations: `(kind, due, operation)`.
    timers: Vec<(u8, u64, String)>,
}

/// Keys at most this far apart are removed in the same pass; the pass steps over the
/// live keys between them, which costs far less than a leaf rebuild.
const RUN_GAP: u64 = 64;

/// Removes `keys` from `table`: each run of nearby keys with one `retain_in` pass, a lone
/// key with `remove`. Leaves `keys` empty.
fn remove_in_runs(table: &mut Table<'_, u64, &'static [u8]>, keys: &mut Vec<u64>) -> Result<()> {
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

macro_rules! view_impl {
    ($ty:ty, $tbl:ident $(, $lt:lifetime)?) => {
        impl$(<$lt>)? View for $ty {
            type Meta = $tbl<$($lt,)? &'static str, &'static [u8]>;
            type Events = $tbl<$($lt,)? u64, &'static [u8]>;
            type Receipts = $tbl<$($lt,)? &'static str, &'static [u8]>;
            type Results = $tbl<$($lt,)? u64, &'static [u8]>;
            type Scopes = $tbl<$($lt,)? &'static str, &'static [u8]>;
            type OpEvents = $tbl<$($lt,)? (&'static str, u64), ()>;
            type Timers = $tbl<$($lt,)? (u8, u64, &'static str), ()>;
            type ScopeTimers = $tbl<$($lt,)? (u64, u64), ()>;
            type Windows = $tbl<$($lt,)? (&'static str, u64, &'static str), ()>;
            type Holds = $tbl<$($lt,)? (&'static str, &'static str), ()>;
            type InDoubt = $tbl<$($lt,)? &'static str, ()>;
            fn meta_t(&self) -> Result<&Self::Meta> { Ok(&self.meta) }
            fn events_t(&self) -> Result<&Self::Events> { Ok(&self.events) }
            fn receipts_t(&self) -> Result<&Self::Receipts> { Ok(&self.receipts) }
            fn results_t(&self) -> Result<&Self::Results> { Ok(&self.results) }
            fn scopes_t(&self) -> Result<&Self::Scopes> { Ok(&self.scopes) }
            fn op_events_t(&self) -> Result<&Self::OpEvents> { Ok(&self.op_events) }
            fn timers_t(&self) -> Result<&Self::Timers> { Ok(&self.timers) }
            fn scope_timers_t(&self) -> Result<&Self::ScopeTimers> { Ok(&self.scope_timers) }
            fn windows_t(&self) -> Result<&Self::Windows> { Ok(&self.windows) }
            fn holds_t(&self) -> Result<&Self::Holds> { Ok(&self.holds) }
            fn in_doubt_t(&self) -> Result<&Self::InDoubt> { Ok(&self.in_doubt) }
        }
    };
}
view_impl!(WriteTables<'txn>, Table, 'txn);

/// One index entry implied by a receipt (see `engine::index_entries`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum IndexEntry {
    Timer(TimerKind, u64),
    Window(String, u64),
    Hold(String),
    InDoubt,
}

impl<'txn> WriteTables<'txn> {
    pub(crate) fn open(txn: &'txn WriteTransaction) -> Result<WriteTables<'txn>> {
        Ok(WriteTables {
            meta: txn.open_table(META)?,
            events: txn.open_table(EVENTS)?,
            receipts: txn.open_table(RECEIPTS)?,
            results: txn.open_table(RESULTS)?,
            scopes: txn.open_table(SCOPES)?,
            op_events: txn.open_table(OP_EVENTS)?,
            timers: txn.open_table(TIMERS)?,
            scope_timers: txn.open_table(SCOPE_TIMERS)?,
            windows: txn.open_table(WINDOWS)?,
            holds: txn.open_table(HOLDS)?,
            in_doubt: txn.open_table(IN_DOUBT)?,
            dirty: false,
            held: None,
        })
    }

    pub(crate) fn put_format(&mut self, f: &FormatRecord) -> Result<()> {
        self.dirty = true;
        self.meta
            .insert("format", codec::encode(RecordKind::Meta, f).as_slice())?;
        Ok(())
    }

    pub(crate) fn put_state(&mut self, s: &StateRecord) -> Result<()> {
        self.dirty = true;
        self.meta
            .insert("state", codec::encode(RecordKind::Meta, s).as_slice())?;
        Ok(())
    }

    pub(crate) fn put_event(&mut self, ev: &Event) -> Result<()> {
        self.dirty = true;
        self.events
            .insert(ev.seq, codec::encode(RecordKind::Event, ev).as_slice())?;
        if let Some(op) = &ev.operation_id {
            self.op_events.insert((op.as_str(), ev.seq), ())?;
        }
        Ok(())
    }

    /// Deletes the event `seq`; the caller removes its `op_events` entry (see
    /// [`WriteTables::take_op_events`]). Held back while [`WriteTables::hold_deletes`]
    /// is on.
    pub(crate) fn delete_event(&mut self, seq: u64) -> Result<()> {
        self.dirty = true;
        match &mut self.held {
            Some(held) => held.events.push(seq),
            None => {
                self.events.remove(seq)?;
            }
        }
        Ok(())
    }

    /// Deletes every `op_events` entry of operation `op`, in one pass over its key range,
    /// and returns the sequence numbers of its events, in order.
    pub(crate) fn take_op_events(&mut self, op: &str) -> Result<Vec<u64>> {
        self.dirty = true;
        let mut seqs = Vec::new();
        self.op_events
            .retain_in((op, 0u64)..=(op, u64::MAX), |(_, seq), ()| {
                seqs.push(seq);
                false
            })?;
        Ok(seqs)
    }

    /// From now until [`WriteTables::apply_held_deletes`], deletions of events and results
    /// are collected instead of applied. Only for work that never reads a deleted key
    /// again before applying them: a compaction batch, whose purged operations are
    /// already gone from `receipts` and `op_events`, the only ways to reach those keys.
    pub(crate) fn hold_deletes(&mut self) {
        if self.held.is_none() {
            self.held = Some(HeldDeletes::default());
        }
    }

    /// Applies the deletions collected since [`WriteTables::hold_deletes`] and stops
    /// collecting.
    pub(crate) fn apply_held_deletes(&mut self) -> Result<()> {
        if let Some(mut held) = self.held.take() {
            remove_in_runs(&mut self.events, &mut held.events)?;
            remove_in_runs(&mut self.results, &mut held.results)?;
            remove_timers(&mut self.timers, &mut held.timers)?;
        }
        Ok(())
    }

    /// Removes the timer of an operation being purged. Held back while
    /// [`WriteTables::hold_deletes`] is on: nothing re-creates a purged operation's
    /// timer in the same batch.
    pub(crate) fn delete_purged_timer(
        &mut self,
        op: &str,
        kind: TimerKind,
        due: u64,
    ) -> Result<()> {
        self.dirty = true;
        match &mut self.held {
            Some(held) => held.timers.push((kind as u8, due, op.to_string())),
            None => {
                self.timers.remove((kind as u8, due, op))?;
            }
        }
        Ok(())
    }

    pub(crate) fn put_receipt(&mut self, rec: &ReceiptRecord) -> Result<()> {
        self.dirty = true;
        self.receipts.insert(
            rec.operation_id.as_str(),
            codec::encode(RecordKind::Receipt, rec).as_slice(),
        )?;
        Ok(())
    }

    pub(crate) fn delete_receipt(&mut self, id: &str) -> Result<()> {
        self.dirty = true;
        self.receipts.remove(id)?;
        Ok(())
    }

    pub(crate) fn put_scope(&mut self, rec: &ScopeRecord) -> Result<()> {
        self.dirty = true;
        self.scopes.insert(
            rec.scope.as_str(),
            codec::encode(RecordKind::Scope, rec).as_slice(),
        )?;
        Ok(())
    }

    pub(crate) fn put_result(&mut self, seq: u64, id: &str, result: &OpResult) -> Result<()> {
        self.dirty = true;
        self.results
            .insert(seq, encode_result(seq, id, result).as_slice())?;
        Ok(())
    }

    /// Deletes the result `seq`. Held back while [`WriteTables::hold_deletes`] is on.
    pub(crate) fn delete_result(&mut self, seq: u64) -> Result<()> {
        self.dirty = true;
        match &mut self.held {
            Some(held) => held.results.push(seq),
            None => {
                self.results.remove(seq)?;
            }
        }
        Ok(())
    }

    pub(crate) fn put_scope_timer(&mut self, due: u64, seq: u64) -> Result<()> {
        self.dirty = true;
        self.scope_timers.insert((due, seq), ())?;
        Ok(())
    }

    pub(crate) fn delete_scope_timer(&mut self, due: u64, seq: u64) -> Result<()> {
        self.dirty = true;
        self.scope_timers.remove((due, seq))?;
        Ok(())
    }

    pub(crate) fn insert_index(&mut self, op: &str, entry: &IndexEntry) -> Result<()> {
        self.dirty = true;
        match entry {
            IndexEntry::Timer(kind, due) => {
                self.timers.insert((*kind as u8, *due, op), ())?;
            }
            IndexEntry::Window(session, deadline) => {
                self.windows.insert((session.as_str(), *deadline, op), ())?;
            }
            IndexEntry::Hold(scope) => {
                self.holds.insert((scope.as_str(), op), ())?;
            }
            IndexEntry::InDoubt => {
                self.in_doubt.insert(op, ())?;
            }
        }
        Ok(())
    }

    pub(crate) fn remove_index(&mut self, op: &str, entry: &IndexEntry) -> Result<()> {
        self.dirty = true;
        match entry {
            IndexEntry::Timer(kind, due) => {
                self.timers.remove((*kind as u8, *due, op))?;
            }
            IndexEntry::Window(session, deadline) => {
                self.windows.remove((session.as_str(), *deadline, op))?;
            }
            IndexEntry::Hold(scope) => {
                self.holds.remove((scope.as_str(), op))?;
            }
            IndexEntry::InDoubt => {
                self.in_doubt.remove(op)?;
            }
        }
        Ok(())
    }
}

/// Removes the held timers `keys`, one `retain_in` pass per timer kind from the first to
/// the last key. A compaction batch fires a prefix of each kind's due timers, so the keys
/// between are due timers of the same batch: the pass steps over at most a batch.
fn remove_timers(
    table: &mut Table<'_, (u8, u64, &'static str), ()>,
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
    use redb::ReadableDatabase as _;

    /// A table of keys `0..n` in memory, `remove_in_runs(doomed)` applied, and the keys
    /// that are left.
    fn left_after(n: u64, doomed: &[u64]) -> Result<Vec<u64>> {
        const T: TableDefinition<u64, &[u8]> = TableDefinition::new("t");
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
            let mut table = txn.open_table(TIMERS)?;
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
        let table = read.open_table(TIMERS)?;
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
