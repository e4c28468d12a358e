//! The public vocabulary: operations, outcomes, claims, receipts and admissions.

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::intent::{Intent, IntentHash};

/// Whether fresh work may start from a base revision older than the scope's.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub enum StaleBasePolicy {
    /// Refuse with [`ErrorKind::StaleBase`](crate::ErrorKind::StaleBase) (the default).
    #[default]
    Strict,
    /// Accept: the embedder merges or rebases the change itself.
    Relaxed,
}

/// A mutating operation as submitted by a client.
///
/// # Example
///
/// ```
/// use opjournal::{Intent, Operation};
/// use serde_json::json;
///
/// let op = Operation::new("op_7f3", Intent::from_json("scene.add_light", &json!({"near": "door"}))?)
///     .scope("scene/main")
///     .base_revision(183)
///     .session("tab-1");
/// assert_eq!(op.id(), "op_7f3");
/// # Ok::<(), opjournal::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct Operation {
    pub(crate) id: String,
    pub(crate) intent: Intent,
    pub(crate) scope: Option<String>,
    pub(crate) base_revision: Option<u64>,
    pub(crate) session: Option<String>,
    pub(crate) stale_base: StaleBasePolicy,
}

impl Operation {
    /// An operation with a client-chosen id (stable across retries) and its intent.
    /// The id is checked when submitted: non-empty, at most 256 bytes, no control characters.
    pub fn new(id: impl Into<String>, intent: Intent) -> Self {
        Operation {
            id: id.into(),
            intent,
            scope: None,
            base_revision: None,
            session: None,
            stale_base: StaleBasePolicy::Strict,
        }
    }

    /// The scope the operation mutates: revisions and the mutation lock are per scope.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// The scope revision the client saw.
    pub fn base_revision(mut self, revision: u64) -> Self {
        self.base_revision = Some(revision);
        self
    }

    /// The client session (connection identity); delivery windows are per session.
    pub fn session(mut self, session: impl Into<String>) -> Self {
        self.session = Some(session.into());
        self
    }

    /// Accept a base revision older than the scope's (see [`StaleBasePolicy::Relaxed`]).
    pub fn allow_stale_base(mut self) -> Self {
        self.stale_base = StaleBasePolicy::Relaxed;
        self
    }

    /// The operation id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The intent.
    pub fn intent(&self) -> &Intent {
        &self.intent
    }
}

/// The result payload the client must eventually see.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OpResult {
    /// The payload bytes.
    pub bytes: Vec<u8>,
    /// A short list of changed assets, for the UI.
    pub changed_assets: Vec<String>,
}

impl OpResult {
    /// The payload decoded as JSON into `T` (the counterpart of [`Outcome::applied_json`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) if the payload is not
    /// JSON, or not JSON of `T`'s shape.
    ///
    /// # Example
    ///
    /// ```
    /// use opjournal::Outcome;
    /// use serde::Deserialize;
    /// use serde_json::json;
    ///
    /// #[derive(Deserialize)]
    /// struct Added { light: String }
    ///
    /// let outcome = Outcome::applied_json(184, &json!({"light": "light-1"}))?;
    /// # let result = opjournal::OpResult { bytes: br#"{"light":"light-1"}"#.to_vec(), changed_assets: vec![] };
    /// // ... later, from a receipt's result or a replay:
    /// let added: Added = result.json()?;
    /// assert_eq!(added.light, "light-1");
    /// # let _ = outcome;
    /// # Ok::<(), opjournal::Error>(())
    /// ```
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> crate::Result<T> {
        serde_json::from_slice(&self.bytes).map_err(|e| {
            crate::Error::invalid(
                "result",
                &String::from_utf8_lossy(&self.bytes),
                format!("it does not decode as JSON of the requested type: {e}"),
            )
        })
    }
}

/// How a claimed operation ended, with its result, as passed to
/// [`Journal::complete`](crate::Journal::complete).
///
/// # Example
///
/// ```
/// use opjournal::Outcome;
///
/// let ok = Outcome::applied(184, b"{\"light\":\"light-1\"}".to_vec())
///     .changed_assets(["scene/main/light-1"]);
/// let failed = Outcome::failed("the door no longer exists");
/// # let _ = (ok, failed);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct Outcome {
    pub(crate) kind: OutcomeKind,
    pub(crate) result: OpResult,
}

