//! Appending records and syncing them.

use std::fmt;
use std::io;

use super::format::*;
use super::reader::{End, Scan};
use super::storage::LogStorage;

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
