//! A reference model of the journal's semantics (DESIGN.md §3, §4, §6, §7), in memory.
//!
//! Self-contained: it depends only on `opjournal`, `std` and `sha2` (for the delivery
//! jitter).
//!
//! Two layers:
//! - [`Model`]: one method per journal call, each returning the expected answer in a
//!   comparable form ([`Expect`]) and advancing the model as the journal should. The model
//!   keeps its own time (`max(clock, high-water)`, like the journal) and applies every clock
//!   on every read. [`Model::step`] runs one [`Call`] against a [`Journal`] and the model
//!   and compares the answers; [`Model::check_against`] compares every observable state.
//! - [`Recovery`]: what a crash may legitimately leave. Every durable `Ok` is kept; lazily
//!   durable calls (`delivered`, `acknowledge`: they ride along with the next commit) and a
//!   call that failed with an I/O error may or may not have landed, in order. After a reopen the
//!   journal must equal one of those states exactly — never a mix.
//!
//! Two delivery rules the model states on its own, since a service relies on them:
//! - only the session an operation was submitted with acknowledges it (`NotOwner`
//!   otherwise; an operation without a session may be acknowledged by any caller);
//! - the retry budget is spent the moment its last delivery is recorded: the receipt of
//!   that `delivered` call already says `Exhausted`, and nothing is pushed after it.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use opjournal::{
    Admission, Claim, DeliveryState, ErrorKind, ExecutionStatus, InDoubtCause, Intent, IntentHash,
    Journal, JournalBuilder, ManualClock, OpResult, Operation, Outcome, Receipt, Resolution,
    RetryPolicy, ScopeLock, Sharing, Timestamp,
};

// ---------------------------------------------------------------------------------------
// Configuration.
// ---------------------------------------------------------------------------------------

/// The journal settings the model needs to predict answers. [`ModelConfig::builder`] makes
/// a [`JournalBuilder`] with exactly these settings.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// Execution lease.
    pub lease: Duration,
    /// Acknowledgement timeout.
    pub ack_timeout: Duration,
    /// Result retention.
    pub result_retention: Duration,
    /// Audit retention.
    pub audit_retention: Duration,
    /// Delivery retry budget.
    pub retry: RetryPolicy,
    /// Unacknowledged results per session.
    pub session_window: u32,
    /// Scope lock policy.
    pub scope_lock: ScopeLock,
    /// Largest result payload.
    pub max_result_bytes: u64,
    /// Timers fired per compaction batch.
    pub compaction_batch: usize,
    /// File sharing (the default, `LiveReaders`): redb's commit protocol, on the fault
    /// disk as on a file.
    pub sharing: Sharing,
    /// How large the log grows before a checkpoint (`None`: the library's default, 4 MiB;
    /// at least 64 KiB).
    pub checkpoint_size: Option<u64>,
    /// How compaction finds what is due (`JournalBuilder::compaction_scan`): `Some(true)`
    /// scans every receipt, `None` lets the journal choose (these journals are too small
    /// to scan by themselves).
    pub compaction_scan: Option<bool>,
    /// On the fault disk, whether the journal keeps its log in two files, as a journal
    /// file does (each cycle in the file the cycle before did not use, so that a checkpoint
    /// commits beside the next cycle), instead of one (a custom storage with one log, where
    /// every checkpoint commits in the call that reaches it). Off in [`ModelConfig::small`].
    pub two_logs: bool,
}

impl ModelConfig {
    /// Short clocks (milliseconds to seconds), so that random clock jumps cross every
    /// deadline: lease 1 s, ack timeout 5 s, retention 10 s, audit retention 20 s, three
    /// deliveries backing off 100 ms to 400 ms, a window of 3 results per session.
    pub fn small() -> ModelConfig {
        ModelConfig {
            lease: Duration::from_millis(1_000),
            ack_timeout: Duration::from_millis(5_000),
            result_retention: Duration::from_millis(10_000),
            audit_retention: Duration::from_millis(20_000),
            retry: RetryPolicy {
                attempts: 3,
                initial_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_millis(400),
            },
            session_window: 3,
            scope_lock: ScopeLock::Serial,
            max_result_bytes: 64,
            compaction_batch: 3,
            sharing: Sharing::LiveReaders,
            checkpoint_size: None,
            compaction_scan: None,
            two_logs: false,
        }
    }

    /// A builder configured like the model, on `clock`.
    pub fn builder(&self, clock: &ManualClock) -> JournalBuilder {
        let builder = match self.checkpoint_size {
            Some(bytes) => opjournal::Journal::builder().checkpoint_size(bytes),
            None => opjournal::Journal::builder(),
        };
        builder
            .lease(self.lease)
            .ack_timeout(self.ack_timeout)
            .result_retention(self.result_retention)
            .audit_retention(self.audit_retention)
            .retry_policy(self.retry)
            .session_window(self.session_window)
            .scope_lock(self.scope_lock)
            .max_result_bytes(self.max_result_bytes)
            .compaction_batch(self.compaction_batch)
            .compaction_scan(self.compaction_scan)
            .sharing(self.sharing)
            .clock(clock.clone())
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn plus(t: u64, d: Duration) -> u64 {
    t.saturating_add(ms(d))
}

// ---------------------------------------------------------------------------------------
// Inputs (the public opjournal types do not expose every field, so the model keeps its own).
// ---------------------------------------------------------------------------------------

/// An operation as the model sees it; [`OpSpec::operation`] builds the real one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpSpec {
    /// Operation id.
    pub id: String,
    /// Intent name.
    pub intent_name: String,
    /// Intent arguments (canonical JSON is computed by `Intent::from_json`).
    pub intent_args: serde_json::Value,
    /// Scope.
    pub scope: Option<String>,
    /// Session.
    pub session: Option<String>,
    /// Base revision.
    pub base_revision: Option<u64>,
    /// `allow_stale_base()`.
    pub allow_stale: bool,
}

impl OpSpec {
    /// The intent.
    ///
    /// # Panics
    ///
    /// If the intent name is invalid (the generators only use valid names).
    pub fn intent(&self) -> Intent {
        Intent::from_json(&self.intent_name, &self.intent_args).expect("valid intent name")
    }

    /// The operation to submit.
    pub fn operation(&self) -> Operation {
        let mut op = Operation::new(self.id.clone(), self.intent());
        if let Some(s) = &self.scope {
            op = op.scope(s.clone());
        }
        if let Some(s) = &self.session {
            op = op.session(s.clone());
        }
        if let Some(b) = self.base_revision {
            op = op.base_revision(b);
        }
        if self.allow_stale {
            op = op.allow_stale_base();
        }
        op
    }
}

/// An outcome as the model sees it; [`OutcomeSpec::outcome`] builds the real one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutcomeSpec {
    /// `Some(rev)`: applied at `rev`; `None`: failed with `message`.
    pub applied: Option<u64>,
    /// Failure message (failed outcomes).
    pub message: String,
    /// Result payload.
    pub bytes: Vec<u8>,
    /// Changed assets.
    pub assets: Vec<String>,
}

impl OutcomeSpec {
    /// Applied at `rev` with `bytes`.
    pub fn applied(rev: u64, bytes: Vec<u8>) -> OutcomeSpec {
        OutcomeSpec {
            applied: Some(rev),
            message: String::new(),
            bytes,
            assets: Vec::new(),
        }
    }

    /// Failed with `message`.
    pub fn failed(message: &str) -> OutcomeSpec {
        OutcomeSpec {
            applied: None,
            message: message.to_string(),
            bytes: Vec::new(),
            assets: Vec::new(),
        }
    }

