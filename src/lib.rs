//! # opjournal
//!
//! An embedded, single-file, durable operation journal that gives mutating operations an
//! *exactly-once effect*: a stable operation id, an intent hash, a durable receipt with
//! base and result revisions, a recorded outcome that is replayed (never re-executed)
//! after a reconnect, and a delivery state kept apart from the execution state.
//!
//! Start with [`Journal::open`] or [`Journal::builder`], then [`Journal::submit`].
//! See the README for the story, the guarantees and the CLI.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![deny(clippy::unwrap_used)]

pub mod check;
mod clock;
pub mod codec;
mod config;
mod engine;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod index;
mod inspect;
mod intent;
mod journal;
mod log;
mod record;
#[cfg(feature = "service")]
pub mod service;
mod types;
mod validate;

pub use check::{repair, verify};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use config::{
    DEFAULT_MAX_RESULT_BYTES, MAX_RESULT_BYTES_CEILING, RetryPolicy, ScopeLock, Sharing,
};
pub use engine::stats::Stats;
pub use error::{Error, ErrorKind, Result};
pub use inspect::{Access, Inspector};
pub use intent::{Intent, IntentHash, canonical_json};
pub use journal::{CompactionReport, CompactorHandle, Journal, JournalBuilder};
pub use log::{FileLog, LogStorage, MemoryLog};
/// The storage engine under the index, re-exported for custom backends
/// ([`JournalBuilder::open_backends`]).
pub use redb;
pub use types::{
    Admission, Claim, Deadlines, DeliveryState, Event, EventKind, ExecutionStatus, InDoubtCause,
    OpResult, Operation, Outcome, OutcomeKind, Receipt, Replay, Resolution, ResolvedAs, ResultInfo,
    RevisionCause, StaleBasePolicy,
};
pub use validate::{MAX_NAME_BYTES, validate_name};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
