//! A simulated disk holding a journal's files, the redb file and its log (and the log's
//! second file, `<journal>-log2`, for journals opened with it), with fault injection, for
//! crash tests.
//!
//! Self-contained (std, redb and opjournal's [`LogStorage`] trait only), so fuzz targets and
//! tools can include it by path.
//!
//! [`FaultDisk::backend`] is the redb file (a [`redb::StorageBackend`]) and
//! [`FaultDisk::log`] the log beside it (an [`opjournal::LogStorage`]), [`FaultDisk::log2`]
//! the log's second file (another one, for `open_backends_with_spare_log`). Each file keeps two
//! images, as redb's own crash tests do:
//! - `live`: every write and length change, as the process sees the file (the page cache);
//! - `durable`: what the file's last completed `sync_data` made permanent.
//!
//! Everything written to a file since its last completed sync is *pending*. A sync makes
//! only that file's pending writes durable, as `fdatasync` does. A simulated power cut
//! keeps, drops or half-applies each pending write of each file (torn at 512-byte sector
//! granularity, each sector of a torn write landing or not independently), in any
//! combination: the disk may reorder unsynced writes, within a file and across files. A
//! process crash without power loss keeps `live`. Removing the log (a clean close) is a
//! pending change too, which a power cut may keep or drop (the directory is not synced).
//!
//! Faults: the Nth write, set_len, sync or remove, of either file or of one of them, from
//! the moment a [`Trigger`] is armed fails with `EIO` or `ENOSPC`, once or from then on, or
//! the power is cut at that moment (the operation does not happen and every later one, on
//! every file, fails: the process is dead). The files share one fault counter, one
//! power state and one set of statistics. A failed sync makes nothing durable; its pending
//! writes stay pending, as Linux may have dropped them from the page cache (the
//! "fsyncgate" behaviour).
#![allow(dead_code)]

use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use std::ops::Bound;

use redb::{BackendError, StorageBackend};

/// The sector size at which a torn write tears.
pub const SECTOR: u64 = 512;

/// Linux `EIO`.
pub const EIO: i32 = 5;
/// Linux `ENOSPC`.
pub const ENOSPC: i32 = 28;

/// The files on the disk.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DiskFile {
    /// The redb file (the index).
    Db,
    /// The log beside it (the commit point).
    Log,
    /// The log's second file (a journal opened with a spare log keeps each cycle of the
    /// log in the file the cycle before did not use).
    Log2,
}

impl DiskFile {
    fn index(self) -> usize {
        match self {
            DiskFile::Db => 0,
            DiskFile::Log => 1,
            DiskFile::Log2 => 2,
        }
    }

    /// Every file.
    pub const ALL: [DiskFile; 3] = [DiskFile::Db, DiskFile::Log, DiskFile::Log2];

    /// Whether it is one of the log's files.
    pub fn is_log(self) -> bool {
        matches!(self, DiskFile::Log | DiskFile::Log2)
    }
}

/// The kinds of operation a trigger counts.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum IoKind {
    /// `write`.
    Write,
    /// `set_len`.
    SetLen,
    /// `sync_data`.
    Sync,
    /// Removing the file (the log, when a journal closes cleanly).
    Remove,
}

impl IoKind {
    fn index(self) -> usize {
        match self {
            IoKind::Write => 0,
            IoKind::SetLen => 1,
            IoKind::Sync => 2,
            IoKind::Remove => 3,
        }
    }
}

/// What happens when a trigger fires.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// The operation fails with this errno (`EIO` or `ENOSPC`) and does nothing. With
    /// `persistent`, every later operation of the same kind fails too (on every file).
    Fail {
        /// The raw OS error.
        errno: i32,
        /// Whether it keeps failing.
        persistent: bool,
    },
    /// The power is cut just before the operation: it does not happen, and nothing after it
    /// reaches the disk.
    PowerCut,
}

/// Fire `action` at the `nth` (1-based) operation of `kind` counted from arming, on `file`
/// (or on any file, counted together, for `None`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Trigger {
    /// Which operations are counted.
    pub kind: IoKind,
    /// Which one fires (1 = the next one).
    pub nth: u64,
    /// What happens.
    pub action: FaultAction,
    /// Which file's operations count (`None`: all).
    pub file: Option<DiskFile>,
}

