//! Compaction: firing due timers in bounded batches, and the background compactor.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::{Error, ErrorKind, Result};
use crate::journal::Inner;
use crate::machine::{self, Fired};

/// What one [`Journal::compact`](crate::Journal::compact) call did, per clock.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct CompactionReport {
    /// Running operations whose lease expired (now `InDoubt`).
    pub lease_expired: u64,
    /// Deliveries whose retry budget was spent.
    pub exhausted: u64,
    /// Results whose acknowledgement expired.
    pub ack_expired: u64,
    /// Results retired (payload dropped, audit record kept).
    pub retired: u64,
    /// Operations purged with their events (audit retention passed).
    pub purged: u64,
    /// Superseded scope revision events purged.
    pub revision_events_purged: u64,
    /// Receipts read by a scan of every receipt in operation id order, which a pass runs
    /// first when more than half of them are due for retiring or purging (one read of each
    /// page instead of a lookup per due operation); 0 when the pass looked up each
    /// operation whose timer was due.
    pub receipts_scanned: u64,
    /// Write transactions used.
    pub batches: u32,
    /// Wall time spent.
    #[serde(serialize_with = "ser_duration_ms")]
    pub elapsed: Duration,
}

fn ser_duration_ms<S: serde::Serializer>(
    d: &Duration,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    // Whole microseconds as milliseconds: three decimals, no float noise.
    s.serialize_f64(d.as_micros() as f64 / 1000.0)
}

impl CompactionReport {
    fn add(&mut self, f: &Fired) {
        self.lease_expired += f.lease_expired;
        self.exhausted += f.exhausted;
        self.ack_expired += f.ack_expired;
        self.retired += f.retired;
        self.purged += f.purged;
        self.revision_events_purged += f.revision_events_purged;
        self.receipts_scanned += f.scanned;
    }

    /// Total transitions fired.
    pub fn total(&self) -> u64 {
        self.lease_expired
            + self.exhausted
            + self.ack_expired
            + self.retired
            + self.purged
            + self.revision_events_purged
    }
}

fn delta(after: Fired, before: Fired) -> Fired {
    Fired {
        lease_expired: after.lease_expired - before.lease_expired,
        exhausted: after.exhausted - before.exhausted,
        ack_expired: after.ack_expired - before.ack_expired,
        retired: after.retired - before.retired,
        purged: after.purged - before.purged,
        revision_events_purged: after.revision_events_purged - before.revision_events_purged,
        scanned: after.scanned - before.scanned,
    }
}

/// Where a pass starts, if anything is due (checked on a read snapshot, so an idle
/// journal's compaction writes nothing).
fn first_batch(inner: &Inner) -> Result<Option<machine::Resume>> {
    inner.read_with(None, |snap, now| {
        machine::first_resume(&snap.tables, now.0, inner.cfg.compaction_scan)
    })
}

pub(crate) fn run(inner: &Inner) -> Result<CompactionReport> {
    run_pass(inner, false)
}

/// A compaction pass. With `yielding`, a journal shared with other processes does not wait
/// for a writer lock another process holds: the pass ends there (that process, or the
/// next pass, goes on), so that compactors in N processes take turns instead of queueing.
/// No transition fires twice either way: each batch reads what is due under the lock.
fn run_pass(inner: &Inner, yielding: bool) -> Result<CompactionReport> {
    let start = Instant::now();
    let mut report = CompactionReport::default();
    inner.check_writable()?;
    {
        // Checkpoints during the pass defer the deletions of events and results; they are
        // removed at its end, in one pass over each table.
        let _compacting = Compacting::new(inner);
        passes(inner, yielding, &mut report)?;
    }
    // The deferred purges are removed by a checkpoint that commits beside the log: the
    // pass's changes are durable in the log already, and reads see them through the
    // purged marker until the commit publishes the tables without them.
    if inner.compacting.load(Ordering::SeqCst) == 0 && inner.purges_deferred()? {
        inner.checkpoint_beside()?;
    }
    report.elapsed = start.elapsed();
    crate::trace_event!(
        DEBUG,
        lease_expired = report.lease_expired,
        exhausted = report.exhausted,
        ack_expired = report.ack_expired,
        retired = report.retired,
        purged = report.purged,
        revision_events_purged = report.revision_events_purged,
        receipts_scanned = report.receipts_scanned,
        batches = report.batches,
        elapsed_us = report.elapsed.as_micros() as u64,
        "compaction pass"
    );
    Ok(report)
}

/// Counts a running pass in [`Inner::compacting`] for as long as it lives.
struct Compacting<'a>(&'a Inner);

