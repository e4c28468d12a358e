//! The state machine: how events fold into receipts, which index entries a receipt
//! implies, which clock transitions are due, and the commands that validate input and
//! append events.
//!
//! Invariants, relied on by `repair` and `verify`:
//! - every receipt is the fold of its operation's events ([`transition`]);
//! - every index entry is a function of one receipt ([`index_entries`]) or of a scope's
//!   revision events (scope timers);
//! - a command validates against the *effective* state (clocks applied, nothing written)
//!   and returns a refusal before any write; only then does it materialize due
//!   transitions and append its own event.

mod clocks;
mod commands;
mod compaction;
mod fold;
mod reads;
pub(crate) mod stats;

use crate::clock::Timestamp;
use crate::config::Config;
use crate::index::WriteTables;
use crate::record::StateRecord;
pub(crate) use clocks::effective;
pub(crate) use commands::*;
pub(crate) use compaction::{Resume, compact_batch, first_resume};
pub(crate) use fold::{index_entries, transition};
pub(crate) use reads::*;

/// Counts of what compaction (or any materialization) fired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fired {
    pub lease_expired: u64,
    pub exhausted: u64,
    pub ack_expired: u64,
    pub retired: u64,
    pub purged: u64,
    pub revision_events_purged: u64,
    /// Receipts a compaction's scan visited (not a transition).
    pub scanned: u64,
}

/// A write transaction in progress, with the time of its batch.
pub(crate) struct Ctx<'a, 'txn> {
    pub t: &'a mut WriteTables<'txn>,
    pub now: Timestamp,
    pub cfg: &'a Config,
    pub state: &'a mut StateRecord,
    pub fired: Fired,
}
