//! The stored records: the file's own types, apart from the API's (`types.rs`), so that
//! an API change never changes the file by accident. Their encoding (`src/codec.rs`) is
//! the file format (docs/format.md): the order of fields and of enum variants must not
//! change without a format version bump, and the golden-bytes test (tests/format.rs)
//! guards it.
//! The API's types are converted from and to these at the edge (`convert`).

mod convert;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;

/// One entry of the event journal, the file's source of truth. `H` is how the intent hash
/// is stored: [`IntentDigest`] (with its scheme) since format 2, a bare [`Digest`] in
/// format 1 (read as it is, see [`Event::from_v1`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Event<H = IntentDigest> {
    /// Position in the journal; unique, increasing, never reused.
    pub seq: u64,
    /// When it was recorded (the journal's clock).
    pub at: Timestamp,
    /// The operation it belongs to (`None` for scope events).
    pub operation_id: Option<String>,
    /// What happened.
    pub kind: EventKind<H>,
}

/// What an event records. Every index (receipts, scopes, timers, windows) is a function of
/// these, which is what `repair` relies on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum EventKind<H = IntentDigest> {
    /// Fresh work was accepted and claimed. The claim's epoch is this event's `seq`.
    Submitted {
        /// 1 for the first attempt; +1 after each release or not-applied resolution.
        attempt: u32,
        /// The intent's name.
        intent_name: String,
        /// The intent hash.
        intent_hash: H,
        /// The scope mutated, if any.
        scope: Option<String>,
        /// The client session, if any.
        session: Option<String>,
        /// The revision the client saw, if given.
        base_revision: Option<u64>,
        /// When the execution lease expires.
        lease_until: Timestamp,
        /// Whether the scope lock is held until acknowledgement (hold-until-ack).
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
        intent_hash: H,
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
    /// retention passed: the payload is gone (lost to damage, not aged out), the outcome and
    /// audit record are kept, and the operation answers expired. Variant 14, written only by
    /// `repair`; a build older than this variant reads it as a damaged record.
    ResultLost,
}

impl<H> EventKind<H> {
    /// A short lowercase name (`submitted`, `completed`, ...), as shown by the CLI.
    pub(crate) fn name(&self) -> &'static str {
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
pub(crate) enum OutcomeKind {
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
pub(crate) enum InDoubtCause {
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
pub(crate) enum ResolvedAs {
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
pub(crate) enum RevisionCause {
    /// The embedder reported a change made outside the journal.
    External,
    /// Compaction purged the operation that established the scope's revision and kept the
    /// revision with this event.
    Checkpoint,
}

/// Size and checksum of a stored result payload.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ResultInfo {
    /// Payload bytes.
    pub len: u64,
    /// CRC-32 of the payload bytes.
    pub crc32: u32,
    /// Number of changed assets listed with it.
    pub assets: u32,
}

/// The deadlines a terminal outcome starts, fixed when it is recorded.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Deadlines {
    /// When an unacknowledged result's acknowledgement expires.
    pub ack: Timestamp,
    /// When the result payload is retired.
    pub retain: Timestamp,
    /// When the audit record is purged.
    pub purge: Timestamp,
    /// When a never-delivered result first counts as due for a push.
    pub first_push: Timestamp,
}

/// The delivery axis, as stored (see the public `DeliveryState`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) enum DeliveryState {
    Pending,
    Delivered,
    Acknowledged,
    Exhausted,
    AckExpired,
}

impl DeliveryState {
    pub(crate) fn name(self) -> &'static str {
        crate::types::DeliveryState::from(self).name()
    }

    pub(crate) fn is_open(self) -> bool {
        crate::types::DeliveryState::from(self).is_open()
    }
}

/// A SHA-256 digest as format 1 stored it: 32 bytes, under the first hash scheme.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct Digest(pub [u8; 32]);

/// An intent hash as stored since format 2: the scheme that computed it, then the 32
/// digest bytes. A retry is matched under the recorded scheme, so an operation recorded
/// before a scheme change still matches its retry.
///
/// Encoded as one byte string of 33 bytes (scheme, then digest): a byte string decodes
/// in one copy, where a fixed array decodes element by element (a third of a receipt's
/// decoding time).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct IntentDigest {
    pub scheme: u8,
    pub bytes: [u8; 32],
}

impl Serialize for IntentDigest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut out = [0u8; 33];
        out[0] = self.scheme;
        out[1..].copy_from_slice(&self.bytes);
        s.serialize_bytes(&out)
    }
}

impl<'de> Deserialize<'de> for IntentDigest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = IntentDigest;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("33 bytes: a hash scheme and a SHA-256 digest")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<IntentDigest, E> {
                let Some((&scheme, digest)) = v.split_first() else {
                    return Err(E::invalid_length(0, &self));
                };
                let bytes: [u8; 32] = digest
                    .try_into()
                    .map_err(|_| E::invalid_length(v.len(), &self))?;
                Ok(IntentDigest { scheme, bytes })
            }
        }
        d.deserialize_bytes(Visitor)
    }
}

