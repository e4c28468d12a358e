//! Reading a cold file ahead of the page-number walk.
//!
//! The walk reads pages in the order the trees link them, which is no order on the disk:
//! one read at a time, each waiting for the device when the operating system does not hold
//! the page. After a reboot (the first open after a power cut, or of a project not opened
//! since) that is one device round trip per page. On this project's test machine, whose
//! reads of an uncached page take 20-35 µs, a walk of every page of a 20 MiB journal took
//! 100 ms that way, and the 769 branch pages of a 274 MiB one 20 ms or so; slower disks
//! take many times that. Two remedies, one per [`Depth`]:
//!
//! - [`Depth::Full`] reads about every page: [`read_ahead`] reads the file once in order
//!   first, which the device streams (the kernel reads ahead of sequential reads), and the
//!   walk then finds every page in memory. Files over [`READ_AHEAD_MAX`] are left to the
//!   threads below.
//! - [`Depth::Branches`] reads one page in a hundred, scattered: [`prefetching`] reads each
//!   page on one of [`THREADS`] threads as soon as the walk knows it will read it (when it
//!   reads the branch naming it), so the device has many reads in flight instead of one.
//!
//! Whether the file is cold is judged by timing a few reads of single pages spread over it
//! ([`is_cold`]), as no portable call answers it without `unsafe` (`mincore` needs a
//! mapping). A file whose pages are held (the usual reopen, or one a running writer uses)
//! is read as before; a wrong guess costs time, never correctness: the walk reads and
//! checks what it reads either way, and errors met ahead are left to it.
//!
//! [`Depth`]: super::Depth
//! [`Depth::Full`]: super::Depth::Full
//! [`Depth::Branches`]: super::Depth::Branches

use std::fs::File;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use super::ReadAt;
use super::layout::PAGE_SIZE;
use super::reading::read_exact_at;

/// A read of one page that takes longer than this went to the device: reads of a page the
/// operating system holds take 1-3 µs, of one it does not, 10 µs on the fastest devices
/// and 20-35 µs on this project's test machine.
const COLD_READ: Duration = Duration::from_micros(10);
/// Pages timed to judge the file: spread over it, each at the middle of its eighth.
const PROBES: u64 = 4;
/// The chunk of the read ahead: large enough for the device to stream, small enough to
/// stay in the CPU's cache between reads.
const CHUNK: usize = 1 << 20;
/// Below this, the walk's reads are few enough not to matter.
const SMALL_FILE: u64 = 64 * 1024;
/// The largest file read ahead in order: a walk of every page of a larger one has its
/// pages read by the prefetch threads instead, since the operating system might not hold a
/// whole read ahead of it until the walk comes to its pages (and the file would be read
/// twice).
pub(super) const READ_AHEAD_MAX: u64 = 1 << 30;
/// Threads reading pages ahead of a walk of branches: reads in flight at once.
const THREADS: usize = 8;
/// The most of one page read ahead (a larger page is a value's, read by the walk itself).
const PREFETCH_MAX: u64 = 64 * 1024;

/// Whether the `len`-byte file read through `read` looks absent from the operating system's
/// cache: at least half of [`PROBES`] single-page reads spread over it took longer than
/// [`COLD_READ`]. A page or two held by chance (the header, a root) does not make a cold
/// file look warm, and one read delayed by the scheduler does not make a warm one look
/// cold. A file under [`SMALL_FILE`] is never cold: its few reads do not matter.
pub(super) fn is_cold(len: u64, read: &mut ReadAt<'_>) -> bool {
    if len < SMALL_FILE {
        return false;
    }
    let mut page = [0u8; PAGE_SIZE as usize];
    let pages = len / PAGE_SIZE;
    let mut slow = 0;
    for i in 0..PROBES {
        // The middle of the i-th of 2 * PROBES equal parts, odd ones only.
        let at = pages * (2 * i + 1) / (2 * PROBES) * PAGE_SIZE;
        let start = Instant::now();
        if read(at, &mut page).is_err() {
            return false;
        }
        if start.elapsed() > COLD_READ {
            slow += 1;
        }
    }
    slow * 2 >= PROBES
}

/// Reads the `len` bytes read through `read` from start to end in [`CHUNK`]s, discarding
/// them. A failed read ends it: the walk's own reads meet the error and report it.
pub(super) fn read_ahead(len: u64, read: &mut ReadAt<'_>) {
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0u64;
    while at < len {
        let n = usize::try_from(len - at).map_or(CHUNK, |left| left.min(CHUNK));
        if read(at, &mut buf[..n]).is_err() {
            return;
        }
        at += n as u64;
    }
}

/// Runs `walk` with a prefetch that reads each byte range (start, length) it is given on
/// one of [`THREADS`] threads, discarding the bytes. The threads stop when the walk ends,
/// whatever is still queued. A thread that cannot be started leaves its share to the
/// others (or, with none, to the walk's own reads).
pub(super) fn prefetching<R>(file: &File, walk: impl FnOnce(&mut dyn FnMut(u64, u64)) -> R) -> R {
    let (tx, rx) = channel::<(u64, u64)>();
    let rx = Mutex::new(rx);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            let (rx, done) = (&rx, &done);
            let _ = std::thread::Builder::new()
                .name("opjournal-prefetch".into())
                .spawn_scoped(s, move || prefetch_pages(file, rx, done));
        }
        let out = walk(&mut |start, len| {
            let _ = tx.send((start, len));
        });
        done.store(true, Ordering::Relaxed);
        // Ends the threads' waits: `recv` answers that no more will come.
        drop(tx);
        out
    })
}

