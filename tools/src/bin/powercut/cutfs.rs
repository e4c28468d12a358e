//! cutfs: a passthrough FUSE file system over a backing directory that loses unsynced
//! writes at a simulated power cut (a small LazyFS, on `fuser`).
//!
//! What a process sees through the mount is what it would see on a local file system
//! (the page cache): every write, length change, create, link, rename and unlink at once.
//! What the backing directory holds is what a reboot would find (the disk):
//! - a file's data changes (writes, length changes) reach its backing file at the file's
//!   next `fsync`/`fdatasync` (both make data and length durable);
//! - directory changes (create, link, rename, unlink) reach the backing directory at the
//!   directory's next `fsync`, in order. A file created and synced but whose directory was
//!   not synced after its creation vanishes at a power cut, as POSIX allows.
//!
//! [`Shared::cut`] is the power cut: every change not yet durable is dropped, or (policy
//! [`CutPolicy::Random`], as the crash suite's in-memory fault disk does) each pending data
//! write of each file is kept, dropped or torn at 512-byte sector granularity, in any
//! combination (the disk reorders unsynced writes), length changes are kept or dropped, and
//! a random prefix of the pending directory changes is kept (metadata is journaled in
//! order). From then on every operation fails with `EIO`.
//!
//! A trigger ([`Shared::arm`]) stops the world at the Nth changing operation (write,
//! length change, sync, create, link, rename, unlink): the operation is held (it does not
//! happen), the harness is told, kills the writer and cuts the power, then the held
//! operation fails with `EIO` (the writer is dead by then and never sees it).
//!
//! Files live flat in the mount's root (no subdirectories: the journal needs none). Each
//! file's data lives in a staging hard link `<backing>/.cutfs/<inode>`, so that a file
//! whose name is not durable yet still has somewhere durable to keep its synced data;
//! [`Shared::finish`] removes the staging directory after unmounting, leaving exactly the
//! durable names. The backing directory must not be changed by anyone else while mounted.
//! Reads and writes use direct I/O (no kernel page cache to go stale at a cut); attributes
//! are never cached. cutfs implements no lock calls, so the kernel keeps `flock` and
//! (OFD) byte-range locks itself, as redb's file locks need.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

/// The sector size at which a torn write tears (as the in-memory fault disk).
pub const SECTOR: u64 = 512;

/// The staging directory inside the backing directory.
const STAGING: &str = ".cutfs";

/// Attributes and entries are never cached by the kernel: every `stat` sees the live size.
const TTL: Duration = Duration::ZERO;

/// How a power cut treats the changes not yet durable.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CutPolicy {
    /// Every pending change reached the disk (as a process crash without power loss).
    KeepAll,
    /// None did.
    DropAll,
    /// Each data write kept, dropped or torn; length changes kept or dropped; a random
    /// prefix of the directory changes kept.
    Random,
}

/// What a file is to the journal, by the name it was created with.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// The redb file (`*.opj`, or the temporary file a journal is created under).
    Db,
    /// The logs beside it (`*-log`, `*-log2`).
    Log,
    /// Anything else.
    Other,
}

impl Class {
    fn of(name: &OsStr) -> Class {
        let name = name.to_string_lossy();
        if name.ends_with("-log") || name.ends_with("-log2") {
            Class::Log
        } else if name.ends_with(".opj") || name.contains(".creating-") {
            Class::Db
        } else {
            Class::Other
        }
    }
}

/// A change to a file's data not yet durable.
#[derive(Debug)]
enum Pending {
    Write {
        offset: u64,
        data: Vec<u8>,
    },
    /// A write of zeros, kept without its bytes.
    Zeros {
        offset: u64,
        len: u64,
    },
    SetLen(u64),
}

/// A change to the root directory not yet durable.
#[derive(Debug)]
enum DirOp {
    /// A new name for a file (create or link).
    Link {
        name: OsString,
        ino: u64,
    },
    Unlink {
        name: OsString,
    },
    Rename {
        from: OsString,
        to: OsString,
    },
}

#[derive(Debug)]
struct Node {
    class: Class,
    /// The size the process sees.
    size: u64,
    pending: Vec<Pending>,
    nlink: u32,
    mtime: SystemTime,
    /// The staging hard link: the file's durable data.
    data: File,
}