    /// The real outcome.
    pub fn outcome(&self) -> Outcome {
        let o = match self.applied {
            Some(rev) => Outcome::applied(rev, self.bytes.clone()),
            None => Outcome::failed(self.message.clone()).with_result(self.bytes.clone()),
        };
        o.changed_assets(self.assets.clone())
    }

    fn result(&self) -> OpResult {
        OpResult {
            bytes: self.bytes.clone(),
            changed_assets: self.assets.clone(),
        }
    }
}

/// A resolution as the model sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolutionSpec {
    /// `Resolution::Completed(outcome)`.
    Completed(OutcomeSpec),
    /// `Resolution::NotApplied`.
    NotApplied,
}

impl ResolutionSpec {
    /// The real resolution.
    pub fn resolution(&self) -> Resolution {
        match self {
            ResolutionSpec::Completed(o) => Resolution::Completed(o.outcome()),
            ResolutionSpec::NotApplied => Resolution::not_applied(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Comparable answers.
// ---------------------------------------------------------------------------------------

/// An error, reduced to what the model predicts. Storage failures (`Io`, `Poisoned`, ...)
/// are never predicted; they are [`ErrView::Failure`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrView {
    /// `InvalidInput`.
    InvalidInput,
    /// `ResultTooLarge`.
    ResultTooLarge,
    /// `IntentMismatch`.
    IntentMismatch,
    /// `StaleBase` with the scope's current revision.
    StaleBase {
        /// Current revision.
        current: u64,
    },
    /// `ScopeBusy` with the holder.
    ScopeBusy {
        /// The holder.
        holder: String,
    },
    /// `WindowFull` with the oldest result and when it frees.
    WindowFull {
        /// Oldest unacknowledged operation.
        oldest: String,
        /// Its ack deadline.
        frees_at: u64,
    },
    /// `StaleClaim`.
    StaleClaim,
    /// `LeaseExpired` with the expiry.
    LeaseExpired {
        /// When the lease expired.
        expired_at: u64,
    },
    /// `RevisionNotForward` with the current revision.
    RevisionNotForward {
        /// Current revision.
        current: u64,
    },
    /// `InvalidState`.
    InvalidState,
    /// `UnknownOperation`.
    UnknownOperation,
    /// `NotOwner`: another session's result.
    NotOwner,
    /// Anything the model does not predict: I/O, poisoned, corrupt, storage.
    Failure(String),
}

impl ErrView {
    /// Reduces a journal error.
    pub fn of(e: &opjournal::Error) -> ErrView {
        match e.kind() {
            ErrorKind::InvalidInput { .. } => ErrView::InvalidInput,
            ErrorKind::ResultTooLarge { .. } => ErrView::ResultTooLarge,
            ErrorKind::IntentMismatch { .. } => ErrView::IntentMismatch,
            ErrorKind::StaleBase { current, .. } => ErrView::StaleBase { current: *current },
            ErrorKind::ScopeBusy { holder, .. } => ErrView::ScopeBusy {
                holder: holder.clone(),
            },
            ErrorKind::WindowFull {
                oldest, frees_at, ..
            } => ErrView::WindowFull {
                oldest: oldest.clone(),
                frees_at: frees_at.as_millis(),
            },
            ErrorKind::StaleClaim { .. } => ErrView::StaleClaim,
            ErrorKind::LeaseExpired { expired_at, .. } => ErrView::LeaseExpired {
                expired_at: expired_at.as_millis(),
            },
            ErrorKind::RevisionNotForward { current, .. } => {
                ErrView::RevisionNotForward { current: *current }
            }
            ErrorKind::InvalidState { .. } => ErrView::InvalidState,
            ErrorKind::UnknownOperation { .. } => ErrView::UnknownOperation,
            ErrorKind::NotOwner { .. } => ErrView::NotOwner,
            other => ErrView::Failure(format!("{other:?}: {e}")),
        }
    }

    /// Whether this is a storage failure (the outcome of the call is unknown).
    pub fn is_failure(&self) -> bool {
        matches!(self, ErrView::Failure(_))
    }
}

/// The model's answer for one call: a value or a predicted refusal.
pub type Expect<T> = Result<T, ErrView>;

/// A receipt in comparable form. `epoch: None` in an expected view means "not known to the
/// model" (a submit whose answer was lost to a fault): then `epoch` and `next_delivery_at`
/// are not compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiptView {
    pub operation_id: String,
    pub attempt: u32,
    pub intent_name: String,
    pub intent_hash: IntentHash,
    pub scope: Option<String>,
    pub session: Option<String>,
    pub base_revision: Option<u64>,
    pub result_revision: Option<u64>,
    pub status: ExecutionStatus,
    pub failure: Option<String>,
    pub applied: Option<bool>,
    pub in_doubt_cause: Option<InDoubtCause>,
    pub delivery: Option<DeliveryState>,
    pub delivery_count: u32,
    pub epoch: Option<u64>,
    pub submitted_at: u64,
    pub lease_until: Option<u64>,
    pub completed_at: Option<u64>,
    pub acknowledged_at: Option<u64>,
    pub next_delivery_at: Option<u64>,
    pub ack_deadline: Option<u64>,
    pub retain_until: Option<u64>,
    pub purge_at: Option<u64>,
    pub result_size: Option<u64>,
}

impl ReceiptView {
    /// The comparable form of a journal receipt.
    pub fn of(r: &Receipt) -> ReceiptView {
        let t = |x: Option<Timestamp>| x.map(Timestamp::as_millis);
        ReceiptView {
            operation_id: r.operation_id.clone(),
            attempt: r.attempt,
            intent_name: r.intent_name.clone(),
            intent_hash: r.intent_hash,
            scope: r.scope.clone(),
            session: r.session.clone(),
            base_revision: r.base_revision,
            result_revision: r.result_revision,
            status: r.status,
            failure: r.failure.clone(),
            applied: r.applied,
            in_doubt_cause: r.in_doubt_cause,
            delivery: r.delivery,
            delivery_count: r.delivery_count,
            epoch: Some(r.epoch),
            submitted_at: r.submitted_at.as_millis(),
            lease_until: t(r.lease_until),
            completed_at: t(r.completed_at),
            acknowledged_at: t(r.acknowledged_at),
            next_delivery_at: t(r.next_delivery_at),
            ack_deadline: t(r.ack_deadline),
            retain_until: t(r.retain_until),
            purge_at: t(r.purge_at),
            result_size: r.result_size,
        }
    }

    /// Whether `actual` is what this expected view allows.
    pub fn admits(&self, actual: &ReceiptView) -> bool {
        if self.epoch.is_none() {
            let mut e = self.clone();
            e.epoch = actual.epoch;
            e.next_delivery_at = actual.next_delivery_at;
            return &e == actual;
        }
        self == actual
    }
}

/// What `submit` answers, in comparable form. A fresh claim's epoch is not predicted; the
/// model learns it with [`Model::bind_claim`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdmissionView {
    /// `Fresh(claim)`.
    Fresh {
        /// Attempt number.
        attempt: u32,
        /// Lease expiry.
        lease_until: u64,
    },
    /// `InProgress(receipt)`.
    InProgress(ReceiptView),
    /// `Replay(replay)`: receipt and result (always marked replayed).
    Replay(ReceiptView, OpResult),
    /// `Expired(receipt)`.
    Expired(ReceiptView),
    /// `InDoubt(receipt)`.
    InDoubt(ReceiptView),
    /// An admission this model does not know (never expected).
    Other(String),
}

impl AdmissionView {
    /// The comparable form of an admission.
    pub fn of(a: &Admission) -> AdmissionView {
        match a {
            Admission::Fresh(c) => AdmissionView::Fresh {
                attempt: c.attempt(),
                lease_until: c.lease_until().as_millis(),
            },
            Admission::InProgress(r) => AdmissionView::InProgress(ReceiptView::of(r)),
            Admission::Replay(r) => {
                let mut v = ReceiptView::of(&r.receipt);
                if !r.replayed {
                    // A replay not marked as one is a different answer.
                    v.intent_name = format!("{} (NOT MARKED AS REPLAY)", v.intent_name);
                }
                AdmissionView::Replay(v, r.result.clone())
            }
            Admission::Expired(r) => AdmissionView::Expired(ReceiptView::of(r)),
            Admission::InDoubt(r) => AdmissionView::InDoubt(ReceiptView::of(r)),
            other => AdmissionView::Other(other.name().to_string()),
        }
    }