/// One prefetch thread: reads the ranges queued on `rx` until the queue closes or `done`.
fn prefetch_pages(file: &File, rx: &Mutex<Receiver<(u64, u64)>>, done: &AtomicBool) {
    let mut buf = Vec::new();
    while !done.load(Ordering::Relaxed) {
        // The lock is released at the end of this statement: one thread waits in `recv`,
        // the others for the lock, and each takes one range at a time.
        let next = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok((start, len)) = next else { return };
        let Ok(n) = usize::try_from(len.min(PREFETCH_MAX)) else {
            continue;
        };
        if buf.len() < n {
            buf.resize(n, 0);
        }
        let _ = read_exact_at(file, &mut buf[..n], start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader of a `len`-byte file that notes each read's range and takes `slow` for the
    /// reads whose offsets `is_slow` picks.
    fn reader<'a>(
        len: u64,
        reads: &'a mut Vec<(u64, usize)>,
        is_slow: impl Fn(u64) -> bool + 'a,
    ) -> impl FnMut(u64, &mut [u8]) -> std::io::Result<()> + 'a {
        move |at, buf| {
            reads.push((at, buf.len()));
            if at + buf.len() as u64 > len {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if is_slow(at) {
                std::thread::sleep(COLD_READ * 3);
            }
            Ok(())
        }
    }

    #[test]
    fn read_ahead_reads_every_byte_once_in_order_in_chunks() {
        let len = CHUNK as u64 * 2 + 12_345;
        let mut reads = Vec::new();
        read_ahead(len, &mut reader(len, &mut reads, |_| false));
        assert_eq!(
            reads,
            vec![
                (0, CHUNK),
                (CHUNK as u64, CHUNK),
                (2 * CHUNK as u64, 12_345)
            ]
        );
    }

    #[test]
    fn read_ahead_stops_at_the_first_failed_read() {
        let len = CHUNK as u64 * 2;
        let mut reads = Vec::new();
        // The walk was told a longer file than there is: the read past the end fails, and
        // the read ahead stops there instead of going on.
        read_ahead(len * 4, &mut reader(len, &mut reads, |_| false));
        assert_eq!(reads.len(), 3, "{reads:?}");
    }

    /// What the writer's open does before a walk of every page.
    fn read_ahead_if_cold(len: u64, read: &mut ReadAt<'_>) {
        if is_cold(len, read) {
            read_ahead(len, read);
        }
    }

    #[test]
    fn a_file_whose_probed_pages_are_slow_to_read_is_read_ahead() {
        let len = 40 * CHUNK as u64 + 3 * PAGE_SIZE;
        let mut reads = Vec::new();
        // Every single-page read is slow: the probes judge the file cold.
        read_ahead_if_cold(len, &mut reader(len, &mut reads, |_| true));
        let probes: Vec<_> = reads.iter().take(PROBES as usize).copied().collect();
        assert!(
            probes
                .iter()
                .all(|&(at, n)| n == PAGE_SIZE as usize && at % PAGE_SIZE == 0)
        );
        assert_eq!(
            reads.len(),
            PROBES as usize + 41,
            "the probes, then 41 chunks"
        );
        assert_eq!(reads[PROBES as usize], (0, CHUNK));
    }

    #[test]
    fn a_file_with_one_slow_probe_of_four_is_not_read_ahead() {
        let len = 40 * CHUNK as u64;
        let mut reads = Vec::new();
        let first_probe = len / PAGE_SIZE / 8 * PAGE_SIZE;
        read_ahead_if_cold(len, &mut reader(len, &mut reads, |at| at == first_probe));
        assert_eq!(reads.len(), PROBES as usize, "{reads:?}");
        assert_eq!(
            reads[0].0, first_probe,
            "the first probe is the one made slow"
        );
    }

    #[test]
    fn a_small_file_is_not_probed() {
        let mut reads = Vec::new();
        read_ahead_if_cold(
            SMALL_FILE - 1,
            &mut reader(SMALL_FILE, &mut reads, |_| true),
        );
        assert!(reads.is_empty(), "{reads:?}");
    }

    #[test]
    fn prefetching_returns_the_walks_answer_and_ends_with_reads_still_queued() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("f");
        std::fs::write(&path, vec![1u8; 64 * PAGE_SIZE as usize]).expect("write");
        let file = File::open(&path).expect("open");
        let answer = prefetching(&file, |prefetch| {
            // Pages of the file, pages past its end (their reads fail, quietly), and far
            // more than the threads read before the walk ends: the queue is dropped.
            for i in 0..100_000u64 {
                prefetch((i % 128) * PAGE_SIZE, PAGE_SIZE);
            }
            prefetch(u64::MAX - 10, u64::MAX);
            42
        });
        assert_eq!(answer, 42);
    }
}