impl Trigger {
    /// A trigger counting the operations of every file.
    pub fn any(kind: IoKind, nth: u64, action: FaultAction) -> Trigger {
        Trigger {
            kind,
            nth,
            action,
            file: None,
        }
    }

    /// A trigger counting the operations of `file` only.
    pub fn on(file: DiskFile, kind: IoKind, nth: u64, action: FaultAction) -> Trigger {
        Trigger {
            kind,
            nth,
            action,
            file: Some(file),
        }
    }
}

/// How a power cut treats the writes pending since each file's last completed sync.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CutPolicy {
    /// Every pending write reached the platter (a process crash loses nothing either).
    KeepAll,
    /// None did.
    DropAll,
    /// Each independently: kept, dropped or torn (sector by sector).
    Random,
    /// Every write to the file's first sector (redb's commit slots and flags) dropped, the
    /// others kept: a disk that wrote a commit's pages but not the header naming it, nor
    /// the one clearing the mark on the commit before.
    KeepAllButHeader,
    /// Every write to the file's first sector dropped, the others as [`CutPolicy::Random`].
    RandomButHeader,
}

#[derive(Clone, Debug)]
enum Pending {
    Write {
        offset: u64,
        data: Vec<u8>,
    },
    /// A write of zeros (preallocation), kept without its bytes.
    Zeros {
        offset: u64,
        len: u64,
    },
    SetLen(u64),
    Remove,
}

impl Pending {
    /// Applies the write to `image`, whole or, for a torn write, the bytes in `range`
    /// (offsets in the file).
    fn apply(&self, image: &mut Image, range: Option<std::ops::Range<u64>>) {
        let (offset, len) = match self {
            Pending::Write { offset, data } => (*offset, data.len() as u64),
            Pending::Zeros { offset, len } => (*offset, *len),
            Pending::SetLen(len) => return image.set_len(to_usize(*len)),
            Pending::Remove => return image.set_len(0),
        };
        let r = range.unwrap_or(offset..offset + len);
        let from = to_usize(r.start - offset);
        let n = to_usize(r.end - r.start);
        match self {
            Pending::Write { data, .. } => {
                image.write(to_usize(r.start), Some(&data[from..from + n]), n);
            }
            _ => image.write(to_usize(r.start), None, n),
        }
    }
}

/// Whether `data` is all zeros (compared a block at a time, as `memcmp` does it fast).
fn is_zeros(data: &[u8]) -> bool {
    static ZEROS: [u8; 4096] = [0; 4096];
    data.chunks(ZEROS.len()).all(|c| c == &ZEROS[..c.len()])
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Counters of one file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileStats {
    /// Writes that reached the live image.
    pub writes: u64,
    /// Bytes those writes carried.
    pub bytes_written: u64,
    /// Length changes that reached the live image.
    pub set_lens: u64,
    /// Completed syncs.
    pub syncs: u64,
    /// Removals.
    pub removes: u64,
}

impl FileStats {
    /// The operations of `kind` counted.
    pub fn ops(&self, kind: IoKind) -> u64 {
        match kind {
            IoKind::Write => self.writes,
            IoKind::SetLen => self.set_lens,
            IoKind::Sync => self.syncs,
            IoKind::Remove => self.removes,
        }
    }

    /// Adds `o` to `self`.
    pub fn add(&mut self, o: &FileStats) {
        self.writes += o.writes;
        self.bytes_written += o.bytes_written;
        self.set_lens += o.set_lens;
        self.syncs += o.syncs;
        self.removes += o.removes;
    }
}

/// Counters of the disk, for the figures a long run reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// The redb file's.
    pub db: FileStats,
    /// The log's.
    pub log: FileStats,
    /// The log's second file's.
    pub log2: FileStats,
    /// Faults injected (failed operations and power cuts).
    pub faults: u64,
    /// Syncs attempted after the power was cut, or of a file after a fault fired on it (a
    /// poisoned handle must never retry a sync of the file that failed).
    pub syncs_after_fault: u64,
}

impl DiskStats {
    /// The counters of `file`.
    pub fn file(&self, file: DiskFile) -> &FileStats {
        match file {
            DiskFile::Db => &self.db,
            DiskFile::Log => &self.log,
            DiskFile::Log2 => &self.log2,
        }
    }

    /// Adds `o` to `self`.
    pub fn add(&mut self, o: &DiskStats) {
        self.db.add(&o.db);
        self.log.add(&o.log);
        self.log2.add(&o.log2);
        self.faults += o.faults;
        self.syncs_after_fault += o.syncs_after_fault;
    }
}

