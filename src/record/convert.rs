//! The conversions between the stored records and the API's types (`types.rs`), both
//! ways: the API shows what the file holds, and `import_dump` writes back what the API
//! showed.
//!
//! They are written out field by field, and enums variant by variant without a wildcard
//! arm, so a variant added on either side fails to compile here until its conversion is
//! decided: the file format never follows an API change by accident.

use super::{
    Deadlines, DeliveryState, Event, EventKind, InDoubtCause, IntentDigest, OutcomeKind,
    ResolvedAs, ResultInfo, RevisionCause,
};
use crate::intent_hash::{HashScheme, IntentHash};
use crate::types as api;

/// The scheme byte names the scheme: 1 is the first (legacy) one, which format 1
/// stored implicitly; 2 is RFC 8785 (JCS).
impl From<IntentDigest> for IntentHash {
    fn from(d: IntentDigest) -> IntentHash {
        let scheme = match d.scheme {
            IntentDigest::LEGACY => HashScheme::LegacyV1,
            _ => HashScheme::JcsV2,
        };
        IntentHash::new(scheme, d.bytes)
    }
}

impl From<IntentHash> for IntentDigest {
    fn from(h: IntentHash) -> IntentDigest {
        IntentDigest {
            scheme: match h.scheme() {
                HashScheme::LegacyV1 => IntentDigest::LEGACY,
                HashScheme::JcsV2 => IntentDigest::JCS,
            },
            bytes: *h.as_bytes(),
        }
    }
}

impl From<DeliveryState> for api::DeliveryState {
    fn from(s: DeliveryState) -> api::DeliveryState {
        match s {
            DeliveryState::Pending => api::DeliveryState::Pending,
            DeliveryState::Delivered => api::DeliveryState::Delivered,
            DeliveryState::Acknowledged => api::DeliveryState::Acknowledged,
            DeliveryState::Exhausted => api::DeliveryState::Exhausted,
            DeliveryState::AckExpired => api::DeliveryState::AckExpired,
        }
    }
}

impl From<InDoubtCause> for api::InDoubtCause {
    fn from(c: InDoubtCause) -> api::InDoubtCause {
        match c {
            InDoubtCause::LeaseTimeout => api::InDoubtCause::LeaseTimeout,
            InDoubtCause::Reopened => api::InDoubtCause::Reopened,
            InDoubtCause::EventsLost => api::InDoubtCause::EventsLost,
        }
    }
}

impl From<&OutcomeKind> for api::OutcomeKind {
    fn from(o: &OutcomeKind) -> api::OutcomeKind {
        match o {
            OutcomeKind::Applied { result_revision } => api::OutcomeKind::Applied {
                result_revision: *result_revision,
            },
            OutcomeKind::Failed { message } => api::OutcomeKind::Failed {
                message: message.clone(),
            },
        }
    }
}

impl From<&api::OutcomeKind> for OutcomeKind {
    fn from(o: &api::OutcomeKind) -> OutcomeKind {
        match o {
            api::OutcomeKind::Applied { result_revision } => OutcomeKind::Applied {
                result_revision: *result_revision,
            },
            api::OutcomeKind::Failed { message } => OutcomeKind::Failed {
                message: message.clone(),
            },
        }
    }
}

impl From<ResultInfo> for api::ResultInfo {
    fn from(r: ResultInfo) -> api::ResultInfo {
        api::ResultInfo {
            len: r.len,
            crc32: r.crc32,
            assets: r.assets,
        }
    }
}

impl From<Deadlines> for api::Deadlines {
    fn from(d: Deadlines) -> api::Deadlines {
        api::Deadlines {
            ack: d.ack,
            retain: d.retain,
            purge: d.purge,
            first_push: d.first_push,
        }
    }
}

impl From<RevisionCause> for api::RevisionCause {
    fn from(c: RevisionCause) -> api::RevisionCause {
        match c {
            RevisionCause::External => api::RevisionCause::External,
            RevisionCause::Checkpoint => api::RevisionCause::Checkpoint,
        }
    }
}

