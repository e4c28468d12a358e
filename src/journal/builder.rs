//! [`JournalBuilder`]: the settings, then open.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::config::{Config, RetryPolicy, ScopeLock, Sharing};
use crate::error::Result;
use crate::journal::Journal;
use crate::log::LogStorage;

/// Configures and opens a [`Journal`]. Every setting has a default, listed with its setter.
///
/// Durations apply to transitions made after the journal is opened with them: deadlines
/// are computed when an operation changes state and stored with it.
///
/// # Example
///
/// ```
/// use opjournal::{Journal, ScopeLock};
/// use std::time::Duration;
///
/// let dir = tempfile::tempdir()?;
/// let journal = Journal::builder()
///     .ack_timeout(Duration::from_secs(600))
///     .scope_lock(ScopeLock::HoldUntilAck)
///     .open(dir.path().join("project.opj"))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default)]
#[must_use]
pub struct JournalBuilder {
    config: Config,
}

impl JournalBuilder {
    /// A builder with every default.
    pub fn new() -> Self {
        JournalBuilder::default()
    }

    /// The execution lease (default 5 min): a `Running` operation whose claim holder neither
    /// completes, releases nor extends within it becomes `InDoubt`.
    pub fn lease(mut self, d: Duration) -> Self {
        self.config.lease = d;
        self
    }