/// The bytes of one file, in 64 KiB chunks shared between copies until one of them
/// writes (copy on write); a chunk of zeros takes no memory. Copying an image (a reboot, a
/// power cut, the durable image at a sync) costs what differs, not the whole file: the log
/// alone is a megabyte of preallocated zeros.
#[derive(Clone, Debug, Default)]
pub struct Image {
    len: usize,
    /// `None`: all zeros.
    chunks: Vec<Option<Arc<Vec<u8>>>>,
}

/// The size of an image's chunks.
const CHUNK: usize = 64 << 10;

impl Image {
    /// An image holding `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Image {
        let chunks = bytes
            .chunks(CHUNK)
            .map(|c| {
                (!is_zeros(c)).then(|| {
                    let mut v = c.to_vec();
                    v.resize(CHUNK, 0);
                    Arc::new(v)
                })
            })
            .collect();
        Image {
            len: bytes.len(),
            chunks,
        }
    }

    /// The bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len];
        for (i, c) in self.chunks.iter().enumerate() {
            if let Some(c) = c {
                let start = i * CHUNK;
                let end = (start + CHUNK).min(self.len);
                out[start..end].copy_from_slice(&c[..end - start]);
            }
        }
        out
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes (a file absent or empty).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes in `range`, if it lies within the image.
    pub fn get(&self, range: std::ops::Range<usize>) -> Option<Vec<u8>> {
        if range.end > self.len || range.start > range.end {
            return None;
        }
        let mut out = vec![0u8; range.len()];
        self.read(range.start, &mut out);
        Some(out)
    }

    fn read(&self, offset: usize, out: &mut [u8]) {
        let mut done = 0;
        while done < out.len() {
            let at = offset + done;
            let (i, within) = (at / CHUNK, at % CHUNK);
            let n = (CHUNK - within).min(out.len() - done);
            match &self.chunks[i] {
                Some(c) => out[done..done + n].copy_from_slice(&c[within..within + n]),
                None => out[done..done + n].fill(0),
            }
            done += n;
        }
    }

    fn set_len(&mut self, len: usize) {
        if len < self.len {
            self.chunks.truncate(len.div_ceil(CHUNK));
            let tail = len % CHUNK;
            if tail != 0
                && let Some(Some(c)) = self.chunks.last_mut()
            {
                Arc::make_mut(c)[tail..].fill(0);
            }
        } else {
            self.chunks.resize(len.div_ceil(CHUNK), None);
        }
        self.len = len;
    }

    /// Writes `data` at `offset` (`None`: that many zeros), growing the image if needed.
    fn write(&mut self, offset: usize, data: Option<&[u8]>, len: usize) {
        if offset + len > self.len {
            self.set_len(offset + len);
        }
        let mut done = 0;
        while done < len {
            let at = offset + done;
            let (i, within) = (at / CHUNK, at % CHUNK);
            let n = (CHUNK - within).min(len - done);
            let chunk = &mut self.chunks[i];
            match data {
                Some(d) => {
                    let c = chunk.get_or_insert_with(|| Arc::new(vec![0u8; CHUNK]));
                    Arc::make_mut(c)[within..within + n].copy_from_slice(&d[done..done + n]);
                }
                None if n == CHUNK => *chunk = None,
                None => {
                    if let Some(c) = chunk {
                        Arc::make_mut(c)[within..within + n].fill(0);
                    }
                }
            }
            done += n;
        }
    }
}

impl PartialEq for Image {
    fn eq(&self, other: &Image) -> bool {
        self.len == other.len
            && self
                .chunks
                .iter()
                .zip(&other.chunks)
                .all(|(a, b)| match (a, b) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
                    (None, None) => true,
                    (Some(c), None) | (None, Some(c)) => is_zeros(c),
                })
    }
}

impl Eq for Image {}

impl From<Vec<u8>> for Image {
    fn from(bytes: Vec<u8>) -> Image {
        Image::from_bytes(&bytes)
    }
}

/// What a disk holds: the redb file and the log's files (empty when absent), as a reboot
/// finds them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskImage {
    /// The redb file.
    pub db: Image,
    /// The log file (empty: absent or empty).
    pub log: Image,
    /// The log's second file (empty: absent or empty).
    pub log2: Image,
}

