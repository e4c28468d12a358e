//! Reading a cycle's records back: the valid prefix that recovery keeps.

use std::io;

use super::format::*;
use super::storage::LogStorage;

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
    let log = super::storage::MemoryLog::new();
    log.write_at(0, bytes)?;
    scan_storage(&log, cursor, each)
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
    let mut reader = Reader::new(storage, len);
    loop {
        let (end, kind, payload, crc) = match reader.slot(at, cursor, out.next_lsn, out.prev_crc)? {
            Slot::Eof => {
                out.stopped = End::Eof;
                break;
            }
            Slot::Blank => {
                out.stopped = End::Clean;
                break;
            }
            Slot::NotNext(p) => {
                out.stopped = End::Stale(format!("at offset {at}: {p}"));
                break;
            }
            Slot::TooLong { plen } => {
                out.stopped = End::Stale(format!(
                    "at offset {at}: a payload of {plen} bytes runs past the end of the log"
                ));
                break;
            }
            Slot::Framed(f) if !f.holds() => {
                out.stopped = End::Stale(format!(
                    "at offset {at}: the CRC does not match (a torn or stale record)"
                ));
                break;
            }
            Slot::Framed(f) => (f.end, f.kind(), f.payload, f.computed),
        };
        // Record numbers come from the file: one that leaves no successor ends the cycle.
        let Some(next_lsn) = out.next_lsn.checked_add(1) else {
            out.stopped = End::Stale(format!("at offset {at}: the last record number"));
            break;
        };
        each(Record {
            lsn: out.next_lsn,
            kind,
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

/// One cycle's records as read from one of the log files: the file (its index in the
/// list given to [`scan_cycles`]), the cycle, and the scan.
#[derive(Debug)]
pub(crate) struct Cycle {
    pub file: usize,
    pub cursor: Cursor,
    pub scan: Scan,
}

/// Reads the log's records from `cursor`'s cycle on, across the journal's log files
/// (`files[0]` is `<journal>-log`, `files[1]`, if given, `<journal>-log2`): the cycle is
/// in the file whose first record slot holds its first record, whole or not (`files[0]`
/// when neither does), and the next cycle, if the writer had started it before redb
/// committed this one, in the other file, if its first slot holds the record that follows
/// this cycle's last (the next generation's, with the next record number). A first record
/// that is torn or damaged still places its cycle, with no records read: so recovery
/// resumes there, and `verify` checks that file for damage. There is never a third cycle:
/// a cycle starts in a file only after redb holds every record of the cycle before the one
/// it follows. Returns one or two cycles, the writer's last (where it continues) last.
///
/// # Errors
///
/// A storage's I/O error; `each`'s error.
pub(crate) fn scan_cycles<E: From<io::Error>>(
    files: &[&dyn LogStorage],
    cursor: Cursor,
    mut each: impl FnMut(Record<'_>) -> Result<(), E>,
) -> Result<Vec<Cycle>, E> {
    let file = match files.get(1) {
        Some(other) if !starts_cycle(files[0], cursor)? && starts_cycle(*other, cursor)? => 1,
        _ => 0,
    };
    let first = Cycle {
        file,
        cursor,
        scan: scan_storage(files[file], cursor, &mut each)?,
    };
    let mut cycles = Vec::with_capacity(2);
    // A cycle cut short by damage is not followed: the next one's first record number
    // does not follow the last one read.
    let follows = files.get(1 - file).zip(cursor.generation.checked_add(1));
    let next = follows.map(|(other, generation)| {
        (
            other,
            Cursor {
                journal_id: cursor.journal_id,
                generation,
                first_lsn: first.scan.next_lsn,
            },
        )
    });
    cycles.push(first);
    if let Some((other, next)) = next
        && starts_cycle(*other, next)?
    {
        let scan = scan_storage(*other, next, &mut each)?;
        cycles.push(Cycle {
            file: 1 - file,
            cursor: next,
            scan,
        });
    }
    Ok(cycles)
}

/// Whether `storage` is a log of `cursor`'s journal whose first record slot holds the
/// first record of `cursor`'s cycle (its header: generation and record number), whether
/// or not the record is whole.
fn starts_cycle(storage: &dyn LogStorage, cursor: Cursor) -> io::Result<bool> {
    let len = storage.len()?;
    if len < START + RECORD_HEADER_LEN as u64 {
        return Ok(false);
    }
    // Two small reads (the file's header, the first slot's): not the scan's read-ahead.
    let mut head = [0u8; HEADER_LEN];
    storage.read_at(0, &mut head)?;
    let ours = Header::decode(&head)
        .is_ok_and(|h| h.journal_id == cursor.journal_id && h.version == u32::from(LOG_VERSION));
    if !ours {
        return Ok(false);
    }
    let mut slot = [0u8; RECORD_HEADER_LEN];
    storage.read_at(START, &mut slot)?;
    Ok(slot.iter().any(|b| *b != 0) && head_problem(&slot, cursor, cursor.first_lsn).is_none())
}

/// A read-ahead window over a log: records are read in chunks of [`Window::CHUNK`] bytes (or
/// one record, if larger), so a scan makes a few large reads instead of two per record, and
/// holds at most one chunk or one record, whatever the log's length.
#[derive(Default)]
pub(super) struct Window {
    /// Where `buf` starts in the log.
    start: u64,
    buf: Vec<u8>,
}

impl Window {
    pub(super) const CHUNK: usize = 256 << 10;

    /// The `n` bytes at `at` (the caller checked that they lie before `len`).
    pub(super) fn get(
        &mut self,
        storage: &dyn LogStorage,
        at: u64,
        n: usize,
        len: u64,
    ) -> io::Result<&[u8]> {
        let end = self.start + self.buf.len() as u64;
        if at < self.start || at + n as u64 > end {
            let want = n.max(Self::CHUNK) as u64;
            let take = want.min(len.saturating_sub(at)).max(n as u64);
            // Resized, not cleared and refilled with zeros: the read overwrites every byte
            // (a chunk's zeroing cost as much as the scan's CRCs). A failed read empties
            // the window, so no byte of it is served as the log's.
            self.buf.resize(
                usize::try_from(take).map_err(|_| io::Error::other("a record is too large"))?,
                0,
            );
            if let Err(e) = storage.read_at(at, &mut self.buf) {
                self.buf.clear();
                return Err(e);
            }
            self.start = at;
        }
        let from = usize::try_from(at - self.start).map_err(|_| io::Error::other("offset"))?;
        Ok(&self.buf[from..from + n])
    }
}

/// What the record slot at an offset of the log holds, for a reader of one cycle that
/// expects a given lsn: the one reading of a record (bounds, header, length, payload, CRC)
/// that recovery, `verify` and `repair` share.
pub(super) enum Slot<'r> {
    /// No room for a record header before the end of the storage.
    Eof,
    /// A header of zeros: never written in this file.
    Blank,
    /// A header that is not the expected record of the cycle, and why.
    NotNext(String),
    /// The expected record's header, declaring a payload that runs past the end of the
    /// storage (or over [`MAX_PAYLOAD`]).
    TooLong {
        /// The length it declares.
        plen: u64,
    },
    /// The expected record's header and its payload, whose CRC may or may not hold.
    Framed(Framed<'r>),
}

/// A record read whole: its header and payload as found, and its CRC checked.
pub(super) struct Framed<'r> {
    /// Its header as found.
    pub head: [u8; RECORD_HEADER_LEN],
    /// Its payload as found.
    pub payload: &'r [u8],
    /// Where it ends (after its trailer).
    pub end: u64,
    /// The CRC its header stores.
    pub stored: u32,
    /// The CRC of its header and payload, chained from the CRC the reader was given.
    pub computed: u32,
}

impl Framed<'_> {
    /// Whether the stored CRC holds (chained from the CRC the reader was given).
    pub(super) fn holds(&self) -> bool {
        self.stored == self.computed
    }

    /// Whether the stored CRC holds when chained from `prev` instead.
    pub(super) fn holds_after(&self, prev: u32) -> bool {
        record_crc(prev, &self.head[0..24], self.payload) == self.stored
    }

    /// The record's kind.
    pub(super) fn kind(&self) -> u8 {
        self.head[3]
    }
}

/// Reads record slots of a log of `len` bytes through a read-ahead [`Window`].
pub(super) struct Reader<'s> {
    storage: &'s dyn LogStorage,
    len: u64,
    window: Window,
}

impl<'s> Reader<'s> {
    pub(super) fn new(storage: &'s dyn LogStorage, len: u64) -> Reader<'s> {
        Reader {
            storage,
            len,
            window: Window::default(),
        }
    }

    /// The slot at `at`, read as the record of `cursor`'s cycle numbered `lsn`, its CRC
    /// chained from `prev`.
    pub(super) fn slot(
        &mut self,
        at: u64,
        cursor: Cursor,
        lsn: u64,
        prev: u32,
    ) -> io::Result<Slot<'_>> {
        if at.saturating_add(RECORD_HEADER_LEN as u64) > self.len {
            return Ok(Slot::Eof);
        }
        let mut head = [0u8; RECORD_HEADER_LEN];
        head.copy_from_slice(
            self.window
                .get(self.storage, at, RECORD_HEADER_LEN, self.len)?,
        );
        if head.iter().all(|b| *b == 0) {
            return Ok(Slot::Blank);
        }
        if let Some(p) = head_problem(&head, cursor, lsn) {
            return Ok(Slot::NotNext(p));
        }
        let plen = u64::from(u32_at(&head, 4));
        let end = record_end(at, plen);
        if plen > MAX_PAYLOAD || end > self.len {
            return Ok(Slot::TooLong { plen });
        }
        let n = usize::try_from(plen).map_err(io::Error::other)?;
        let payload = self
            .window
            .get(self.storage, at + RECORD_HEADER_LEN as u64, n, self.len)?;
        Ok(Slot::Framed(Framed {
            head,
            payload,
            end,
            stored: u32_at(&head, 24),
            computed: record_crc(prev, &head[0..24], payload),
        }))
    }
}
