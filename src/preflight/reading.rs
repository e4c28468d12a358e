//! Reading a journal file that is input, in place and without writing it: recognizing it
//! before redb sees it (a regular file), where its data ends (redb's own
//! length, from its header: bytes after it are not part of the journal), and two storage
//! backends for redb.
//!
//! - [`InPlace`]: the file read-only, seen with the journal's length, so that bytes appended
//!   after the journal (garbage, a hole) are neither read nor mistaken for damage.
//! - [`Scratch`]: the file read-only with every write kept in memory, up to a limit. redb
//!   writes when it recovers a file a writer did not close and when it checks its page
//!   checksums; on a `Scratch` it does both without touching the file, and without copying it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::Mutex;

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

use crate::error::{Error, ErrorKind, Result};

/// What a path holds, for refusing anything that is not a regular file before opening it
/// (opening a FIFO blocks, reading `/dev/zero` never ends).
fn file_type_name(ft: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if ft.is_char_device() {
            return "a character device";
        }
        if ft.is_block_device() {
            return "a block device";
        }
        if ft.is_socket() {
            return "a socket";
        }
    }
    if ft.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// The detail of [`ErrorKind::NotAJournal`] for a path that is not a regular file; the CLI
/// recognizes it by its ending.
pub(crate) const NOT_REGULAR: &str = "not a regular file (a journal is one file, usually `*.opj`)";

/// The metadata of the file at `path`, or `None` if nothing is there. Anything that is not a
/// regular file (a directory, a FIFO, a device, a socket) is refused at once with
/// [`ErrorKind::NotAJournal`], before anything opens it.
///
/// # Errors
///
/// [`ErrorKind::NotAJournal`]; [`ErrorKind::Io`] when the metadata cannot be read.
pub(crate) fn regular_file(path: &Path) -> Result<Option<std::fs::Metadata>> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io_during("read the journal file's metadata", e)),
    };
    if !meta.is_file() {
        let what = file_type_name(meta.file_type());
        let detail = if what == "not a regular file" {
            format!("it is {NOT_REGULAR}")
        } else {
            format!("it is {what}, {NOT_REGULAR}")
        };
        return Err(Error::new(ErrorKind::NotAJournal {
            path: path.to_path_buf(),
            detail,
        }));
    }
    Ok(Some(meta))
}

/// As [`regular_file`], for readers: a missing file is an I/O error (`NotFound`) and an
/// empty one is not a journal.
///
/// # Errors
///
/// [`ErrorKind::NotAJournal`], [`ErrorKind::Io`].
pub(crate) fn existing_journal_file(path: &Path) -> Result<std::fs::Metadata> {
    let meta = regular_file(path)?.ok_or_else(|| {
        Error::io_during(
            "open the journal file",
            io::Error::from(io::ErrorKind::NotFound),
        )
    })?;
    if meta.len() == 0 {
        return Err(Error::new(ErrorKind::NotAJournal {
            path: path.to_path_buf(),
            detail: "the file is empty".into(),
        }));
    }
    Ok(meta)
}

/// The redb header fields that say how long the database is.
const GOD_BYTE: usize = 9;
const RECOVERY_REQUIRED: u8 = 2;
const PAGE_SIZE: u64 = 4096;
/// The most pages a redb region holds (its page index is 20 bits).
const MAX_REGION_PAGES: u32 = 1 << 20;
/// The most regions a redb file has.
const MAX_REGIONS: u64 = 1 << 20;

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// Where a journal's data ends in its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extent {
    /// The file's length.
    pub file_len: u64,
    /// The length the journal's header gives (redb's layout), when the header is readable.
    pub stored_len: Option<u64>,
    /// Whether the header says a writer has the file open or did not close it.
    pub unclean: bool,
}

impl Extent {
    /// Reads the header of `file` (`file_len` bytes long).
    pub(crate) fn of(file: &File, file_len: u64) -> io::Result<Extent> {
        let mut head = [0u8; 64];
        let n = usize::try_from(file_len.min(64)).unwrap_or(64);
        read_exact_at(file, &mut head[..n], 0)?;
        Ok(Extent::from_header(&head[..n], file_len))
    }