impl From<&ResolvedAs> for api::ResolvedAs {
    fn from(r: &ResolvedAs) -> api::ResolvedAs {
        match r {
            ResolvedAs::NotApplied { purge_at } => api::ResolvedAs::NotApplied {
                purge_at: *purge_at,
            },
            ResolvedAs::Completed {
                outcome,
                result,
                deadlines,
            } => api::ResolvedAs::Completed {
                outcome: outcome.into(),
                result: (*result).into(),
                deadlines: (*deadlines).into(),
            },
        }
    }
}

impl From<&EventKind> for api::EventKind {
    fn from(k: &EventKind) -> api::EventKind {
        match k {
            EventKind::Submitted {
                attempt,
                intent_name,
                intent_hash,
                scope,
                session,
                base_revision,
                lease_until,
                hold_until_ack,
            } => api::EventKind::Submitted {
                attempt: *attempt,
                intent_name: intent_name.clone(),
                intent_hash: (*intent_hash).into(),
                scope: scope.clone(),
                session: session.clone(),
                base_revision: *base_revision,
                lease_until: *lease_until,
                hold_until_ack: *hold_until_ack,
            },
            EventKind::LeaseExtended { epoch, lease_until } => api::EventKind::LeaseExtended {
                epoch: *epoch,
                lease_until: *lease_until,
            },
            EventKind::Completed {
                epoch,
                outcome,
                result,
                deadlines,
            } => api::EventKind::Completed {
                epoch: *epoch,
                outcome: outcome.into(),
                result: (*result).into(),
                deadlines: (*deadlines).into(),
            },
            EventKind::Released { epoch, purge_at } => api::EventKind::Released {
                epoch: *epoch,
                purge_at: *purge_at,
            },
            EventKind::LeaseExpired { epoch, cause } => api::EventKind::LeaseExpired {
                epoch: *epoch,
                cause: (*cause).into(),
            },
            EventKind::Resolved { resolution } => api::EventKind::Resolved {
                resolution: resolution.into(),
            },
            EventKind::Delivered {
                count,
                next_due,
                final_attempt,
            } => api::EventKind::Delivered {
                count: *count,
                next_due: *next_due,
                final_attempt: *final_attempt,
            },
            EventKind::Acknowledged { late } => api::EventKind::Acknowledged { late: *late },
            EventKind::AckExpired => api::EventKind::AckExpired,
            EventKind::Exhausted => api::EventKind::Exhausted,
            EventKind::Retired => api::EventKind::Retired,
            EventKind::Salvaged {
                attempt,
                intent_name,
                intent_hash,
                scope,
                session,
                lost_events,
            } => api::EventKind::Salvaged {
                attempt: *attempt,
                intent_name: intent_name.clone(),
                intent_hash: (*intent_hash).into(),
                scope: scope.clone(),
                session: session.clone(),
                lost_events: *lost_events,
            },
            EventKind::RevisionAdvanced {
                scope,
                revision,
                cause,
                purge_at,
            } => api::EventKind::RevisionAdvanced {
                scope: scope.clone(),
                revision: *revision,
                cause: (*cause).into(),
                purge_at: *purge_at,
            },
            EventKind::FormatUpgraded { from, to } => api::EventKind::FormatUpgraded {
                from: *from,
                to: *to,
            },
            EventKind::ResultLost => api::EventKind::ResultLost,
        }
    }
}

/// The file's form of an event the API shows (for `import_dump`): the inverse of
/// `From<&Event> for api::Event`.
impl From<&api::Event> for Event {
    fn from(e: &api::Event) -> Event {
        Event {
            seq: e.seq,
            at: e.at,
            operation_id: e.operation_id.clone(),
            kind: (&e.kind).into(),
        }
    }
}

impl From<api::InDoubtCause> for InDoubtCause {
    fn from(c: api::InDoubtCause) -> InDoubtCause {
        match c {
            api::InDoubtCause::LeaseTimeout => InDoubtCause::LeaseTimeout,
            api::InDoubtCause::Reopened => InDoubtCause::Reopened,
            api::InDoubtCause::EventsLost => InDoubtCause::EventsLost,
        }
    }
}

impl From<api::ResultInfo> for ResultInfo {
    fn from(r: api::ResultInfo) -> ResultInfo {
        ResultInfo {
            len: r.len,
            crc32: r.crc32,
            assets: r.assets,
        }
    }
}

