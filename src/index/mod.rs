//! The index: redb's tables, and how the journal reads and changes them.
//!
//! Everything that knows about redb's tables lives here, so mapping the receipt model onto
//! another store is a port of this module. Changes are made in a batch ([`WriteTables`])
//! over the layers not yet in redb; the committer logs each batch and then lays it on the
//! memtable; a checkpoint ([`checkpoint`]) writes the memtable into redb in one large
//! transaction. Every value read is checked (magic, CRC, decode, embedded key) and a
//! failure is a typed `Corrupt { table, key }` error, never a panic.
//!
//! - `tables`: the tables once (definitions, key and value types) and the [`Memtable`];
//! - `layers`: reads through the layers over a redb snapshot ([`Layered`], [`Snapshot`]);
//! - `values`: the stored values, decoded and checked against their keys;
//! - `view`: the journal's reads on any layering ([`View`]);
//! - `write`: a batch of changes ([`WriteTables`]);
//! - `checkpoint`: the memtable written into redb ([`checkpoint`]);
//! - `store`: the seam for stores other than redb (PostgreSQL): bytes in key order.
//!
//! The checks of redb's own file, before redb reads it, are not here: see `preflight`.

mod checkpoint;
mod layers;
pub(crate) mod purged;
pub(crate) mod store;
mod tables;
mod values;
mod view;
mod write;

pub(crate) use checkpoint::{checkpoint, create_tables};
pub(crate) use layers::{Base, Layered, Layers, Snapshot};
pub(crate) use purged::mark_two_logs;
pub(crate) use tables::{
    Events, Holds, InDoubt, Memtable, Meta, OpEvents, Quarantine, Receipts, Results, ScopeTimers,
    Scopes, Staged, Table, TableKey, TableValue, Timers, Windows,
};
pub(crate) use values::{
    decode_event, decode_event_frame, decode_format, decode_format_raw, decode_inline_result,
    decode_meta, decode_receipt, decode_receipt_frame, decode_result, decode_scope,
    split_receipt_value,
};
// Only `crate::fuzzing` writes a result record outside a batch.
#[cfg(feature = "internals")]
pub(crate) use values::encode_result;
pub(crate) use view::View;
pub(crate) use write::{IndexEntry, WriteTables};

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
