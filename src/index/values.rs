//! The tables' values as stored: each framed record decoded and checked against the key
//! it was found under, and the result records written inline after a receipt (format 3)
//! or on their own in `results`.
//!
//! Every decode answers a typed `Corrupt { table, key }` error naming what failed (the
//! frame, the payload, or a record carrying another key than the one it is stored under),
//! never a panic: the file is input. Records of format 1 are read as this format holds
//! them; a record of a newer format is refused with both versions named.

use crate::codec::{self, RecordKind};
use crate::error::{Error, Result};
use crate::record::{Event, FormatRecord, ReceiptRecord, ResultHeader, ScopeRecord};
use crate::types::OpResult;

pub(super) fn corrupt(
    table: &str,
    key: impl std::fmt::Display,
    e: impl std::fmt::Display,
) -> Error {
    Error::corrupt(table, key, e.to_string())
}

/// An event record of this format or of format 1, without checking where it was found.
pub(crate) fn decode_event_frame(bytes: &[u8]) -> std::result::Result<Event, codec::FrameError> {
    match codec::unframe_versioned(RecordKind::Event, bytes)? {
        (1, payload) => codec::decode_payload(1, payload).map(Event::from_v1),
        (v, payload) => codec::decode_payload(v, payload),
    }
}

/// The largest result record (framed, with its header) stored inline in its receipt's
/// value (format 3): a replay of such a result reads one value, found in one B-tree
/// descent. Larger results, and those of files written before format 3, are in `results`,
/// keyed by the completing event's seq, so they are appended in order, packed, and written
/// once. Inline, a result rides along every rewrite of its receipt (a delivery, an
/// acknowledgement: each logs the receipt's whole value again, and each checkpoint writes
/// its page again), sits in a tree keyed by the caller's random ids (pages half empty
/// with a few large values each), and is read by every scan of the receipts. 256 bytes,
/// about a receipt's own size, keeps small answers on the one-read path at little cost.
/// Until 2026-12-06 it was 2 KiB: with 1 KiB results a lifecycle logged 3,557 bytes, the
/// result twice; out of line, the cost is a second read for a replay of an id no cache
/// holds (`docs/performance.md`, "Results out of line").
pub(crate) const INLINE_RESULT_MAX: usize = 256;

/// Splits a `receipts` value into its receipt record and the result record stored inline
/// after it (format 3), if there is one. The receipt record's length field says where it
/// ends; a value whose length field points past its end is left whole (and then fails to
/// unframe as a receipt, naming the lengths).
pub(crate) fn split_receipt_value(bytes: &[u8]) -> (&[u8], Option<&[u8]>) {
    if bytes.len() < codec::HEADER_LEN {
        return (bytes, None);
    }
    let declared = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
    match codec::HEADER_LEN.checked_add(declared) {
        Some(end) if end < bytes.len() => (&bytes[..end], Some(&bytes[end..])),
        _ => (bytes, None),
    }
}

/// The completing seq a result record names, read without decoding its payload (`None`:
/// not a result record this build reads).
pub(super) fn result_record_seq(bytes: &[u8]) -> Option<u64> {
    let (version, payload) = codec::unframe_versioned(RecordKind::Result, bytes).ok()?;
    let (header, _): (ResultHeader, usize) = codec::decode_prefix(version, payload).ok()?;
    Some(header.completed_seq)
}

/// The result seq of a terminal record whose result is kept.
pub(super) fn kept_result_seq(rec: &ReceiptRecord) -> Option<u64> {
    match &rec.state {
        crate::record::ExecRecord::Done(d) => d.result_seq,
        _ => None,
    }
}

/// Decodes the result stored inline in the receipt of `id`, which must be the one its
/// receipt names (completed at `seq`, by `id`).
pub(crate) fn decode_inline_result(id: &str, seq: u64, bytes: &[u8]) -> Result<OpResult> {
    let bad = |e: &dyn std::fmt::Display| corrupt("receipts", id, format!("inline result: {e}"));
    let (version, payload) =
        codec::unframe_versioned(RecordKind::Result, bytes).map_err(|e| bad(&e))?;
    let (header, used): (ResultHeader, usize) =
        codec::decode_prefix(version, payload).map_err(|e| bad(&e))?;
    if header.completed_seq != seq || header.operation_id != id {
        return Err(bad(&format!(
            "it is the result of `{}` completed at seq {}, and the receipt names seq {seq}",
            header.operation_id, header.completed_seq
        )));
    }
    Ok(OpResult {
        bytes: payload[used..].to_vec(),
        changed_assets: header.changed_assets,
    })
}

