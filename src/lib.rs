//! # opjournal
//!
//! An embedded, single-file, durable operation journal that gives mutating operations an
//! *exactly-once effect*.
//!
//! ## The failure window
//!
//! The dangerous moment in a mutating call is *after* success: the client sends operation
//! `op_7f3`, the editor applies the change at revision 184 and records the outcome, and the
//! connection drops before the client has seen the result. When the client reconnects and
//! asks about `op_7f3` again, re-running the mutation would duplicate an object, overwrite
//! a newer file or spend credits twice; refusing to answer leaves the user blind.
//!
//! The journal gives every operation a stable id, an intent hash, and a durable receipt. A
//! repeated id is answered with the recorded outcome, marked as a replay, instead of being
//! executed again: **the reply may be delivered more than once; the edit lands once.**
//! Delivery (has the client seen the result?) is tracked apart from execution (did the
//! effect happen?), with clocks that expire unacknowledged results, retire old payloads and
//! purge old audit records.
//!
//! ## Example
//!
//! Submit an operation, apply it, record the outcome; a retry of the same operation is
//! replayed, not re-applied. [`Journal::execute`] runs this whole pattern in one call.
//!
//! ```
//! use opjournal::{Admission, Intent, Journal, Operation, Outcome};
//! use serde_json::json;
//!
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("project.opj");
//! let journal = Journal::open(&path)?; // one file per project, created if missing
//! let op = Operation::new("op_7f3", Intent::from_json("scene.add_light", &json!({"near": "door"}))?)
//!     .scope("scene/main")
//!     .base_revision(183)
//!     .session("tab-1");
//!
//! match journal.submit(op.clone())? {
//!     Admission::Fresh(claim) => {
//!         // Apply the edit to the project here, producing revision 184.
//!         journal.complete(&claim, Outcome::applied(184, b"light-1".to_vec()))?;
//!     }
//!     other => unreachable!("a new id is fresh work, not {other:?}"),
//! }
//!
//! // The connection dropped; the client reconnects and sends `op_7f3` again.
//! match journal.submit(op)? {
//!     Admission::Replay(replay) => {
//!         assert!(replay.replayed);
//!         assert_eq!(replay.result.bytes, b"light-1"); // send it, marked as a replay
//!     }
//!     other => unreachable!("a completed id is replayed, not {other:?}"),
//! }
//! journal.delivered("op_7f3")?;
//! journal.acknowledge("op_7f3", Some("tab-1"))?; // the client saw it
//! # Ok::<(), opjournal::Error>(())
//! ```
//!
//! [`Admission`] has five answers: `Fresh` (execute, then [`Journal::complete`] or
//! [`Journal::release`]), `InProgress` (attach; do not apply), `Replay` (send the recorded
//! result), `Expired` (the outcome is known but its result aged out: refresh, do not re-run)
//! and `InDoubt` (the claim holder vanished: look at the project, then [`Journal::resolve`]).
//!
//! ## Guarantees
//!
//! - **Durability.** Every call that changes execution state (`submit` of fresh work,
//!   `complete`, `release`, `extend_lease`, `resolve`, `advance_revision`) is synced to disk
//!   before it returns `Ok`: no call that returned `Ok` is lost to a crash or a power loss.
//!   Concurrent callers share one commit. Deliveries and acknowledgements are durable
//!   lazily (with the next commit, a compactor pass, [`Journal::flush`] or close, or at the
//!   next one recorded once 256 wait or the oldest has waited 200 ms): losing one only
//!   causes a redelivery that is marked as a replay.
//! - **What survives a crash.** Every recorded outcome, and every operation that was
//!   `Running`, which reopens as `InDoubt`: nothing is ever re-executed automatically; the
//!   embedder, who can look at the project, resolves it.
//! - **Atomicity.** A refused call writes nothing; a failed commit leaves no partial state.
//!   After an I/O error the handle refuses writes ([`ErrorKind::Poisoned`]) until it is
//!   reopened.
//! - **Errors.** One [`Error`] type with a matchable [`ErrorKind`]. Refusals
//!   ([`Error::is_refusal`]) name the values and the next step;
//!   [`Error::is_retryable`] says whether the same call may succeed later unchanged.
//!   Damaged files give [`ErrorKind::Corrupt`], never a panic.
//!
//! ## Features
//!
//! - `cli` (default): the `opjournal` command-line tool (inspect, verify, repair, compact,
//!   backup, export and import).
//!   Embedders use `default-features = false` to keep its dependencies out.
//! - `service` (with `cli`): `opjournal::service`, the reference editor service over TCP
//!   that `opjournal demo` and `opjournal serve` run, the model to copy.
//! - `mcp` (with `cli`): `opjournal::mcp`, journaled tools for servers of the Model Context
//!   Protocol on the official Rust SDK, rmcp (brings rmcp and tokio).
//! - `postgres`: a journal in PostgreSQL, shared by several processes on several machines
//!   (`JournalBuilder::open_postgres`, `Journal::execute_in` for the effect and the receipt
//!   in one transaction; brings the blocking `postgres` client). A journal in memory
//!   ([`Journal::in_memory`]) needs no feature.
//! - `tracing`: a span for each public [`Journal`] call (with its operation id) and an
//!   event for each compaction pass (counts per clock), through the `tracing` crate.
//! - `internals`: the record codec (`opjournal::codec`) and the fuzzing entry points
//!   (`opjournal::fuzzing`), for the fuzz targets and benchmarks. Not a stable API: it
//!   follows the file format.
//!
//! The CLI, the file format and the durability tests are described in the repository's
//! README and `docs/` folder.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![deny(clippy::unwrap_used)]