impl IntentDigest {
    /// The scheme of format 1's hashes (and of every hash `repair` could not recover).
    pub(crate) const LEGACY: u8 = 1;
    /// RFC 8785 (JCS) canonical JSON, the scheme of new hashes since format 2.
    pub(crate) const JCS: u8 = 2;

    /// A format 1 digest: computed under the first scheme.
    pub(crate) fn legacy(d: Digest) -> IntentDigest {
        IntentDigest {
            scheme: IntentDigest::LEGACY,
            bytes: d.0,
        }
    }

    /// The hash `repair` records when an operation's intent was lost: all zeros, which
    /// any retry matches (and is answered in doubt).
    pub(crate) const LOST: IntentDigest = IntentDigest {
        scheme: IntentDigest::LEGACY,
        bytes: [0; 32],
    };

    pub(crate) fn is_lost(&self) -> bool {
        self.bytes == [0; 32]
    }
}

impl<H> Event<H> {
    /// The same event with its intent hash stored as `f` makes it.
    pub(crate) fn map_hash<G>(self, f: impl Fn(H) -> G) -> Event<G> {
        Event {
            seq: self.seq,
            at: self.at,
            operation_id: self.operation_id,
            kind: self.kind.map_hash(f),
        }
    }
}

impl Event {
    /// A format 1 event, as this format holds it.
    pub(crate) fn from_v1(e: Event<Digest>) -> Event {
        e.map_hash(IntentDigest::legacy)
    }
}

impl<H> EventKind<H> {
    /// The same kind with its intent hash (if any) stored as `f` makes it.
    pub(crate) fn map_hash<G>(self, f: impl Fn(H) -> G) -> EventKind<G> {
        match self {
            EventKind::Submitted {
                attempt,
                intent_name,
                intent_hash,
                scope,
                session,
                base_revision,
                lease_until,
                hold_until_ack,
            } => EventKind::Submitted {
                attempt,
                intent_name,
                intent_hash: f(intent_hash),
                scope,
                session,
                base_revision,
                lease_until,
                hold_until_ack,
            },
            EventKind::Salvaged {
                attempt,
                intent_name,
                intent_hash,
                scope,
                session,
                lost_events,
            } => EventKind::Salvaged {
                attempt,
                intent_name,
                intent_hash: f(intent_hash),
                scope,
                session,
                lost_events,
            },
            EventKind::LeaseExtended { epoch, lease_until } => {
                EventKind::LeaseExtended { epoch, lease_until }
            }
            EventKind::Completed {
                epoch,
                outcome,
                result,
                deadlines,
            } => EventKind::Completed {
                epoch,
                outcome,
                result,
                deadlines,
            },
            EventKind::Released { epoch, purge_at } => EventKind::Released { epoch, purge_at },
            EventKind::LeaseExpired { epoch, cause } => EventKind::LeaseExpired { epoch, cause },
            EventKind::Resolved { resolution } => EventKind::Resolved { resolution },
            EventKind::Delivered {
                count,
                next_due,
                final_attempt,
            } => EventKind::Delivered {
                count,
                next_due,
                final_attempt,
            },
            EventKind::Acknowledged { late } => EventKind::Acknowledged { late },
            EventKind::AckExpired => EventKind::AckExpired,
            EventKind::Exhausted => EventKind::Exhausted,
            EventKind::Retired => EventKind::Retired,
            EventKind::RevisionAdvanced {
                scope,
                revision,
                cause,
                purge_at,
            } => EventKind::RevisionAdvanced {
                scope,
                revision,
                cause,
                purge_at,
            },
            EventKind::FormatUpgraded { from, to } => EventKind::FormatUpgraded { from, to },
            EventKind::ResultLost => EventKind::ResultLost,
        }
    }
}

// ---- derived records (indexes that `repair` rebuilds from the events) ----

/// The receipt row: a fold of the operation's events. `H` as for [`Event`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ReceiptRecord<H = IntentDigest> {
    pub operation_id: String,
    pub attempt: u32,
    pub intent_name: String,
    pub intent_hash: H,
    pub scope: Option<String>,
    pub session: Option<String>,
    pub base_revision: Option<u64>,
    pub epoch: u64,
    pub hold_until_ack: bool,
    pub submitted_at: Timestamp,
    pub state: ExecRecord,
}