    /// The extent that the first bytes `head` of a file `file_len` bytes long give.
    pub(crate) fn from_header(head: &[u8], file_len: u64) -> Extent {
        let none = Extent {
            file_len,
            stored_len: None,
            unclean: false,
        };
        if head.len() < 32 || head[..9] != super::file::REDB_MAGIC {
            return none;
        }
        let page_size = u64::from(u32_at(head, 12));
        let header_pages = u32_at(head, 16);
        let max_pages = u32_at(head, 20);
        let full_regions = u64::from(u32_at(head, 24));
        let trailing = u32_at(head, 28);
        if page_size != PAGE_SIZE
            || max_pages == 0
            || max_pages > MAX_REGION_PAGES
            || header_pages > MAX_REGION_PAGES
            || trailing > max_pages
            || full_regions + u64::from(trailing > 0) == 0
            || full_regions + u64::from(trailing > 0) > MAX_REGIONS
        {
            return none;
        }
        // Bounded by the checks above, and checked all the same: every factor is read
        // from the file.
        let pages = |n: u32| (u64::from(header_pages) + u64::from(n)).checked_mul(page_size);
        let tail = if trailing > 0 {
            pages(trailing)
        } else {
            Some(0)
        };
        let len = pages(max_pages)
            .and_then(|region| full_regions.checked_mul(region))
            .and_then(|regions| regions.checked_add(page_size))
            .zip(tail)
            .and_then(|(len, tail)| len.checked_add(tail));
        let Some(len) = len else {
            return none;
        };
        Extent {
            file_len,
            stored_len: Some(len),
            unclean: head[GOD_BYTE] & RECOVERY_REQUIRED != 0,
        }
    }

    /// The length to read the journal with: the header's, when the file was closed cleanly
    /// and is at least that long (redb keeps the header's layout exact at every clean
    /// close); the file's otherwise.
    pub(crate) fn journal_len(&self) -> u64 {
        match self.stored_len {
            Some(len) if !self.unclean && len <= self.file_len => len,
            _ => self.file_len,
        }
    }

    /// Bytes after the journal's data: appended, not part of it.
    pub(crate) fn trailing(&self) -> u64 {
        self.file_len - self.journal_len()
    }

    /// Bytes the header promises that the file lacks (a truncated file).
    pub(crate) fn missing(&self) -> u64 {
        self.stored_len
            .map_or(0, |len| len.saturating_sub(self.file_len))
    }
}

pub(crate) fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        let mut done = 0;
        while done < buf.len() {
            let n = std::os::windows::fs::FileExt::seek_read(
                file,
                &mut buf[done..],
                offset + done as u64,
            )?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            done += n;
        }
        Ok(())
    }
}

fn read_only_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        "the journal file is read here in place and never written",
    )
}

/// How a backend answers redb's file locks.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Locks {
    /// Taken on the file as redb asks, except that an exclusive lock is taken shared: the
    /// file is open read-only (which takes no exclusive lock), and this handle never writes
    /// it, so it only needs to exclude writers (whose locks are exclusive) and may share
    /// the file with other readers.
    Forward,
    /// Not taken (redb then assumes one process): for a second handle on a file that a handle
    /// of this process already holds.
    Skip,
}

macro_rules! forward_locks {
    () => {
        fn try_lock_range(
            &self,
            start: Bound<u64>,
            end: Bound<u64>,
        ) -> std::result::Result<bool, BackendError> {
            match self.locks {
                Locks::Forward => self.file.try_lock_shared_range(start, end),
                Locks::Skip => Err(BackendError::Unsupported),
            }
        }
        fn try_lock_shared_range(
            &self,
            start: Bound<u64>,
            end: Bound<u64>,
        ) -> std::result::Result<bool, BackendError> {
            match self.locks {
                Locks::Forward => self.file.try_lock_shared_range(start, end),
                Locks::Skip => Err(BackendError::Unsupported),
            }
        }
        fn lock_range(
            &self,
            start: Bound<u64>,
            end: Bound<u64>,
        ) -> std::result::Result<(), BackendError> {
            match self.locks {
                Locks::Forward => self.file.lock_shared_range(start, end),
                Locks::Skip => Err(BackendError::Unsupported),
            }
        }
        fn lock_shared_range(
            &self,
            start: Bound<u64>,
            end: Bound<u64>,
        ) -> std::result::Result<(), BackendError> {
            match self.locks {
                Locks::Forward => self.file.lock_shared_range(start, end),
                Locks::Skip => Err(BackendError::Unsupported),
            }
        }
        fn unlock_range(
            &self,
            start: Bound<u64>,
            end: Bound<u64>,
        ) -> std::result::Result<(), BackendError> {
            match self.locks {
                Locks::Forward => self.file.unlock_range(start, end),
                Locks::Skip => Err(BackendError::Unsupported),
            }
        }
        fn query_lock_range(
            &self,
            start: Bound<u64>,
            end: Bound<u64>,
        ) -> std::result::Result<bool, BackendError> {
            match self.locks {
                Locks::Forward => self.file.query_lock_range(start, end),
                Locks::Skip => Err(BackendError::Unsupported),
            }
        }
        fn close(&self) -> io::Result<()> {
            match self.locks {
                Locks::Forward => self.file.close(),
                Locks::Skip => Ok(()),
            }
        }
    };
}