    /// The delivery retry budget (default 8 attempts, 1 s doubling to 5 min).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.config.retry = policy;
        self
    }

    /// How long a terminal result waits for its acknowledgement (default 15 min). Past it,
    /// the result is `AckExpired`: its session window slot and any hold-until-ack scope
    /// lock are freed.
    pub fn ack_timeout(mut self, d: Duration) -> Self {
        self.config.ack_timeout = d;
        self
    }

    /// How long a result payload is kept after the outcome (default 7 days). Past it the
    /// operation is `Retired`: the payload is dropped, the audit record stays.
    pub fn result_retention(mut self, d: Duration) -> Self {
        self.config.result_retention = d;
        self
    }

    /// How long the audit record is kept after the outcome (default 90 days). Past it the
    /// operation and its events are purged and the id is unknown again.
    pub fn audit_retention(mut self, d: Duration) -> Self {
        self.config.audit_retention = d;
        self
    }

    /// The most unacknowledged results one session may have (default 64).
    pub fn session_window(mut self, n: u32) -> Self {
        self.config.session_window = n;
        self
    }

    /// The scope lock policy (default [`ScopeLock::Serial`]).
    pub fn scope_lock(mut self, policy: ScopeLock) -> Self {
        self.config.scope_lock = policy;
        self
    }

    /// The largest accepted result payload in bytes (default 4 MiB, at most 64 MiB).
    pub fn max_result_bytes(mut self, n: u64) -> Self {
        self.config.max_result_bytes = n;
        self
    }

    /// How the file is shared between processes (default [`Sharing::LiveReaders`]).
    pub fn sharing(mut self, sharing: Sharing) -> Self {
        self.config.sharing = sharing;
        self
    }

    /// The most operations one compaction batch handles (default 1,000). Each batch is one
    /// write transaction; a batch ends early, after the operation in hand, as soon as a
    /// foreground call queues, and the waiting calls share its commit, so a foreground
    /// call never waits for a whole batch. Larger batches mean fewer commits (and syncs)
    /// per compaction.
    pub fn compaction_batch(mut self, n: usize) -> Self {
        self.config.compaction_batch = n;
        self
    }

    /// How compaction finds what is due: `Some(true)` scans every receipt in operation id
    /// order, `Some(false)` looks up each operation whose timer is due, `None` (the
    /// default) scans when more than half of the receipts are due for retiring or purging. Both
    /// leave the same journal; this is for the tests and fuzzers that compare them, and is
    /// not a stable API.
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub fn compaction_scan(mut self, scan: Option<bool>) -> Self {
        self.config.compaction_scan = scan;
        self
    }

    /// Whether checkpoints record redb's allocator state, so that reopening after a crash
    /// and read-only opens of a crashed file need no full scan of the file (default
    /// `true`). Commits are not affected: they only append to the log.
    pub fn quick_repair(mut self, enabled: bool) -> Self {
        self.config.quick_repair = enabled;
        self
    }

    /// How large the log may grow before a checkpoint writes it into redb and starts it
    /// over (default 16 MiB, at least 64 KiB). The checkpoint starts the next cycle in the
    /// log's other file and commits on the journal's checkpoint thread while calls go on;
    /// if the one before has not finished by then, it waits for a moment when no call is
    /// queued, up to twice this size. It is taken up to a sixteenth early, so that each log
    /// file keeps the power of two that holds the size (twice that under a steady load)
    /// instead of growing to the next. Changes logged since the last committed checkpoint
    /// are also held in memory (roughly as much again, up to three times while a checkpoint
    /// commits under a steady load), so this bounds the journal's memory beside the page
    /// cache, and the time a reopen after a crash spends reading the log back. Larger
    /// values checkpoint less often (fewer, larger redb transactions).
    pub fn checkpoint_size(mut self, bytes: u64) -> Self {
        self.config.checkpoint_bytes = bytes;
        self
    }

    /// Whether checkpoints commit in the background (default `true`). When the log reaches
    /// [`checkpoint_size`](Self::checkpoint_size), the call that finds it so starts the
    /// log's next cycle in its other file and returns; the checkpoint thread writes and
    /// commits the ended cycle's changes into redb while calls go on. Nothing is lost to a
    /// crash meanwhile: both log files hold every change redb does not, and recovery reads
    /// them in order. [`Journal::flush`](crate::Journal::flush) waits for it.
    ///
    /// With `false` the call that starts a checkpoint waits for it, so every write to the
    /// files happens at a point that the calls determine. Tests that inject faults at the
    /// n-th write of a storage backend ([`open_backends`](Self::open_backends)) need that
    /// to be reproducible.
    pub fn background_checkpoints(mut self, enabled: bool) -> Self {
        self.config.background_checkpoints = enabled;
        self
    }

    /// The most memory redb's page cache may use (default 8 MiB). The cache grows with
    /// the pages read, up to this bound, so a journal smaller than it is held whole. A
    /// journal larger than the bound has its other pages read again from the operating
    /// system's cache when they are needed: replay lookups of old ids slow down first
    /// (random ids over a 270 MiB journal: about 30% slower than with a 1 GiB cache). A
    /// service with one large journal and memory to spare may raise it.
    pub fn cache_size(mut self, bytes: usize) -> Self {
        self.config.cache_bytes = bytes;
        self
    }

    /// Up to what file size opening reads every page of the file to check the page
    /// numbers in it (default 32 MiB; `u64::MAX`: always). redb allocates a
    /// page's whole size, which its number claims (up to 4 GiB), before reading it, and
    /// does not check that the page lies inside the file; so before anything reads a
    /// file, its trees are walked and a number outside the file is refused as `Corrupt`
    /// (with `repair` as the next step). Walking every page costs about a millisecond per
    /// 10 MiB of file (page cache warm); a file not in the page cache (after a reboot) is
    /// read once in order first: for 20 MiB, 9 ms on the project's test machine, where
    /// reading its pages in the trees' order took 100 ms. A larger file has its table
    /// definitions, its
    /// redb's own tree and every branch page of every table checked (about one
    /// page in a hundred, well under a millisecond per 100 MiB); only a leaf page damaged
    /// into looking like a branch is then left to be met when it is read. The read-only
    /// [`Inspector`](crate::Inspector) and [`repair`](crate::repair) always walk every page.
    pub fn page_check_size(mut self, bytes: u64) -> Self {
        self.config.page_check_bytes = bytes;
        self
    }

    /// How much memory the replay cache may use (default 1 MiB; 0 turns it off). It keeps
    /// terminal answers (receipt and result) of operations asked about recently, so that a
    /// client re-asking after a reconnect is answered without reading the index; entries
    /// read again are kept longest. Larger values help when many clients re-ask many
    /// results at once.
    pub fn replay_cache_size(mut self, bytes: usize) -> Self {
        self.config.replay_cache_bytes = bytes;
        self
    }

    /// The clock (default [`SystemClock`](crate::SystemClock)). Use [`ManualClock`](crate::ManualClock) in tests.
    /// A journal in PostgreSQL uses the database server's time unless a clock is set here.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.config.clock = Arc::new(clock);
        self.config.custom_clock = true;
        self
    }

    /// Opens the journal at `path`, creating it if missing.
    ///
    /// Operations that were `Running` when the file was last closed are `InDoubt` after
    /// this returns: the process that held their claims is gone, and nothing is re-run.
    ///
    /// # Errors
    ///
    /// - [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for an inconsistent
    ///   configuration (for example a result retention shorter than the ack timeout);
    /// - [`ErrorKind::Locked`](crate::ErrorKind::Locked) if another handle has it open;
    /// - [`ErrorKind::NotAJournal`](crate::ErrorKind::NotAJournal) for another kind of file;
    /// - [`ErrorKind::UnsupportedFormat`](crate::ErrorKind::UnsupportedFormat) for a newer format;
    /// - [`ErrorKind::Corrupt`](crate::ErrorKind::Corrupt) or [`ErrorKind::Io`](crate::ErrorKind::Io).
    pub fn open(self, path: impl AsRef<Path>) -> Result<Journal> {
        let _span = crate::trace_span!(DEBUG, "open", path = %path.as_ref().display());
        self.config.validate()?;
        Journal::open_with(path.as_ref(), self.config)
    }

    /// Opens (or creates) a journal on custom storage: a redb backend for the index and a
    /// [`LogStorage`] for the log, such as in-memory ones ([`redb::backends::InMemoryBackend`]
    /// and [`MemoryLog`](crate::MemoryLog)) or fault-injecting ones for crash tests. `label`
    /// names it in messages. redb runs the commit protocol of the builder's [`Sharing`]
    /// mode, as for a file (a backend without byte-range locks is opened without
    /// cross-process locks: one process at a time must use it), and a clean close empties
    /// the log storage.
    ///
    /// # Errors
    ///
    /// As [`JournalBuilder::open`].
    ///
    /// # Example
    ///
    /// ```
    /// use opjournal::{Journal, MemoryLog};
    ///
    /// let journal = Journal::builder().open_backends(
    ///     opjournal::redb::backends::InMemoryBackend::new(),
    ///     MemoryLog::new(),
    ///     "in-memory",
    /// )?;
    /// assert_eq!(journal.scope_revision("scene/main")?, 0);
    /// # Ok::<(), opjournal::Error>(())
    /// ```
    pub fn open_backends(
        self,
        backend: impl redb::StorageBackend,
        log: impl LogStorage,
        label: &str,
    ) -> Result<Journal> {
        let _span = crate::trace_span!(DEBUG, "open", path = %label);
        self.config.validate()?;
        Journal::open_backends_with(backend, vec![Arc::new(log)], label, self.config)
    }

    /// As [`JournalBuilder::open_backends`], with a second log storage, as a journal file
    /// has (`<journal>-log2`): each cycle of the log starts in the storage the cycle before
    /// did not use, so that a checkpoint commits into redb on the journal's checkpoint
    /// thread while calls go on logging, instead of holding them up. Give the same two
    /// storages, in the same order, every time the journal opens: recovery follows the
    /// log from one into the other.
    ///
    /// # Errors
    ///
    /// As [`JournalBuilder::open_backends`].
    ///
    /// # Examples
    ///
    /// ```
    /// use opjournal::{Journal, MemoryLog};
    ///
    /// let journal = Journal::builder().open_backends_with_spare_log(
    ///     opjournal::redb::backends::InMemoryBackend::new(),
    ///     MemoryLog::new(),
    ///     MemoryLog::new(),
    ///     "in-memory",
    /// )?;
    /// assert_eq!(journal.scope_revision("scene/main")?, 0);
    /// # Ok::<(), opjournal::Error>(())
    /// ```
    pub fn open_backends_with_spare_log(
        self,
        backend: impl redb::StorageBackend,
        log: impl LogStorage,
        spare: impl LogStorage,
        label: &str,
    ) -> Result<Journal> {
        let _span = crate::trace_span!(DEBUG, "open", path = %label);
        self.config.validate()?;
        Journal::open_backends_with(
            backend,
            vec![Arc::new(log), Arc::new(spare)],
            label,
            self.config,
        )
    }

    /// Opens a new, empty journal in memory with these settings (see
    /// [`Journal::in_memory`]): nothing is written anywhere, and the journal is gone when its
    /// last handle is dropped.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for a setting out of range.
    pub fn open_in_memory(self) -> Result<Journal> {
        let _span = crate::trace_span!(DEBUG, "open", path = ":memory:");
        self.config.validate()?;
        super::memory::open_in_memory(self.config)
    }

    /// A journal in PostgreSQL ([`JournalBuilder::open_postgres`], feature `postgres`):
    /// how long the database may take over one step of a call (default 30 s). The server
    /// cancels a statement running longer (`statement_timeout`), stops a lock wait this
    /// long (`lock_timeout`, the journal's writer lock included) and ends a session idle
    /// this long inside a transaction (`idle_in_transaction_session_timeout`, so that a
    /// process that stalls while holding the writer lock frees it). The client bounds
    /// each call too: when the server stays silent for this long plus a tenth of it (at
    /// least 1 s) while a call waits for its answer (a network partition), the call fails
    /// with [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) instead of waiting
    /// for the operating system to give up on the connection.
    ///
    /// A longer timeout lets calls wait longer behind another process's transaction; a
    /// shorter one notices a partition sooner.
    ///
    /// # Errors
    ///
    /// [`JournalBuilder::open_postgres`] answers
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for a timeout under
    /// 1 ms or over 2,147,483,647 ms (PostgreSQL's limit).
    #[cfg(feature = "postgres")]
    pub fn database_timeout(mut self, timeout: Duration) -> Self {
        self.config.database_timeout = timeout;
        self
    }

    /// Opens the journal `name` in the PostgreSQL database at `url` (a URL such as
    /// `postgresql://user@host:5432/db`, or libpq's `key=value` pairs), creating the
    /// schema and the journal if missing (feature `postgres`). Handles in any number of
    /// processes, on any number of machines, share the journal: each call is one
    /// transaction under the journal's writer lock, so every guarantee holds across
    /// processes. Time is the database server's, unless [`JournalBuilder::clock`] set one.
    /// Opening marks nothing in doubt (other processes may be running their operations):
    /// a `Running` operation whose process died becomes `InDoubt` when its lease expires.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) when the database cannot
    /// be reached (retry); [`ErrorKind::UnsupportedFormat`](crate::ErrorKind::UnsupportedFormat)
    /// for a schema or journal written by a newer build; [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput)
    /// for a setting out of range or a bad URL or name.
    #[cfg(feature = "postgres")]
    pub fn open_postgres(self, url: &str, name: &str) -> Result<Journal> {
        let _span = crate::trace_span!(DEBUG, "open", path = %name);
        self.config.validate()?;
        super::remote::open_postgres(url, name, self.config)
    }
}
