//! Journal configuration: the clocks, bounds and policies, set on [`JournalBuilder`].

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};

/// How the journal file is shared between processes.
///
/// The choice trades single-caller commit latency for live inspection; see the README's
/// "Performance" section for the figures on this kind of machine.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Sharing {
    /// One writer process; any number of read-only processes (such as `opjournal ls` or
    /// `opjournal verify`) may open the file while it runs and see its committed state.
    /// Every commit takes two syncs (redb's two-phase commit), which readers need.
    #[default]
    LiveReaders,
    /// The writer excludes every other process: the CLI cannot open the file while the
    /// journal is open. Commits take one sync, and acknowledgements and delivery counts
    /// are committed without a sync of their own.
    Exclusive,
}

/// Who holds a scope's mutation lock.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ScopeLock {
    /// An operation holds the lock while it is `Running` (the default): one mutation at a
    /// time per scope.
    #[default]
    Serial,
    /// An operation holds the lock while it is `Running` and, once terminal, until its
    /// result is acknowledged or the acknowledgement expires. Clients then see each result
    /// before the next mutation starts.
    HoldUntilAck,
}

/// The delivery retry budget: how often and how long a result is pushed again.
///
/// Attempt `n` (1-based, `n < attempts`) schedules the next one after a delay drawn
/// uniformly from `[0, min(initial · 2^(n-1), max)]` ("full jitter"), deterministic per
/// operation and attempt. Recording delivery number `attempts` without an acknowledgement
/// spends the budget: the delivery is
/// [`Exhausted`](crate::DeliveryState::Exhausted) from that call on (no more pushes; the
/// result stays retrievable and the acknowledgement is still accepted until it expires).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Deliveries before the budget is spent (default 8).
    pub attempts: u32,
    /// The first backoff, and the grace before a fresh result counts as due for a push
    /// (default 1 s).
    pub initial_backoff: Duration,
    /// The longest backoff (default 5 min).
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 8,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
        }
    }
}

/// The largest result payload accepted by default: 4 MiB.
pub const DEFAULT_MAX_RESULT_BYTES: u64 = 4 << 20;
/// The hard ceiling for `max_result_bytes`: 64 MiB.
pub const MAX_RESULT_BYTES_CEILING: u64 = 64 << 20;
/// How much the log (or the memtable of changes not yet in redb) may grow before a
/// checkpoint writes it into redb, by default: 16 MiB. A checkpoint's commit has syncs
/// that do not shrink with it, so larger checkpoints keep calls faster over a long
/// session: on a journal growing to 200,000 operations, 8 threads ran 7,669 lifecycles a
/// second with these defaults against 5,954 with 4 MiB and a 20 MiB cache (p99 2.15
/// against 3.77 ms), 32 threads 13,919 against 8,309. The memtables, up to about three
/// times this size while a checkpoint commits, are paid for by a smaller page cache.
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 16 << 20;
/// The replay cache's bound by default: 1 MiB, several hundred answers of a kilobyte.
pub const DEFAULT_REPLAY_CACHE_BYTES: usize = 1 << 20;
/// redb's page cache bound by default: 8 MiB. An editor keeps a journal per open
/// project, so the default is what a desktop app can afford beside the memtables of
/// [`DEFAULT_CHECKPOINT_BYTES`]: each MiB of cache costs about 1.4 MiB of resident memory
/// once full, since its pages are allocated and freed on every caller's thread (glibc's
/// per-thread arenas keep the holes). The pages the cache does not hold are read again
/// from the operating system's cache: random replay lookups over a journal of hundreds of
/// MiB are about 30% slower than with a cache that holds it all, and no slower with 8 MiB
/// than with 20 (the branch pages every lookup reads fit in either).
pub const DEFAULT_CACHE_BYTES: usize = 8 << 20;
/// Files up to this size have every page's numbers checked when a writer opens them by
/// default: 32 MiB, a few milliseconds of reading.
pub const DEFAULT_PAGE_CHECK_BYTES: u64 = 32 << 20;
/// The page cache bound of read-only inspection ([`Inspector`](crate::Inspector), the
/// CLI): 32 MiB, so that scanning a large journal (`export`, `verify`) runs in
/// bounded memory.
pub const INSPECT_CACHE_BYTES: usize = 32 << 20;

