//! Pacing a background checkpoint's writes into redb's file.
//!
//! A checkpoint that commits beside the log writes megabytes of pages into redb's file and
//! syncs them at once. A call's log sync issued meanwhile waits for the device's cache
//! flush, and a flush makes durable everything the device holds, whoever wrote it: each
//! call during such a commit paid for the whole checkpoint's bytes (4 ms at the p99 of 8
//! threads, against under 1 ms with no checkpoint in the run). So the commit on the
//! checkpoint thread syncs redb's file every [`CHUNK`] bytes it writes and pauses
//! [`PAUSE`] after each: its bytes reach the device a little at a time, and a log sync
//! finds at most about a chunk ahead of it.
//!
//! The extra syncs only make a prefix of the commit's writes durable earlier, which a power
//! cut could have done anyway: they add no crash state. Only the thread that began pacing
//! is paced (a reader that writes a page back is not), and a commit that is holding the
//! callers up stops pausing ([`Pace::hurry`]: the log filled up again before it ended).

use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use redb::{BackendError, StorageBackend};

/// Bytes a paced commit writes between two syncs of redb's file.
pub(crate) const CHUNK: u64 = 64 << 10;
/// The pause after each chunk's sync: at most 64 KiB a millisecond, about a third of what
/// this project's test machine's disk writes, so a 6 MiB commit takes a tenth of a second
/// or more. A log that fills up before it ends hurries it.
pub(crate) const PAUSE: Duration = Duration::from_millis(1);

/// Which writes are paced, shared by the journal and its redb backend.
#[derive(Debug)]
pub(crate) struct Pace {
    /// Set while a thread paces its writes (read on every write, so it is an atomic).
    active: AtomicBool,
    /// The pacing thread.
    thread: Mutex<Option<ThreadId>>,
    /// Stop pausing and syncing early until the pacing ends.
    hurry: AtomicBool,
    /// Threads waiting for the checkpoint thread ([`Pace::waiting`]): no commit is paced
    /// while there are any, whether it began before they came or after.
    waiters: AtomicUsize,
    /// Bytes written since the last sync.
    written: AtomicU64,
    chunk: u64,
    pause: Duration,
}

impl Default for Pace {
    fn default() -> Self {
        Pace::new(CHUNK, PAUSE)
    }
}

impl Pace {
    pub(crate) fn new(chunk: u64, pause: Duration) -> Pace {
        Pace {
            active: AtomicBool::new(false),
            thread: Mutex::new(None),
            hurry: AtomicBool::new(false),
            waiters: AtomicUsize::new(0),
            written: AtomicU64::new(0),
            chunk,
            pause,
        }
    }

    /// Paces this thread's writes until the guard drops.
    pub(crate) fn begin(self: &Arc<Self>) -> Paced {
        *self.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current().id());
        self.written.store(0, Ordering::SeqCst);
        self.hurry.store(false, Ordering::SeqCst);
        self.active.store(true, Ordering::SeqCst);
        Paced {
            pace: Arc::clone(self),
        }
    }

    /// The callers wait for the paced commit: it goes on at full speed.
    pub(crate) fn hurry(&self) {
        if self.active.load(Ordering::Relaxed) {
            self.hurry.store(true, Ordering::SeqCst);
        }
    }

    /// No commit is paced until the guard drops: a thread waits for the checkpoint
    /// thread (a leader whose log filled up, a close, an explicit checkpoint).
    pub(crate) fn waiting(self: &Arc<Self>) -> Waiting {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        Waiting {
            pace: Arc::clone(self),
        }
    }

    /// Whether pausing is off: hurried, or waited for.
    fn hurried(&self) -> bool {
        self.hurry.load(Ordering::Acquire) || self.waiters.load(Ordering::Acquire) > 0
    }

    /// Whether this thread's writes are paced now.
    fn pacing_here(&self) -> bool {
        self.active.load(Ordering::Acquire)
            && !self.hurried()
            && *self.thread.lock().unwrap_or_else(|e| e.into_inner())
                == Some(std::thread::current().id())
    }

    /// Counts `n` bytes written by this thread; true when a chunk is complete (the caller
    /// syncs, then [`Pace::pause`]s).
    fn wrote(&self, n: u64) -> bool {
        if !self.pacing_here() {
            return false;
        }
        let total = self
            .written
            .fetch_add(n, Ordering::SeqCst)
            .saturating_add(n);
        if total >= self.chunk {
            self.written.store(0, Ordering::SeqCst);
            return true;
        }
        false
    }

    fn pause(&self) {
        if !self.hurried() {
            std::thread::sleep(self.pause);
        }
    }
}