impl ReceiptRecord {
    /// A format 1 receipt, as this format holds it.
    pub(crate) fn from_v1(r: ReceiptRecord<Digest>) -> ReceiptRecord {
        ReceiptRecord {
            operation_id: r.operation_id,
            attempt: r.attempt,
            intent_name: r.intent_name,
            intent_hash: IntentDigest::legacy(r.intent_hash),
            scope: r.scope,
            session: r.session,
            base_revision: r.base_revision,
            epoch: r.epoch,
            hold_until_ack: r.hold_until_ack,
            submitted_at: r.submitted_at,
            state: r.state,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ExecRecord {
    Running {
        lease_until: Timestamp,
    },
    InDoubt {
        since: Timestamp,
        cause: InDoubtCause,
        lease_until: Timestamp,
    },
    Done(DoneRecord),
    /// Released or resolved as not applied: answers as unknown, keeps the attempt count
    /// and the history until `purge_at`.
    Vacant {
        since: Timestamp,
        purge_at: Timestamp,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DoneRecord {
    pub outcome: OutcomeKind,
    pub completed_at: Timestamp,
    /// The claim epoch that completed it; `None` if it was resolved.
    pub completed_by: Option<u64>,
    /// Key of the payload in `results`; `None` once retired.
    pub result_seq: Option<u64>,
    pub result: ResultInfo,
    pub deadlines: Deadlines,
    pub retired_at: Option<Timestamp>,
    pub delivery: DeliveryRecord,
    /// Why the result was dropped, once retired. Stored as an optional trailer: the last
    /// bytes of a receipt payload, written only for [`RetireCause::Damage`] (so every other
    /// receipt encodes as before this field existed) and read by [`ReceiptRecord::decode`].
    #[serde(skip_deserializing, skip_serializing_if = "RetireCause::is_retention")]
    pub retire_cause: RetireCause,
}

/// Why a terminal operation's result payload was dropped.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum RetireCause {
    /// Its retention passed (an `Retired` event). Never written: it is the absence of the
    /// receipt's trailer.
    #[default]
    Retention,
    /// `repair` found the payload damaged or missing (a `ResultLost` event).
    Damage,
}

impl RetireCause {
    pub(crate) fn is_retention(&self) -> bool {
        *self == RetireCause::Retention
    }
}

impl ReceiptRecord {
    /// Decodes a receipt payload of format 2 or later: the record, then the optional
    /// trailer ([`DoneRecord::retire_cause`]), which only a receipt retired by damage has.
    /// A trailer anywhere else, or one that says `Retention` (never written), is refused, so
    /// every receipt has one encoding.
    pub(crate) fn decode(
        version: u8,
        payload: &[u8],
    ) -> std::result::Result<ReceiptRecord, crate::codec::FrameError> {
        let (mut rec, used): (ReceiptRecord, usize) =
            crate::codec::decode_prefix(version, payload)?;
        let trailer = payload.get(used..).unwrap_or_default();
        if trailer.is_empty() {
            return Ok(rec);
        }
        let cause: RetireCause = crate::codec::decode_payload(version, trailer)?;
        match &mut rec.state {
            ExecRecord::Done(d) if d.retired_at.is_some() && !cause.is_retention() => {
                d.retire_cause = cause;
                Ok(rec)
            }
            _ => Err(crate::codec::FrameError::Decode(format!(
                "{} trailing bytes after the record",
                trailer.len()
            ))),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DeliveryRecord {
    pub state: DeliveryState,
    pub count: u32,
    pub next_due: Timestamp,
    pub final_attempt: bool,
    pub last_delivered_at: Option<Timestamp>,
    pub acknowledged_at: Option<Timestamp>,
}

/// A scope's revision and the event that established it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ScopeRecord {
    pub scope: String,
    pub revision: u64,
    /// The `seq` of the event that set `revision` (kept alive by compaction).
    pub anchor_seq: u64,
    pub updated_at: Timestamp,
}

/// The `meta` table's `format` entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FormatRecord {
    pub format_version: u32,
    pub created_at: Timestamp,
    pub created_by: String,
    /// When an older format was upgraded to this one, if it was.
    pub upgraded: Option<Upgrade>,
}

/// A format upgrade, as the format record keeps it (the journal also has an event).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Upgrade {
    pub from: u32,
    pub at: Timestamp,
}

/// The `format` entry as format 1 wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FormatRecordV1 {
    pub format_version: u32,
    pub created_at: Timestamp,
    pub created_by: String,
}

impl From<FormatRecordV1> for FormatRecord {
    fn from(v1: FormatRecordV1) -> FormatRecord {
        FormatRecord {
            format_version: v1.format_version,
            created_at: v1.created_at,
            created_by: v1.created_by,
            upgraded: None,
        }
    }
}

/// The `meta` table's `state` entry, rewritten by every commit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StateRecord {
    pub clock_high_water: Timestamp,
    pub next_seq: u64,
}

/// The `meta` table's `checkpoint` entry: where the log's current cycle starts. Written by
/// every checkpoint (and when a journal is created or upgraded to format 2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CheckpointRecord {
    /// Ties the log to this redb file: a log beside it with another id is not its log.
    pub journal_id: u64,
    /// The generation the log's records carry until the next checkpoint.
    pub generation: u64,
    /// The lsn of the first record of that generation.
    pub next_lsn: u64,
}

/// The header of a `results` value; the payload bytes follow it unencoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ResultHeader {
    pub operation_id: String,
    /// The seq of the event that recorded the outcome (the `results` key).
    pub completed_seq: u64,
    pub changed_assets: Vec<String>,
}