/// The journal file, read-only, seen with at most `cap` bytes: what follows the journal's
/// data is not shown to redb.
#[derive(Debug)]
pub(crate) struct InPlace {
    file: FileBackend,
    cap: Option<u64>,
    locks: Locks,
}

impl InPlace {
    /// `file`, opened read-only, seen with at most `cap` bytes (`None`: as long as it is,
    /// which follows a live writer that grows it).
    pub(crate) fn new(file: File, cap: Option<u64>) -> io::Result<InPlace> {
        Ok(InPlace {
            file: file_backend(file)?,
            cap,
            locks: Locks::Forward,
        })
    }
}

fn file_backend(file: File) -> io::Result<FileBackend> {
    FileBackend::new(file).map_err(io::Error::other)
}

impl StorageBackend for InPlace {
    fn len(&self) -> io::Result<u64> {
        let len = self.file.len()?;
        Ok(self.cap.map_or(len, |cap| len.min(cap)))
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        if let Some(cap) = self.cap
            && offset.saturating_add(out.len() as u64) > cap
        {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.file.read(offset, out)
    }

    fn set_len(&self, _len: u64) -> io::Result<()> {
        Err(read_only_error())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn write(&self, _offset: u64, _data: &[u8]) -> io::Result<()> {
        Err(read_only_error())
    }

    forward_locks!();
}

/// The size of the chunks a [`Scratch`] keeps.
const CHUNK: u64 = 4096;

/// The journal file read in place, with every write kept in memory (at most `limit` bytes):
/// redb may recover or check the file on it as if it could write, and the file is never
/// written. Reads past the end of the file, up to the length redb set, read as
/// zero (a truncated file is seen at its full length, its missing pages zero).
#[derive(Debug)]
pub(crate) struct Scratch {
    file: FileBackend,
    locks: Locks,
    state: Mutex<ScratchState>,
    limit: u64,
}

#[derive(Debug)]
struct ScratchState {
    /// The file's length, fixed when the scratch was made.
    file_len: u64,
    /// The length redb sees.
    len: u64,
    /// Written chunks, by chunk number.
    chunks: BTreeMap<u64, Box<[u8]>>,
}

impl Scratch {
    /// A scratch over `file` (read-only), seen as `len` bytes long, keeping at most `limit`
    /// bytes of writes.
    pub(crate) fn new(file: File, len: u64, limit: u64, locks: Locks) -> io::Result<Scratch> {
        let file = file_backend(file)?;
        let file_len = file.len()?;
        Ok(Scratch {
            file,
            locks,
            state: Mutex::new(ScratchState {
                file_len,
                len,
                chunks: BTreeMap::new(),
            }),
            limit,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ScratchState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fills `out` with the file's bytes at `offset` as written before any scratch write:
    /// the file's, then zeros.
    fn read_base(&self, file_len: u64, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let end = offset + out.len() as u64;
        let from_file = end.min(file_len).saturating_sub(offset);
        let split = usize::try_from(from_file).map_err(io::Error::other)?;
        if split > 0 {
            self.file.read(offset, &mut out[..split])?;
        }
        out[split..].fill(0);
        Ok(())
    }
}

impl StorageBackend for Scratch {
    fn len(&self) -> io::Result<u64> {
        Ok(self.state().len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let s = self.state();
        let end = offset
            .checked_add(out.len() as u64)
            .filter(|e| *e <= s.len)
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        let mut at = offset;
        while at < end {
            let chunk = at / CHUNK;
            let within = (at % CHUNK) as usize;
            let n = ((CHUNK - at % CHUNK).min(end - at)) as usize;
            let dst = &mut out[(at - offset) as usize..(at - offset) as usize + n];
            match s.chunks.get(&chunk) {
                Some(c) => dst.copy_from_slice(&c[within..within + n]),
                None => self.read_base(s.file_len, at, dst)?,
            }
            at += n as u64;
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut s = self.state();
        if len < s.len {
            // Bytes cut off read as zero if the length grows again.
            let first_gone = len.div_ceil(CHUNK);
            s.chunks.retain(|c, _| *c < first_gone);
            if !len.is_multiple_of(CHUNK)
                && let Some(c) = s.chunks.get_mut(&(len / CHUNK))
            {
                c[(len % CHUNK) as usize..].fill(0);
            }
            s.file_len = s.file_len.min(len);
        }
        s.len = len;
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut s = self.state();
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| io::Error::other("write past the end of the address space"))?;
        let mut at = offset;
        while at < end {
            let chunk = at / CHUNK;
            let within = (at % CHUNK) as usize;
            let n = ((CHUNK - at % CHUNK).min(end - at)) as usize;
            if !s.chunks.contains_key(&chunk) {
                if (s.chunks.len() as u64 + 1) * CHUNK > self.limit {
                    return Err(io::Error::new(
                        io::ErrorKind::OutOfMemory,
                        format!(
                            "the storage engine needed more than {} MiB of scratch memory to read \
                             the file in place",
                            self.limit >> 20
                        ),
                    ));
                }
                let mut c = vec![0u8; CHUNK as usize].into_boxed_slice();
                let file_len = s.file_len;
                self.read_base(file_len, chunk * CHUNK, &mut c)?;
                s.chunks.insert(chunk, c);
            }
            if let Some(c) = s.chunks.get_mut(&chunk) {
                c[within..within + n].copy_from_slice(&data[(at - offset) as usize..][..n]);
            }
            at += n as u64;
        }
        s.len = s.len.max(end);
        Ok(())
    }

    forward_locks!();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(page: u32, hdr: u32, max: u32, full: u32, trailing: u32, god: u8) -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[..9].copy_from_slice(&super::super::file::REDB_MAGIC);
        h[9] = god;
        h[12..16].copy_from_slice(&page.to_le_bytes());
        h[16..20].copy_from_slice(&hdr.to_le_bytes());
        h[20..24].copy_from_slice(&max.to_le_bytes());
        h[24..28].copy_from_slice(&full.to_le_bytes());
        h[28..32].copy_from_slice(&trailing.to_le_bytes());
        h
    }

    #[test]
    fn the_extent_is_the_header_layout_and_bytes_after_it_are_trailing() {
        let h = header(4096, 0, 4096, 0, 33, 0);
        let e = Extent::from_header(&h, 139_264 + 10_000);
        assert_eq!(e.stored_len, Some(139_264));
        assert_eq!(
            (e.journal_len(), e.trailing(), e.missing()),
            (139_264, 10_000, 0)
        );
        // A truncated file: the header promises more than the file has.
        let e = Extent::from_header(&h, 100_000);
        assert_eq!(
            (e.journal_len(), e.trailing(), e.missing()),
            (100_000, 0, 39_264)
        );
        // Full regions count before the trailing one.
        let e = Extent::from_header(&header(4096, 1, 8, 2, 3, 0), 1 << 30);
        assert_eq!(e.stored_len, Some(4096 + 2 * 9 * 4096 + 4 * 4096));
    }

    #[test]
    fn an_unclean_or_unreadable_header_leaves_the_length_to_the_file() {
        let e = Extent::from_header(&header(4096, 0, 4096, 0, 33, RECOVERY_REQUIRED), 200_000);
        assert_eq!((e.journal_len(), e.trailing()), (200_000, 0));
        for bad in [
            header(512, 0, 4096, 0, 33, 0),
            header(4096, 0, 0, 0, 33, 0),
            header(4096, 0, 4096, 0, 0, 0),
            header(4096, 0, 16, 0, 17, 0),
        ] {
            let e = Extent::from_header(&bad, 200_000);
            assert_eq!((e.stored_len, e.journal_len()), (None, 200_000), "{bad:?}");
        }
        assert_eq!(Extent::from_header(b"not redb", 8).journal_len(), 8);
    }

    #[test]
    fn a_scratch_keeps_writes_in_memory_and_reads_zeros_past_the_file() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 10_000])?;
        let s = Scratch::new(File::open(&path)?, 16_384, 1 << 20, Locks::Skip)?;
        let mut buf = vec![0u8; 16_384];
        s.read(0, &mut buf)?;
        assert!(buf[..10_000].iter().all(|b| *b == 7) && buf[10_000..].iter().all(|b| *b == 0));
        s.write(4090, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10])?;
        s.read(4088, &mut buf[..14])?;
        assert_eq!(&buf[..14], &[7, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 7, 7]);
        s.set_len(4092)?;
        s.set_len(8192)?;
        s.read(4088, &mut buf[..8])?;
        assert_eq!(
            &buf[..8],
            &[7, 7, 1, 2, 0, 0, 0, 0],
            "cut bytes read as zero"
        );
        assert!(
            std::fs::read(&path)?.iter().all(|b| *b == 7),
            "the file is unchanged"
        );
        let tight = Scratch::new(File::open(&path)?, 16_384, 4096, Locks::Skip)?;
        tight.write(0, &[1])?;
        assert!(tight.write(8192, &[1]).is_err(), "the limit holds");
        Ok(())
    }
}