impl DiskImage {
    /// The image of `file`.
    pub fn file(&self, file: DiskFile) -> &Image {
        match file {
            DiskFile::Db => &self.db,
            DiskFile::Log => &self.log,
            DiskFile::Log2 => &self.log2,
        }
    }
}

#[derive(Debug, Default, Clone)]
struct FileState {
    live: Image,
    durable: Image,
    pending: Vec<Pending>,
}

#[derive(Debug, Default)]
struct State {
    files: [FileState; 3],
    counts: [u64; 4],
    trigger: Option<Trigger>,
    /// Kinds that fail from now on, with their errno.
    failing: [Option<i32>; 4],
    /// The power is off (or the process is dead): nothing reaches the disk any more.
    dead: bool,
    /// The file the first fault fired on.
    fired_on: Option<DiskFile>,
    /// The counters when the first fault fired.
    stats_at_fault: Option<DiskStats>,
    stats: DiskStats,
    /// How long each sync takes before it completes (a real disk's fsync costs
    /// milliseconds; zero by default).
    sync_delay: std::time::Duration,
    /// Byte-range locks held on the redb file, and the next backend's holder number.
    locks: Vec<RangeLock>,
    holders: u64,
}

/// The simulated disk, shared by every backend and log opened on it (cheap to clone).
#[derive(Clone, Debug, Default)]
pub struct FaultDisk {
    state: Arc<Mutex<State>>,
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// `durable` plus the pending changes `policy` lets through.
fn cut(f: &FileState, policy: CutPolicy, rng: &mut dyn FnMut() -> u64) -> Image {
    let mut image = f.durable.clone();
    for p in &f.pending {
        let header = matches!(p, Pending::Write { offset, .. } | Pending::Zeros { offset, .. } if *offset < SECTOR);
        let choice = match policy {
            CutPolicy::KeepAll => 0,
            CutPolicy::DropAll => 1,
            CutPolicy::Random => rng() % 3,
            CutPolicy::KeepAllButHeader | CutPolicy::RandomButHeader if header => 1,
            CutPolicy::KeepAllButHeader => 0,
            CutPolicy::RandomButHeader => rng() % 3,
        };
        match (p, choice) {
            (_, 1) => {}
            (Pending::SetLen(_) | Pending::Remove, _) | (_, 0) => p.apply(&mut image, None),
            (Pending::Write { offset, data }, _) => {
                tear(p, *offset, data.len() as u64, &mut image, rng);
            }
            (Pending::Zeros { offset, len }, _) => tear(p, *offset, *len, &mut image, rng),
        }
    }
    image
}

/// Applies a torn write: each 512-byte sector (aligned to the file) lands or not.
fn tear(p: &Pending, offset: u64, len: u64, image: &mut Image, rng: &mut dyn FnMut() -> u64) {
    let end = offset + len;
    let mut at = offset;
    while at < end {
        let sector_end = ((at / SECTOR) + 1) * SECTOR;
        let chunk_end = sector_end.min(end);
        if rng().is_multiple_of(2) {
            p.apply(image, Some(at..chunk_end));
        }
        at = chunk_end;
    }
}

impl FaultDisk {
    /// An empty disk: no redb file, no log files.
    pub fn new() -> FaultDisk {
        FaultDisk::default()
    }