/// A receipt record of this format or of format 1, without checking where it was found.
/// A result stored inline after it is ignored (see [`split_receipt_value`]).
pub(crate) fn decode_receipt_frame(
    bytes: &[u8],
) -> std::result::Result<ReceiptRecord, codec::FrameError> {
    let bytes = split_receipt_value(bytes).0;
    match codec::unframe_versioned(RecordKind::Receipt, bytes)? {
        (1, payload) => codec::decode_payload(1, payload).map(ReceiptRecord::from_v1),
        (v, payload) => ReceiptRecord::decode(v, payload),
    }
}

pub(crate) fn decode_event(key: u64, bytes: &[u8]) -> Result<Event> {
    let ev = decode_event_frame(bytes).map_err(|e| corrupt("events", key, e))?;
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
    let rec = decode_receipt_frame(bytes).map_err(|e| corrupt("receipts", key, e))?;
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
    let (version, payload) = codec::unframe_versioned(RecordKind::Result, bytes)
        .map_err(|e| corrupt("results", key, e))?;
    let (header, used): (ResultHeader, usize) =
        codec::decode_prefix(version, payload).map_err(|e| corrupt("results", key, e))?;
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
    let header = ResultHeader {
        operation_id: operation_id.to_string(),
        completed_seq: seq,
        changed_assets: result.changed_assets.clone(),
    };
    codec::encode_with_tail(RecordKind::Result, &header, &result.bytes, 0)
}

/// Decodes the `format` record, of this format or of format 1. A newer one is refused with
/// both versions named: a file a newer build wrote is never read (or rewritten) as if it
/// were of this format.
pub(crate) fn decode_format(bytes: &[u8]) -> Result<FormatRecord> {
    let mut f = decode_format_raw(bytes)?;
    // Format 3 with deferred purges pending, or with a second log file: read as format 3,
    // whose reads here apply the purges (see `purged`) and whose writers and readers
    // follow both logs; builds that do not know them refuse it.
    if f.format_version == super::purged::FORMAT_PENDING_PURGES
        || f.format_version == super::purged::FORMAT_TWO_LOGS
    {
        f.format_version = u32::from(codec::FORMAT_VERSION);
    }
    if f.format_version > u32::from(codec::FORMAT_VERSION) {
        return Err(Error::new(crate::error::ErrorKind::UnsupportedFormat {
            found: f.format_version,
            supported: u32::from(codec::FORMAT_VERSION),
        }));
    }
    Ok(f)
}

/// Decodes the `format` record with the version it stores (4 and 5 as they are), for the
/// checkpoint that rewrites it.
pub(crate) fn decode_format_raw(bytes: &[u8]) -> Result<FormatRecord> {
    let unsupported = |found: u32| {
        Error::new(crate::error::ErrorKind::UnsupportedFormat {
            found,
            supported: u32::from(codec::FORMAT_VERSION),
        })
    };
    match codec::unframe_versioned(RecordKind::Meta, bytes) {
        Ok((1, payload)) => codec::decode_payload::<crate::record::FormatRecordV1>(1, payload)
            .map(FormatRecord::from)
            .map_err(|e| corrupt("meta", "format", e)),
        Ok((v, payload)) => {
            codec::decode_payload(v, payload).map_err(|e| corrupt("meta", "format", e))
        }
        Err(codec::FrameError::NewerVersion(v)) => Err(unsupported(u32::from(v))),
        Err(e) => Err(corrupt("meta", "format", e)),
    }
}

pub(crate) fn decode_meta<T: serde::de::DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T> {
    codec::decode(RecordKind::Meta, bytes).map_err(|e| corrupt("meta", key, e))
}