/// Keeps commits unpaced while a thread waits for the checkpoint thread.
pub(crate) struct Waiting {
    pace: Arc<Pace>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.pace.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Ends a thread's pacing when dropped.
pub(crate) struct Paced {
    pace: Arc<Pace>,
}

impl Drop for Paced {
    fn drop(&mut self) {
        self.pace.active.store(false, Ordering::SeqCst);
        *self.pace.thread.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// A redb backend whose writes by the pacing thread are synced a chunk at a time, with a
/// pause after each (see the module's documentation); everything else goes straight to
/// `inner`.
#[derive(Debug)]
pub(crate) struct PacedBackend<B> {
    inner: B,
    pace: Arc<Pace>,
}

impl<B> PacedBackend<B> {
    pub(crate) fn new(inner: B, pace: Arc<Pace>) -> Self {
        PacedBackend { inner, pace }
    }
}

impl<B: StorageBackend> StorageBackend for PacedBackend<B> {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.pace.written.store(0, Ordering::SeqCst);
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.inner.write(offset, data)?;
        if self.pace.wrote(data.len() as u64) {
            self.inner.sync_data()?;
            self.pace.pause();
        }
        Ok(())
    }

    fn close(&self) -> Result<(), std::io::Error> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use opjournal_testkit::fault_backend::{FaultBackend, FaultDisk};

    use super::*;

    const PAGE: usize = 4096;

    /// A paced backend over the fault disk's redb file, which counts its syncs.
    struct Fixture {
        b: PacedBackend<FaultBackend>,
        disk: FaultDisk,
        syncs_before: u64,
    }

    fn backend(pause: Duration) -> (Fixture, Arc<Pace>) {
        let pace = Arc::new(Pace::new(4 * PAGE as u64, pause));
        let disk = FaultDisk::new();
        let b = PacedBackend::new(disk.backend(), Arc::clone(&pace));
        b.set_len(64 * PAGE as u64)
            .unwrap_or_else(|e| panic!("in memory: {e}"));
        let syncs_before = disk.stats().db.syncs;
        (
            Fixture {
                b,
                disk,
                syncs_before,
            },
            pace,
        )
    }

    fn write_pages(b: &Fixture, n: usize) {
        for i in 0..n {
            b.b.write((i * PAGE) as u64, &[7u8; PAGE])
                .unwrap_or_else(|e| panic!("in memory: {e}"));
        }
    }

    fn syncs(b: &Fixture) -> u64 {
        b.disk.stats().db.syncs - b.syncs_before
    }

    #[test]
    fn the_pacing_thread_syncs_after_every_chunk_and_pauses() {
        let (b, pace) = backend(Duration::from_millis(5));
        let paced = pace.begin();
        let start = Instant::now();
        write_pages(&b, 32);
        // 32 pages in chunks of 4: 8 syncs, each followed by a pause.
        assert_eq!(syncs(&b), 8);
        assert!(
            start.elapsed() >= Duration::from_millis(40),
            "paused {:?} in all",
            start.elapsed()
        );
        // The commit's own sync starts a new chunk.
        write_pages(&b, 2);
        b.b.sync_data().unwrap_or_else(|e| panic!("in memory: {e}"));
        write_pages(&b, 3);
        assert_eq!(syncs(&b), 9, "2 + 3 pages across a sync are no chunk");
        drop(paced);
    }

    #[test]
    fn writes_of_other_threads_and_after_the_pacing_ends_go_straight_through() {
        let (b, pace) = backend(Duration::from_secs(10));
        let paced = pace.begin();
        std::thread::scope(|s| {
            s.spawn(|| write_pages(&b, 32));
        });
        assert_eq!(
            syncs(&b),
            0,
            "another thread (a reader writing a page back)"
        );
        drop(paced);
        write_pages(&b, 32);
        assert_eq!(syncs(&b), 0, "after the guard dropped");
    }

    #[test]
    fn a_hurried_commit_neither_syncs_early_nor_pauses() {
        let (b, pace) = backend(Duration::from_secs(10));
        let _paced = pace.begin();
        write_pages(&b, 2);
        pace.hurry();
        let start = Instant::now();
        write_pages(&b, 32);
        assert_eq!(syncs(&b), 0);
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn no_commit_is_paced_while_a_thread_waits_for_the_checkpoint_thread() {
        let (b, pace) = backend(Duration::from_secs(10));
        // The wait began before the commit did (a job queued behind it).
        let waiting = pace.waiting();
        let paced = pace.begin();
        let start = Instant::now();
        write_pages(&b, 32);
        assert_eq!(syncs(&b), 0);
        assert!(start.elapsed() < Duration::from_secs(5));
        drop(waiting);
        drop(paced);
    }

    #[test]
    fn hurrying_with_no_commit_paced_leaves_the_next_one_paced() {
        let (b, pace) = backend(Duration::from_millis(1));
        pace.hurry();
        let _paced = pace.begin();
        write_pages(&b, 8);
        assert_eq!(syncs(&b), 2);
    }
}
