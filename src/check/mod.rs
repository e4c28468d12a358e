//! `verify` and `repair`: the file is input, so every record is checked, every index is
//! checked against the event journal, and damage is reported by table and key, never by a
//! panic. Both read the file in place, never copy it, and hold bounded memory.

mod repair;
mod salvage;
mod source;
mod verify;

pub use repair::{EngineAccess, IndexChanges, LostOperation, RepairOptions, RepairReport, repair};
pub(crate) use salvage::scan_frames;
pub use salvage::{IntactRecords, intact_records};
pub use verify::{
    Finding, INTEGRITY_SCRATCH_BYTES, Integrity, LogCheck, MAX_FINDINGS, VerifyReport, verify,
    verify_inspected,
};

/// Adds to `ops` the operations a log record dropped by recovery touched, as far as its
/// payload tells: the keys of its changes when it decodes, and, when it does not (a
/// damaged record), the operation named by every intact receipt or event frame in it
/// (each value in a record carries its own CRC, and a change to an operation writes its
/// id in several of them, so one damaged byte cannot hide it). With `receipts`, also keeps
/// each receipt the record holds (a later record's replacing an earlier one's, as records
/// are read in log order).
pub(crate) fn ops_of_log_record(
    payload: &[u8],
    ops: &mut std::collections::BTreeSet<String>,
    mut receipts: Option<&mut std::collections::BTreeMap<String, crate::record::ReceiptRecord>>,
) {
    use crate::index::Table;
    let mut m = crate::index::Memtable::default();
    if m.apply_encoded(payload).is_ok() {
        for (op, value) in crate::index::Receipts::map(&m) {
            ops.insert(op.to_string());
            if let Some(kept) = receipts.as_deref_mut()
                && let Some(rec) = value
                    .as_ref()
                    .and_then(|v| crate::index::decode_receipt_frame(v).ok())
            {
                kept.insert(op.to_string(), rec);
            }
        }
        for (op, _) in crate::index::OpEvents::map(&m).keys() {
            ops.insert(op.to_string());
        }
        return;
    }
    for (kind, frame) in scan_frames(payload) {
        let op = match kind {
            crate::codec::RecordKind::Receipt => match crate::index::decode_receipt_frame(frame) {
                Ok(rec) => {
                    let op = rec.operation_id.clone();
                    if let Some(kept) = receipts.as_deref_mut() {
                        kept.insert(op.clone(), rec);
                    }
                    Some(op)
                }
                Err(_) => None,
            },
            crate::codec::RecordKind::Event => crate::index::decode_event_frame(frame)
                .ok()
                .and_then(|e| e.operation_id),
            _ => continue,
        };
        if let Some(op) = op {
            ops.insert(op);
        }
    }
}