#[derive(Clone)]
pub(crate) struct Config {
    pub lease: Duration,
    pub retry: RetryPolicy,
    pub ack_timeout: Duration,
    pub result_retention: Duration,
    pub audit_retention: Duration,
    pub session_window: u32,
    pub scope_lock: ScopeLock,
    pub max_result_bytes: u64,
    pub sharing: Sharing,
    pub compaction_batch: usize,
    /// Whether compaction scans every receipt (`Some(true)`), looks each due operation up
    /// (`Some(false)`), or chooses by how much is due (`None`).
    pub compaction_scan: Option<bool>,
    pub quick_repair: bool,
    pub checkpoint_bytes: u64,
    /// Whether a checkpoint commits on the checkpoint thread while calls go on logging into
    /// the other log file (else the call that starts it waits for it, so every write
    /// happens at a point the calls determine).
    pub background_checkpoints: bool,
    pub replay_cache_bytes: usize,
    pub cache_bytes: usize,
    pub page_check_bytes: u64,
    pub clock: Arc<dyn Clock>,
    /// Whether the embedder set the clock: a journal in a database server then uses it
    /// (tests), else the server's time.
    pub custom_clock: bool,
    /// A journal in PostgreSQL: the server's statement, lock and idle-in-transaction
    /// timeouts, and (plus a margin) the client's limit on the server's silence in a call.
    #[cfg(feature = "postgres")]
    pub database_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            lease: Duration::from_secs(5 * 60),
            retry: RetryPolicy::default(),
            ack_timeout: Duration::from_secs(15 * 60),
            result_retention: Duration::from_secs(7 * 24 * 3600),
            audit_retention: Duration::from_secs(90 * 24 * 3600),
            session_window: 64,
            scope_lock: ScopeLock::Serial,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            sharing: Sharing::LiveReaders,
            compaction_batch: 1000,
            compaction_scan: None,
            quick_repair: true,
            checkpoint_bytes: DEFAULT_CHECKPOINT_BYTES,
            background_checkpoints: true,
            replay_cache_bytes: DEFAULT_REPLAY_CACHE_BYTES,
            cache_bytes: DEFAULT_CACHE_BYTES,
            page_check_bytes: DEFAULT_PAGE_CHECK_BYTES,
            clock: Arc::new(SystemClock),
            custom_clock: false,
            #[cfg(feature = "postgres")]
            database_timeout: Duration::from_secs(30),
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Config");
        d.field("lease", &self.lease)
            .field("retry", &self.retry)
            .field("ack_timeout", &self.ack_timeout)
            .field("result_retention", &self.result_retention)
            .field("audit_retention", &self.audit_retention)
            .field("session_window", &self.session_window)
            .field("scope_lock", &self.scope_lock)
            .field("max_result_bytes", &self.max_result_bytes)
            .field("sharing", &self.sharing)
            .field("compaction_batch", &self.compaction_batch)
            .field("compaction_scan", &self.compaction_scan)
            .field("cache_bytes", &self.cache_bytes)
            .field("page_check_bytes", &self.page_check_bytes)
            .field("quick_repair", &self.quick_repair)
            .field("checkpoint_bytes", &self.checkpoint_bytes)
            .field("background_checkpoints", &self.background_checkpoints)
            .field("replay_cache_bytes", &self.replay_cache_bytes);
        #[cfg(feature = "postgres")]
        d.field("database_timeout", &self.database_timeout);
        d.finish_non_exhaustive()
    }
}

impl Config {
    pub(crate) fn validate(&self) -> Result<()> {
        let positive = |what: &'static str, d: Duration| {
            if d.as_millis() == 0 {
                Err(Error::invalid(
                    what,
                    &format!("{d:?}"),
                    "it must be at least one millisecond",
                ))
            } else {
                Ok(())
            }
        };
        positive("lease", self.lease)?;
        positive("ack timeout", self.ack_timeout)?;
        positive("result retention", self.result_retention)?;
        positive("audit retention", self.audit_retention)?;
        #[cfg(feature = "postgres")]
        {
            positive("database timeout", self.database_timeout)?;
            // The server takes its timeouts as an int of milliseconds.
            if self.database_timeout.as_millis() > i32::MAX as u128 {
                return Err(Error::invalid(
                    "database timeout",
                    &format!("{:?}", self.database_timeout),
                    "PostgreSQL's timeouts go up to 2147483647 ms (about 24 days)",
                ));
            }
        }
        positive("initial backoff", self.retry.initial_backoff)?;
        if self.retry.max_backoff < self.retry.initial_backoff {
            return Err(Error::invalid(
                "max backoff",
                &format!("{:?}", self.retry.max_backoff),
                format!(
                    "it must be at least the initial backoff ({:?})",
                    self.retry.initial_backoff
                ),
            ));
        }
        if self.retry.attempts == 0 {
            return Err(Error::invalid(
                "retry attempts",
                "0",
                "at least one delivery attempt is needed",
            ));
        }
        if self.result_retention < self.ack_timeout {
            return Err(Error::invalid(
                "result retention",
                &format!("{:?}", self.result_retention),
                format!(
                    "it must be at least the acknowledgement timeout ({:?}), so an unacknowledged result stays retrievable until its acknowledgement expires",
                    self.ack_timeout
                ),
            ));
        }
        if self.audit_retention < self.result_retention {
            return Err(Error::invalid(
                "audit retention",
                &format!("{:?}", self.audit_retention),
                format!(
                    "it must be at least the result retention ({:?})",
                    self.result_retention
                ),
            ));
        }
        if self.session_window == 0 {
            return Err(Error::invalid(
                "session window",
                "0",
                "a session needs room for at least one unacknowledged result",
            ));
        }
        if self.max_result_bytes > MAX_RESULT_BYTES_CEILING {
            return Err(Error::invalid(
                "max result bytes",
                &self.max_result_bytes.to_string(),
                format!("the ceiling is {MAX_RESULT_BYTES_CEILING} bytes"),
            ));
        }
        if self.checkpoint_bytes < 64 << 10 {
            return Err(Error::invalid(
                "checkpoint size",
                &self.checkpoint_bytes.to_string(),
                "it must be at least 65536 bytes (64 KiB)",
            ));
        }
        if self.compaction_batch == 0 {
            return Err(Error::invalid(
                "compaction batch",
                "0",
                "a batch must fire at least one timer",
            ));
        }
        Ok(())
    }
}