    /// Whether `actual` is what this expected answer allows.
    pub fn admits(&self, actual: &AdmissionView) -> bool {
        match (self, actual) {
            (AdmissionView::InProgress(e), AdmissionView::InProgress(a))
            | (AdmissionView::Expired(e), AdmissionView::Expired(a))
            | (AdmissionView::InDoubt(e), AdmissionView::InDoubt(a)) => e.admits(a),
            (AdmissionView::Replay(e, er), AdmissionView::Replay(a, ar)) => e.admits(a) && er == ar,
            (e, a) => e == a,
        }
    }
}

fn admits<T, A>(expected: &Expect<T>, actual: &Expect<A>, same: impl Fn(&T, &A) -> bool) -> bool {
    match (expected, actual) {
        (Ok(e), Ok(a)) => same(e, a),
        (Err(e), Err(a)) => e == a,
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------
// The model's records.
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
struct MDone {
    applied: Option<u64>,
    failure: Option<String>,
    result: OpResult,
    completed_at: u64,
    ack: u64,
    retain: u64,
    purge: u64,
    retired: bool,
    delivery: DeliveryState,
    count: u32,
    next_due: u64,
    final_attempt: bool,
    acknowledged_at: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum MState {
    /// `uncertain_fire`: a failed compaction may have recorded the lease expiry.
    Running {
        lease_until: u64,
        uncertain_fire: bool,
    },
    /// `alt`: another cause the journal may show (after a failed compaction and a reopen).
    InDoubt {
        cause: InDoubtCause,
        alt: Option<InDoubtCause>,
        lease_until: u64,
    },
    Vacant {
        purge_at: u64,
    },
    Done(Box<MDone>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct MOp {
    id: String,
    attempt: u32,
    intent_name: String,
    intent_hash: IntentHash,
    scope: Option<String>,
    session: Option<String>,
    base_revision: Option<u64>,
    epoch: Option<u64>,
    hold_until_ack: bool,
    submitted_at: u64,
    state: MState,
}

impl MOp {
    /// The record with every clock applied at `now`; `None` once purged.
    fn effective(&self, now: u64) -> Option<MOp> {
        let mut r = self.clone();
        match &mut r.state {
            MState::Running { lease_until, .. } if now >= *lease_until => {
                r.state = MState::InDoubt {
                    cause: InDoubtCause::LeaseTimeout,
                    alt: None,
                    lease_until: *lease_until,
                };
            }
            MState::Running { .. } | MState::InDoubt { .. } => {}
            MState::Vacant { purge_at } => {
                if now >= *purge_at {
                    return None;
                }
            }
            MState::Done(d) => {
                if matches!(
                    d.delivery,
                    DeliveryState::Pending | DeliveryState::Delivered
                ) && d.final_attempt
                    && now >= d.next_due
                    && d.next_due < d.ack
                {
                    d.delivery = DeliveryState::Exhausted;
                }
                if d.delivery.is_open() && now >= d.ack {
                    d.delivery = DeliveryState::AckExpired;
                }
                if !d.retired && now >= d.retain {
                    d.retired = true;
                }
                if now >= d.purge {
                    return None;
                }
            }
        }
        Some(r)
    }

    fn is_vacant(&self) -> bool {
        matches!(self.state, MState::Vacant { .. })
    }

    fn holds_lock(&self) -> bool {
        match &self.state {
            MState::Running { .. } => true,
            MState::Done(d) => self.hold_until_ack && !d.retired && d.delivery.is_open(),
            _ => false,
        }
    }

    /// The public receipt (`None` for a vacant id).
    fn view(&self) -> Option<ReceiptView> {
        let mut v = ReceiptView {
            operation_id: self.id.clone(),
            attempt: self.attempt,
            intent_name: self.intent_name.clone(),
            intent_hash: self.intent_hash,
            scope: self.scope.clone(),
            session: self.session.clone(),
            base_revision: self.base_revision,
            result_revision: None,
            status: ExecutionStatus::Running,
            failure: None,
            applied: None,
            in_doubt_cause: None,
            delivery: None,
            delivery_count: 0,
            epoch: self.epoch,
            submitted_at: self.submitted_at,
            lease_until: None,
            completed_at: None,
            acknowledged_at: None,
            next_delivery_at: None,
            ack_deadline: None,
            retain_until: None,
            purge_at: None,
            result_size: None,
        };
        match &self.state {
            MState::Vacant { .. } => return None,
            MState::Running { lease_until, .. } => v.lease_until = Some(*lease_until),
            MState::InDoubt {
                cause, lease_until, ..
            } => {
                v.status = ExecutionStatus::InDoubt;
                v.in_doubt_cause = Some(*cause);
                v.lease_until = Some(*lease_until);
            }
            MState::Done(d) => {
                match d.applied {
                    Some(rev) => {
                        v.status = ExecutionStatus::Applied;
                        v.result_revision = Some(rev);
                        v.applied = Some(true);
                    }
                    None => {
                        v.status = ExecutionStatus::Failed;
                        v.failure = d.failure.clone();
                        v.applied = Some(false);
                    }
                }
                if d.retired {
                    v.status = ExecutionStatus::Retired;
                } else {
                    v.result_size = Some(d.result.bytes.len() as u64);
                }
                let pushing = matches!(
                    d.delivery,
                    DeliveryState::Pending | DeliveryState::Delivered
                );
                // The budget is spent when its last delivery is recorded.
                v.delivery = Some(if pushing && d.final_attempt {
                    DeliveryState::Exhausted
                } else {
                    d.delivery
                });
                v.delivery_count = d.count;
                v.completed_at = Some(d.completed_at);
                v.acknowledged_at = d.acknowledged_at;
                if pushing && !d.final_attempt && !d.retired {
                    v.next_delivery_at = Some(d.next_due);
                }
                v.ack_deadline = Some(d.ack);
                v.retain_until = Some(d.retain);
                v.purge_at = Some(d.purge);
            }
        }
        Some(v)
    }

    /// The views this record may show: the in-doubt cause may be one of two after a
    /// failed compaction.
    fn views(&self) -> Vec<ReceiptView> {
        let Some(v) = self.view() else {
            return Vec::new();
        };
        let mut out = vec![v.clone()];
        if let MState::InDoubt { alt: Some(alt), .. } = &self.state {
            let mut w = v;
            w.in_doubt_cause = Some(*alt);
            out.push(w);
        }
        out
    }

    fn result(&self) -> Option<OpResult> {
        match &self.state {
            MState::Done(d) if !d.retired => Some(d.result.clone()),
            _ => None,
        }
    }
}

/// The delay cap after delivery `n` (1-based): `min(initial · 2^(n-1), max)`.
fn backoff(retry: &RetryPolicy, n: u32) -> Duration {
    let factor = 1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX);
    retry
        .initial_backoff
        .checked_mul(factor)
        .unwrap_or(retry.max_backoff)
        .min(retry.max_backoff)
}

/// Full jitter, deterministic per operation, epoch and delivery (the journal's formula).
fn jitter(id: &str, epoch: u64, n: u32, cap: Duration) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"opjournal.jitter.v1\0");
    h.update(id.as_bytes());
    h.update(epoch.to_le_bytes());
    h.update(n.to_le_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let cap_ms = ms(cap);
    let r = u64::from_le_bytes(first);
    if cap_ms == u64::MAX {
        r
    } else {
        r % (cap_ms + 1)
    }
}

// ---------------------------------------------------------------------------------------
// The model.
// ---------------------------------------------------------------------------------------

/// The reference model: what every journal call should answer, and the state it leaves.
#[derive(Clone, Debug)]
pub struct Model {
    cfg: ModelConfig,
    clock: ManualClock,
    /// The journal's time: never below the highest clock reading so far.
    hw: u64,
    ops: BTreeMap<String, MOp>,
    scopes: BTreeMap<String, u64>,
    /// Every id, scope and session ever named, so `check_against` can look at all of them.
    ids: BTreeSet<String>,
    sessions: BTreeSet<String>,
}

impl PartialEq for Model {
    fn eq(&self, other: &Model) -> bool {
        self.ops == other.ops && self.scopes == other.scopes
    }
}

impl Model {
    /// An empty journal's model, reading time from `clock` (the journal's clock).
    pub fn new(cfg: ModelConfig, clock: ManualClock) -> Model {
        let hw = opjournal::Clock::now(&clock).as_millis();
        Model {
            cfg,
            clock,
            hw,
            ops: BTreeMap::new(),
            scopes: BTreeMap::new(),
            ids: BTreeSet::new(),
            sessions: BTreeSet::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The clock shared with the journal.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// The journal's time now: the clock, never below what was read before.
    pub fn now(&mut self) -> u64 {
        let t = opjournal::Clock::now(&self.clock).as_millis().max(self.hw);
        self.hw = t;
        t
    }

    /// The highest time read so far.
    pub fn high_water(&self) -> u64 {
        self.hw
    }

    /// Every operation id the model has seen.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.ids.iter().map(String::as_str)
    }

    /// The scopes with a recorded revision.
    pub fn scopes(&self) -> impl Iterator<Item = (&str, u64)> {
        self.scopes.iter().map(|(s, r)| (s.as_str(), *r))
    }

    /// A scope's revision (0 if never recorded).
    pub fn scope_revision(&self, scope: &str) -> u64 {
        self.scopes.get(scope).copied().unwrap_or(0)
    }

    fn eff(&self, id: &str, now: u64) -> Option<MOp> {
        self.ops.get(id).and_then(|r| r.effective(now))
    }

    /// Records every clock transition due for `id` (what a write touching it does).
    fn materialize(&mut self, id: &str, now: u64) {
        match self.ops.get(id).map(|r| r.effective(now)) {
            Some(Some(r)) => {
                self.ops.insert(id.to_string(), r);
            }
            Some(None) => {
                self.ops.remove(id);
            }
            None => {}
        }
    }

    /// The effective receipt of `id`, `None` if unknown (the model's `lookup`).
    pub fn lookup(&mut self, id: &str) -> Option<ReceiptView> {
        let now = self.now();
        self.eff(id, now).and_then(|r| r.view())
    }

    /// Whether `id` is effectively in doubt.
    pub fn is_in_doubt(&mut self, id: &str) -> bool {
        let now = self.now();
        matches!(
            self.eff(id, now).map(|r| r.state),
            Some(MState::InDoubt { .. })
        )
    }

    /// Whether `id` is effectively terminal (applied, failed or retired).
    pub fn is_terminal(&mut self, id: &str) -> bool {
        let now = self.now();
        matches!(self.eff(id, now).map(|r| r.state), Some(MState::Done(_)))
    }

    /// Whether `id` is effectively terminal as of the last time read (does not read the
    /// clock, so a generator may call it without moving the model's time).
    pub fn peek_is_terminal(&self, id: &str) -> bool {
        matches!(
            self.eff(id, self.hw).map(|r| r.state),
            Some(MState::Done(_))
        )
    }

    /// The epoch the model knows for `id`'s current attempt.
    pub fn epoch(&self, id: &str) -> Option<u64> {
        self.ops.get(id).and_then(|r| r.epoch)
    }

    // ---- calls ----

    /// `submit`.
    pub fn submit(&mut self, op: &OpSpec) -> Expect<AdmissionView> {
        self.ids.insert(op.id.clone());
        if let Some(s) = &op.session {
            self.sessions.insert(s.clone());
        }
        // The journal records the current scheme's hash (with its scheme), and a recorded
        // hash is compared under its own scheme.
        let hash = op.intent().hash();
        for name in [Some(&op.id), op.scope.as_ref(), op.session.as_ref()]
            .into_iter()
            .flatten()
        {
            if !valid_name(name) {
                return Err(ErrView::InvalidInput);
            }
        }
        // Bad input is refused before the journal reads its clock.
        let now = self.now();
        if let Some(rec) = self.eff(&op.id, now)
            && !rec.is_vacant()
        {
            if rec.intent_hash != hash && *rec.intent_hash.as_bytes() != [0; 32] {
                return Err(ErrView::IntentMismatch);
            }
            let view = rec.view().ok_or(ErrView::InvalidState)?;
            return Ok(match &rec.state {
                MState::Running { .. } => AdmissionView::InProgress(view),
                MState::InDoubt { .. } => AdmissionView::InDoubt(view),
                MState::Done(d) if d.retired => AdmissionView::Expired(view),
                MState::Done(d) => AdmissionView::Replay(view, d.result.clone()),
                MState::Vacant { .. } => unreachable!("vacant handled above"),
            });
        }
        self.check_fresh(op, now)?;
        self.materialize(&op.id, now);
        let attempt = self
            .ops
            .get(&op.id)
            .map_or(1, |r| r.attempt.saturating_add(1));
        let lease_until = plus(now, self.cfg.lease);
        self.ops.insert(
            op.id.clone(),
            MOp {
                id: op.id.clone(),
                attempt,
                intent_name: op.intent_name.clone(),
                intent_hash: hash,
                scope: op.scope.clone(),
                session: op.session.clone(),
                base_revision: op.base_revision,
                epoch: None,
                hold_until_ack: self.cfg.scope_lock == ScopeLock::HoldUntilAck,
                submitted_at: now,
                state: MState::Running {
                    lease_until,
                    uncertain_fire: false,
                },
            },
        );
        Ok(AdmissionView::Fresh {
            attempt,
            lease_until,
        })
    }

    fn check_fresh(&self, op: &OpSpec, now: u64) -> Result<(), ErrView> {
        if let Some(scope) = &op.scope {
            if let (Some(base), false) = (op.base_revision, op.allow_stale) {
                let current = self.scope_revision(scope);
                if base < current {
                    return Err(ErrView::StaleBase { current });
                }
            }
            for (id, rec) in &self.ops {
                if id == &op.id || rec.scope.as_deref() != Some(scope.as_str()) {
                    continue;
                }
                if let Some(e) = rec.effective(now)
                    && e.holds_lock()
                {
                    return Err(ErrView::ScopeBusy { holder: id.clone() });
                }
            }
        }
        if let Some(session) = &op.session {
            let live = self.window(session, now);
            if live.len() >= self.cfg.session_window as usize
                && let Some((deadline, oldest)) = live.first()
            {
                return Err(ErrView::WindowFull {
                    oldest: oldest.clone(),
                    frees_at: *deadline,
                });
            }
        }
        Ok(())
    }

    /// The session's unacknowledged, unexpired results: (ack deadline, id), oldest first.
    fn window(&self, session: &str, now: u64) -> Vec<(u64, String)> {
        let mut live: Vec<(u64, String)> = self
            .ops
            .values()
            .filter(|r| r.session.as_deref() == Some(session))
            .filter_map(|r| r.effective(now))
            .filter_map(|r| match &r.state {
                MState::Done(d) if !d.retired && d.delivery.is_open() && d.ack > now => {
                    Some((d.ack, r.id.clone()))
                }
                _ => None,
            })
            .collect();
        live.sort();
        live
    }

    /// Learns the epoch of a claim handed out by `submit` (the model cannot predict it).
    pub fn bind_claim(&mut self, claim: &Claim) {
        if let Some(r) = self.ops.get_mut(claim.operation_id())
            && r.attempt == claim.attempt()
            && r.epoch.is_none()
        {
            r.epoch = Some(claim.epoch());
        }
    }

    fn check_claim(&self, claim: &Claim, now: u64) -> Result<MOp, ErrView> {
        let Some(rec) = self.eff(claim.operation_id(), now) else {
            return Err(ErrView::StaleClaim);
        };
        if rec.epoch != Some(claim.epoch()) {
            return Err(ErrView::StaleClaim);
        }
        match rec.state {
            MState::Running { .. } | MState::InDoubt { .. } => Ok(rec),
            _ => Err(ErrView::StaleClaim),
        }
    }

    fn validate_outcome(&self, o: &OutcomeSpec) -> Result<(), ErrView> {
        if o.bytes.len() as u64 > self.cfg.max_result_bytes {
            return Err(ErrView::ResultTooLarge);
        }
        if o.applied.is_none() && o.message.len() > 16 * 1024 {
            return Err(ErrView::ResultTooLarge);
        }
        if o.assets.len() > 256 || o.assets.iter().any(|a| a.len() > 256) {
            return Err(ErrView::InvalidInput);
        }
        Ok(())
    }

    fn done(&self, now: u64, o: &OutcomeSpec) -> MDone {
        MDone {
            applied: o.applied,
            failure: o.applied.is_none().then(|| o.message.clone()),
            result: o.result(),
            completed_at: now,
            ack: plus(now, self.cfg.ack_timeout),
            retain: plus(now, self.cfg.result_retention),
            purge: plus(now, self.cfg.audit_retention),
            retired: false,
            delivery: DeliveryState::Pending,
            count: 0,
            next_due: plus(now, self.cfg.retry.initial_backoff),
            final_attempt: false,
            acknowledged_at: None,
        }
    }

    /// `complete`.
    pub fn complete(&mut self, claim: &Claim, o: &OutcomeSpec) -> Expect<ReceiptView> {
        let now = self.now();
        let rec = self.check_claim(claim, now)?;
        self.validate_outcome(o)?;
        if let (Some(rev), Some(scope)) = (o.applied, &rec.scope) {
            let current = self.scope_revision(scope);
            if rev <= current {
                return Err(ErrView::RevisionNotForward { current });
            }
            self.scopes.insert(scope.clone(), rev);
        }
        let mut rec = rec;
        rec.state = MState::Done(Box::new(self.done(now, o)));
        let view = rec.view().ok_or(ErrView::InvalidState)?;
        self.ops.insert(rec.id.clone(), rec);
        Ok(view)
    }

    /// `release`.
    pub fn release(&mut self, claim: &Claim) -> Expect<()> {
        let now = self.now();
        let mut rec = self.check_claim(claim, now)?;
        rec.state = MState::Vacant {
            purge_at: plus(now, self.cfg.audit_retention),
        };
        self.ops.insert(rec.id.clone(), rec);
        Ok(())
    }

    /// `extend_lease_by`; answers the new lease expiry.
    pub fn extend_lease(&mut self, claim: &Claim, by: Duration) -> Expect<u64> {
        if by.is_zero() {
            return Err(ErrView::InvalidInput);
        }
        let now = self.now();
        let mut rec = self.check_claim(claim, now)?;
        if let MState::InDoubt { lease_until, .. } = rec.state {
            return Err(ErrView::LeaseExpired {
                expired_at: lease_until,
            });
        }
        let lease_until = plus(now, by);
        rec.state = MState::Running {
            lease_until,
            uncertain_fire: false,
        };
        self.ops.insert(rec.id.clone(), rec);
        Ok(lease_until)
    }

    /// The session `id` was submitted with, if the model knows the id.
    pub fn session_of(&self, id: &str) -> Option<String> {
        self.ops.get(id).and_then(|r| r.session.clone())
    }

    fn known(&mut self, id: &str, now: u64) -> Result<MOp, ErrView> {
        self.ids.insert(id.to_string());
        match self.eff(id, now) {
            Some(r) if !r.is_vacant() => Ok(r),
            _ => Err(ErrView::UnknownOperation),
        }
    }

    /// `resolve`.
    pub fn resolve(&mut self, id: &str, res: &ResolutionSpec) -> Expect<Option<ReceiptView>> {
        let now = self.now();
        let mut rec = self.known(id, now)?;
        if !matches!(rec.state, MState::InDoubt { .. }) {
            return Err(ErrView::InvalidState);
        }
        match res {
            ResolutionSpec::NotApplied => {
                rec.state = MState::Vacant {
                    purge_at: plus(now, self.cfg.audit_retention),
                };
                self.ops.insert(id.to_string(), rec);
                Ok(None)
            }
            ResolutionSpec::Completed(o) => {
                self.validate_outcome(o)?;
                if let (Some(rev), Some(scope)) = (o.applied, &rec.scope)
                    && rev > self.scope_revision(scope)
                {
                    self.scopes.insert(scope.clone(), rev);
                }
                rec.state = MState::Done(Box::new(self.done(now, o)));
                let view = rec.view();
                self.ops.insert(id.to_string(), rec);
                Ok(view)
            }
        }
    }

    /// `delivered`.
    pub fn delivered(&mut self, id: &str) -> Expect<ReceiptView> {
        let now = self.now();
        let mut rec = self.known(id, now)?;
        let epoch = rec.epoch;
        let MState::Done(d) = &mut rec.state else {
            return Err(ErrView::InvalidState);
        };
        if d.retired {
            return Err(ErrView::InvalidState);
        }
        let count = d.count.saturating_add(1);
        if matches!(
            d.delivery,
            DeliveryState::Pending | DeliveryState::Delivered
        ) {
            // The last permitted delivery spends the budget: exhausted as of now. Further
            // deliveries (replays a client asked for) change nothing.
            if !d.final_attempt {
                let cap = backoff(&self.cfg.retry, count);
                if count >= self.cfg.retry.attempts {
                    d.next_due = now;
                    d.final_attempt = true;
                } else {
                    // Unknown epoch: the due time is unknown too (views then skip it).
                    d.next_due = now.saturating_add(epoch.map_or(0, |e| jitter(id, e, count, cap)));
                }
            }
            d.delivery = DeliveryState::Delivered;
        }
        d.count = count;
        let view = rec.view().ok_or(ErrView::InvalidState)?;
        self.ops.insert(id.to_string(), rec);
        Ok(view)
    }

    /// `acknowledge` by `session`: only the session an operation was submitted with
    /// acknowledges it (any caller, for an operation submitted without one).
    pub fn acknowledge(&mut self, id: &str, session: Option<&str>) -> Expect<ReceiptView> {
        let now = self.now();
        let mut rec = self.known(id, now)?;
        if let Some(owner) = &rec.session
            && session != Some(owner.as_str())
        {
            return Err(ErrView::NotOwner);
        }
        let MState::Done(d) = &mut rec.state else {
            return Err(ErrView::InvalidState);
        };
        if d.delivery != DeliveryState::Acknowledged {
            d.delivery = DeliveryState::Acknowledged;
            d.acknowledged_at = Some(now);
        }
        let view = rec.view().ok_or(ErrView::InvalidState)?;
        self.ops.insert(id.to_string(), rec);
        Ok(view)
    }

    /// `advance_revision`.
    pub fn advance_revision(&mut self, scope: &str, revision: u64) -> Expect<u64> {
        let _ = self.now();
        if !valid_name(scope) {
            return Err(ErrView::InvalidInput);
        }
        let current = self.scope_revision(scope);
        if revision < current {
            return Err(ErrView::RevisionNotForward { current });
        }
        if revision > current {
            self.scopes.insert(scope.to_string(), revision);
        }
        Ok(revision)
    }

    /// A successful `compact()`: every due transition is recorded.
    pub fn compacted(&mut self) {
        let now = self.now();
        let ids: Vec<String> = self.ops.keys().cloned().collect();
        for id in ids {
            self.materialize(&id, now);
        }
    }

    /// A `compact()` that failed: some of its batches may have landed. Only the cause of a
    /// later in-doubt state is observable (lease timeout rather than reopen).
    pub fn compaction_uncertain(&mut self) {
        let now = self.now();
        for r in self.ops.values_mut() {
            if let MState::Running {
                lease_until,
                uncertain_fire,
            } = &mut r.state
                && now >= *lease_until
            {
                *uncertain_fire = true;
            }
        }
    }

    /// The journal was reopened: every operation still `Running` lost its claim holder.
    pub fn reopened(&mut self) {
        for r in self.ops.values_mut() {
            if let MState::Running {
                lease_until,
                uncertain_fire,
            } = r.state
            {
                r.state = MState::InDoubt {
                    cause: InDoubtCause::Reopened,
                    alt: uncertain_fire.then_some(InDoubtCause::LeaseTimeout),
                    lease_until,
                };
            }
        }
    }

    /// Sets the shared clock to at least the highest time read so far, so that the reopened
    /// journal (whose persisted high-water mark may be older than its last reads) judges
    /// the clocks as this model does.
    pub fn before_reopen(&mut self) {
        let t = self.now();
        if opjournal::Clock::now(&self.clock).as_millis() < t {
            self.clock.set(Timestamp::from_millis(t));
        }
    }

    // ---- reads ----

    /// `result(id)`.
    pub fn result(&mut self, id: &str) -> Option<OpResult> {
        let now = self.now();
        self.eff(id, now).and_then(|r| r.result())
    }

    /// `in_doubt()`: the ids, sorted.
    pub fn in_doubt(&mut self) -> Vec<String> {
        let now = self.now();
        self.ops
            .values()
            .filter_map(|r| r.effective(now))
            .filter(|r| matches!(r.state, MState::InDoubt { .. }))
            .map(|r| r.id)
            .collect()
    }

    /// `undelivered(session)`: the ids in order (unacknowledged, unexpired results whose
    /// retry budget is not spent).
    pub fn undelivered(&mut self, session: &str) -> Vec<String> {
        let now = self.now();
        self.window(session, now)
            .into_iter()
            .filter(|(_, id)| {
                self.eff(id, now).is_some_and(|r| {
                    matches!(&r.state, MState::Done(d)
                        if matches!(d.delivery, DeliveryState::Pending | DeliveryState::Delivered))
                })
            })
            .map(|(_, id)| id)
            .collect()
    }

    /// `due_redeliveries(limit)`: the ids in order (earliest due first). `None` when the
    /// order depends on a due time the model does not know.
    pub fn due_redeliveries(&mut self, limit: usize) -> Option<Vec<String>> {
        let now = self.now();
        let mut due = Vec::new();
        for r in self.ops.values() {
            let Some(e) = r.effective(now) else { continue };
            if let MState::Done(d) = &e.state
                && matches!(
                    d.delivery,
                    DeliveryState::Pending | DeliveryState::Delivered
                )
                && !d.final_attempt
                && !d.retired
            {
                if e.epoch.is_none() && d.count > 0 {
                    return None;
                }
                if d.next_due <= now {
                    due.push((d.next_due, e.id.clone()));
                }
            }
        }
        due.sort();
        due.truncate(limit);
        Some(due.into_iter().map(|(_, id)| id).collect())
    }

    /// Adopts what the model could not know from the journal, once the journal matched
    /// this model: epochs of submits whose answer was lost, and which of two possible
    /// in-doubt causes a failed compaction left.
    pub fn learn_epochs(&mut self, journal: &Journal) -> Result<(), String> {
        let settle: Vec<String> = self
            .ops
            .iter()
            .filter(|(_, r)| matches!(r.state, MState::InDoubt { alt: Some(_), .. }))
            .map(|(id, _)| id.clone())
            .collect();
        for id in settle {
            let actual = journal
                .lookup(&id)
                .map_err(|e| format!("lookup `{id}`: {e}"))?;
            if let Some(r) = self.ops.get_mut(&id)
                && let MState::InDoubt { cause, alt, .. } = &mut r.state
            {
                if let Some(c) = actual.and_then(|a| a.in_doubt_cause) {
                    *cause = c;
                }
                *alt = None;
            }
        }
        let ids: Vec<String> = self
            .ops
            .iter()
            .filter(|(_, r)| r.epoch.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            let actual = journal
                .lookup(&id)
                .map_err(|e| format!("lookup `{id}`: {e}"))?;
            if let (Some(a), Some(r)) = (actual, self.ops.get_mut(&id))
                && a.attempt == r.attempt
            {
                r.epoch = Some(a.epoch);
                // A delivery recorded while the epoch was unknown used a guessed due time.
                if let MState::Done(d) = &mut r.state
                    && let Some(t) = a.next_delivery_at
                {
                    d.next_due = t.as_millis();
                }
            }
        }
        Ok(())
    }

    /// Compares every observable state of `journal` with the model: each id's receipt and
    /// result, each scope's revision, each session's undelivered results, the in-doubt
    /// list and the due redeliveries. Returns a description of every difference.
    pub fn check_against(&mut self, journal: &Journal) -> Result<(), String> {
        let mut diffs = String::new();
        let now = self.now();
        let ids: Vec<String> = self.ids.iter().cloned().collect();
        for id in &ids {
            let expected = self.eff(id, now).map(|r| r.views()).unwrap_or_default();
            let actual = match journal.lookup(id) {
                Ok(a) => a.map(|r| ReceiptView::of(&r)),
                Err(e) => {
                    let _ = writeln!(diffs, "lookup `{id}` failed: {e}");
                    continue;
                }
            };
            let ok = match &actual {
                None => expected.is_empty(),
                Some(a) => expected.iter().any(|e| e.admits(a)),
            };
            if !ok {
                let _ = writeln!(
                    diffs,
                    "receipt `{id}`:\n  expected {expected:?}\n  actual   {actual:?}"
                );
            }
            let er = self.eff(id, now).and_then(|r| r.result());
            match journal.result(id) {
                Ok(ar) if ar == er => {}
                Ok(ar) => {
                    let _ = writeln!(diffs, "result `{id}`: expected {er:?}, actual {ar:?}");
                }
                Err(e) => {
                    let _ = writeln!(diffs, "result `{id}` failed: {e}");
                }
            }
        }
        let scopes: Vec<(String, u64)> = self.scopes.iter().map(|(s, r)| (s.clone(), *r)).collect();
        for (scope, rev) in scopes {
            match journal.scope_revision(&scope) {
                Ok(a) if a == rev => {}
                Ok(a) => {
                    let _ = writeln!(
                        diffs,
                        "scope `{scope}`: expected revision {rev}, actual {a}"
                    );
                }
                Err(e) => {
                    let _ = writeln!(diffs, "scope `{scope}` failed: {e}");
                }
            }
        }
        let sessions: Vec<String> = self.sessions.iter().cloned().collect();
        for session in sessions {
            let expected = self.undelivered(&session);
            match journal.undelivered(&session) {
                Ok(a) => {
                    let actual: Vec<String> =
                        a.iter().map(|r| r.receipt.operation_id.clone()).collect();
                    if actual != expected {
                        let _ = writeln!(
                            diffs,
                            "undelivered `{session}`: expected {expected:?}, actual {actual:?}"
                        );
                    }
                    if a.iter().any(|r| !r.replayed) {
                        let _ = writeln!(diffs, "undelivered `{session}`: not marked as replay");
                    }
                }
                Err(e) => {
                    let _ = writeln!(diffs, "undelivered `{session}` failed: {e}");
                }
            }
        }
        let expected = self.in_doubt();
        match journal.in_doubt() {
            Ok(a) => {
                let mut actual: Vec<String> = a.iter().map(|r| r.operation_id.clone()).collect();
                let sorted_by_lease = a.windows(2).all(|w| w[0].lease_until <= w[1].lease_until);
                actual.sort();
                if actual != expected || !sorted_by_lease {
                    let _ = writeln!(
                        diffs,
                        "in_doubt: expected {expected:?}, actual {actual:?} (sorted by lease: {sorted_by_lease})"
                    );
                }
            }
            Err(e) => {
                let _ = writeln!(diffs, "in_doubt failed: {e}");
            }
        }
        if let Some(expected) = self.due_redeliveries(16) {
            match journal.due_redeliveries(16) {
                Ok(a) => {
                    let actual: Vec<String> =
                        a.iter().map(|r| r.receipt.operation_id.clone()).collect();
                    if actual != expected {
                        let _ = writeln!(
                            diffs,
                            "due_redeliveries: expected {expected:?}, actual {actual:?}"
                        );
                    }
                }
                Err(e) => {
                    let _ = writeln!(diffs, "due_redeliveries failed: {e}");
                }
            }
        }
        if diffs.is_empty() { Ok(()) } else { Err(diffs) }
    }

    /// Runs `call` against `journal` and the model, compares the answers, and returns what
    /// happened. A storage failure leaves the model unchanged and is reported as
    /// [`StepResult::Failed`] (the caller decides what the outcome may be).
    pub fn step(&mut self, journal: &Journal, call: &Call) -> Result<StepResult, String> {
        let before = self.clone();
        let lazy = matches!(call, Call::Delivered(_) | Call::Acknowledge(..));
        macro_rules! compare {
            ($expected:expr, $actual:expr, $same:expr) => {{
                let expected = $expected;
                let actual = $actual;
                if let Err(e) = &actual
                    && e.is_failure()
                {
                    let after = std::mem::replace(self, before);
                    return Ok(StepResult::Failed {
                        error: e.clone(),
                        after: Box::new(after),
                    });
                }
                if !admits(&expected, &actual, $same) {
                    let model_now = self.hw;
                    *self = before;
                    return Err(format!(
                        "{call:?} (journal time {}, model time {model_now}):\n  expected {expected:?}\n  actual   {actual:?}",
                        journal.now().as_millis()
                    ));
                }
                if actual.is_err() {
                    // A refusal writes nothing: the model must not have moved either.
                    let moved = self.ops != before.ops || self.scopes != before.scopes;
                    if moved {
                        return Err(format!("model moved on a refusal of {call:?}"));
                    }
                }
                (actual.is_err(), actual)
            }};
        }
        match call {
            Call::Submit(op) => {
                let actual = journal.submit(op.operation());
                let claim = match &actual {
                    Ok(Admission::Fresh(c)) => Some(c.clone()),
                    _ => None,
                };
                let view = actual.as_ref().map(AdmissionView::of).map_err(ErrView::of);
                let expected = self.submit(op);
                let (refused, _) =
                    compare!(expected, view, |e: &AdmissionView, a: &AdmissionView| e
                        .admits(a));
                if let Some(c) = &claim {
                    self.bind_claim(c);
                }
                // Only fresh work writes; a known id is answered from a read snapshot, which
                // makes nothing durable (lazily durable calls before it stay lazy).
                Ok(StepResult::Done {
                    durable: claim.is_some(),
                    claim,
                    refused,
                })
            }
            Call::Complete(claim, o) => {
                let actual = journal
                    .complete(claim, o.outcome())
                    .map(|r| ReceiptView::of(&r))
                    .map_err(|e| ErrView::of(&e));
                let expected = self.complete(claim, o);
                let (refused, _) =
                    compare!(expected, actual, |e: &ReceiptView, a: &ReceiptView| e
                        .admits(a));
                Ok(StepResult::Done {
                    claim: None,
                    durable: true,
                    refused,
                })
            }
            Call::Release(claim) => {
                let actual = journal.release(claim).map_err(|e| ErrView::of(&e));
                let expected = self.release(claim);
                let (refused, _) = compare!(expected, actual, |_: &(), _: &()| true);
                Ok(StepResult::Done {
                    claim: None,
                    durable: true,
                    refused,
                })
            }
            Call::ExtendLease(claim, by) => {
                let actual = journal.extend_lease_by(claim, *by);
                let new_claim = actual.as_ref().ok().cloned();
                let actual = actual
                    .map(|c| c.lease_until().as_millis())
                    .map_err(|e| ErrView::of(&e));
                let expected = self.extend_lease(claim, *by);
                let (refused, _) = compare!(expected, actual, |e: &u64, a: &u64| e == a);
                Ok(StepResult::Done {
                    claim: new_claim,
                    durable: true,
                    refused,
                })
            }
            Call::Resolve(id, res) => {
                let actual = journal
                    .resolve(id, res.resolution())
                    .map(|r| r.map(|r| ReceiptView::of(&r)))
                    .map_err(|e| ErrView::of(&e));
                let expected = self.resolve(id, res);
                let (refused, _) = compare!(
                    expected,
                    actual,
                    |e: &Option<ReceiptView>, a: &Option<ReceiptView>| match (e, a) {
                        (Some(e), Some(a)) => e.admits(a),
                        (None, None) => true,
                        _ => false,
                    }
                );
                Ok(StepResult::Done {
                    claim: None,
                    durable: true,
                    refused,
                })
            }
            Call::Delivered(id) => {
                let actual = journal
                    .delivered(id)
                    .map(|r| ReceiptView::of(&r))
                    .map_err(|e| ErrView::of(&e));
                let expected = self.delivered(id);
                let (refused, actual) =
                    compare!(expected, actual, |e: &ReceiptView, a: &ReceiptView| e
                        .admits(a));
                if let Ok(a) = &actual
                    && let Some(r) = self.ops.get_mut(id.as_str())
                    && r.epoch.is_none()
                    && let MState::Done(d) = &mut r.state
                    && let Some(t) = a.next_delivery_at
                {
                    d.next_due = t;
                }
                Ok(StepResult::Done {
                    claim: None,
                    durable: !lazy,
                    refused,
                })
            }
            Call::Acknowledge(id, session) => {
                let actual = journal
                    .acknowledge(id, session.as_deref())
                    .map(|r| ReceiptView::of(&r))
                    .map_err(|e| ErrView::of(&e));
                let expected = self.acknowledge(id, session.as_deref());
                let (refused, _) =
                    compare!(expected, actual, |e: &ReceiptView, a: &ReceiptView| e
                        .admits(a));
                Ok(StepResult::Done {
                    claim: None,
                    durable: !lazy,
                    refused,
                })
            }
            Call::AdvanceRevision(scope, rev) => {
                let actual = journal
                    .advance_revision(scope, *rev)
                    .map_err(|e| ErrView::of(&e));
                let expected = self.advance_revision(scope, *rev);
                let (refused, _) = compare!(expected, actual, |e: &u64, a: &u64| e == a);
                Ok(StepResult::Done {
                    claim: None,
                    durable: true,
                    refused,
                })
            }
            Call::Compact => match journal.compact() {
                Ok(_) => {
                    // Compaction first commits the pending lazy writes, then fires every
                    // due timer in durable batches.
                    self.compacted();
                    Ok(StepResult::Done {
                        claim: None,
                        durable: true,
                        refused: false,
                    })
                }
                Err(e) => {
                    let error = ErrView::of(&e);
                    if !error.is_failure() {
                        return Err(format!("compact refused: {e}"));
                    }
                    self.compaction_uncertain();
                    let mut after = self.clone();
                    after.compacted();
                    Ok(StepResult::Failed {
                        error,
                        after: Box::new(after),
                    })
                }
            },
            Call::Flush => {
                let r = journal.flush();
                // Flushing reads the clock only when lazy writes are pending; read it on
                // both sides so the model's time stays the journal's either way.
                let _ = journal.now();
                self.now();
                match r {
                    Ok(()) => Ok(StepResult::Done {
                        claim: None,
                        durable: true,
                        refused: false,
                    }),
                    Err(e) => Ok(StepResult::Failed {
                        error: ErrView::of(&e),
                        after: Box::new(self.clone()),
                    }),
                }
            }
            Call::Lookup(id) => {
                self.ids.insert(id.clone());
                let actual = journal.lookup(id);
                let now = self.now();
                let expected = self.eff(id, now).map(|r| r.views()).unwrap_or_default();
                match actual {
                    Err(e) => {
                        let error = ErrView::of(&e);
                        if error.is_failure() {
                            return Ok(StepResult::Failed {
                                error,
                                after: Box::new(self.clone()),
                            });
                        }
                        Err(format!("lookup `{id}` refused: {e}"))
                    }
                    Ok(a) => {
                        let a = a.map(|r| ReceiptView::of(&r));
                        let ok = match &a {
                            None => expected.is_empty(),
                            Some(a) => expected.iter().any(|e| e.admits(a)),
                        };
                        if ok {
                            Ok(StepResult::Done {
                                claim: None,
                                durable: false,
                                refused: false,
                            })
                        } else {
                            Err(format!(
                                "lookup `{id}`:\n  expected {expected:?}\n  actual   {a:?}"
                            ))
                        }
                    }
                }
            }
        }
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= opjournal::MAX_NAME_BYTES && !s.chars().any(char::is_control)
}

/// One journal call, for [`Model::step`].
#[derive(Clone, Debug)]
pub enum Call {
    /// `submit`.
    Submit(OpSpec),
    /// `complete`.
    Complete(Claim, OutcomeSpec),
    /// `release`.
    Release(Claim),
    /// `extend_lease_by`.
    ExtendLease(Claim, Duration),
    /// `resolve`.
    Resolve(String, ResolutionSpec),
    /// `delivered`.
    Delivered(String),
    /// `acknowledge` by a session (`None`: a caller without one).
    Acknowledge(String, Option<String>),
    /// `advance_revision`.
    AdvanceRevision(String, u64),
    /// `compact`.
    Compact,
    /// `flush`.
    Flush,
    /// `lookup` (compared on the spot).
    Lookup(String),
}

/// What [`Model::step`] observed.
#[derive(Debug)]
pub enum StepResult {
    /// The journal answered as the model predicted (a value or a refusal).
    Done {
        /// A claim handed out (`Fresh`) or renewed (`extend_lease`).
        claim: Option<Claim>,
        /// Whether an `Ok` here must survive any crash (false for lazily durable calls).
        durable: bool,
        /// Whether the journal refused, as predicted (nothing was written).
        refused: bool,
    },
    /// A storage failure: the call may or may not have landed. The model is left as if it
    /// did not; `after` is the model as if it did.
    Failed {
        /// The error.
        error: ErrView,
        /// The model had the call landed.
        after: Box<Model>,
    },
}

// ---------------------------------------------------------------------------------------
// Recovery: which states a crash may leave.
// ---------------------------------------------------------------------------------------

/// The states a reopened journal may legitimately show, oldest first: the last state known
/// durable, then each later state that may have landed (lazily durable calls, a call that
/// failed with an I/O error). Commits are ordered, so a recovered journal shows one of
/// these states (a prefix of the history), never a mix.
#[derive(Clone, Debug)]
pub struct Recovery {
    candidates: Vec<Model>,
}

impl Recovery {
    /// Starts from a state known durable.
    pub fn new(durable: &Model) -> Recovery {
        Recovery {
            candidates: vec![durable.clone()],
        }
    }

    /// A call that writes returned `Ok`: its batch committed durably, with every lazy write
    /// before it, so every earlier state is superseded.
    pub fn durable(&mut self, m: &Model) {
        self.candidates.clear();
        self.candidates.push(m.clone());
    }

    /// The journal was closed cleanly (dropping it commits the lazy writes): only the
    /// newest state is possible.
    pub fn closed_cleanly(&mut self) {
        let keep = self.candidates.len().saturating_sub(1);
        self.candidates.drain(..keep);
    }

    /// A call returned `Ok` but may be lost to a crash, or failed and may have landed.
    pub fn maybe(&mut self, m: &Model) {
        if self.candidates.last() != Some(m) {
            self.candidates.push(m.clone());
        }
    }

    /// Applies `f` to every possible state (for example [`Model::compaction_uncertain`]
    /// after a compaction failed part way: its earlier batches are durable).
    pub fn update_all(&mut self, mut f: impl FnMut(&mut Model)) {
        for m in &mut self.candidates {
            f(m);
        }
    }

    /// How many states are possible.
    pub fn len(&self) -> usize {
        self.candidates.len()
    }

    /// Whether no state is possible (never: there is always a durable base).
    pub fn is_empty(&self) -> bool {
        self.candidates.is_empty()
    }

    /// After a reopen: finds the candidate the journal equals (newest first), applies the
    /// reopen (Running → InDoubt) and returns it with how many later candidates were lost.
    /// `Err` describes the differences from every candidate.
    pub fn recover(&self, journal: &Journal) -> Result<(Model, usize), String> {
        let mut report = String::new();
        for (i, c) in self.candidates.iter().enumerate().rev() {
            let mut m = c.clone();
            m.reopened();
            // Ids named in any candidate are looked at in every one.
            for other in &self.candidates {
                m.ids.extend(other.ids.iter().cloned());
                m.sessions.extend(other.sessions.iter().cloned());
                m.hw = m.hw.max(other.hw);
            }
            match m.check_against(journal) {
                Ok(()) => {
                    m.learn_epochs(journal)?;
                    return Ok((m, self.candidates.len() - 1 - i));
                }
                Err(d) => {
                    let _ = writeln!(
                        report,
                        "-- candidate {i} of {}:\n{d}",
                        self.candidates.len()
                    );
                }
            }
        }
        Err(report)
    }
}
