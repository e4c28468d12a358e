//! The log: the journal's commit point, a file of CRC-framed batches beside the redb file.
//!
//! A group commit appends one record and syncs once; checkpoints apply the logged batches
//! to redb (the index) in large transactions and then start the log over. The file is
//! preallocated and overwritten in place, so a sync writes data pages only and never
//! updates the file's size, as SQLite's WAL does when it is reused.
//!
//! # Layout (all integers little-endian; docs/format.md has the byte-by-byte tables)
//!
//! ```text
//! 0     64     header: magic "opj-log\x1a", format version u32, reserved u32,
//!                      journal id u64, CRC-32 of bytes 0..24
//! 64    4032   zero
//! 4096  ...    records, back to back, then whatever an earlier cycle left
//! ```
//!
//! A record:
//!
//! ```text
//! 0   2   magic "OL"
//! 2   1   format version
//! 3   1   kind (1: a batch of index changes)
//! 4   4   payload length
//! 8   8   generation: which checkpoint cycle wrote it
//! 16  8   lsn: the record's number, one more than the record before it
//! 24  4   CRC-32 over bytes 0..24 and the payload, chained: the CRC computation starts
//!         from the CRC of the record before (the first record of a generation starts
//!         from a seed made of the journal id and the generation)
//! 28  len payload
//! +0  4   trailer "LOG\x1a" (outside the CRC: there only if the write reached the end)
//! ```
//!
//! The file's length is a power of two of at least 1 MiB, and past the current cycle's
//! records it is zero on disk before a record is written there (see [`Writer`]): that is
//! how `verify` tells a torn record from a damaged one (see [`dropped`]).
//!
//! # Recovery
//!
//! The redb file names the generation its last checkpoint started and the lsn that
//! comes next. Reading the log keeps records from the first one on as long as each has
//! the right magic, version, generation and lsn and its chained CRC holds; the first
//! record that does not ends the log. That is how a torn or unsynced tail is cut, and how
//! records of an earlier cycle (a stale generation, or the same bytes in another order)
//! are never taken for new ones: the CRC chain of a record written now cannot continue
//! into bytes left from before. Starting a new cycle needs no write at all: the next
//! record simply carries the next generation.
//!
//! # What the log assumes of the storage
//!
//! A completed `sync_data` makes every earlier write durable. A write that a power cut
//! interrupts may leave any mix of old and new sectors (the CRC finds it), but writing a
//! sector never changes a *different* sector's bytes ("power-safe overwrite", as SQLite
//! assumes by default): records share sectors with the record before them. Telling damage
//! from a torn write (`verify`, `repair`) also assumes that a 512-byte sector lands whole
//! or not at all; a device that tears inside a sector can make `verify` call a torn last
//! record damaged (never the reverse), which recovery is not affected by.

mod file;

use std::fmt;
use std::io;
use std::sync::Mutex;

pub use file::FileLog;
pub(crate) use file::sync_parent;

/// Where a journal's log lives: a file beside the redb file ([`FileLog`]), or, for tests,
/// an in-memory or fault-injecting disk passed to
/// [`JournalBuilder::open_backends`](crate::JournalBuilder::open_backends).
///
/// The contract is that of a file: reads and writes at an offset, a length that grows
/// with [`LogStorage::set_len`] (new bytes read as zero), and a sync after which every
/// completed write survives a power cut.
pub trait LogStorage: Send + Sync + fmt::Debug + 'static {
    /// The current length in bytes.
    ///
    /// # Errors
    ///
    /// The underlying I/O error.
    fn len(&self) -> io::Result<u64>;

    /// Whether the storage holds no bytes.
    ///
    /// # Errors
    ///
    /// The underlying I/O error.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Fills `buf` from `offset`; reading past the end is an error.
    ///
    /// # Errors
    ///
    /// The underlying I/O error, or `UnexpectedEof`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    /// Writes all of `data` at `offset`, growing the storage if needed.
    ///
    /// # Errors
    ///
    /// The underlying I/O error.
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;

    /// Sets the length; new bytes read as zero.
    ///
    /// # Errors
    ///
    /// The underlying I/O error.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Makes every completed write durable.
    ///
    /// # Errors
    ///
    /// The underlying I/O error. After a failed sync, the journal refuses further writes
    /// until it is reopened (the data may never have reached the disk).
    fn sync_data(&self) -> io::Result<()>;

    /// Removes the log after a clean close, when everything in it is in the redb file
    /// (a file backend deletes its file; the default empties the storage).
    ///
    /// # Errors
    ///
    /// The underlying I/O error (the journal is still closed cleanly: a leftover log of
    /// an earlier cycle is ignored by the next open).
    fn discard(&self) -> io::Result<()> {
        self.set_len(0)?;
        self.sync_data()
    }
}