impl<'a> Compacting<'a> {
    fn new(inner: &'a Inner) -> Compacting<'a> {
        inner.compacting.fetch_add(1, Ordering::SeqCst);
        Compacting(inner)
    }
}

impl Drop for Compacting<'_> {
    fn drop(&mut self) {
        self.0.compacting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The batches of a pass, each in its own write.
fn passes(inner: &Inner, yielding: bool, report: &mut CompactionReport) -> Result<()> {
    // Pending deliveries and acknowledgements first: they change what is due.
    inner.flush()?;
    if let Some(mut resume) = first_batch(inner)? {
        let limit = inner.cfg.compaction_batch;
        loop {
            // A checkpoint committing beside the log while the log has filled up again:
            // the pass waits for it here, outside the committer, instead of making the
            // leader wait for it with foreground calls queued behind.
            inner.wait_for_checkpoint_room();
            let waiting = inner.foreground_waiting.clone();
            let from = resume.clone();
            let batch = move |ctx: &mut machine::Ctx<'_, '_>| {
                let before = ctx.fired;
                let yield_now = || waiting.load(std::sync::atomic::Ordering::SeqCst) > 0;
                let (more, next) = machine::compact_batch(ctx, limit, &from, &yield_now)?;
                Ok((more, delta(ctx.fired, before), next))
            };
            let done = if yielding {
                inner.write_background_yielding(batch)
            } else {
                inner.write_background(batch)
            };
            let (more, fired, next) = match done {
                Err(e) if super::committer::is_skipped(&e) => break,
                other => other?,
            };
            resume = next;
            report.batches += 1;
            report.add(&fired);
            if !more {
                break;
            }
        }
    }
    Ok(())
}

/// A running background compactor, from [`Journal::spawn_compactor`](crate::Journal::spawn_compactor).
///
/// Dropping it stops the thread and waits for it; a batch in progress finishes first, so
/// no work is lost. Keep it for as long as the compactor should run.
///
/// A pass that fails is retried at the next interval; the failure is kept for the
/// embedder: [`CompactorHandle::errors`] counts the failed passes and
/// [`CompactorHandle::last_error`] returns the latest one. A poisoned or closed journal
/// ends the thread ([`CompactorHandle::is_running`] turns false, and
/// [`CompactorHandle::stop`] returns that error).
///
/// # Example
///
/// ```
/// use std::time::Duration;
///
/// # let dir = tempfile::tempdir()?;
/// let journal = opjournal::Journal::open(dir.path().join("project.opj"))?;
/// let compactor = journal.spawn_compactor(Duration::from_secs(1));
/// // ... serve requests ...
/// if let Some(err) = compactor.last_error() {
///     eprintln!("compaction failed {} times, last: {err}", compactor.errors());
/// }
/// assert!(compactor.stop().is_none());
/// # Ok::<(), opjournal::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "the compactor stops when its handle is dropped: keep the handle while it should run"]
pub struct CompactorHandle {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<Option<Error>>>,
    failures: Arc<Mutex<Failures>>,
}

/// Failed passes of a background compactor.
#[derive(Debug, Default)]
struct Failures {
    count: u64,
    last: Option<Arc<Error>>,
}

impl CompactorHandle {
    pub(crate) fn spawn(
        inner: Weak<Inner>,
        gate: Arc<Mutex<bool>>,
        interval: Duration,
    ) -> CompactorHandle {
        let (tx, rx) = mpsc::channel::<()>();
        let failures = Arc::new(Mutex::new(Failures::default()));
        let record = failures.clone();
        let thread = std::thread::Builder::new()
            .name("opjournal-compactor".into())
            .spawn(move || {
                loop {
                    match rx.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => {}
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return None,
                    }
                    // Hold the journal only during a pass, under the gate, so that
                    // dropping the journal waits for at most this pass and then closes
                    // the file.
                    let closed = gate.lock().unwrap_or_else(|e| e.into_inner());
                    if *closed {
                        return None;
                    }
                    let inner = inner.upgrade()?;
                    let result = pass(&inner);
                    drop(inner);
                    drop(closed);
                    if let Err(e) = result {
                        crate::trace_event!(WARN, error = %e, "background compaction pass failed");
                        // A poisoned or closed journal ends the thread; the error is kept
                        // for `stop`. Other errors are retried at the next interval.
                        let fatal = matches!(e.kind(), ErrorKind::Poisoned | ErrorKind::Closed);
                        let kept = if fatal {
                            // These kinds carry no source: an equal copy for `last_error`.
                            Arc::new(Error::new(e.kind().clone()))
                        } else {
                            Arc::new(e)
                        };
                        let mut f = record.lock().unwrap_or_else(|p| p.into_inner());
                        f.count += 1;
                        f.last = Some(kept.clone());
                        drop(f);
                        if fatal {
                            return Some(Error::new(kept.kind().clone()));
                        }
                    }
                }
            });
        match thread {
            Ok(t) => CompactorHandle {
                stop: Some(tx),
                thread: Some(t),
                failures,
            },
            // Without a thread there is nothing to stop; `compact()` still works.
            Err(_) => CompactorHandle {
                stop: None,
                thread: None,
                failures,
            },
        }
    }

    /// How many passes failed since the compactor started. Failed passes are retried at
    /// the next interval.
    pub fn errors(&self) -> u64 {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .count
    }

    /// The error of the latest failed pass, if any pass failed. It stays until a later
    /// pass fails with another error.
    pub fn last_error(&self) -> Option<Arc<Error>> {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last
            .clone()
    }

    /// Whether the compactor thread still runs: false after a poisoned or closed journal
    /// ended it (see [`CompactorHandle::stop`]), or if the thread could not be started.
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops the compactor and waits for it. Returns the error that ended it early, if
    /// any (for example [`ErrorKind::Poisoned`]).
    pub fn stop(mut self) -> Option<Error> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Option<Error> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.thread.take().and_then(|t| t.join().ok().flatten())
    }
}

fn pass(inner: &Arc<Inner>) -> Result<()> {
    run_pass(inner, true).map(drop)
}

impl Drop for CompactorHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}
