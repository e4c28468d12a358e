//! Entry points for fuzzers and property tests. Not part of the stable API.

use crate::codec::{self, RecordKind};
use crate::index;
use crate::record::{
    CheckpointRecord, Event, FormatRecord, ReceiptRecord, ScopeRecord, StateRecord,
};

/// Feeds `bytes` to every record decoder. For each that accepts it, checks that encoding
/// the decoded value and decoding again gives the same value. Returns how many decoders
/// accepted the bytes, or a description of a broken round trip.
///
/// # Errors
///
/// A message naming the decoder whose round trip failed.
pub fn decode_every_record(bytes: &[u8]) -> Result<u32, String> {
    let mut accepted = 0;
    accepted += roundtrip(RecordKind::Event, bytes, index::decode_event_frame)?;
    accepted += roundtrip(RecordKind::Receipt, bytes, index::decode_receipt_frame)?;
    accepted += roundtrip(RecordKind::Scope, bytes, |b| {
        codec::decode::<ScopeRecord>(RecordKind::Scope, b)
    })?;
    accepted += roundtrip(RecordKind::Meta, bytes, |b| {
        index::decode_format(b).map_err(|e| codec::FrameError::Decode(e.to_string()))
    })?;
    accepted += roundtrip(RecordKind::Meta, bytes, |b| {
        codec::decode::<StateRecord>(RecordKind::Meta, b)
    })?;
    accepted += roundtrip(RecordKind::Meta, bytes, |b| {
        codec::decode::<CheckpointRecord>(RecordKind::Meta, b)
    })?;
    // Results: header plus raw payload, keyed by the seq they carry.
    if let Ok((version, payload)) = codec::unframe_versioned(RecordKind::Result, bytes)
        && let Ok((header, used)) =
            codec::decode_prefix::<crate::record::ResultHeader>(version, payload)
    {
        let (h2, body) = index::decode_result(header.completed_seq, bytes)
            .map_err(|e| format!("result decoded by prefix but not as a record: {e}"))?;
        if h2 != header || body != payload[used..] {
            return Err("result decode is not stable".into());
        }
        let re = index::encode_result(
            header.completed_seq,
            &header.operation_id,
            &crate::types::OpResult {
                bytes: body,
                changed_assets: header.changed_assets.clone(),
            },
        );
        // The re-encoding decodes to the same value. (Not always to the same bytes: the
        // variable-length integers of format 2 accept longer encodings of a value than the
        // encoder writes, and a format 1 record re-encodes as format 2.)
        if index::decode_result(header.completed_seq, &re).ok() != Some((h2, body_again(bytes)?)) {
            return Err("result re-encoding does not decode to the same result".into());
        }
        accepted += 1;
    }
    // A receipts value with a result inline after the receipt (format 3): the result must
    // decode against the receipt it follows, and re-encoding both gives the same pair.
    if let (head, Some(tail)) = index::split_receipt_value(bytes)
        && let Ok(rec) = index::decode_receipt_frame(head)
        && let crate::record::ExecRecord::Done(d) = &rec.state
        && let Some(seq) = d.result_seq
        && let Ok(result) = index::decode_inline_result(&rec.operation_id, seq, tail)
    {
        let mut re = codec::encode(RecordKind::Receipt, &rec);
        re.extend_from_slice(&index::encode_result(seq, &rec.operation_id, &result));
        let (head2, tail2) = index::split_receipt_value(&re);
        let again = tail2.ok_or("a re-encoded receipt lost its inline result")?;
        if index::decode_receipt_frame(head2).ok().as_ref() != Some(&rec)
            || index::decode_inline_result(&rec.operation_id, seq, again).ok() != Some(result)
        {
            return Err("a receipt with an inline result does not re-encode to itself".into());
        }
        // Counted once, as the receipt it is (accepted above).
    }
    // The raw scanner must never panic and only return CRC-valid frames.
    for (kind, frame) in crate::check::scan_frames(bytes) {
        codec::unframe(kind, frame).map_err(|e| format!("scan returned an invalid frame: {e}"))?;
    }
    Ok(accepted)
}

/// The payload bytes of a result record that decoded.
fn body_again(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let (version, payload) =
        codec::unframe_versioned(RecordKind::Result, bytes).map_err(|e| e.to_string())?;
    let (_, used) = codec::decode_prefix::<crate::record::ResultHeader>(version, payload)
        .map_err(|e| e.to_string())?;
    Ok(payload[used..].to_vec())
}