mod check;
mod clock;
#[cfg(feature = "internals")]
pub mod codec;
#[cfg(not(feature = "internals"))]
mod codec;
mod config;
mod error;
mod execute;
mod fsutil;
#[cfg(feature = "internals")]
pub mod fuzzing;
mod index;
mod inspect;
mod intent;
mod intent_hash;
mod journal;
mod log;
mod machine;
#[cfg(feature = "mcp")]
pub mod mcp;
mod panics;
#[cfg(feature = "postgres")]
pub mod postgres;
mod preflight;
mod record;
#[cfg(feature = "service")]
pub mod service;
mod trace;
pub(crate) use trace::{trace_event, trace_span};
mod transfer;
mod types;
mod validate;

/// redb, re-exported for custom storage backends
/// ([`JournalBuilder::open_backends`]) and for matching the engine errors this crate
/// converts from.
pub use redb;

pub use check::{
    EngineAccess, Finding, INTEGRITY_SCRATCH_BYTES, IndexChanges, IntactRecords, Integrity,
    LogCheck, LostOperation, MAX_FINDINGS, RepairOptions, RepairReport, VerifyReport,
    intact_records, repair, verify, verify_inspected,
};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use config::{
    DEFAULT_MAX_RESULT_BYTES, MAX_RESULT_BYTES_CEILING, RetryPolicy, ScopeLock, Sharing,
};
pub use error::{Error, ErrorKind, Result};
pub use execute::{ExecuteError, Executed, Failure, Unrecorded};
pub use inspect::{Access, Inspector};
pub use intent::{Intent, canonical_json};
pub use intent_hash::{HashScheme, IntentHash};
pub use journal::{CompactionReport, CompactorHandle, Journal, JournalBuilder};
pub use log::{FileLog, LogStorage, MemoryLog};
pub use machine::stats::{OldestUnacked, ReplayCacheStats, Stats};
pub use transfer::{BackupReport, DUMP_VERSION, DumpReport, ImportReport, backup, import_dump};
pub use types::{
    Admission, Claim, Deadlines, DeliveryState, Event, EventKind, ExecutionStatus, InDoubtCause,
    OpResult, Operation, Outcome, OutcomeKind, Receipt, Replay, Resolution, ResolvedAs, ResultInfo,
    RetireCause, RevisionCause, StaleBasePolicy,
};
pub use validate::{MAX_NAME_BYTES, validate_name};

/// The version of the journal file format this build reads and writes.
pub const FORMAT_VERSION: u32 = codec::FORMAT_VERSION as u32;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