impl From<api::Deadlines> for Deadlines {
    fn from(d: api::Deadlines) -> Deadlines {
        Deadlines {
            ack: d.ack,
            retain: d.retain,
            purge: d.purge,
            first_push: d.first_push,
        }
    }
}

impl From<api::RevisionCause> for RevisionCause {
    fn from(c: api::RevisionCause) -> RevisionCause {
        match c {
            api::RevisionCause::External => RevisionCause::External,
            api::RevisionCause::Checkpoint => RevisionCause::Checkpoint,
        }
    }
}

impl From<&api::ResolvedAs> for ResolvedAs {
    fn from(r: &api::ResolvedAs) -> ResolvedAs {
        match r {
            api::ResolvedAs::NotApplied { purge_at } => ResolvedAs::NotApplied {
                purge_at: *purge_at,
            },
            api::ResolvedAs::Completed {
                outcome,
                result,
                deadlines,
            } => ResolvedAs::Completed {
                outcome: outcome.into(),
                result: (*result).into(),
                deadlines: (*deadlines).into(),
            },
        }
    }
}

impl From<&api::EventKind> for EventKind {
    fn from(k: &api::EventKind) -> EventKind {
        match k {
            api::EventKind::Submitted {
                attempt,
                intent_name,
                intent_hash,
                scope,
                session,
                base_revision,
                lease_until,
                hold_until_ack,
            } => EventKind::Submitted {
                attempt: *attempt,
                intent_name: intent_name.clone(),
                intent_hash: (*intent_hash).into(),
                scope: scope.clone(),
                session: session.clone(),
                base_revision: *base_revision,
                lease_until: *lease_until,
                hold_until_ack: *hold_until_ack,
            },
            api::EventKind::LeaseExtended { epoch, lease_until } => EventKind::LeaseExtended {
                epoch: *epoch,
                lease_until: *lease_until,
            },
            api::EventKind::Completed {
                epoch,
                outcome,
                result,
                deadlines,
            } => EventKind::Completed {
                epoch: *epoch,
                outcome: outcome.into(),
                result: (*result).into(),
                deadlines: (*deadlines).into(),
            },
            api::EventKind::Released { epoch, purge_at } => EventKind::Released {
                epoch: *epoch,
                purge_at: *purge_at,
            },
            api::EventKind::LeaseExpired { epoch, cause } => EventKind::LeaseExpired {
                epoch: *epoch,
                cause: (*cause).into(),
            },
            api::EventKind::Resolved { resolution } => EventKind::Resolved {
                resolution: resolution.into(),
            },
            api::EventKind::Delivered {
                count,
                next_due,
                final_attempt,
            } => EventKind::Delivered {
                count: *count,
                next_due: *next_due,
                final_attempt: *final_attempt,
            },
            api::EventKind::Acknowledged { late } => EventKind::Acknowledged { late: *late },
            api::EventKind::AckExpired => EventKind::AckExpired,
            api::EventKind::Exhausted => EventKind::Exhausted,
            api::EventKind::Retired => EventKind::Retired,
            api::EventKind::Salvaged {
                attempt,
                intent_name,
                intent_hash,
                scope,
                session,
                lost_events,
            } => EventKind::Salvaged {
                attempt: *attempt,
                intent_name: intent_name.clone(),
                intent_hash: (*intent_hash).into(),
                scope: scope.clone(),
                session: session.clone(),
                lost_events: *lost_events,
            },
            api::EventKind::RevisionAdvanced {
                scope,
                revision,
                cause,
                purge_at,
            } => EventKind::RevisionAdvanced {
                scope: scope.clone(),
                revision: *revision,
                cause: (*cause).into(),
                purge_at: *purge_at,
            },
            api::EventKind::FormatUpgraded { from, to } => EventKind::FormatUpgraded {
                from: *from,
                to: *to,
            },
            api::EventKind::ResultLost => EventKind::ResultLost,
        }
    }
}

impl From<&Event> for api::Event {
    fn from(e: &Event) -> api::Event {
        api::Event {
            seq: e.seq,
            at: e.at,
            operation_id: e.operation_id.clone(),
            kind: (&e.kind).into(),
            pending: false,
        }
    }
}
