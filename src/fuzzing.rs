//! Entry points for fuzzers and property tests. Not part of the stable API.

use crate::codec::{self, RecordKind};
use crate::record::{Event, FormatRecord, ReceiptRecord, ScopeRecord, StateRecord};
use crate::store;

/// Feeds `bytes` to every record decoder. For each that accepts it, checks that encoding
/// the decoded value and decoding again gives the same value. Returns how many decoders
/// accepted the bytes, or a description of a broken round trip.
///
/// # Errors
///
/// A message naming the decoder whose round trip failed.
pub fn decode_every_record(bytes: &[u8]) -> Result<u32, String> {
    let mut accepted = 0;
    accepted += roundtrip::<Event>(RecordKind::Event, bytes)?;
    accepted += roundtrip::<ReceiptRecord>(RecordKind::Receipt, bytes)?;
    accepted += roundtrip::<ScopeRecord>(RecordKind::Scope, bytes)?;
    accepted += roundtrip::<FormatRecord>(RecordKind::Meta, bytes)?;
    accepted += roundtrip::<StateRecord>(RecordKind::Meta, bytes)?;
    // Results: header plus raw payload, keyed by the seq they carry.
    if let Ok(payload) = codec::unframe(RecordKind::Result, bytes)
        && let Ok((header, used)) = codec::decode_prefix::<crate::record::ResultHeader>(payload)
    {
        let (h2, body) = store::decode_result(header.completed_seq, bytes)
            .map_err(|e| format!("result decoded by prefix but not as a record: {e}"))?;
        if h2 != header || body != payload[used..] {
            return Err("result decode is not stable".into());
        }
        let re = store::encode_result(
            header.completed_seq,
            &header.operation_id,
            &crate::types::OpResult {
                bytes: body,
                changed_assets: header.changed_assets.clone(),
            },
        );
        if re != bytes {
            return Err("result re-encoding differs from the accepted bytes".into());
        }
        accepted += 1;
    }
    // The raw scanner must never panic and only return CRC-valid frames.
    for (kind, frame) in crate::check::scan_frames(bytes) {
        codec::unframe(kind, frame).map_err(|e| format!("scan returned an invalid frame: {e}"))?;
    }
    Ok(accepted)
}

fn roundtrip<T>(kind: RecordKind, bytes: &[u8]) -> Result<u32, String>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let Ok(value) = codec::decode::<T>(kind, bytes) else {
        return Ok(0);
    };
    let encoded = codec::encode(kind, &value);
    let again: T = codec::decode(kind, &encoded)
        .map_err(|e| format!("{kind:?}: re-encoded value does not decode: {e}"))?;
    if again != value {
        return Err(format!("{kind:?}: round trip changed the value"));
    }
    Ok(1)
}