impl Outcome {
    /// The effect happened and produced revision `result_revision`, which must move the
    /// scope forward.
    pub fn applied(result_revision: u64, result: impl Into<Vec<u8>>) -> Self {
        Outcome {
            kind: OutcomeKind::Applied { result_revision },
            result: OpResult {
                bytes: result.into(),
                changed_assets: Vec::new(),
            },
        }
    }

    /// The effect happened and produced revision `result_revision`; the result payload is
    /// `result` serialized as JSON (read it back with [`OpResult::json`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) if `result` does not
    /// serialize to JSON (a map with non-string keys, a failing `Serialize` impl).
    ///
    /// # Example
    ///
    /// ```
    /// use opjournal::Outcome;
    /// use serde::Serialize;
    ///
    /// #[derive(Serialize)]
    /// struct Added { light: &'static str }
    ///
    /// let outcome = Outcome::applied_json(184, &Added { light: "light-1" })?;
    /// # let _ = outcome;
    /// # Ok::<(), opjournal::Error>(())
    /// ```
    pub fn applied_json<T: Serialize + ?Sized>(
        result_revision: u64,
        result: &T,
    ) -> crate::Result<Self> {
        let bytes = serde_json::to_vec(result).map_err(|e| {
            crate::Error::invalid(
                "result",
                &format!("revision {result_revision}"),
                format!("it does not serialize to JSON: {e}"),
            )
        })?;
        Ok(Outcome::applied(result_revision, bytes))
    }

    /// The operation failed (possibly after its effect started). Recorded and replayed like
    /// a success. Use [`Journal::release`](crate::Journal::release) instead for work
    /// rejected before any effect.
    pub fn failed(message: impl Into<String>) -> Self {
        Outcome {
            kind: OutcomeKind::Failed {
                message: message.into(),
            },
            result: OpResult::default(),
        }
    }

    /// Replaces the result payload (for a failure: details for the client).
    pub fn with_result(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.result.bytes = bytes.into();
        self
    }

    /// Lists the changed assets (at most 256, each at most 256 bytes).
    pub fn changed_assets<I, S>(mut self, assets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.result.changed_assets = assets.into_iter().map(Into::into).collect();
        self
    }

    /// Applied or failed.
    pub fn kind(&self) -> &OutcomeKind {
        &self.kind
    }
}

/// How an `InDoubt` operation ended, decided by the embedder after looking at the real
/// project state. Passed to [`Journal::resolve`](crate::Journal::resolve).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolution {
    /// The operation ended with this outcome (applied at some revision, or failed).
    Completed(Outcome),
    /// The effect did not happen: the id becomes unknown again and may be resubmitted
    /// (as the next attempt).
    NotApplied,
}

impl Resolution {
    /// The effect happened at `result_revision`.
    pub fn applied(result_revision: u64, result: impl Into<Vec<u8>>) -> Self {
        Resolution::Completed(Outcome::applied(result_revision, result))
    }

    /// The operation failed.
    pub fn failed(message: impl Into<String>) -> Self {
        Resolution::Completed(Outcome::failed(message))
    }

    /// The effect did not happen.
    pub fn not_applied() -> Self {
        Resolution::NotApplied
    }
}

/// The right to execute one attempt of an operation, handed out by a `Fresh` admission.
///
/// It carries a lease epoch: [`complete`](crate::Journal::complete),
/// [`release`](crate::Journal::release) and [`extend_lease`](crate::Journal::extend_lease)
/// succeed only while it is the operation's current epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub(crate) operation_id: String,
    pub(crate) epoch: u64,
    pub(crate) attempt: u32,
    pub(crate) lease_until: Timestamp,
    pub(crate) scope: Option<String>,
    pub(crate) base_revision: Option<u64>,
}

