//! The log's bytes: the header, the record frame and its chained CRC, and the cursor that
//! names a cycle (the module docs of `log` draw the layout).

/// The first bytes of a log file.
pub(crate) const MAGIC: [u8; 8] = *b"opj-log\x1a";
/// The log's own format version (its header and record frames). It is the version of
/// the journal format that introduced the log, and stays 2 while only the values the log
/// carries change (format 3 stores small results inline in receipts; the log frames them
/// as any value): a log left by a format-2 build is read back by this one.
pub(crate) const LOG_VERSION: u8 = 2;
/// The header's size on disk; records start at [`START`].
pub(crate) const HEADER_LEN: usize = 28;
/// Where the first record starts.
pub(crate) const START: u64 = 4096;
/// The two bytes that start every record.
pub(crate) const RECORD_MAGIC: [u8; 2] = *b"OL";
/// Bytes before a record's payload.
pub(crate) const RECORD_HEADER_LEN: usize = 28;
/// The four bytes that end every record, after its payload (outside the CRC). A write that
/// stopped before its end leaves them missing (the log past its records is zero), so a
/// record whose CRC fails while they are present was written whole and damaged after.
pub(crate) const RECORD_TRAILER: [u8; 4] = *b"LOG\x1a";
/// Bytes after a record's payload.
pub(crate) const RECORD_TRAILER_LEN: usize = 4;
/// The sector size the log's damage test assumes a power cut tears at (sectors may land
/// in any order, each whole or not at all; a larger physical sector is a whole number of
/// these).
pub(crate) const SECTOR: u64 = 512;
/// Record kind: a batch of index changes (see `index::batch`).
pub(crate) const KIND_BATCH: u8 = 1;
/// The longest payload a record may declare: a batch holds at most a few results of at
/// most 64 MiB each, and reading never allocates more than this for one record.
pub(crate) const MAX_PAYLOAD: u64 = 1 << 30;

/// What the header of a log file says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub version: u32,
    pub journal_id: u64,
}

impl Header {
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..8].copy_from_slice(&MAGIC);
        out[8..12].copy_from_slice(&self.version.to_le_bytes());
        out[16..24].copy_from_slice(&self.journal_id.to_le_bytes());
        let crc = crc32fast::hash(&out[0..24]);
        out[24..28].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// The header in `bytes`, or why it is not one.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Header, String> {
        if bytes.len() < HEADER_LEN || bytes.iter().take(HEADER_LEN).all(|b| *b == 0) {
            return Err("the log has no header".into());
        }
        if bytes[0..8] != MAGIC {
            return Err("the log does not start with the log file signature".into());
        }
        let stored = u32_at(bytes, 24);
        if crc32fast::hash(&bytes[0..24]) != stored {
            return Err("the log header's CRC does not match".into());
        }
        Ok(Header {
            version: u32_at(bytes, 8),
            journal_id: u64_at(bytes, 16),
        })
    }
}

pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// A new journal's id, which ties its log to it: random, from the standard library's
/// randomly keyed hasher, the time and the process.
pub(crate) fn new_journal_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.write_u32(std::process::id());
    h.finish()
}

/// The CRC a generation's first record chains from.
pub(crate) fn seed(journal_id: u64, generation: u64) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(b"opjournal.log\0");
    h.update(&journal_id.to_le_bytes());
    h.update(&generation.to_le_bytes());
    h.finalize()
}

/// Where a record at `at` with a payload of `plen` bytes ends (after its trailer).
pub(super) fn record_end(at: u64, plen: u64) -> u64 {
    at.saturating_add((RECORD_HEADER_LEN + RECORD_TRAILER_LEN) as u64)
        .saturating_add(plen)
}

pub(super) fn record_crc(prev: u32, header24: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(prev);
    h.update(header24);
    h.update(payload);
    h.finalize()
}

/// Where a cycle of the log starts: what the redb file's last checkpoint says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub journal_id: u64,
    pub generation: u64,
    /// The lsn the generation's first record carries.
    pub first_lsn: u64,
}

/// The smallest log file created; it doubles when a record does not fit, so its length is
/// always a power of two of at least this (any other length is damage: a cut or an
/// extension).
pub(crate) const INITIAL_CAPACITY: u64 = 1 << 20;

/// Whether `len` is a length the writer gives a log file.
pub(crate) fn is_capacity(len: u64) -> bool {
    len >= INITIAL_CAPACITY && len.is_power_of_two()
}

/// Why a record header is not the next record of `cursor`'s cycle (`None`: it is).
pub(super) fn head_problem(head: &[u8], cursor: Cursor, next_lsn: u64) -> Option<String> {
    if head[0..2] != RECORD_MAGIC {
        Some("no record magic".to_string())
    } else if head[2] != LOG_VERSION {
        Some(format!("record version {}", head[2]))
    } else if u64_at(head, 8) != cursor.generation {
        Some(format!(
            "generation {} (the current one is {})",
            u64_at(head, 8),
            cursor.generation
        ))
    } else if u64_at(head, 16) != next_lsn {
        Some(format!(
            "lsn {} where {next_lsn} comes next",
            u64_at(head, 16)
        ))
    } else {
        None
    }
}