/// Counters of the operations the file system served.
#[derive(Clone, Copy, Debug, Default)]
pub struct FsStats {
    /// Data writes, length changes, data syncs (of files of each class: db, log).
    pub writes: [u64; 2],
    pub set_lens: [u64; 2],
    pub syncs: [u64; 2],
    pub dir_syncs: u64,
    pub dir_ops: u64,
    pub reads: u64,
}

/// What a power cut found and did.
#[derive(Clone, Debug, Default)]
pub struct CutReport {
    /// Pending data changes of the redb file(s) and of the log at the cut.
    pub pending_db: usize,
    pub pending_log: usize,
    /// Pending directory changes at the cut.
    pub pending_dir: usize,
    /// Of the redb file's, those past its 512-byte header: a transaction's pages (the
    /// header alone is rewritten, unsynced, after each commit).
    pub pending_db_pages: usize,
    /// Pending data changes kept whole, dropped, torn; directory changes kept, dropped.
    pub kept: usize,
    pub dropped: usize,
    pub torn: usize,
    pub dir_kept: usize,
    pub dir_dropped: usize,
    /// The operation a trigger held (it did not happen), if the cut came from a trigger.
    pub held: Option<String>,
    /// The class of the file the held operation was on.
    pub held_class: Option<Class>,
    /// Operations served before the cut.
    pub stats: FsStats,
}

struct State {
    backing: PathBuf,
    nodes: HashMap<u64, Node>,
    /// The live root directory: name → inode.
    names: BTreeMap<OsString, u64>,
    dir_pending: Vec<DirOp>,
    next_ino: u64,
    /// The power is off: every operation fails.
    dead: bool,
    /// Syncs of the log do nothing (see [`Shared::lie_about_log_syncs`]).
    lying: bool,
    /// Changing operations served (the trigger counts these).
    ops: u64,
    trigger: Option<u64>,
    held: Option<String>,
    held_class: Option<Class>,
    stats: FsStats,
    started: SystemTime,
}

/// The gate a held operation waits at.
#[derive(Default)]
struct Gate {
    open: bool,
}

/// The file system's state, shared by the FUSE session and the harness.
pub struct Shared {
    state: Mutex<State>,
    gate: Mutex<Gate>,
    gate_cv: Condvar,
    /// Told when a trigger holds an operation.
    on_trigger: Box<dyn Fn() + Send + Sync>,
}

fn class_index(c: Class) -> Option<usize> {
    match c {
        Class::Db => Some(0),
        Class::Log => Some(1),
        Class::Other => None,
    }
}

fn is_zeros(data: &[u8]) -> bool {
    static ZEROS: [u8; 4096] = [0; 4096];
    data.chunks(ZEROS.len()).all(|c| c == &ZEROS[..c.len()])
}