    /// A disk whose files' live and durable images are `image` (what a reboot finds).
    pub fn from_image(image: DiskImage) -> FaultDisk {
        let disk = FaultDisk::default();
        {
            let mut s = disk.lock();
            s.files[DiskFile::Db.index()] = FileState {
                live: image.db.clone(),
                durable: image.db,
                pending: Vec::new(),
            };
            s.files[DiskFile::Log.index()] = FileState {
                live: image.log.clone(),
                durable: image.log,
                pending: Vec::new(),
            };
            s.files[DiskFile::Log2.index()] = FileState {
                live: image.log2.clone(),
                durable: image.log2,
                pending: Vec::new(),
            };
            // (Clones share every chunk until one side writes.)
        }
        disk
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The redb file, as a backend to hand to redb.
    pub fn backend(&self) -> FaultBackend {
        let holder = {
            let mut s = self.lock();
            s.holders += 1;
            s.holders
        };
        FaultBackend {
            disk: self.clone(),
            holder,
        }
    }

    /// The log file, as a [`opjournal::LogStorage`] to hand to the journal.
    pub fn log(&self) -> FaultLog {
        FaultLog {
            disk: self.clone(),
            file: DiskFile::Log,
        }
    }

    /// The log's second file, as a [`opjournal::LogStorage`] to hand to the journal beside
    /// [`FaultDisk::log`] (`JournalBuilder::open_backends_with_spare_log`).
    pub fn log2(&self) -> FaultLog {
        FaultLog {
            disk: self.clone(),
            file: DiskFile::Log2,
        }
    }

    /// Arms `trigger` (replacing any armed one); counting starts now.
    pub fn arm(&self, trigger: Trigger) {
        let mut s = self.lock();
        s.counts = [0; 4];
        s.trigger = Some(trigger);
    }

    /// Disarms the trigger and heals persistent failures (the disk was replaced).
    pub fn heal(&self) {
        let mut s = self.lock();
        s.trigger = None;
        s.failing = [None; 4];
    }

    /// Whether a trigger fired (or the power was cut by one) on this disk.
    pub fn fired(&self) -> bool {
        self.lock().fired_on.is_some()
    }

    /// The file the first fault fired on.
    pub fn fired_on(&self) -> Option<DiskFile> {
        self.lock().fired_on
    }

    /// Whether a sync of any file completed between `before` (the counters a harness read
    /// before a call) and the first fault: the call had made something durable before the
    /// fault hit (a log sync: its record; a redb sync: a checkpoint's commit).
    pub fn fault_followed_a_sync(&self, before: &DiskStats) -> bool {
        let syncs = |s: &DiskStats| DiskFile::ALL.map(|f| s.file(f).syncs).iter().sum::<u64>();
        self.lock()
            .stats_at_fault
            .is_some_and(|at| syncs(&at) > syncs(before))
    }

    /// Whether the disk is dead (power cut or process killed).
    pub fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// Cuts the power now (between operations): nothing reaches the disk any more.
    pub fn cut(&self) {
        let mut s = self.lock();
        s.dead = true;
    }

    /// Makes every later sync, of any file, take `delay` before it completes (and makes
    /// anything durable), as a real disk's fsync does; `Duration::ZERO` (the default) for
    /// instant syncs. Other operations are not held up meanwhile.
    pub fn set_sync_delay(&self, delay: std::time::Duration) {
        self.lock().sync_delay = delay;
    }

    /// The counters.
    pub fn stats(&self) -> DiskStats {
        self.lock().stats
    }

    /// The live images (what the process wrote; survives a process crash).
    pub fn live_image(&self) -> DiskImage {
        let s = self.lock();
        DiskImage {
            db: s.files[0].live.clone(),
            log: s.files[1].live.clone(),
            log2: s.files[2].live.clone(),
        }
    }

    /// The durable images (what completed syncs made permanent).
    pub fn durable_image(&self) -> DiskImage {
        let s = self.lock();
        DiskImage {
            db: s.files[0].durable.clone(),
            log: s.files[1].durable.clone(),
            log2: s.files[2].durable.clone(),
        }
    }

    /// Writes, length changes and removals pending since the files' last completed syncs.
    pub fn pending_ops(&self) -> usize {
        let s = self.lock();
        s.files.iter().map(|f| f.pending.len()).sum()
    }

    /// Pending changes of one file.
    pub fn pending_ops_of(&self, file: DiskFile) -> usize {
        self.lock().files[file.index()].pending.len()
    }

    /// What the disk holds after a power cut: each file's durable image plus the pending
    /// changes that `policy` lets through (independently per change, and per file). `rng`
    /// supplies randomness (any 64-bit generator).
    pub fn power_cut_image(&self, policy: CutPolicy, rng: &mut dyn FnMut() -> u64) -> DiskImage {
        let s = self.lock();
        DiskImage {
            db: cut(&s.files[0], policy, rng),
            log: cut(&s.files[1], policy, rng),
            log2: cut(&s.files[2], policy, rng),
        }
    }

    /// Counts an operation of `kind` on `file` and decides its fate: `Ok(())` to perform it.
    fn admit(s: &mut State, file: DiskFile, kind: IoKind) -> io::Result<()> {
        if s.dead {
            if kind == IoKind::Sync {
                s.stats.syncs_after_fault += 1;
            }
            return Err(errno(EIO));
        }
        if s.fired_on == Some(file) && kind == IoKind::Sync {
            s.stats.syncs_after_fault += 1;
        }
        if let Some(code) = s.failing[kind.index()] {
            s.stats.faults += 1;
            return Err(errno(code));
        }
        let counted = s.trigger.is_some_and(|t| t.file.is_none_or(|f| f == file));
        if counted {
            s.counts[kind.index()] += 1;
        }
        if let Some(t) = s.trigger
            && counted
            && t.kind == kind
            && s.counts[kind.index()] >= t.nth
        {
            s.trigger = None;
            if s.fired_on.is_none() {
                s.fired_on = Some(file);
                s.stats_at_fault = Some(s.stats);
            }
            s.stats.faults += 1;
            match t.action {
                FaultAction::Fail {
                    errno: code,
                    persistent,
                } => {
                    if persistent {
                        s.failing[kind.index()] = Some(code);
                    }
                    return Err(errno(code));
                }
                FaultAction::PowerCut => {
                    s.dead = true;
                    return Err(errno(EIO));
                }
            }
        }
        Ok(())
    }

    fn len_of(&self, file: DiskFile) -> io::Result<u64> {
        let s = self.lock();
        if s.dead {
            return Err(errno(EIO));
        }
        Ok(s.files[file.index()].live.len() as u64)
    }

    fn read_of(&self, file: DiskFile, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let s = self.lock();
        if s.dead {
            return Err(errno(EIO));
        }
        let live = &s.files[file.index()].live;
        let start = usize::try_from(offset).map_err(|_| errno(EIO))?;
        start
            .checked_add(out.len())
            .filter(|e| *e <= live.len())
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        live.read(start, out);
        Ok(())
    }

    fn set_len_of(&self, file: DiskFile, len: u64) -> io::Result<()> {
        let mut s = self.lock();
        FaultDisk::admit(&mut s, file, IoKind::SetLen)?;
        let f = &mut s.files[file.index()];
        let p = Pending::SetLen(len);
        p.apply(&mut f.live, None);
        f.pending.push(p);
        stats_of(&mut s.stats, file).set_lens += 1;
        Ok(())
    }

    fn sync_of(&self, file: DiskFile) -> io::Result<()> {
        let delay = self.lock().sync_delay;
        if !delay.is_zero() {
            // Outside the lock: the disk serves other operations while a sync is in flight.
            std::thread::sleep(delay);
        }
        let mut s = self.lock();
        FaultDisk::admit(&mut s, file, IoKind::Sync)?;
        let f = &mut s.files[file.index()];
        // `durable` with every pending change applied is `live`: applying them costs what
        // they wrote, where copying `live` would cost the whole file at every sync.
        for p in std::mem::take(&mut f.pending) {
            p.apply(&mut f.durable, None);
        }
        stats_of(&mut s.stats, file).syncs += 1;
        Ok(())
    }

    fn write_of(&self, file: DiskFile, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut s = self.lock();
        FaultDisk::admit(&mut s, file, IoKind::Write)?;
        let f = &mut s.files[file.index()];
        // Preallocation writes zeros: kept without their bytes.
        let p = if is_zeros(data) {
            Pending::Zeros {
                offset,
                len: data.len() as u64,
            }
        } else {
            Pending::Write {
                offset,
                data: data.to_vec(),
            }
        };
        p.apply(&mut f.live, None);
        f.pending.push(p);
        let st = stats_of(&mut s.stats, file);
        st.writes += 1;
        st.bytes_written += data.len() as u64;
        Ok(())
    }

    fn remove_of(&self, file: DiskFile) -> io::Result<()> {
        let mut s = self.lock();
        FaultDisk::admit(&mut s, file, IoKind::Remove)?;
        let f = &mut s.files[file.index()];
        f.live.set_len(0);
        f.pending.push(Pending::Remove);
        stats_of(&mut s.stats, file).removes += 1;
        Ok(())
    }
}

fn stats_of(stats: &mut DiskStats, file: DiskFile) -> &mut FileStats {
    match file {
        DiskFile::Db => &mut stats.db,
        DiskFile::Log => &mut stats.log,
        DiskFile::Log2 => &mut stats.log2,
    }
}

/// The redb file of a [`FaultDisk`], as a [`StorageBackend`], with byte-range locks as a
/// file has them (each backend one holder, like one open file description), so that redb
/// runs any concurrency mode on it: `SingleWriter`, the journal's default, writes its
/// commits as it does on a file.
#[derive(Debug)]
pub struct FaultBackend {
    disk: FaultDisk,
    holder: u64,
}

/// A byte-range lock: its holder, its first and last byte, and whether it is shared.
#[derive(Clone, Copy, Debug)]
struct RangeLock {
    holder: u64,
    first: u64,
    last: u64,
    shared: bool,
}

/// A lock range's first and last byte (`None` for an empty range).
fn lock_bounds(start: Bound<u64>, end: Bound<u64>) -> Option<(u64, u64)> {
    let first = match start {
        Bound::Unbounded => 0,
        Bound::Included(x) => x,
        Bound::Excluded(x) => x.checked_add(1)?,
    };
    let last = match end {
        Bound::Unbounded => u64::MAX,
        Bound::Included(x) => x,
        Bound::Excluded(x) => x.checked_sub(1)?,
    };
    (first <= last).then_some((first, last))
}

impl FaultBackend {
    /// Whether another holder's lock over any of `first..=last` conflicts with a lock of
    /// this kind.
    fn conflicts(s: &State, holder: u64, first: u64, last: u64, shared: bool) -> bool {
        s.locks.iter().any(|l| {
            l.holder != holder && l.first <= last && first <= l.last && !(shared && l.shared)
        })
    }