impl Claim {
    /// The operation id.
    pub fn operation_id(&self) -> &str {
        &self.operation_id
    }
    /// The lease epoch (unique in the journal, never reused).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    /// The attempt number (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
    /// When the lease expires unless extended.
    pub fn lease_until(&self) -> Timestamp {
        self.lease_until
    }
    /// The scope, if any.
    pub fn scope(&self) -> Option<&str> {
        self.scope.as_deref()
    }
    /// The base revision the client gave, if any.
    pub fn base_revision(&self) -> Option<u64> {
        self.base_revision
    }
}

/// Did the effect happen? The execution axis of the state machine.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ExecutionStatus {
    /// Claimed and executing under a live lease. Survives a crash as `InDoubt`.
    Running,
    /// The claim holder vanished (lease expired, or the journal was reopened). Nothing will
    /// re-run it; the embedder must [`resolve`](crate::Journal::resolve) it.
    InDoubt,
    /// Terminal: the effect happened. Never undone; replayed, never re-applied.
    Applied,
    /// Terminal: the operation failed. Replayed like a success.
    Failed,
    /// Terminal, and the result payload is gone: its retention passed, or (see
    /// [`Receipt::retire_cause`]) `repair` found it lost to damage. The audit record
    /// (outcome, revisions, timestamps, history) remains.
    Retired,
}

impl ExecutionStatus {
    /// Lowercase name, as shown by the CLI.
    pub fn name(self) -> &'static str {
        match self {
            ExecutionStatus::Running => "running",
            ExecutionStatus::InDoubt => "in_doubt",
            ExecutionStatus::Applied => "applied",
            ExecutionStatus::Failed => "failed",
            ExecutionStatus::Retired => "retired",
        }
    }
}

/// Has the client seen the result? The delivery axis, only for terminal operations.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DeliveryState {
    /// Never delivered.
    Pending,
    /// Delivered at least once (see [`Receipt::delivery_count`]); not yet acknowledged.
    Delivered,
    /// The client acknowledged it.
    Acknowledged,
    /// The retry budget is spent: no more pushes. The budget is spent the moment its last
    /// delivery ([`RetryPolicy::attempts`](crate::RetryPolicy::attempts), 8 by default) is
    /// recorded with [`Journal::delivered`](crate::Journal::delivered): the receipt that call
    /// returns already says `Exhausted`, and
    /// [`undelivered`](crate::Journal::undelivered) and
    /// [`due_redeliveries`](crate::Journal::due_redeliveries) leave it out. A service stops
    /// pushing when it sees this state rather than counting deliveries itself.
    ///
    /// The result stays retrievable (a resubmit replays it, and may be recorded as a further
    /// delivery), and the acknowledgement can still arrive until it expires. Like every
    /// delivery state, it is recorded lazily: after a crash the last deliveries may be
    /// forgotten, and the result is pushed again.
    Exhausted,
    /// The acknowledgement timeout passed: the session window slot and any hold-until-ack
    /// scope lock are freed; the history is kept.
    AckExpired,
}

impl DeliveryState {
    /// Lowercase name, as shown by the CLI.
    pub fn name(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Acknowledged => "acknowledged",
            DeliveryState::Exhausted => "exhausted",
            DeliveryState::AckExpired => "ack_expired",
        }
    }

    /// Whether the result still waits for its acknowledgement (holds a window slot).
    pub fn is_open(self) -> bool {
        matches!(
            self,
            DeliveryState::Pending | DeliveryState::Delivered | DeliveryState::Exhausted
        )
    }
}