fn errno(e: &io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

impl State {
    fn class_of(&self, ino: u64) -> Class {
        self.nodes.get(&ino).map_or(Class::Other, |n| n.class)
    }

    fn staging(&self, ino: u64) -> PathBuf {
        self.backing.join(STAGING).join(ino.to_string())
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, size, perm, nlink, mtime) = if ino == INodeNo::ROOT.0 {
            (FileType::Directory, 0, 0o755, 2, self.started)
        } else {
            let n = self.nodes.get(&ino)?;
            (FileType::RegularFile, n.size, 0o644, n.nlink, n.mtime)
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: self.started,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    /// A new inode whose staging file is `data`.
    fn add_node(&mut self, class: Class, data: File, size: u64, nlink: u32) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(
            ino,
            Node {
                class,
                size,
                pending: Vec::new(),
                nlink,
                mtime: SystemTime::now(),
                data,
            },
        );
        ino
    }

    /// Makes a file's pending data changes durable.
    fn sync_file(&mut self, ino: u64) -> io::Result<()> {
        let node = self.nodes.get_mut(&ino).ok_or(io::ErrorKind::NotFound)?;
        if self.lying && node.class == Class::Log {
            return Ok(());
        }
        for p in node.pending.drain(..) {
            apply(&node.data, &p, None)?;
        }
        Ok(())
    }

    /// Makes the pending directory changes durable, in order.
    fn sync_dir(&mut self) -> io::Result<()> {
        let ops = std::mem::take(&mut self.dir_pending);
        for op in &ops {
            self.apply_dir_op(op)?;
        }
        Ok(())
    }

    fn apply_dir_op(&self, op: &DirOp) -> io::Result<()> {
        match op {
            DirOp::Link { name, ino } => {
                std::fs::hard_link(self.staging(*ino), self.backing.join(name))
            }
            DirOp::Unlink { name } => std::fs::remove_file(self.backing.join(name)),
            DirOp::Rename { from, to } => {
                std::fs::rename(self.backing.join(from), self.backing.join(to))
            }
        }
    }

    fn count(&mut self, class: Class, which: fn(&mut FsStats) -> &mut [u64; 2]) {
        if let Some(i) = class_index(class) {
            which(&mut self.stats)[i] += 1;
        }
    }

    /// The bytes `offset..offset + size` as the process sees them.
    fn read(&self, ino: u64, offset: u64, size: u32) -> io::Result<Vec<u8>> {
        let node = self.nodes.get(&ino).ok_or(io::ErrorKind::NotFound)?;
        let end = node.size.min(offset.saturating_add(u64::from(size)));
        if end <= offset {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; (end - offset) as usize];
        // The durable bytes (zeros past the backing file's end) ...
        let mut done = 0;
        while done < buf.len() {
            let n = node.data.read_at(&mut buf[done..], offset + done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        // ... under every pending change, in order.
        for p in &node.pending {
            match p {
                Pending::Write { offset: at, data } => {
                    overlay(&mut buf, offset, *at, data.len() as u64, Some(data));
                }
                Pending::Zeros { offset: at, len } => overlay(&mut buf, offset, *at, *len, None),
                Pending::SetLen(len) => {
                    // Bytes past a truncation read as zeros if the file grows again.
                    if *len < end {
                        let from = len.saturating_sub(offset) as usize;
                        buf[from..].fill(0);
                    }
                }
            }
        }
        Ok(buf)
    }
}

/// Copies the part of a write at `at` (of `len` bytes, `data` or zeros) that falls in
/// `buf`, which holds the file's bytes from `offset`.
fn overlay(buf: &mut [u8], offset: u64, at: u64, len: u64, data: Option<&Vec<u8>>) {
    let buf_end = offset + buf.len() as u64;
    let from = at.max(offset);
    let to = (at + len).min(buf_end);
    if from >= to {
        return;
    }
    let dst = &mut buf[(from - offset) as usize..(to - offset) as usize];
    match data {
        Some(d) => dst.copy_from_slice(&d[(from - at) as usize..(to - at) as usize]),
        None => dst.fill(0),
    }
}

/// Applies a pending change to the durable file, whole or only the bytes in `range`.
fn apply(file: &File, p: &Pending, range: Option<std::ops::Range<u64>>) -> io::Result<()> {
    match p {
        Pending::SetLen(len) => file.set_len(*len),
        Pending::Write { offset, data } => {
            let r = range.unwrap_or(*offset..*offset + data.len() as u64);
            let from = (r.start - offset) as usize;
            let to = (r.end - offset) as usize;
            file.write_all_at(&data[from..to], r.start)
        }
        Pending::Zeros { offset, len } => {
            let r = range.unwrap_or(*offset..*offset + len);
            let zeros = vec![0u8; (r.end - r.start).min(1 << 20) as usize];
            let mut at = r.start;
            while at < r.end {
                let n = (r.end - at).min(zeros.len() as u64);
                file.write_all_at(&zeros[..n as usize], at)?;
                at += n;
            }
            Ok(())
        }
    }
}

/// Applies a torn write: each 512-byte sector (aligned to the file) lands or not.
fn tear(
    file: &File,
    p: &Pending,
    offset: u64,
    len: u64,
    rng: &mut dyn FnMut() -> u64,
) -> io::Result<()> {
    let end = offset + len;
    let mut at = offset;
    while at < end {
        let sector_end = ((at / SECTOR) + 1) * SECTOR;
        let chunk_end = sector_end.min(end);
        if rng().is_multiple_of(2) {
            apply(file, p, Some(at..chunk_end))?;
        }
        at = chunk_end;
    }
    Ok(())
}

impl Shared {
    /// The file system over `backing` (an existing directory; its regular files are the
    /// files the mount starts with, durable). `on_trigger` is told when a trigger holds an
    /// operation.
    pub fn new(backing: &Path, on_trigger: Box<dyn Fn() + Send + Sync>) -> io::Result<Shared> {
        let staging = backing.join(STAGING);
        std::fs::create_dir_all(&staging)?;
        let mut state = State {
            backing: backing.to_path_buf(),
            nodes: HashMap::new(),
            names: BTreeMap::new(),
            dir_pending: Vec::new(),
            next_ino: 2,
            dead: false,
            lying: false,
            ops: 0,
            trigger: None,
            held: None,
            held_class: None,
            stats: FsStats::default(),
            started: SystemTime::now(),
        };
        // The files already there (hard links of one file become one inode).
        let mut by_inode: HashMap<(u64, u64), u64> = HashMap::new();
        for entry in std::fs::read_dir(backing)? {
            let entry = entry?;
            let name = entry.file_name();
            let meta = entry.metadata()?;
            if name == STAGING || !meta.is_file() {
                continue;
            }
            let ino = match by_inode.get(&(meta.dev(), meta.ino())) {
                Some(ino) => {
                    if let Some(n) = state.nodes.get_mut(ino) {
                        n.nlink += 1;
                    }
                    *ino
                }
                None => {
                    let ino = state.next_ino;
                    std::fs::hard_link(entry.path(), state.staging(ino))?;
                    let data = OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(state.staging(ino))?;
                    let ino = state.add_node(Class::of(&name), data, meta.len(), 1);
                    by_inode.insert((meta.dev(), meta.ino()), ino);
                    ino
                }
            };
            state.names.insert(name, ino);
        }
        Ok(Shared {
            state: Mutex::new(state),
            gate: Mutex::new(Gate::default()),
            gate_cv: Condvar::new(),
            on_trigger,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Holds the `n`th changing operation from now (1 = the next one), and tells the
    /// harness.
    pub fn arm(&self, n: u64) {
        let mut s = self.lock();
        s.trigger = Some(s.ops + n.max(1));
    }

    /// A lying disk, to show that the harness notices lost writes: syncs of the log answer
    /// success and make nothing durable.
    pub fn lie_about_log_syncs(&self) {
        self.lock().lying = true;
    }

    /// Counters so far.
    pub fn stats(&self) -> FsStats {
        self.lock().stats
    }

    /// The power cut: applies to the backing directory the part of the pending changes
    /// `policy` lets through, drops the rest, and fails every operation from now on.
    ///
    /// # Errors
    ///
    /// The backing directory's I/O errors (the harness cannot trust the run then).
    pub fn cut(&self, policy: CutPolicy, rng: &mut dyn FnMut() -> u64) -> io::Result<CutReport> {
        let mut s = self.lock();
        let mut report = CutReport {
            held: s.held.clone(),
            held_class: s.held_class,
            stats: s.stats,
            pending_dir: s.dir_pending.len(),
            ..CutReport::default()
        };
        if s.dead {
            return Ok(report);
        }
        s.dead = true;
        for node in s.nodes.values_mut() {
            if node.class == Class::Db {
                report.pending_db_pages += node
                    .pending
                    .iter()
                    .filter(|p| match p {
                        Pending::Write { offset, .. } | Pending::Zeros { offset, .. } => {
                            *offset >= SECTOR
                        }
                        Pending::SetLen(_) => true,
                    })
                    .count();
            }
            match node.class {
                Class::Db => report.pending_db += node.pending.len(),
                Class::Log => report.pending_log += node.pending.len(),
                Class::Other => {}
            }
            for p in node.pending.drain(..) {
                let choice = match policy {
                    CutPolicy::KeepAll => 0,
                    CutPolicy::DropAll => 1,
                    CutPolicy::Random => rng() % 3,
                };
                match (&p, choice) {
                    (_, 1) => report.dropped += 1,
                    (Pending::SetLen(_), _) | (_, 0) => {
                        apply(&node.data, &p, None)?;
                        report.kept += 1;
                    }
                    (Pending::Write { offset, data }, _) => {
                        tear(&node.data, &p, *offset, data.len() as u64, rng)?;
                        report.torn += 1;
                    }
                    (Pending::Zeros { offset, len }, _) => {
                        tear(&node.data, &p, *offset, *len, rng)?;
                        report.torn += 1;
                    }
                }
            }
        }
        let ops = std::mem::take(&mut s.dir_pending);
        let keep = match policy {
            CutPolicy::KeepAll => ops.len(),
            CutPolicy::DropAll => 0,
            CutPolicy::Random => (rng() % (ops.len() as u64 + 1)) as usize,
        };
        for op in &ops[..keep] {
            s.apply_dir_op(op)?;
        }
        report.dir_kept = keep;
        report.dir_dropped = ops.len() - keep;
        drop(s);
        self.release();
        Ok(report)
    }

    /// Lets a held operation go on (it fails: the power is off by then).
    pub fn release(&self) {
        let mut g = self
            .gate
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.open = true;
        self.gate_cv.notify_all();
    }

    /// After unmounting: removes the staging directory, leaving the durable names.
    ///
    /// # Errors
    ///
    /// The removal's I/O error.
    pub fn finish(&self) -> io::Result<()> {
        let mut s = self.lock();
        s.dead = true;
        s.nodes.clear();
        std::fs::remove_dir_all(s.backing.join(STAGING))
    }

    /// Starts a changing operation: `Err(EIO)` once the power is off, or when a trigger
    /// holds this one (after waiting for the harness to cut the power).
    fn begin(
        &self,
        what: impl FnOnce(&State) -> (String, Class),
    ) -> Result<MutexGuard<'_, State>, Errno> {
        let mut s = self.lock();
        if s.dead {
            return Err(Errno::EIO);
        }
        s.ops += 1;
        if s.trigger == Some(s.ops) {
            let (held, class) = what(&s);
            s.held = Some(held);
            s.held_class = Some(class);
            drop(s);
            (self.on_trigger)();
            let g = self
                .gate
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // The harness cuts the power and opens the gate; if it never does (it died),
            // give up after a while rather than hang the writer forever.
            let _g = self
                .gate_cv
                .wait_timeout_while(g, Duration::from_secs(120), |g| !g.open)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.lock().dead = true;
            return Err(Errno::EIO);
        }
        Ok(s)
    }

    /// A read-only operation: `Err(EIO)` once the power is off.
    fn look(&self) -> Result<MutexGuard<'_, State>, Errno> {
        let s = self.lock();
        if s.dead { Err(Errno::EIO) } else { Ok(s) }
    }
}

fn name_of(s: &State, ino: u64) -> String {
    s.names.iter().find(|(_, i)| **i == ino).map_or_else(
        || format!("inode {ino}"),
        |(n, _)| n.to_string_lossy().into_owned(),
    )
}

/// The FUSE side: a thin wrapper over [`Shared`].
pub struct CutFs(pub Arc<Shared>);

impl Filesystem for CutFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let s = match self.0.look() {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        let attr = (parent == INodeNo::ROOT)
            .then(|| s.names.get(name))
            .flatten()
            .and_then(|ino| s.attr(*ino));
        match attr {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let s = match self.0.look() {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        match s.attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let s = match size {
            Some(len) => self.0.begin(|s| {
                (
                    format!("set_len({len}) of {}", name_of(s, ino.0)),
                    s.class_of(ino.0),
                )
            }),
            None => self.0.look(),
        };
        let mut s = match s {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        if let Some(len) = size {
            let Some(node) = s.nodes.get_mut(&ino.0) else {
                return reply.error(Errno::ENOENT);
            };
            node.pending.push(Pending::SetLen(len));
            node.size = len;
            node.mtime = SystemTime::now();
            let class = node.class;
            s.count(class, |st| &mut st.set_lens);
        }
        match s.attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = match self.0.begin(|_| {
            (
                format!("unlink {}", name.to_string_lossy()),
                Class::of(name),
            )
        }) {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        let Some(ino) = (parent == INodeNo::ROOT)
            .then(|| s.names.remove(name))
            .flatten()
        else {
            return reply.error(Errno::ENOENT);
        };
        if let Some(n) = s.nodes.get_mut(&ino) {
            n.nlink = n.nlink.saturating_sub(1);
        }
        s.dir_pending.push(DirOp::Unlink {
            name: name.to_os_string(),
        });
        s.stats.dir_ops += 1;
        reply.ok();
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut s = match self.0.begin(|_| {
            let what = format!(
                "rename {} to {}",
                name.to_string_lossy(),
                newname.to_string_lossy()
            );
            (what, Class::of(name))
        }) {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        if parent != INodeNo::ROOT || newparent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return reply.error(Errno::EINVAL);
        }
        let Some(&ino) = s.names.get(name) else {
            return reply.error(Errno::ENOENT);
        };
        if name == newname {
            return reply.ok();
        }
        if let Some(&old) = s.names.get(newname) {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return reply.error(Errno::EEXIST);
            }
            if let Some(n) = s.nodes.get_mut(&old) {
                n.nlink = n.nlink.saturating_sub(1);
            }
        }
        s.names.remove(name);
        s.names.insert(newname.to_os_string(), ino);
        s.dir_pending.push(DirOp::Rename {
            from: name.to_os_string(),
            to: newname.to_os_string(),
        });
        s.stats.dir_ops += 1;
        reply.ok();
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut s = match self.0.begin(|s| {
            (
                format!("link {}", newname.to_string_lossy()),
                s.class_of(ino.0),
            )
        }) {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        if newparent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        if s.names.contains_key(newname) {
            return reply.error(Errno::EEXIST);
        }
        let Some(node) = s.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        node.nlink += 1;
        s.names.insert(newname.to_os_string(), ino.0);
        s.dir_pending.push(DirOp::Link {
            name: newname.to_os_string(),
            ino: ino.0,
        });
        s.stats.dir_ops += 1;
        match s.attr(ino.0) {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let s = match self.0.look() {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        if s.nodes.contains_key(&ino.0) {
            // Direct I/O: every read and write reaches this file system (no kernel page
            // cache to go stale when the power is cut).
            reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut s = match self.0.look() {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        s.stats.reads += 1;
        match s.read(ino.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(&e)),
        }
    }
    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut s = match self.0.begin(|s| {
            let what = format!(
                "write of {} bytes at {offset} to {}",
                data.len(),
                name_of(s, ino.0)
            );
            (what, s.class_of(ino.0))
        }) {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        let Some(node) = s.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let len = data.len() as u64;
        node.pending.push(if is_zeros(data) {
            Pending::Zeros { offset, len }
        } else {
            Pending::Write {
                offset,
                data: data.to_vec(),
            }
        });
        node.size = node.size.max(offset + len);
        node.mtime = SystemTime::now();
        let class = node.class;
        s.count(class, |st| &mut st.writes);
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut s = match self.0.begin(|s| {
            let what = format!(
                "{} of {}",
                if datasync { "fdatasync" } else { "fsync" },
                name_of(s, ino.0)
            );
            (what, s.class_of(ino.0))
        }) {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        let class = s.nodes.get(&ino.0).map_or(Class::Other, |n| n.class);
        match s.sync_file(ino.0) {
            Ok(()) => {
                s.count(class, |st| &mut st.syncs);
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let s = match self.0.look() {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let mut entries = vec![
            (INodeNo::ROOT, FileType::Directory, OsString::from(".")),
            (INodeNo::ROOT, FileType::Directory, OsString::from("..")),
        ];
        for (name, ino) in &s.names {
            entries.push((INodeNo(*ino), FileType::RegularFile, name.clone()));
        }
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(ino, (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut s = match self
            .0
            .begin(|_| ("fsync of the directory".to_string(), Class::Other))
        {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        match s.sync_dir() {
            Ok(()) => {
                s.stats.dir_syncs += 1;
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 24, 1 << 24, 1 << 24, 1 << 20, 1 << 20, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut s = match self.0.begin(|_| {
            (
                format!("create {}", name.to_string_lossy()),
                Class::of(name),
            )
        }) {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        let ino = match s.names.get(name) {
            Some(_) if flags & libc::O_EXCL != 0 => return reply.error(Errno::EEXIST),
            Some(&ino) => {
                if flags & libc::O_TRUNC != 0
                    && let Some(n) = s.nodes.get_mut(&ino)
                {
                    n.pending.push(Pending::SetLen(0));
                    n.size = 0;
                }
                ino
            }
            None => {
                let ino = s.next_ino;
                let data = match OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(s.staging(ino))
                {
                    Ok(f) => f,
                    Err(e) => return reply.error(errno(&e)),
                };
                let ino = s.add_node(Class::of(name), data, 0, 1);
                s.names.insert(name.to_os_string(), ino);
                s.dir_pending.push(DirOp::Link {
                    name: name.to_os_string(),
                    ino,
                });
                s.stats.dir_ops += 1;
                ino
            }
        };
        match s.attr(ino) {
            Some(a) => reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            None => reply.error(Errno::ENOENT),
        }
    }
}