/// Decodes `bytes` with `decode`; if it accepts them, encodes the value (in this build's
/// format) and checks that decoding that gives the same value.
fn roundtrip<T>(
    kind: RecordKind,
    bytes: &[u8],
    decode: impl Fn(&[u8]) -> Result<T, codec::FrameError>,
) -> Result<u32, String>
where
    T: serde::Serialize + PartialEq + std::fmt::Debug,
{
    let Ok(value) = decode(bytes) else {
        return Ok(0);
    };
    let encoded = codec::encode(kind, &value);
    let again: T =
        decode(&encoded).map_err(|e| format!("{kind:?}: re-encoded value does not decode: {e}"))?;
    if again != value {
        return Err(format!("{kind:?}: round trip changed the value"));
    }
    Ok(1)
}

/// One fixed record of every kind, encoded: the golden bytes of the file format
/// (docs/format.md). A change here is a format change.
pub fn golden_records() -> Vec<(&'static str, Vec<u8>)> {
    use crate::clock::Timestamp;
    use crate::record::DeliveryState;
    use crate::record::IntentDigest;
    use crate::record::{
        Deadlines, DeliveryRecord, DoneRecord, EventKind, ExecRecord, InDoubtCause, OutcomeKind,
        ResolvedAs, ResultInfo, RevisionCause,
    };
    use crate::types::OpResult;

    let t = Timestamp(1_796_083_200_000);
    let hash = IntentDigest {
        scheme: 2,
        bytes: [0xab; 32],
    };
    let info = ResultInfo {
        len: 7,
        crc32: 0x1234_5678,
        assets: 1,
    };
    let deadlines = Deadlines {
        ack: Timestamp(t.0 + 900_000),
        retain: Timestamp(t.0 + 604_800_000),
        purge: Timestamp(t.0 + 7_776_000_000),
        first_push: Timestamp(t.0 + 1_000),
    };
    let ev = |seq: u64, kind: EventKind| Event {
        seq,
        at: t,
        operation_id: Some("op_7f3".into()),
        kind,
    };
    let mut out: Vec<(&'static str, Vec<u8>)> = vec![
        (
            "event.submitted",
            codec::encode(
                RecordKind::Event,
                &ev(
                    1,
                    EventKind::Submitted {
                        attempt: 1,
                        intent_name: "scene.add_light".into(),
                        intent_hash: hash,
                        scope: Some("scene/main".into()),
                        session: Some("tab-1".into()),
                        base_revision: Some(183),
                        lease_until: Timestamp(t.0 + 300_000),
                        hold_until_ack: false,
                    },
                ),
            ),
        ),
        (
            "event.lease_extended",
            codec::encode(
                RecordKind::Event,
                &ev(
                    2,
                    EventKind::LeaseExtended {
                        epoch: 1,
                        lease_until: Timestamp(t.0 + 600_000),
                    },
                ),
            ),
        ),
        (
            "event.completed",
            codec::encode(
                RecordKind::Event,
                &ev(
                    3,
                    EventKind::Completed {
                        epoch: 1,
                        outcome: OutcomeKind::Applied {
                            result_revision: 184,
                        },
                        result: info,
                        deadlines,
                    },
                ),
            ),
        ),
        (
            "event.released",
            codec::encode(
                RecordKind::Event,
                &ev(
                    4,
                    EventKind::Released {
                        epoch: 1,
                        purge_at: deadlines.purge,
                    },
                ),
            ),
        ),
        (
            "event.lease_expired",
            codec::encode(
                RecordKind::Event,
                &ev(
                    5,
                    EventKind::LeaseExpired {
                        epoch: 1,
                        cause: InDoubtCause::Reopened,
                    },
                ),
            ),
        ),
        (
            "event.resolved",
            codec::encode(
                RecordKind::Event,
                &ev(
                    6,
                    EventKind::Resolved {
                        resolution: ResolvedAs::Completed {
                            outcome: OutcomeKind::Failed {
                                message: "no door".into(),
                            },
                            result: info,
                            deadlines,
                        },
                    },
                ),
            ),
        ),
        (
            "event.delivered",
            codec::encode(
                RecordKind::Event,
                &ev(
                    7,
                    EventKind::Delivered {
                        count: 2,
                        next_due: Timestamp(t.0 + 1_500),
                        final_attempt: false,
                    },
                ),
            ),
        ),
        (
            "event.acknowledged",
            codec::encode(
                RecordKind::Event,
                &ev(8, EventKind::Acknowledged { late: true }),
            ),
        ),
        (
            "event.ack_expired",
            codec::encode(RecordKind::Event, &ev(9, EventKind::AckExpired)),
        ),
        (
            "event.exhausted",
            codec::encode(RecordKind::Event, &ev(10, EventKind::Exhausted)),
        ),
        (
            "event.retired",
            codec::encode(RecordKind::Event, &ev(11, EventKind::Retired)),
        ),
        (
            "event.salvaged",
            codec::encode(
                RecordKind::Event,
                &ev(
                    12,
                    EventKind::Salvaged {
                        attempt: 2,
                        intent_name: "(lost)".into(),
                        intent_hash: IntentDigest::LOST,
                        scope: None,
                        session: None,
                        lost_events: 3,
                    },
                ),
            ),
        ),
        (
            "event.revision_advanced",
            codec::encode(
                RecordKind::Event,
                &Event::<IntentDigest> {
                    seq: 13,
                    at: t,
                    operation_id: None,
                    kind: EventKind::RevisionAdvanced {
                        scope: "scene/main".into(),
                        revision: 190,
                        cause: RevisionCause::External,
                        purge_at: deadlines.purge,
                    },
                },
            ),
        ),
        (
            "event.format_upgraded",
            codec::encode(
                RecordKind::Event,
                &Event::<IntentDigest> {
                    seq: 14,
                    at: t,
                    operation_id: None,
                    kind: EventKind::FormatUpgraded { from: 1, to: 2 },
                },
            ),
        ),
    ];
    let receipt = ReceiptRecord {
        operation_id: "op_7f3".into(),
        attempt: 1,
        intent_name: "scene.add_light".into(),
        intent_hash: hash,
        scope: Some("scene/main".into()),
        session: Some("tab-1".into()),
        base_revision: Some(183),
        epoch: 1,
        hold_until_ack: false,
        submitted_at: t,
        state: ExecRecord::Done(DoneRecord {
            outcome: OutcomeKind::Applied {
                result_revision: 184,
            },
            completed_at: t,
            completed_by: Some(1),
            result_seq: Some(3),
            result: info,
            deadlines,
            retired_at: None,
            delivery: DeliveryRecord {
                state: DeliveryState::Delivered,
                count: 1,
                next_due: Timestamp(t.0 + 800),
                final_attempt: false,
                last_delivered_at: Some(t),
                acknowledged_at: None,
            },
            retire_cause: crate::record::RetireCause::Retention,
        }),
    };
    out.push(("receipt", codec::encode(RecordKind::Receipt, &receipt)));
    // Format 3: the same receipt with its result inline after it, as `receipts` stores it.
    let mut with_result = codec::encode(RecordKind::Receipt, &receipt);
    with_result.extend_from_slice(&index::encode_result(
        3,
        "op_7f3",
        &OpResult {
            bytes: b"light-1".to_vec(),
            changed_assets: vec!["scene/main/light-1".into()],
        },
    ));
    out.push(("receipt.with_result", with_result));
    out.push((
        "scope",
        codec::encode(
            RecordKind::Scope,
            &ScopeRecord {
                scope: "scene/main".into(),
                revision: 184,
                anchor_seq: 3,
                updated_at: t,
            },
        ),
    ));
    out.push((
        "meta.checkpoint",
        codec::encode(
            RecordKind::Meta,
            &crate::record::CheckpointRecord {
                journal_id: 0x0123_4567_89ab_cdef,
                generation: 3,
                next_lsn: 1_000,
            },
        ),
    ));
    out.push((
        "meta.format",
        codec::encode(
            RecordKind::Meta,
            &FormatRecord {
                format_version: 3,
                created_at: t,
                created_by: "opjournal 0.1.0".into(),
                upgraded: None,
            },
        ),
    ));
    out.push((
        "meta.state",
        codec::encode(
            RecordKind::Meta,
            &StateRecord {
                clock_high_water: t,
                next_seq: 14,
            },
        ),
    ));
    out.push((
        "result",
        index::encode_result(
            3,
            "op_7f3",
            &OpResult {
                bytes: b"light-1".to_vec(),
                changed_assets: vec!["scene/main/light-1".into()],
            },
        ),
    ));
    // Written only by `repair` (added within format 3; older records encode as before):
    // the event that records a result lost to damage, and the receipt it leaves, whose
    // payload ends with the retire-cause trailer (`01`, damage).
    out.push((
        "event.result_lost",
        codec::encode(RecordKind::Event, &ev(15, EventKind::ResultLost)),
    ));
    let mut lost = receipt.clone();
    if let ExecRecord::Done(d) = &mut lost.state {
        d.result_seq = None;
        d.retired_at = Some(Timestamp(t.0 + 60_000));
        d.retire_cause = crate::record::RetireCause::Damage;
    }
    out.push((
        "receipt.result_lost",
        codec::encode(RecordKind::Receipt, &lost),
    ));
    out
}