/// The durable record of one operation, as of the moment it was read, with every clock
/// applied (a receipt past a deadline answers as expired even before compaction runs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Receipt {
    /// The operation id.
    pub operation_id: String,
    /// The attempt number (1 for the first).
    pub attempt: u32,
    /// The intent's name.
    pub intent_name: String,
    /// The intent hash.
    pub intent_hash: IntentHash,
    /// The scope, if any.
    pub scope: Option<String>,
    /// The session, if any.
    pub session: Option<String>,
    /// The revision the client saw.
    pub base_revision: Option<u64>,
    /// The revision the mutation produced (applied operations).
    pub result_revision: Option<u64>,
    /// The execution status.
    pub status: ExecutionStatus,
    /// The failure message (failed operations, also once retired).
    pub failure: Option<String>,
    /// Whether the outcome was applied (`Some(true)`), failed (`Some(false)`), or is not
    /// known yet (`None`). Kept after retirement.
    pub applied: Option<bool>,
    /// Why it is in doubt (InDoubt operations).
    pub in_doubt_cause: Option<InDoubtCause>,
    /// The delivery state (terminal operations).
    pub delivery: Option<DeliveryState>,
    /// How many deliveries were recorded.
    pub delivery_count: u32,
    /// The current claim's epoch.
    pub epoch: u64,
    /// When the attempt was submitted.
    pub submitted_at: Timestamp,
    /// When the lease expires (Running) or expired (InDoubt by lease).
    pub lease_until: Option<Timestamp>,
    /// When the outcome was recorded.
    pub completed_at: Option<Timestamp>,
    /// When the client acknowledged the result.
    pub acknowledged_at: Option<Timestamp>,
    /// When the next push is due (open deliveries).
    pub next_delivery_at: Option<Timestamp>,
    /// When the acknowledgement expires (terminal operations).
    pub ack_deadline: Option<Timestamp>,
    /// When the result payload is retired (terminal operations).
    pub retain_until: Option<Timestamp>,
    /// When the audit record is purged (terminal operations).
    pub purge_at: Option<Timestamp>,
    /// The result payload's size in bytes (terminal operations).
    pub result_size: Option<u64>,
    /// Why the result payload is gone (`Retired` operations): its retention passed, or it
    /// was lost to damage that `repair` found.
    pub retire_cause: Option<RetireCause>,
}

/// Why a retired operation's result payload is gone.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RetireCause {
    /// The result retention passed (at [`Receipt::retain_until`]): the payload aged out, as
    /// designed.
    Retention,
    /// The payload was lost to damage: `repair` (at `repaired_at`) found it damaged or
    /// missing before its retention passed. The outcome is known; the result is not.
    Damage {
        /// When the repair that found the loss ran.
        repaired_at: Timestamp,
    },
}

impl Receipt {
    /// Whether the outcome is recorded (applied, failed, or retired).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self.status,
            ExecutionStatus::Applied | ExecutionStatus::Failed | ExecutionStatus::Retired
        )
    }
}

/// A recorded outcome answered instead of re-executing: send `result` to the client,
/// marked as a replay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Replay {
    /// The receipt (status `Applied` or `Failed`; `delivery_count` says how many times the
    /// result was delivered before).
    pub receipt: Receipt,
    /// The recorded result.
    pub result: OpResult,
    /// Always `true`: this answer repeats a recorded outcome; the effect was not re-applied.
    pub replayed: bool,
}

/// What [`Journal::submit`](crate::Journal::submit) answers. Lookup by operation id comes
/// first; scope, revision and window checks apply only to fresh work.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[must_use]
pub enum Admission {
    /// Unknown id: execute the operation, then [`complete`](crate::Journal::complete) or
    /// [`release`](crate::Journal::release) the claim.
    Fresh(Claim),
    /// The same operation is running: attach; do not apply.
    InProgress(Receipt),
    /// The outcome is recorded: send the recorded result, marked as a replay.
    Replay(Replay),
    /// The outcome is known but the result is gone (it aged out, or was lost to damage:
    /// `receipt.retire_cause` says which): tell the client it finished (at
    /// `receipt.result_revision`) and that it must refresh, not retry.
    Expired(Receipt),
    /// The claim holder vanished: look at the project, then
    /// [`resolve`](crate::Journal::resolve).
    InDoubt(Receipt),
}

impl Admission {
    /// A short lowercase name (`fresh`, `in_progress`, `replay`, `expired`, `in_doubt`).
    pub fn name(&self) -> &'static str {
        match self {
            Admission::Fresh(_) => "fresh",
            Admission::InProgress(_) => "in_progress",
            Admission::Replay(_) => "replay",
            Admission::Expired(_) => "expired",
            Admission::InDoubt(_) => "in_doubt",
        }
    }
}

