//! Salvage: records found by scanning the raw bytes when the storage engine refuses
//! the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::repair::{RepairReport, repair_db};
use crate::clock::Timestamp;
use crate::codec::{self, FORMAT_VERSION, RecordKind};
use crate::error::{Error, Result};
use crate::index::{self, Layers, WriteTables};
use crate::record::{Event, FormatRecord, StateRecord};

/// Scans raw bytes for framed records whose CRC holds.
pub(crate) fn scan_frames(bytes: &[u8]) -> Vec<(RecordKind, &[u8])> {
    let mut out = Vec::new();
    let mut i = 0usize;
    while i + codec::HEADER_LEN <= bytes.len() {
        if bytes[i] == codec::MAGIC[0]
            && bytes[i + 1] == codec::MAGIC[1]
            && bytes[i + 2] >= 1
            && bytes[i + 2] <= FORMAT_VERSION
            && let Some(kind) = RecordKind::from_byte(bytes[i + 3])
        {
            let len = u32::from_le_bytes([bytes[i + 4], bytes[i + 5], bytes[i + 6], bytes[i + 7]])
                as usize;
            let end = i + codec::HEADER_LEN + len;
            if end <= bytes.len() && codec::unframe(kind, &bytes[i..end]).is_ok() {
                out.push((kind, &bytes[i..end]));
                i = end;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// Salvages every CRC-valid event and result of `source` into a new journal that
/// replaces `dest` (`dest` is `source`, or its dry-run copy).
pub(crate) fn salvage(
    original: &Path,
    dest: &Path,
    log_bytes: Option<&[u8]>,
    report: &mut RepairReport,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let bytes = std::fs::read(dest).map_err(Error::io)?;
    let mut events: BTreeMap<u64, Event> = BTreeMap::new();
    let mut results: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for (kind, frame) in scan_frames(&bytes) {
        match kind {
            RecordKind::Event => {
                if let Ok(payload) = codec::unframe(kind, frame)
                    && let Ok(ev) = codec::decode_payload::<Event>(payload)
                {
                    events.entry(ev.seq).or_insert(ev);
                }
            }
            RecordKind::Result => {
                if let Ok(payload) = codec::unframe(kind, frame)
                    && let Ok((h, _)) = codec::decode_prefix::<crate::record::ResultHeader>(payload)
                {
                    results
                        .entry(h.completed_seq)
                        .or_insert_with(|| frame.to_vec());
                }
            }
            _ => {}
        }
    }
    if events.is_empty() {
        return Err(Error::corrupt(
            "(file)",
            original.display(),
            "the storage engine refuses the file and no intact event could be salvaged from its bytes",
        ));
    }
    report.salvaged = true;
    let mut tmp_name = dest.as_os_str().to_os_string();
    tmp_name.push(".salvage");
    let tmp = PathBuf::from(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    {
        let db = redb::Builder::new().create(&tmp)?;
        let txn = db.begin_write()?;
        {
            let mut t = WriteTables::over(None, Layers::default());
            t.put_format(&FormatRecord {
                format_version: u32::from(FORMAT_VERSION),
                created_at: Timestamp(0),
                created_by: format!("opjournal {} salvage", env!("CARGO_PKG_VERSION")),
                upgraded: None,
            })?;
            let max_seq = events.keys().next_back().copied().unwrap_or(0);
            let max_at = events.values().map(|e| e.at).max().unwrap_or(Timestamp(0));
            t.put_state(&StateRecord {
                clock_high_water: max_at,
                next_seq: max_seq + 1,
            })?;
            for ev in events.values() {
                t.put_event(ev)?;
            }
            for (seq, frame) in &results {
                t.put_raw::<index::Results>(*seq, frame.clone());
            }
            index::checkpoint(&txn, &t.into_changes())?;
            index::create_tables(&txn)?;
        }
        txn.commit()?;
        // The new file has no checkpoint record, so the log cannot be tied to it: the
        // repair says so if it holds anything.
        repair_db(&db, log_bytes, report, progress)?;
    }
    std::fs::rename(&tmp, dest).map_err(Error::io)?;
    Ok(())
}
