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
//! ```
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
//! assumes by default): records share sectors with the record before them.

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
/// The header's size on disk; records start at [`START`].
pub(crate) const HEADER_LEN: usize = 28;
/// Where the first record starts.
pub(crate) const START: u64 = 4096;
/// The two bytes that start every record.
pub(crate) const RECORD_MAGIC: [u8; 2] = *b"OL";
/// Bytes before a record's payload.
pub(crate) const RECORD_HEADER_LEN: usize = 28;
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
        Ok(h) if h.version != u32::from(crate::codec::FORMAT_VERSION) => {
            out.header_problem = Some(format!(
                "the log is format version {}, this build reads version {}",
                h.version,
                crate::codec::FORMAT_VERSION
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
    } else if head[2] != crate::codec::FORMAT_VERSION {
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
    if header.version != u32::from(crate::codec::FORMAT_VERSION)
        || rh[0..2] != RECORD_MAGIC
        || rh[2] != crate::codec::FORMAT_VERSION
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
        let end = at
            .saturating_add(RECORD_HEADER_LEN as u64)
            .saturating_add(plen);
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
        each(Record {
            lsn: out.next_lsn,
            kind: rh[3],
            payload,
        })?;
        out.prev_crc = crc;
        out.next_lsn += 1;
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

/// What lies past the records that recovery keeps, for `verify` and `repair`: records of
/// the current cycle that recovery drops because one before them is damaged, or because the
/// log's header is.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Dropped {
    /// The header is damaged (or missing) while records of the current cycle follow it: a
    /// writer's open starts the log over and discards them.
    pub header_damaged: bool,
    /// The lsn of the damaged record that ends the valid prefix, when records follow it.
    pub damaged_lsn: Option<u64>,
    /// The records after the damage whose own CRCs hold, chained from the damaged record's
    /// stored CRC.
    pub records: u64,
}

/// Reads `storage` record by record (never the whole log at once) for what recovery drops:
/// when the valid prefix ends at a record that carries the expected magic, version,
/// generation and lsn but fails its CRC (damage, not a torn tail: a torn tail has nothing
/// valid after it), the records after it that continue the chain from its stored CRC; when
/// the header is damaged, the records of the current cycle after it. Calls `each` with
/// every such record and, last, with the damaged record itself as found (when records
/// follow it).
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
    if len >= HEADER_LEN as u64 {
        storage.read_at(0, &mut head)?;
    }
    let header = if len >= HEADER_LEN as u64 {
        Header::decode(&head).ok()
    } else {
        None
    };
    if header.is_some_and(|h| {
        h.journal_id != cursor.journal_id || h.version != u32::from(crate::codec::FORMAT_VERSION)
    }) {
        // Another journal's log, or another format's: none of its records are this cycle's.
        return Ok(out);
    }
    let header_ok = header.is_some();
    let mut at = START;
    let mut next_lsn = cursor.first_lsn;
    let mut prev = seed(cursor.journal_id, cursor.generation);
    let mut buf = Vec::new();
    // First the valid prefix (as recovery reads it), then, past one damaged record, the rest.
    let mut past_damage = !header_ok;
    let mut damaged: Option<(u64, u8, Vec<u8>)> = None;
    loop {
        let mut rh = [0u8; RECORD_HEADER_LEN];
        if at + RECORD_HEADER_LEN as u64 > len {
            break;
        }
        storage.read_at(at, &mut rh)?;
        if rh.iter().all(|b| *b == 0) || head_problem(&rh, cursor, next_lsn).is_some() {
            break;
        }
        let plen = u64::from(u32_at(&rh, 4));
        let end = at + RECORD_HEADER_LEN as u64 + plen;
        if plen > MAX_PAYLOAD || end > len {
            break;
        }
        buf.resize(plen as usize, 0);
        storage.read_at(at + RECORD_HEADER_LEN as u64, &mut buf)?;
        let stored = u32_at(&rh, 24);
        let intact = record_crc(prev, &rh[0..24], &buf) == stored;
        if !intact {
            if past_damage && out.damaged_lsn.is_some() {
                break;
            }
            if !header_ok {
                // Without a header nothing is chained from: the first record must hold.
                break;
            }
            out.damaged_lsn = Some(next_lsn);
            damaged = Some((next_lsn, rh[3], buf.clone()));
            past_damage = true;
        } else if past_damage {
            out.records += 1;
            each(Record {
                lsn: next_lsn,
                kind: rh[3],
                payload: &buf,
            })?;
        }
        prev = stored;
        next_lsn += 1;
        at = end;
    }
    if !header_ok {
        out.header_damaged = out.records > 0;
    } else if out.records == 0 {
        out.damaged_lsn = None;
    } else if let Some((lsn, kind, payload)) = damaged {
        // The damaged record itself is dropped too (it is not counted in `records`, which
        // counts the valid ones after it): its payload, as found, goes to `each` as well,
        // so that the operations it touched can be named when it still decodes (the
        // corruption sweep found operations whose events were in it vanishing unnamed).
        each(Record {
            lsn,
            kind,
            payload: &payload,
        })?;
    }
    Ok(out)
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

/// The smallest log file created; it doubles when a record does not fit.
pub(crate) const INITIAL_CAPACITY: u64 = 1 << 20;

/// Appends records to a log and syncs them. Owned by the group committer.
pub(crate) struct Writer {
    storage: Box<dyn LogStorage>,
    cursor: Cursor,
    next_lsn: u64,
    prev_crc: u32,
    offset: u64,
    capacity: u64,
    frame: Vec<u8>,
}

impl fmt::Debug for Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writer")
            .field("cursor", &self.cursor)
            .field("next_lsn", &self.next_lsn)
            .field("offset", &self.offset)
            .field("capacity", &self.capacity)
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
            frame: Vec::new(),
        };
        let ours = scan.header.is_some_and(|h| {
            h.journal_id == cursor.journal_id
                && h.version == u32::from(crate::codec::FORMAT_VERSION)
        });
        if !ours || scan.len < START {
            // No log for this journal: a new file, or one left by another journal (its
            // records cannot belong to this one). Start it over, preallocated.
            w.initialize()?;
        }
        Ok(w)
    }

    /// Writes the header and zeros up to the initial capacity, and syncs.
    fn initialize(&mut self) -> io::Result<()> {
        let header = Header {
            version: u32::from(crate::codec::FORMAT_VERSION),
            journal_id: self.cursor.journal_id,
        }
        .encode();
        let capacity = self.capacity.max(INITIAL_CAPACITY);
        // Zeros are written, not just a length set: a sparse file would allocate blocks
        // (metadata) on the first write to each, which every later sync would pay for.
        let mut page = vec![0u8; START as usize];
        page[..HEADER_LEN].copy_from_slice(&header);
        self.storage.write_at(0, &page)?;
        self.zero_fill(START, capacity)?;
        self.storage.sync_data()?;
        self.capacity = capacity;
        self.offset = START;
        self.next_lsn = self.cursor.first_lsn;
        self.prev_crc = seed(self.cursor.journal_id, self.cursor.generation);
        Ok(())
    }

    fn zero_fill(&self, from: u64, to: u64) -> io::Result<()> {
        const CHUNK: u64 = 1 << 20;
        let zeros = vec![0u8; CHUNK as usize];
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
        self.frame.clear();
        self.frame.extend_from_slice(&RECORD_MAGIC);
        self.frame.push(crate::codec::FORMAT_VERSION);
        self.frame.push(kind);
        self.frame.extend_from_slice(&len.to_le_bytes());
        self.frame
            .extend_from_slice(&self.cursor.generation.to_le_bytes());
        self.frame.extend_from_slice(&self.next_lsn.to_le_bytes());
        let crc = record_crc(self.prev_crc, &self.frame[0..24], payload);
        self.frame.extend_from_slice(&crc.to_le_bytes());
        self.frame.extend_from_slice(payload);
        let end = self.offset + self.frame.len() as u64;
        if end > self.capacity {
            // Grow by doubling: zeros first, so the new space is allocated once.
            let mut capacity = self.capacity.max(INITIAL_CAPACITY);
            while capacity < end {
                capacity = capacity.saturating_mul(2);
            }
            self.zero_fill(self.capacity, capacity)?;
            self.capacity = capacity;
        }
        self.storage.write_at(self.offset, &self.frame)?;
        self.storage.sync_data()?;
        self.offset = end;
        self.prev_crc = crc;
        self.next_lsn += 1;
        Ok(self.frame.len() as u64)
    }

    /// Starts the next cycle after a checkpoint made everything logged so far durable in
    /// redb: the next record carries `generation` and goes at the start of the file. No
    /// write is needed; the stale records are ignored by their generation.
    pub(crate) fn restart(&mut self, generation: u64) {
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