// ---- events, as the API shows them (the file has its own record types) ----

/// One entry of the event journal, the file's source of truth.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Event {
    /// Position in the journal; unique, increasing, never reused. 0 for a pending event
    /// (see [`Event::pending`]), which gets its position when it commits.
    pub seq: u64,
    /// When it was recorded (the journal's clock).
    pub at: Timestamp,
    /// The operation it belongs to (`None` for scope events).
    pub operation_id: Option<String>,
    /// What happened.
    pub kind: EventKind,
    /// `true` for a delivery or an acknowledgement that this handle recorded and has not
    /// committed yet ([`Journal::delivered`](crate::Journal::delivered) and
    /// [`Journal::acknowledge`](crate::Journal::acknowledge) are durable lazily: with the
    /// next commit, or [`Journal::flush`](crate::Journal::flush)). A crash loses it, which
    /// only causes a recognizable redelivery. Readers in other processes do not see it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
}

/// What an event records. Every index (receipts, scopes, timers, windows) is a function of
/// these, which is what `repair` relies on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum EventKind {
    /// Fresh work was accepted and claimed. The claim's epoch is this event's `seq`.
    Submitted {
        /// 1 for the first attempt; +1 after each release or not-applied resolution.
        attempt: u32,
        /// The intent's name.
        intent_name: String,
        /// The intent hash.
        intent_hash: IntentHash,
        /// The scope mutated, if any.
        scope: Option<String>,
        /// The client session, if any.
        session: Option<String>,
        /// The revision the client saw, if given.
        base_revision: Option<u64>,
        /// When the execution lease expires.
        lease_until: Timestamp,
        /// Whether the scope lock is held until acknowledgement ([`ScopeLock::HoldUntilAck`](crate::ScopeLock::HoldUntilAck)).
        hold_until_ack: bool,
    },
    /// The claim holder extended its lease.
    LeaseExtended {
        /// The claim's epoch.
        epoch: u64,
        /// The new expiry.
        lease_until: Timestamp,
    },
    /// The claim holder recorded the outcome.
    Completed {
        /// The claim's epoch.
        epoch: u64,
        /// Applied or failed.
        outcome: OutcomeKind,
        /// The stored result (payload in the `results` table under this event's `seq`).
        result: ResultInfo,
        /// The clocks started by the outcome.
        deadlines: Deadlines,
    },
    /// The claim holder gave the id back: no effect happened.
    Released {
        /// The claim's epoch.
        epoch: u64,
        /// When the released attempt's history is purged.
        purge_at: Timestamp,
    },
    /// The operation became `InDoubt`.
    LeaseExpired {
        /// The epoch of the claim that lost its lease.
        epoch: u64,
        /// Why.
        cause: InDoubtCause,
    },
    /// The embedder resolved an `InDoubt` operation.
    Resolved {
        /// How it ended.
        resolution: ResolvedAs,
    },
    /// A delivery attempt (first send or redelivery) was recorded.
    Delivered {
        /// Deliveries so far, including this one.
        count: u32,
        /// When the next push is due (or, for the last attempt, when the budget is spent).
        next_due: Timestamp,
        /// Whether this attempt spent the retry budget.
        final_attempt: bool,
    },
    /// The client acknowledged the result.
    Acknowledged {
        /// Whether it arrived after the acknowledgement had expired.
        late: bool,
    },
    /// The acknowledgement timeout passed.
    AckExpired,
    /// The delivery retry budget was spent.
    Exhausted,
    /// The result retention passed: the payload was dropped, the audit record kept.
    Retired,
    /// `repair` could not rebuild the operation from its events (some were damaged): it is
    /// `InDoubt` until the embedder resolves it. The claim epoch is this event's `seq`.
    Salvaged {
        /// The attempt number, as far as it is known.
        attempt: u32,
        /// The intent's name (`(lost)` if unknown).
        intent_name: String,
        /// The intent hash (all zeros if unknown: then any intent is answered `InDoubt`).
        intent_hash: IntentHash,
        /// The scope, if known.
        scope: Option<String>,
        /// The session, if known.
        session: Option<String>,
        /// Events of the operation that were damaged and quarantined.
        lost_events: u32,
    },
    /// A scope's revision moved forward outside an operation's completion.
    RevisionAdvanced {
        /// The scope.
        scope: String,
        /// The new revision.
        revision: u64,
        /// Why it was recorded.
        cause: RevisionCause,
        /// When this event may be purged once a later revision supersedes it.
        purge_at: Timestamp,
    },
    /// The file was upgraded from an older format (written once, by the first writer of
    /// the new build to open it).
    FormatUpgraded {
        /// The format it had.
        from: u32,
        /// The format it has now.
        to: u32,
    },
    /// `repair` found the terminal operation's result payload damaged or missing before its
    /// retention passed: the payload was lost to damage (it did not age out). The outcome and
    /// the audit record are kept; the operation answers [`Admission::Expired`] with
    /// [`Receipt::retire_cause`] [`RetireCause::Damage`].
    ResultLost,
}

