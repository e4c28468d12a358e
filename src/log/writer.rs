//! Appending records and syncing them.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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
    storage: Arc<dyn LogStorage>,
    /// The second log file, where the next cycle starts (see [`Writer::switch`]); `None`
    /// for custom storage, whose cycles all start over in one log.
    spare: Option<Spare>,
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
            .field("spare", &self.spare)
            .finish_non_exhaustive()
    }
}

impl Writer {
    /// A writer that continues after `scan` (the records it found are kept), writing a
    /// header and preallocating the file first if it has none for this journal.
    pub(crate) fn resume(
        storage: Arc<dyn LogStorage>,
        cursor: Cursor,
        scan: &Scan,
    ) -> io::Result<Writer> {
        let mut w = Writer {
            storage,
            spare: None,
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

    /// Gives the writer its second log file (see [`Spare`]).
    pub(crate) fn set_spare(&mut self, spare: Spare) {
        self.spare = Some(spare);
    }

    /// Whether the writer has a second log file.
    pub(crate) fn has_spare(&self) -> bool {
        self.spare.is_some()
    }

    /// Whether redb's file says (format 5) that a second log file may hold records, as a
    /// checkpoint of this handle wrote it: a cycle may start there only then.
    pub(crate) fn spare_marked(&self) -> bool {
        self.spare
            .as_ref()
            .is_some_and(|s| s.marked.load(Ordering::SeqCst))
    }

    /// Records what the last checkpoint wrote about the second log file.
    pub(crate) fn set_spare_marked(&mut self, marked: bool) {
        if let Some(spare) = self.spare.as_mut() {
            spare.marked.store(marked, Ordering::SeqCst);
        }
    }

    /// The flag [`Writer::spare_marked`] reads, for a job that marks the file, the first
    /// time it is asked for (`None` after that, and without a second file).
    pub(crate) fn spare_mark(&mut self) -> Option<Arc<AtomicBool>> {
        let spare = self.spare.as_mut().filter(|s| !s.readying)?;
        spare.readying = true;
        Some(Arc::clone(&spare.marked))
    }

    /// Whether the second log file has yet to be readied ([`Writer::spare_mark`]).
    pub(crate) fn spare_unreadied(&self) -> bool {
        self.spare.as_ref().is_some_and(|s| !s.readying)
    }

    /// Whether the next cycle can start in the second log file now: there is one, and it
    /// has been zeroed since its last cycle.
    pub(crate) fn can_switch(&self) -> bool {
        self.spare
            .as_ref()
            .is_some_and(|s| s.ready.load(Ordering::SeqCst))
    }

    /// The second log file, when it needs preparing and nobody has been handed it to
    /// prepare: it is marked handed over, and the caller prepares it ([`prepare_spare`])
    /// and then sets the flag it returns. `None` when there is nothing to do, or when it
    /// holds records not yet in redb (a cycle found at open: [`Writer::spare_committed`]
    /// tells when they are).
    pub(crate) fn spare_to_prepare(&mut self) -> Option<SpareJob> {
        let capacity = self.capacity;
        let spare = self.spare.as_mut()?;
        if spare.live || spare.handed || spare.ready.load(Ordering::SeqCst) {
            return None;
        }
        spare.handed = true;
        Some(SpareJob {
            storage: Arc::clone(&spare.storage),
            journal_id: self.cursor.journal_id,
            dirty_to: spare.dirty_to,
            capacity,
            ready: Arc::clone(&spare.ready),
        })
    }

    /// Says that redb now holds every record of the second log file (a checkpoint
    /// committed after the open that found them there): it may be zeroed.
    pub(crate) fn spare_committed(&mut self) {
        if let Some(spare) = self.spare.as_mut() {
            spare.live = false;
        }
    }

    /// Starts the next cycle (`generation`) in the second log file, which must be ready
    /// ([`Writer::can_switch`]), and makes the file of the cycle that ends the spare. No
    /// write is needed: the spare was zeroed past its header and synced. The ended cycle's
    /// records are needed until redb holds them: the caller commits them, then zeroes the
    /// returned file up to the returned offset (where its records end), syncs it, and sets
    /// the returned flag.
    ///
    /// # Errors
    ///
    /// The length of the spare cannot be read (nothing changed then).
    pub(crate) fn switch(&mut self, generation: u64) -> io::Result<SpareJob> {
        let Some(spare) = self.spare.as_mut() else {
            return Err(io::Error::other("the journal has one log file"));
        };
        if !spare.ready.load(Ordering::SeqCst) {
            return Err(io::Error::other("the second log file is not zeroed yet"));
        }
        let capacity = spare.storage.len()?;
        let ended_capacity = self.capacity;
        let ended_to = self
            .dirty
            .map_or(self.offset, |(_, to)| to.max(self.offset));
        std::mem::swap(&mut self.storage, &mut spare.storage);
        spare.ready.store(false, Ordering::SeqCst);
        spare.handed = true;
        spare.live = false;
        spare.dirty_to = ended_to;
        self.capacity = capacity;
        self.dirty = None;
        self.cursor.generation = generation;
        self.cursor.first_lsn = self.next_lsn;
        self.prev_crc = seed(self.cursor.journal_id, generation);
        self.offset = START;
        Ok(SpareJob {
            storage: Arc::clone(&spare.storage),
            journal_id: self.cursor.journal_id,
            dirty_to: ended_to,
            capacity: ended_capacity,
            ready: Arc::clone(&spare.ready),
        })
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

    /// Removes the log (both files): after a clean close the journal is one file again.
    pub(crate) fn discard(&self) -> io::Result<()> {
        if let Some(spare) = &self.spare {
            spare.storage.discard()?;
        }
        self.storage.discard()
    }
}

/// The writer's second log file: where the next cycle starts, so that the checkpoint of
/// the cycle that ends can commit beside the new cycle's records. Between cycles it is
/// zeroed past its header (the invariant [`Writer`] keeps for the file it appends to) by
/// the checkpoint thread, after redb holds its records.
pub(crate) struct Spare {
    storage: Arc<dyn LogStorage>,
    /// Zeroed past its header up to its length, which is a capacity, and synced: the next
    /// cycle can start in it. Set by whoever prepared it.
    ready: Arc<AtomicBool>,
    /// Handed to a job that prepares it (it sets `ready`).
    handed: bool,
    /// Holds records that redb does not hold yet (found at open): not to be zeroed before
    /// a checkpoint commits them.
    live: bool,
    /// Where bytes left by its last cycle may end.
    dirty_to: u64,
    /// Whether redb's file says format 5 (see [`Writer::spare_marked`]).
    marked: Arc<AtomicBool>,
    /// A job to mark the file and prepare this one was queued ([`Writer::spare_mark`]).
    readying: bool,
}

impl fmt::Debug for Spare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Spare")
            .field("ready", &self.ready.load(Ordering::SeqCst))
            .field("handed", &self.handed)
            .field("live", &self.live)
            .field("dirty_to", &self.dirty_to)
            .field("marked", &self.marked.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl Spare {
    /// A second log file as found at open: `live` when it holds records of the cycle
    /// before the one the writer continues (not in redb yet), else left by an earlier
    /// cycle (or new, or another journal's), to be prepared before it is used.
    pub(crate) fn found(storage: Arc<dyn LogStorage>, live: bool) -> io::Result<Spare> {
        let dirty_to = storage.len()?;
        Ok(Spare {
            storage,
            ready: Arc::new(AtomicBool::new(false)),
            handed: false,
            live,
            dirty_to,
            marked: Arc::new(AtomicBool::new(false)),
            readying: false,
        })
    }
}

/// The second log file handed over to be prepared for the next cycle
/// ([`SpareJob::prepare`]), after redb holds its records.
pub(crate) struct SpareJob {
    storage: Arc<dyn LogStorage>,
    journal_id: u64,
    dirty_to: u64,
    /// The length to give it if it must be initialized: the other file's.
    capacity: u64,
    ready: Arc<AtomicBool>,
}

impl SpareJob {
    /// Prepares the file ([`prepare_spare`]) and marks it ready for the next cycle.
    ///
    /// # Errors
    ///
    /// The storage's I/O error: the file is not marked ready (the journal is poisoned by
    /// the caller).
    pub(crate) fn prepare(self) -> io::Result<()> {
        prepare_spare(&self.storage, self.journal_id, self.dirty_to, self.capacity)?;
        self.ready.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// Makes `storage` ready to take a cycle of `journal_id`'s log: a header of this journal
/// and a length that is a capacity (else it is initialized, as a new log is, to
/// `capacity`), zero from [`START`] up to `dirty_to` (where bytes of its last cycle may
/// end; zero past it), and synced.
///
/// # Errors
///
/// The storage's I/O error: nothing is known about what reached the disk.
fn prepare_spare(
    storage: &Arc<dyn LogStorage>,
    journal_id: u64,
    dirty_to: u64,
    capacity: u64,
) -> io::Result<()> {
    let len = storage.len()?;
    let ours = if len >= START && is_capacity(len) {
        let mut head = [0u8; HEADER_LEN];
        storage.read_at(0, &mut head)?;
        Header::decode(&head)
            .is_ok_and(|h| h.journal_id == journal_id && h.version == u32::from(LOG_VERSION))
    } else {
        false
    };
    let mut w = Writer {
        storage: Arc::clone(storage),
        spare: None,
        cursor: Cursor {
            journal_id,
            generation: 0,
            first_lsn: 0,
        },
        next_lsn: 0,
        prev_crc: 0,
        offset: START,
        capacity: len,
        dirty: None,
        frame: Vec::new(),
    };
    if ours {
        w.zero_fill(START, dirty_to.min(len))?;
        w.storage.sync_data()
    } else {
        w.capacity = capacity;
        w.initialize()
    }
}