    fn try_lock(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
        shared: bool,
    ) -> Result<bool, BackendError> {
        let (first, last) = lock_bounds(start, end)
            .ok_or_else(|| BackendError::Io(io::Error::from(io::ErrorKind::InvalidInput)))?;
        let mut s = self.disk.lock();
        if Self::conflicts(&s, self.holder, first, last, shared) {
            return Ok(false);
        }
        s.locks.push(RangeLock {
            holder: self.holder,
            first,
            last,
            shared,
        });
        Ok(true)
    }

    /// Waits for the lock (one process: a holder that never lets go is a test's bug,
    /// answered after ten seconds instead of a hang).
    fn lock(&self, start: Bound<u64>, end: Bound<u64>, shared: bool) -> Result<(), BackendError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !self.try_lock(start, end, shared)? {
            if std::time::Instant::now() > deadline {
                return Err(BackendError::Io(io::Error::from(io::ErrorKind::TimedOut)));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Ok(())
    }
}

impl StorageBackend for FaultBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.disk.len_of(DiskFile::Db)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.disk.read_of(DiskFile::Db, offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.disk.set_len_of(DiskFile::Db, len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.disk.sync_of(DiskFile::Db)
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.disk.write_of(DiskFile::Db, offset, data)
    }

    fn close(&self) -> Result<(), io::Error> {
        let holder = self.holder;
        self.disk.lock().locks.retain(|l| l.holder != holder);
        Ok(())
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.try_lock(start, end, false)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.try_lock(start, end, true)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.lock(start, end, false)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.lock(start, end, true)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        let (first, last) = lock_bounds(start, end)
            .ok_or_else(|| BackendError::Io(io::Error::from(io::ErrorKind::InvalidInput)))?;
        let holder = self.holder;
        let mut s = self.disk.lock();
        let at = s
            .locks
            .iter()
            .position(|l| l.holder == holder && l.first == first && l.last == last)
            .ok_or_else(|| BackendError::Io(io::Error::from(io::ErrorKind::NotFound)))?;
        s.locks.remove(at);
        Ok(())
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        let (first, last) = lock_bounds(start, end)
            .ok_or_else(|| BackendError::Io(io::Error::from(io::ErrorKind::InvalidInput)))?;
        Ok(Self::conflicts(
            &self.disk.lock(),
            self.holder,
            first,
            last,
            false,
        ))
    }
}

/// A log file of a [`FaultDisk`] (the log or its second file), as an
/// [`opjournal::LogStorage`]. `discard` removes the file (a pending change until the next
/// sync, like an unlink whose directory is not synced).
#[derive(Debug)]
pub struct FaultLog {
    disk: FaultDisk,
    file: DiskFile,
}

impl opjournal::LogStorage for FaultLog {
    fn len(&self) -> io::Result<u64> {
        self.disk.len_of(self.file)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.disk.read_of(self.file, offset, buf)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.disk.write_of(self.file, offset, data)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.disk.set_len_of(self.file, len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.disk.sync_of(self.file)
    }

    fn discard(&self) -> io::Result<()> {
        self.disk.remove_of(self.file)
    }
}