/// A log kept in memory, for tests and for journals on
/// [`redb::backends::InMemoryBackend`]. Nothing survives the process.
#[derive(Debug, Default)]
pub struct MemoryLog {
    bytes: Mutex<Vec<u8>>,
}

impl MemoryLog {
    /// An empty log.
    pub fn new() -> MemoryLog {
        MemoryLog::default()
    }

    fn bytes(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.bytes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl LogStorage for MemoryLog {
    fn len(&self) -> io::Result<u64> {
        Ok(self.bytes().len() as u64)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let bytes = self.bytes();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let src = start
            .checked_add(buf.len())
            .and_then(|end| bytes.get(start..end))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut bytes = self.bytes();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let end = start + data.len();
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[start..end].copy_from_slice(data);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.bytes().resize(len, 0);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }
}

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

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
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
fn record_end(at: u64, plen: u64) -> u64 {
    at.saturating_add((RECORD_HEADER_LEN + RECORD_TRAILER_LEN) as u64)
        .saturating_add(plen)
}

fn record_crc(prev: u32, header24: &[u8], payload: &[u8]) -> u32 {
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

/// Why reading stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// The bytes at the end offset are zero: never written in this file.
    Clean,
    /// A record that is not the next one: left from an earlier cycle, or torn by a crash
    /// before its sync (the normal end of a log).
    Stale(String),
    /// The storage ended (or the log holds no header).
    Eof,
}

/// What reading the log found.
#[derive(Debug)]
pub(crate) struct Scan {
    /// The header, if the log has a valid one.
    pub header: Option<Header>,
    /// Why the header was not used, if it was not.
    pub header_problem: Option<String>,
    /// Offset after the last valid record (where the next record goes).
    pub end: u64,
    /// The lsn the next record carries.
    pub next_lsn: u64,
    /// The CRC the next record chains from.
    pub prev_crc: u32,
    /// Records kept.
    pub records: u64,
    /// Why reading stopped.
    pub stopped: End,
    /// The storage's length.
    pub len: u64,
}

/// One valid record, as read.
pub(crate) struct Record<'a> {
    pub lsn: u64,
    pub kind: u8,
    pub payload: &'a [u8],
}

/// The start of a scan of a log of `len` bytes whose first bytes are `head`: what its
/// header says about `cursor`'s cycle (another journal's log, or no header, means no
/// records), and the state before the first record.
fn scan_start(head: &[u8], cursor: Cursor, len: u64) -> Scan {
    let mut out = Scan {
        header: None,
        header_problem: None,
        end: START,
        next_lsn: cursor.first_lsn,
        prev_crc: seed(cursor.journal_id, cursor.generation),
        records: 0,
        stopped: End::Eof,
        len,
    };
    match Header::decode(head) {
        Ok(h) if h.journal_id != cursor.journal_id => {
            out.header_problem = Some(format!(
                "the log belongs to another journal (id {:016x}, this journal is {:016x})",
                h.journal_id, cursor.journal_id
            ));
            out.header = Some(h);
            return out;
        }
        Ok(h) if h.version != u32::from(LOG_VERSION) => {
            out.header_problem = Some(format!(
                "the log is format version {}, this build reads version {}",
                h.version, LOG_VERSION
            ));
            out.header = Some(h);
            return out;
        }
        Ok(h) => out.header = Some(h),
        Err(problem) => out.header_problem = Some(problem),
    }
    out
}

/// As [`scan_storage`], over the whole log in memory (the log's tests).
#[cfg(test)]
pub(crate) fn scan(
    bytes: &[u8],
    cursor: Cursor,
    each: impl FnMut(Record<'_>) -> io::Result<()>,
) -> io::Result<Scan> {
    let log = MemoryLog::new();
    log.write_at(0, bytes)?;
    scan_storage(&log, cursor, each)
}

/// Why a record header is not the next record of `cursor`'s cycle (`None`: it is).
fn head_problem(head: &[u8], cursor: Cursor, next_lsn: u64) -> Option<String> {
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

/// The cycle the log's own first record belongs to, for when the redb file's checkpoint
/// (which names the current cycle) cannot be read: the header's journal id, and the
/// generation and lsn of the record at [`START`]. `None` when the header or the first
/// record's head is not one (no magic, another format). The records this cursor finds are
/// of *some* cycle of this log, possibly one the redb file already holds: use them only to
/// name what they touch, never to replay them.
///
/// # Errors
///
/// The storage's I/O error.
pub(crate) fn own_cursor(storage: &dyn LogStorage) -> io::Result<Option<Cursor>> {
    let len = storage.len()?;
    if len < START + RECORD_HEADER_LEN as u64 {
        return Ok(None);
    }
    let mut head = [0u8; HEADER_LEN];
    storage.read_at(0, &mut head)?;
    let Ok(header) = Header::decode(&head) else {
        return Ok(None);
    };
    let mut rh = [0u8; RECORD_HEADER_LEN];
    storage.read_at(START, &mut rh)?;
    if header.version != u32::from(LOG_VERSION) || rh[0..2] != RECORD_MAGIC || rh[2] != LOG_VERSION
    {
        return Ok(None);
    }
    Ok(Some(Cursor {
        journal_id: header.journal_id,
        generation: u64_at(&rh, 8),
        first_lsn: u64_at(&rh, 16),
    }))
}

/// Reads the records of `cursor`'s cycle from `storage` as [`scan`] reads them from bytes,
/// record by record: memory holds one record at a time, whatever the log's length (a log
/// with bytes appended to it is read only as far as its records go).
///
/// # Errors
///
/// The storage's I/O error; `each`'s error.
pub(crate) fn scan_storage<E: From<io::Error>>(
    storage: &dyn LogStorage,
    cursor: Cursor,
    mut each: impl FnMut(Record<'_>) -> Result<(), E>,
) -> Result<Scan, E> {
    let len = storage.len()?;
    let mut head = vec![0u8; usize::try_from(len.min(START)).unwrap_or(0)];
    storage.read_at(0, &mut head)?;
    let mut out = scan_start(&head, cursor, len);
    let ours = out.header.is_some() && out.header_problem.is_none();
    if !ours {
        return Ok(out);
    }
    let mut at = START;
    let mut window = Window::default();
    loop {
        if at + RECORD_HEADER_LEN as u64 > len {
            out.stopped = End::Eof;
            break;
        }
        let rh: [u8; RECORD_HEADER_LEN] = {
            let b = window.get(storage, at, RECORD_HEADER_LEN, len)?;
            let mut rh = [0u8; RECORD_HEADER_LEN];
            rh.copy_from_slice(b);
            rh
        };
        if rh.iter().all(|b| *b == 0) {
            out.stopped = End::Clean;
            break;
        }
        if let Some(p) = head_problem(&rh, cursor, out.next_lsn) {
            out.stopped = End::Stale(format!("at offset {at}: {p}"));
            break;
        }
        let plen = u64::from(u32_at(&rh, 4));
        let end = record_end(at, plen);
        if plen > MAX_PAYLOAD || end > len {
            out.stopped = End::Stale(format!(
                "at offset {at}: a payload of {plen} bytes runs past the end of the log"
            ));
            break;
        }
        let payload = window.get(storage, at + RECORD_HEADER_LEN as u64, plen as usize, len)?;
        let crc = record_crc(out.prev_crc, &rh[0..24], payload);
        if crc != u32_at(&rh, 24) {
            out.stopped = End::Stale(format!(
                "at offset {at}: the CRC does not match (a torn or stale record)"
            ));
            break;
        }
        // Record numbers come from the file: one that leaves no successor ends the cycle.
        let Some(next_lsn) = out.next_lsn.checked_add(1) else {
            out.stopped = End::Stale(format!("at offset {at}: the last record number"));
            break;
        };
        each(Record {
            lsn: out.next_lsn,
            kind: rh[3],
            payload,
        })?;
        out.prev_crc = crc;
        out.next_lsn = next_lsn;
        out.records += 1;
        at = end;
        out.end = end;
    }
    Ok(out)
}

/// A read-ahead window over a log: records are read in chunks of [`Window::CHUNK`] bytes (or
/// one record, if larger), so a scan makes a few large reads instead of two per record, and
/// holds at most one chunk or one record, whatever the log's length.
#[derive(Default)]
struct Window {
    /// Where `buf` starts in the log.
    start: u64,
    buf: Vec<u8>,
}

impl Window {
    const CHUNK: usize = 256 << 10;

    /// The `n` bytes at `at` (the caller checked that they lie before `len`).
    fn get(&mut self, storage: &dyn LogStorage, at: u64, n: usize, len: u64) -> io::Result<&[u8]> {
        let end = self.start + self.buf.len() as u64;
        if at < self.start || at + n as u64 > end {
            let want = n.max(Self::CHUNK) as u64;
            let take = want.min(len.saturating_sub(at)).max(n as u64);
            self.buf.clear();
            self.buf.resize(
                usize::try_from(take).map_err(|_| io::Error::other("a record is too large"))?,
                0,
            );
            storage.read_at(at, &mut self.buf)?;
            self.start = at;
        }
        let from = usize::try_from(at - self.start).map_err(|_| io::Error::other("offset"))?;
        Ok(&self.buf[from..from + n])
    }
}

/// What recovery drops although no crash can have left it so, for `verify` and `repair`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Dropped {
    /// The header is damaged (or missing) while records of the current cycle follow it: a
    /// writer's open starts the log over and discards them.
    pub header_damaged: bool,
    /// The record that ends the valid prefix, when it is damaged rather than torn: its lsn
    /// and what is wrong with it.
    pub damaged: Option<(u64, String)>,
    /// The records after the damaged one whose own CRCs hold, chained from it.
    pub records: u64,
    /// The log's length is not one its writer gives it: what that means.
    pub length: Option<String>,
}

/// What one record slot of a log holds, for [`dropped`].
enum Probe {
    /// The next record, whole.
    Valid { end: u64, crc: u32 },
    /// What a crash can leave where the records end: zeros, a torn record, a record of an
    /// earlier cycle (or nothing to read).
    End,
    /// The next record, written whole and damaged since: what is wrong, where it ends
    /// and the CRCs the record after it may chain from (when its length is known), its
    /// kind and payload as found.
    Damaged {
        why: String,
        end: Option<u64>,
        chain: [u32; 2],
        kind: u8,
        payload: Vec<u8>,
    },
}

/// At most this many places are tried as the end of a record whose length field may be
/// damaged (each try reads the record's CRC): a log full of end markers stays cheap.
const MAX_END_CANDIDATES: usize = 64;

/// Reads the record slot at `at` (the valid records of the cycle end before it) and tells
/// a crash's leftovers from damage. A power cut during an append leaves the record's
/// unwritten sectors as they were, which is zero (the writer's invariant); a kill or a
/// short write leaves a prefix, without the trailer. So a record whose header is the
/// expected one and whose CRC fails is *damaged* when its trailer is in place and none of
/// its sectors is blank, or when the CRC holds once one field of its header is taken as the
/// expected value (its magic, version, generation, lsn, or a length that finds the
/// trailer): a torn write leaves neither.
fn probe(
    storage: &dyn LogStorage,
    len: u64,
    at: u64,
    cursor: Cursor,
    next_lsn: u64,
    prev: u32,
) -> io::Result<Probe> {
    if at + RECORD_HEADER_LEN as u64 > len {
        return Ok(Probe::End);
    }
    let mut rh = [0u8; RECORD_HEADER_LEN];
    storage.read_at(at, &mut rh)?;
    if rh.iter().all(|b| *b == 0) {
        return Ok(Probe::End);
    }
    let problem = head_problem(&rh, cursor, next_lsn);
    // The header as it must read, but for its kind, length and CRC.
    let mut head = rh;
    head[0..2].copy_from_slice(&RECORD_MAGIC);
    head[2] = LOG_VERSION;
    head[8..16].copy_from_slice(&cursor.generation.to_le_bytes());
    head[16..24].copy_from_slice(&next_lsn.to_le_bytes());
    let stored = u32_at(&head, 24);
    let kind = head[3];
    let plen = u64::from(u32_at(&head, 4));
    let end = record_end(at, plen);
    let read_payload = |plen: u64| -> io::Result<Vec<u8>> {
        let mut payload = vec![0u8; usize::try_from(plen).map_err(io::Error::other)?];
        storage.read_at(at + RECORD_HEADER_LEN as u64, &mut payload)?;
        Ok(payload)
    };
    if plen <= MAX_PAYLOAD && end <= len {
        let payload = read_payload(plen)?;
        let crc = record_crc(prev, &head[0..24], &payload);
        match (crc == stored, problem.as_deref()) {
            (true, None) => return Ok(Probe::Valid { end, crc }),
            (true, Some(p)) => {
                return Ok(Probe::Damaged {
                    why: format!("its header is damaged ({p}), while its CRC holds"),
                    end: Some(end),
                    chain: [stored, stored],
                    kind,
                    payload,
                });
            }
            // Not this cycle's next record, even with its header mended: zeros, a record
            // of an earlier cycle, or a torn header.
            (false, Some(_)) => return Ok(Probe::End),
            (false, None) => {}
        }
        let mut trailer = [0u8; RECORD_TRAILER_LEN];
        storage.read_at(end - RECORD_TRAILER_LEN as u64, &mut trailer)?;
        if trailer == RECORD_TRAILER && !has_blank_sector(storage, len, at, end)? {
            return Ok(Probe::Damaged {
                why: "its CRC does not match, although it was written whole (its end marker \
                      is in place and none of its sectors is blank, as a torn write would \
                      leave one)"
                    .into(),
                end: Some(end),
                chain: [stored, crc],
                kind,
                payload,
            });
        }
    } else if problem.is_some() {
        return Ok(Probe::End);
    } else if end > len && !is_capacity(len) {
        // The header is the expected one and its sector was written whole (the length
        // lies between the fields that match), so the record was there: the file was cut.
        return Ok(Probe::Damaged {
            why: format!(
                "it declares {plen} bytes, which run past the end of the file: the log was cut"
            ),
            end: None,
            chain: [stored, stored],
            kind,
            payload: Vec::new(),
        });
    }
    if problem.is_some() {
        return Ok(Probe::End);
    }
    // The trailer is not where the length says: a torn write, or a damaged length. Look
    // for a trailer after which the record's CRC holds.
    let from = at + RECORD_HEADER_LEN as u64;
    let until = len.min(from + MAX_PAYLOAD + RECORD_TRAILER_LEN as u64);
    let mut candidates = 0;
    let mut window = Window::default();
    let mut pos = from;
    while pos + RECORD_TRAILER_LEN as u64 <= until && candidates < MAX_END_CANDIDATES {
        let n = (until - pos).min(Window::CHUNK as u64) as usize;
        let chunk = window.get(storage, pos, n, len)?.to_vec();
        for (i, w) in chunk.windows(RECORD_TRAILER_LEN).enumerate() {
            if w != RECORD_TRAILER {
                continue;
            }
            candidates += 1;
            let p = pos + i as u64 - from;
            if p != plen {
                let mut h = head;
                h[4..8].copy_from_slice(&u32::try_from(p).unwrap_or(u32::MAX).to_le_bytes());
                let payload = read_payload(p)?;
                if record_crc(prev, &h[0..24], &payload) == stored {
                    return Ok(Probe::Damaged {
                        why: format!(
                            "its length field is damaged (it says {plen} bytes; the record \
                             holds {p})"
                        ),
                        end: Some(record_end(at, p)),
                        chain: [stored, stored],
                        kind,
                        payload,
                    });
                }
            }
            if candidates >= MAX_END_CANDIDATES {
                break;
            }
        }
        if n <= RECORD_TRAILER_LEN {
            break;
        }
        // Overlap by the trailer's length less one, so a trailer across chunks is seen.
        pos += (n - (RECORD_TRAILER_LEN - 1)) as u64;
    }
    Ok(Probe::End)
}

/// Whether a [`SECTOR`]-aligned sector overlapping `at..end` (read whole, up to `len`) is
/// all zero: what a power cut leaves of a sector of a record that did not land.
fn has_blank_sector(storage: &dyn LogStorage, len: u64, at: u64, end: u64) -> io::Result<bool> {
    let from = at / SECTOR * SECTOR;
    let to = end.div_ceil(SECTOR).saturating_mul(SECTOR).min(len);
    let mut buf = vec![0u8; usize::try_from(to - from).map_err(io::Error::other)?];
    storage.read_at(from, &mut buf)?;
    Ok(buf
        .chunks(SECTOR as usize)
        .any(|sector| sector.iter().all(|b| *b == 0)))
}

/// Reads `storage` record by record (never the whole log at once) for what recovery drops
/// although no crash can have left it so:
/// - a damaged record where the valid records end (see [`probe`]: a torn or never-synced
///   record is not damage, a record written whole and changed since is), and the records
///   after it that continue the chain from it (a record whose CRC fails with valid records
///   after it is always damage: a record is written only after the one before was synced);
/// - a damaged header with records of the current cycle after it;
/// - a length the writer never gives the file (it was cut or extended).
///
/// Calls `each` with every dropped record whose payload is known: those after the damage,
/// then the damaged record itself as found, so that the operations they touched can be
/// named.
///
/// # Errors
///
/// The storage's I/O error; `each`'s error.
pub(crate) fn dropped<E: From<io::Error>>(
    storage: &dyn LogStorage,
    cursor: Cursor,
    mut each: impl FnMut(Record<'_>) -> Result<(), E>,
) -> Result<Dropped, E> {
    let len = storage.len()?;
    let mut out = Dropped::default();
    let mut head = [0u8; HEADER_LEN];
    let header = if len >= HEADER_LEN as u64 {
        storage.read_at(0, &mut head)?;
        Header::decode(&head).ok()
    } else {
        None
    };
    if header
        .is_some_and(|h| h.journal_id != cursor.journal_id || h.version != u32::from(LOG_VERSION))
    {
        // Another journal's log, or another format's: none of its records are this cycle's.
        return Ok(out);
    }
    if len > 0 && !is_capacity(len) {
        out.length = Some(format!(
            "the log is {len} bytes, a length its writer never gives it (a power of two of at \
             least {INITIAL_CAPACITY}): it was cut or extended, and records past its end, if \
             there were any, are lost"
        ));
    }
    let mut buf = Vec::new();
    if header.is_none() {
        // Without a header a writer starts the log over: the records of the current cycle
        // after it (from the first on, chained from the cycle's seed) are dropped.
        out.records = valid_run(
            storage,
            len,
            START,
            cursor,
            cursor.first_lsn,
            &[seed(cursor.journal_id, cursor.generation)],
            &mut buf,
            &mut each,
        )?;
        out.header_damaged = out.records > 0;
        return Ok(out);
    }
    // The valid prefix, as recovery reads it.
    let mut at = START;
    let mut next_lsn = cursor.first_lsn;
    let mut prev = seed(cursor.journal_id, cursor.generation);
    loop {
        // The record that ends the valid prefix, if it is damaged: what is wrong, where it
        // ends, the CRCs the next record may chain from, its kind and payload, and whether
        // that takes valid records after it.
        let (why, end, chain, kind, payload, needs_followers) =
            match probe(storage, len, at, cursor, next_lsn, prev)? {
                Probe::Valid { end, crc } => {
                    let Some(next) = next_lsn.checked_add(1) else {
                        break;
                    };
                    at = end;
                    prev = crc;
                    next_lsn = next;
                    continue;
                }
                Probe::End => {
                    // A record whose CRC fails with valid records after it is damage,
                    // whatever its sectors look like.
                    let Some((end, chain, kind, payload)) =
                        failing_record(storage, len, at, cursor, next_lsn, prev)?
                    else {
                        break;
                    };
                    let why = "its CRC does not match".to_string();
                    (why, Some(end), chain, kind, payload, true)
                }
                Probe::Damaged {
                    why,
                    end,
                    chain,
                    kind,
                    payload,
                } => (why, end, chain, kind, payload, false),
            };
        let followers = match end {
            Some(end) => valid_run(
                storage,
                len,
                end,
                cursor,
                next_lsn.saturating_add(1),
                &chain,
                &mut buf,
                &mut each,
            )?,
            None => 0,
        };
        if followers > 0 || !needs_followers {
            out.damaged = Some((next_lsn, why));
            out.records = followers;
            if !payload.is_empty() {
                each(Record {
                    lsn: next_lsn,
                    kind,
                    payload: &payload,
                })?;
            }
        }
        break;
    }
    Ok(out)
}

/// The record at `at` when its header is the expected one and its payload lies in the
/// file but its CRC fails: where it ends, the CRCs a next record may chain from (the
/// stored one, the computed one), its kind and payload.
#[allow(clippy::type_complexity)]
fn failing_record(
    storage: &dyn LogStorage,
    len: u64,
    at: u64,
    cursor: Cursor,
    next_lsn: u64,
    prev: u32,
) -> io::Result<Option<(u64, [u32; 2], u8, Vec<u8>)>> {
    if at + RECORD_HEADER_LEN as u64 > len {
        return Ok(None);
    }
    let mut rh = [0u8; RECORD_HEADER_LEN];
    storage.read_at(at, &mut rh)?;
    if head_problem(&rh, cursor, next_lsn).is_some() {
        return Ok(None);
    }
    let plen = u64::from(u32_at(&rh, 4));
    let end = record_end(at, plen);
    if plen > MAX_PAYLOAD || end > len {
        return Ok(None);
    }
    let mut payload = vec![0u8; usize::try_from(plen).map_err(io::Error::other)?];
    storage.read_at(at + RECORD_HEADER_LEN as u64, &mut payload)?;
    let crc = record_crc(prev, &rh[0..24], &payload);
    Ok(Some((end, [u32_at(&rh, 24), crc], rh[3], payload)))
}

/// Counts the valid records from `at` (lsn `lsn` on), the first chained from one of
/// `chain`, and passes each to `each`.
#[allow(clippy::too_many_arguments)]
fn valid_run<E: From<io::Error>>(
    storage: &dyn LogStorage,
    len: u64,
    mut at: u64,
    cursor: Cursor,
    mut lsn: u64,
    chain: &[u32],
    buf: &mut Vec<u8>,
    each: &mut impl FnMut(Record<'_>) -> Result<(), E>,
) -> Result<u64, E> {
    let mut n = 0;
    let mut prevs: Vec<u32> = chain.to_vec();
    loop {
        if at + RECORD_HEADER_LEN as u64 > len {
            break;
        }
        let mut rh = [0u8; RECORD_HEADER_LEN];
        storage.read_at(at, &mut rh)?;
        if head_problem(&rh, cursor, lsn).is_some() {
            break;
        }
        let plen = u64::from(u32_at(&rh, 4));
        let end = record_end(at, plen);
        if plen > MAX_PAYLOAD || end > len {
            break;
        }
        buf.resize(usize::try_from(plen).map_err(io::Error::other)?, 0);
        storage.read_at(at + RECORD_HEADER_LEN as u64, buf)?;
        let stored = u32_at(&rh, 24);
        if !prevs
            .iter()
            .any(|p| record_crc(*p, &rh[0..24], buf) == stored)
        {
            break;
        }
        each(Record {
            lsn,
            kind: rh[3],
            payload: buf,
        })?;
        n += 1;
        prevs = vec![stored];
        let Some(next) = lsn.checked_add(1) else {
            break;
        };
        lsn = next;
        at = end;
    }
    Ok(n)
}

/// Reads the whole of `storage`.
#[cfg(test)]
pub(crate) fn read_all(storage: &dyn LogStorage) -> io::Result<Vec<u8>> {
    let len = storage.len()?;
    let len = usize::try_from(len).map_err(|_| io::Error::other("the log is too large"))?;
    let mut buf = vec![0u8; len];
    storage.read_at(0, &mut buf)?;
    Ok(buf)
}

/// The smallest log file created; it doubles when a record does not fit, so its length is
/// always a power of two of at least this (any other length is damage: a cut or an
/// extension).
pub(crate) const INITIAL_CAPACITY: u64 = 1 << 20;

/// Whether `len` is a length the writer gives a log file.
pub(crate) fn is_capacity(len: u64) -> bool {
    len >= INITIAL_CAPACITY && len.is_power_of_two()
}

/// Appends records to a log and syncs them. Owned by the group committer.
///
/// It keeps one invariant that lets `verify` tell damage from a crash: **past the last
/// record of the current cycle, the file is zero on disk** before a record is written
/// there. A power cut during an append then leaves the record's unwritten sectors zero (a
/// torn write), while a record written whole and damaged later has none (see
/// [`dropped`]). So stale bytes are zeroed and synced before the next record: those of the
/// cycle before, after a checkpoint ([`Writer::restart`]), and those past a torn or stale
/// tail found at open; and the file grows (to a power of two, length first) and syncs
/// before a record goes into the new space.
pub(crate) struct Writer {
    storage: Box<dyn LogStorage>,
    cursor: Cursor,
    next_lsn: u64,
    prev_crc: u32,
    offset: u64,
    capacity: u64,
    /// Bytes that may be non-zero past the records: zeroed and synced before the next
    /// append.
    dirty: Option<(u64, u64)>,
    frame: Vec<u8>,
}

impl fmt::Debug for Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writer")
            .field("cursor", &self.cursor)
            .field("next_lsn", &self.next_lsn)
            .field("offset", &self.offset)
            .field("capacity", &self.capacity)
            .field("dirty", &self.dirty)
            .finish_non_exhaustive()
    }
}

impl Writer {
    /// A writer that continues after `scan` (the records it found are kept), writing a
    /// header and preallocating the file first if it has none for this journal.
    pub(crate) fn resume(
        storage: Box<dyn LogStorage>,
        cursor: Cursor,
        scan: &Scan,
    ) -> io::Result<Writer> {
        let mut w = Writer {
            storage,
            cursor,
            next_lsn: scan.next_lsn,
            prev_crc: scan.prev_crc,
            offset: scan.end,
            capacity: scan.len,
            dirty: None,
            frame: Vec::new(),
        };
        let ours = scan.header.is_some_and(|h| {
            h.journal_id == cursor.journal_id && h.version == u32::from(LOG_VERSION)
        });
        if !ours || scan.len < START {
            // No log for this journal: a new file, or one left by another journal (its
            // records cannot belong to this one). Start it over, preallocated.
            w.initialize()?;
        } else if !is_capacity(scan.len) {
            // A length the writer never makes (the file was cut or extended; `verify`
            // reports it): keep the records read, zero the rest up to a capacity.
            let capacity = scan
                .len
                .max(INITIAL_CAPACITY)
                .checked_next_power_of_two()
                .ok_or_else(|| io::Error::other("the log is too large"))?;
            w.set_capacity(capacity)?;
            w.zero_fill(scan.end, capacity)?;
            w.storage.sync_data()?;
            w.capacity = capacity;
        } else if scan.stopped != End::Clean {
            // A torn record, or records of the cycle before (a crash right after a
            // checkpoint), lie past the end: zero them before the next record.
            w.dirty = Some((scan.end, scan.len));
        }
        Ok(w)
    }

    /// Writes the header and zeros up to the initial capacity (a power of two), and syncs.
    fn initialize(&mut self) -> io::Result<()> {
        let header = Header {
            version: u32::from(LOG_VERSION),
            journal_id: self.cursor.journal_id,
        }
        .encode();
        let capacity = self
            .capacity
            .max(INITIAL_CAPACITY)
            .checked_next_power_of_two()
            .ok_or_else(|| io::Error::other("the log is too large"))?;
        // The length first, synced: a crash or a failed write from here on leaves this
        // length (a length the writer never gives the file reads as damage).
        self.set_capacity(capacity)?;
        // Zeros are written, not just a length set: a sparse file would allocate blocks
        // (metadata) on the first write to each, which every later sync would pay for.
        let mut page = vec![0u8; START as usize];
        page[..HEADER_LEN].copy_from_slice(&header);
        self.storage.write_at(0, &page)?;
        self.zero_fill(START, capacity)?;
        self.storage.sync_data()?;
        self.capacity = capacity;
        self.offset = START;
        self.dirty = None;
        self.next_lsn = self.cursor.first_lsn;
        self.prev_crc = seed(self.cursor.journal_id, self.cursor.generation);
        Ok(())
    }

    /// Sets the file's length and syncs it, before anything is written into the new
    /// space: the length a crash leaves is then always a power of two, and the new space
    /// reads as zero whether or not the zeros written into it next reach the disk.
    fn set_capacity(&self, capacity: u64) -> io::Result<()> {
        self.storage.set_len(capacity)?;
        self.storage.sync_data()
    }

    fn zero_fill(&self, from: u64, to: u64) -> io::Result<()> {
        const CHUNK: u64 = 1 << 20;
        let zeros = vec![0u8; CHUNK.min(to.saturating_sub(from)) as usize];
        let mut at = from;
        while at < to {
            let n = (to - at).min(CHUNK);
            self.storage.write_at(at, &zeros[..n as usize])?;
            at += n;
        }
        Ok(())
    }

    /// Appends one record of `kind` and syncs. On error nothing is known about what
    /// reached the disk: the caller stops writing (the journal is poisoned) and the next
    /// open reads the log again.
    pub(crate) fn append(&mut self, kind: u8, payload: &[u8]) -> io::Result<u64> {
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|l| u64::from(*l) <= MAX_PAYLOAD)
            .ok_or_else(|| io::Error::other("a log record of more than 1 GiB"))?;
        // The record number comes from the file (the last checkpoint): checked, so that a
        // damaged one cannot wrap around to numbers already used.
        let next_lsn = self.next_lsn.checked_add(1).ok_or_else(|| {
            io::Error::other("the log's record numbers are used up (a damaged checkpoint?)")
        })?;
        self.frame.clear();
        self.frame.extend_from_slice(&RECORD_MAGIC);
        self.frame.push(LOG_VERSION);
        self.frame.push(kind);
        self.frame.extend_from_slice(&len.to_le_bytes());
        self.frame
            .extend_from_slice(&self.cursor.generation.to_le_bytes());
        self.frame.extend_from_slice(&self.next_lsn.to_le_bytes());
        let crc = record_crc(self.prev_crc, &self.frame[0..24], payload);
        self.frame.extend_from_slice(&crc.to_le_bytes());
        self.frame.extend_from_slice(payload);
        self.frame.extend_from_slice(&RECORD_TRAILER);
        let end = self.offset + self.frame.len() as u64;
        if let Some((from, to)) = self.dirty {
            // Stale bytes past the records: zero and sync them first (the invariant above).
            self.zero_fill(from, to.min(self.capacity))?;
            self.storage.sync_data()?;
            self.dirty = None;
        }
        if end > self.capacity {
            // Grow by doubling: the length (synced), then zeros (so the new space is
            // allocated once), synced before the record goes there.
            let mut capacity = self.capacity.max(INITIAL_CAPACITY);
            while capacity < end {
                capacity = capacity
                    .checked_mul(2)
                    .ok_or_else(|| io::Error::other("the log is too large"))?;
            }
            self.set_capacity(capacity)?;
            self.zero_fill(self.capacity, capacity)?;
            self.storage.sync_data()?;
            self.capacity = capacity;
        }
        self.storage.write_at(self.offset, &self.frame)?;
        self.storage.sync_data()?;
        self.offset = end;
        self.prev_crc = crc;
        self.next_lsn = next_lsn;
        Ok(self.frame.len() as u64)
    }

    /// Starts the next cycle after a checkpoint made everything logged so far durable in
    /// redb: the next record carries `generation` and goes at the start of the file. No
    /// write is needed now (the stale records are ignored by their generation); the next
    /// append zeroes them first.
    pub(crate) fn restart(&mut self, generation: u64) {
        // The cycle's records are zeroed before the next one's first record (not now: a
        // clean close removes the log instead).
        let to = self
            .dirty
            .map_or(self.offset, |(_, to)| to.max(self.offset));
        self.dirty = Some((START, to));
        self.cursor.generation = generation;
        self.cursor.first_lsn = self.next_lsn;
        self.prev_crc = seed(self.cursor.journal_id, generation);
        self.offset = START;
    }

    /// The cycle in progress: what a checkpoint records for the next one.
    pub(crate) fn cursor(&self) -> Cursor {
        self.cursor
    }

    /// The lsn the next record carries.
    pub(crate) fn next_lsn(&self) -> u64 {
        self.next_lsn
    }

    /// Bytes of records in the current cycle.
    pub(crate) fn used(&self) -> u64 {
        self.offset - START
    }

    /// The log's length on disk.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Removes the log: after a clean close the journal is one file again.
    pub(crate) fn discard(&self) -> io::Result<()> {
        self.storage.discard()
    }
}

#[cfg(test)]
mod tests;