impl EventKind {
    /// A short lowercase name (`submitted`, `completed`, ...), as shown by the CLI.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Submitted { .. } => "submitted",
            EventKind::LeaseExtended { .. } => "lease_extended",
            EventKind::Completed { .. } => "completed",
            EventKind::Released { .. } => "released",
            EventKind::LeaseExpired { .. } => "lease_expired",
            EventKind::Resolved { .. } => "resolved",
            EventKind::Delivered { .. } => "delivered",
            EventKind::Acknowledged { .. } => "acknowledged",
            EventKind::AckExpired => "ack_expired",
            EventKind::Exhausted => "exhausted",
            EventKind::Retired => "retired",
            EventKind::Salvaged { .. } => "salvaged",
            EventKind::RevisionAdvanced { .. } => "revision_advanced",
            EventKind::FormatUpgraded { .. } => "format_upgraded",
            EventKind::ResultLost => "result_lost",
        }
    }
}

/// How an operation ended, as recorded (without the payload).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutcomeKind {
    /// The effect happened and moved the scope to `result_revision`.
    Applied {
        /// The revision the mutation produced.
        result_revision: u64,
    },
    /// The operation failed; the failure is its outcome and is replayed like a success.
    Failed {
        /// What went wrong, for the client.
        message: String,
    },
}

/// Why an operation is `InDoubt`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InDoubtCause {
    /// The claim holder did not complete, release or extend within the lease.
    LeaseTimeout,
    /// The journal was reopened while the operation was `Running`: the process that held
    /// the claim is gone (a crash, or a close with claims outstanding).
    Reopened,
    /// `repair` found some of the operation's events damaged, so its outcome is unknown.
    EventsLost,
}

/// How an `InDoubt` operation was resolved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResolvedAs {
    /// The effect did not happen; the id is unknown again (the next attempt is +1).
    NotApplied {
        /// When this attempt's history is purged.
        purge_at: Timestamp,
    },
    /// The operation ended with this outcome.
    Completed {
        /// Applied or failed.
        outcome: OutcomeKind,
        /// The stored result (payload under this event's `seq`).
        result: ResultInfo,
        /// The clocks started by the outcome.
        deadlines: Deadlines,
    },
}

/// Why a scope revision event was recorded.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RevisionCause {
    /// The embedder reported a change made outside the journal.
    External,
    /// Compaction purged the operation that established the scope's revision and kept the
    /// revision with this event.
    Checkpoint,
}

/// Size and checksum of a stored result payload.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultInfo {
    /// Payload bytes.
    pub len: u64,
    /// CRC-32 of the payload bytes.
    pub crc32: u32,
    /// Number of changed assets listed with it.
    pub assets: u32,
}

/// The deadlines a terminal outcome starts, fixed when it is recorded.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deadlines {
    /// When an unacknowledged result's acknowledgement expires.
    pub ack: Timestamp,
    /// When the result payload is retired.
    pub retain: Timestamp,
    /// When the audit record is purged.
    pub purge: Timestamp,
    /// When a never-delivered result first counts as due for a push.
    pub first_push: Timestamp,
}
