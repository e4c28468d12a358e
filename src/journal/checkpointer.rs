//! Checkpoints beside the commits. Writing the memtable into redb's B-trees is most of a
//! checkpoint's time; done by the group commit's leader, it held up every call behind it
//! (tens of milliseconds every few thousand lifecycles). So a checkpoint has two steps:
//!
//! 1. **Freeze** (the leader, after a batch): the memtable becomes a read-only layer under a
//!    new, empty one, and this thread writes the frozen layer into a redb write transaction
//!    while commits go on into the log and the new memtable. Reads see the new memtable,
//!    then the frozen one, then redb's last checkpoint.
//! 2. **Commit** (with the leader role held: the leader after its next batch, or the
//!    thread when the role is free): the changes logged meanwhile (the new memtable, small) go into the same
//!    transaction, which commits with the checkpoint record, and the log starts its next
//!    cycle. No record is appended meanwhile (the leader role is held), so the transaction
//!    holds exactly what the log held: the log and its recovery are as before.
//!
//! Until the commit, redb is unchanged on disk and the log holds everything, so a crash
//! at any point recovers as before.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;

use crate::error::{Error, ErrorKind, Result};
use crate::index;

use super::Inner;
use super::committer::lock;
use super::reads::{read_lock, write_lock};

/// The background checkpoint's state, shared by the journal and its thread.
#[derive(Default)]
pub(crate) struct Checkpointer {
    shared: Mutex<Shared>,
    cv: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Shared {
    step: Step,
    /// The thread is running and takes frozen memtables.
    running: bool,
    /// The thread ends once its work in hand is done.
    stop: bool,
    /// Tests hold the thread before it writes a frozen memtable.
    #[cfg(test)]
    held: bool,
}

// One per journal, and the transaction is handed over once per checkpoint: boxing it would
// save nothing worth an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Default)]
enum Step {
    /// Nothing frozen (or a frozen memtable left by a failure: the handle is poisoned).
    #[default]
    Idle,
    /// The thread is writing the frozen memtable into a redb transaction.
    Writing,
    /// Written, not committed yet.
    Prepared(redb::WriteTransaction),
    /// Being committed, by the holder of the leader role.
    Committing,
}

impl Checkpointer {
    /// Asks the thread to end once its work in hand is done, without waiting for it.
    pub(crate) fn stop_soon(&self) {
        lock(&self.shared).stop = true;
        self.cv.notify_all();
    }
}

impl Inner {
    /// Starts the checkpoint thread of a journal in a file.
    pub(crate) fn start_checkpointer(this: &Arc<Inner>) -> Result<()> {
        let cp = this.checkpointer.clone();
        let weak = Arc::downgrade(this);
        {
            let mut s = lock(&cp.shared);
            s.running = true;
            s.stop = false;
        }
        let thread = std::thread::Builder::new()
            .name("opjournal-checkpoint".into())
            .spawn(move || run(&cp, &weak))
            .map_err(|e| Error::io_during("start the journal's checkpoint thread", e))?;
        *lock(&this.checkpointer.thread) = Some(thread);
        Ok(())
    }

    /// Stops the checkpoint thread and waits for it: a frozen memtable it was given is
    /// written first, and the next inline checkpoint commits it.
    pub(crate) fn stop_checkpointer(&self) {
        let cp = &self.checkpointer;
        {
            let mut s = lock(&cp.shared);
            s.stop = true;
            cp.cv.notify_all();
        }
        if let Some(thread) = lock(&cp.thread).take() {
            let _ = thread.join();
        }
        lock(&cp.shared).running = false;
    }

    /// After a batch, by the leader: commits a prepared checkpoint, or freezes the
    /// memtable for the thread once the log has outgrown the checkpoint size. Without the
    /// thread (or when the memtable outgrows twice the size while one is being written,
    /// so that memory stays bounded on a slow disk) the checkpoint runs here. An error
    /// poisons the handle; the batch just committed is durable in the log either way.
    pub(crate) fn after_batch(&self) {
        if !matches!(self.storage, super::Storage::File) {
            return;
        }
        enum Next {
            Nothing,
            Commit,
            Freeze,
            Inline,
        }
        let next = {
            let s = lock(&self.checkpointer.shared);
            match s.step {
                Step::Prepared(_) => Next::Commit,
                // Only the holder of the leader role commits: not seen here.
                Step::Committing => Next::Nothing,
                Step::Writing if self.checkpoint_due(2) => Next::Inline,
                Step::Writing => Next::Nothing,
                Step::Idle if !self.checkpoint_due(1) => Next::Nothing,
                Step::Idle if s.running && !s.stop => Next::Freeze,
                Step::Idle => Next::Inline,
            }
        };
        let _ = match next {
            Next::Nothing => Ok(()),
            Next::Commit => self.commit_prepared(),
            Next::Freeze => {
                self.freeze();
                Ok(())
            }
            Next::Inline => self.checkpoint(),
        };
    }

    /// Moves the memtable under a new, empty one and hands it to the thread.
    fn freeze(&self) {
        let cp = &self.checkpointer;
        let mut s = lock(&cp.shared);
        {
            let mut committed = write_lock(&self.committed);
            if committed.frozen.is_some() || committed.mem.is_empty() {
                // A frozen memtable left by a failure (the handle is poisoned), or only the
                // log to start over: the inline checkpoint's case.
                drop(committed);
                drop(s);
                let _ = self.checkpoint();
                return;
            }
            let mem = std::mem::take(&mut committed.mem);
            committed.frozen = Some(Arc::new(mem));
        }
        s.step = Step::Writing;
        cp.cv.notify_all();
    }

    /// The thread's part: writes the frozen memtable into a new redb write transaction.
    fn prepare(&self) {
        let frozen = read_lock(&self.committed).frozen.clone();
        let written = crate::preflight::guarded("checkpoint", || {
            let frozen = frozen.ok_or_else(|| Error::new(ErrorKind::Storage))?;
            let db = self.db()?;
            let mut txn = db.begin_write()?;
            // Quick repair: see the inline checkpoint.
            txn.set_quick_repair(self.cfg.quick_repair);
            index::checkpoint(&txn, &frozen)?;
            Ok(txn)
        });
        let cp = &self.checkpointer;
        let mut s = lock(&cp.shared);
        s.step = match written {
            Ok(txn) => Step::Prepared(txn),
            Err(_e) => {
                crate::trace_event!(WARN, error = %_e, "checkpoint failed");
                // The frozen memtable stays for reads; the log holds it for the next open.
                self.poisoned.store(true, Ordering::SeqCst);
                Step::Idle
            }
        };
        cp.cv.notify_all();
    }

    /// Commits a prepared checkpoint, if there is one. Called with the leader role held.
    pub(crate) fn commit_prepared(&self) -> Result<()> {
        let txn = {
            let mut s = lock(&self.checkpointer.shared);
            match std::mem::replace(&mut s.step, Step::Committing) {
                Step::Prepared(txn) => txn,
                other => {
                    s.step = other;
                    return Ok(());
                }
            }
        };
        let r = self
            .check_writable()
            .and_then(|()| self.checkpoint_with(Some(txn)));
        if r.is_err() {
            self.poisoned.store(true, Ordering::SeqCst);
        }
        lock(&self.checkpointer.shared).step = Step::Idle;
        self.checkpointer.cv.notify_all();
        r
    }

    /// Waits until no frozen memtable is being written, and takes a prepared transaction
    /// if there is one: an inline checkpoint (with the leader role held) commits it with
    /// the memtable.
    pub(crate) fn settle_checkpoint(&self) -> Option<redb::WriteTransaction> {
        let cp = &self.checkpointer;
        let mut s = lock(&cp.shared);
        while matches!(s.step, Step::Writing) {
            s = cp.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        match std::mem::take(&mut s.step) {
            Step::Prepared(txn) => Some(txn),
            other => {
                s.step = other;
                None
            }
        }
    }
}

/// The thread: writes each frozen memtable into a transaction, then commits it if the
/// leader role is free (an idle journal); while callers hold the role, the leader commits
/// it after its batch. It never waits for the role, so a leader that waits for its write
/// (see [`Inner::settle_checkpoint`]) always gets it. On `stop` it ends once no frozen
/// memtable is waiting to be written (a prepared transaction is committed by the closing
/// checkpoint). Holds the journal only while it works, so that dropping the journal's
/// last handle is not kept waiting.
fn run(cp: &Checkpointer, journal: &Weak<Inner>) {
    /// How long a prepared checkpoint waits before the thread tries the role again.
    const RETRY: std::time::Duration = std::time::Duration::from_millis(2);
    loop {
        let write = {
            let mut s = lock(&cp.shared);
            loop {
                #[cfg(test)]
                let held = s.held;
                #[cfg(not(test))]
                let held = false;
                match s.step {
                    Step::Writing if !held => break true,
                    _ if s.stop => return,
                    Step::Prepared(_) => break false,
                    _ => s = cp.cv.wait(s).unwrap_or_else(|e| e.into_inner()),
                }
            }
        };
        let Some(inner) = journal.upgrade() else {
            return;
        };
        if write {
            inner.prepare();
        } else if inner.try_exclusive(|| inner.commit_prepared()).is_none() {
            drop(inner);
            let s = lock(&cp.shared);
            if matches!(s.step, Step::Prepared(_)) {
                drop(cp.cv.wait_timeout(s, RETRY));
            }
        }
    }
}

#[cfg(test)]
impl Inner {
    /// Holds (or releases) the thread before it writes the next frozen memtable.
    pub(crate) fn hold_checkpointer(&self, held: bool) {
        let mut s = lock(&self.checkpointer.shared);
        s.held = held;
        self.checkpointer.cv.notify_all();
    }

    /// Whether a frozen memtable waits for, or is being written by, the thread.
    pub(crate) fn checkpoint_in_flight(&self) -> bool {
        !matches!(lock(&self.checkpointer.shared).step, Step::Idle)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::{Admission, Intent, Journal, Operation, Outcome};

    fn lifecycle(journal: &Journal, i: usize) {
        let intent = Intent::from_json("t.set", &serde_json::json!({ "i": i })).expect("intent");
        let op = Operation::new(format!("op-{i:05}"), intent);
        let Ok(Admission::Fresh(claim)) = journal.submit(op) else {
            panic!("op-{i:05} was not fresh");
        };
        journal
            .complete(&claim, Outcome::applied(1, vec![b'r'; 200]))
            .expect("complete");
    }

    fn replayed(journal: &Journal, i: usize) -> bool {
        let intent = Intent::from_json("t.set", &serde_json::json!({ "i": i })).expect("intent");
        matches!(
            journal.submit(Operation::new(format!("op-{i:05}"), intent)),
            Ok(Admission::Replay(r)) if r.result.bytes == vec![b'r'; 200]
        )
    }

    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "timed out: {what}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The point of the thread: while it writes a frozen memtable into redb (held here
    /// before it starts), calls commit and every operation reads back, from the new
    /// memtable and the frozen one; once it goes on, the checkpoint commits with the
    /// changes logged meanwhile, and a reopen finds everything.
    #[test]
    fn commits_go_on_while_a_checkpoint_writes_the_index_and_nothing_is_lost() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j.opj");
        let journal = Journal::builder()
            .checkpoint_size(64 << 10)
            .open(&path)
            .expect("open");
        journal.inner.hold_checkpointer(true);
        let mut n = 0;
        while !journal.inner.checkpoint_in_flight() {
            lifecycle(&journal, n);
            n += 1;
            assert!(n < 5_000, "no checkpoint was due after {n} lifecycles");
        }
        let frozen_at = n;
        assert!(
            crate::journal::reads::read_lock(&journal.inner.committed)
                .frozen
                .is_some(),
            "a checkpoint in flight has a frozen memtable"
        );
        // The thread is held: these commits do not wait for it.
        for _ in 0..10 {
            lifecycle(&journal, n);
            n += 1;
        }
        assert!(journal.inner.checkpoint_in_flight(), "the thread was held");
        for i in 0..n {
            assert!(replayed(&journal, i), "op-{i:05} during the checkpoint");
        }
        journal.inner.hold_checkpointer(false);
        wait_until("the checkpoint commits", || {
            !journal.inner.checkpoint_in_flight()
        });
        {
            let committed = crate::journal::reads::read_lock(&journal.inner.committed);
            assert!(committed.frozen.is_none() && committed.mem.is_empty());
        }
        for i in 0..n {
            assert!(replayed(&journal, i), "op-{i:05} after the checkpoint");
        }
        lifecycle(&journal, n);
        n += 1;
        drop(journal);
        let journal = Journal::open(&path).expect("reopen");
        for i in 0..n {
            assert!(replayed(&journal, i), "op-{i:05} after reopening");
        }
        assert!(frozen_at > 0 && n > frozen_at + 10);
    }

    /// A crash while the thread writes (the journal's redb file unchanged, its log holding
    /// everything): what the log held is recovered. The handle is forgotten, not closed,
    /// and the files are copied while it is held, as a kill leaves them.
    #[test]
    fn a_crash_during_a_checkpoint_in_progress_recovers_everything_from_the_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j.opj");
        let journal = Journal::builder()
            .checkpoint_size(64 << 10)
            .open(&path)
            .expect("open");
        journal.inner.hold_checkpointer(true);
        let mut n = 0;
        while !journal.inner.checkpoint_in_flight() {
            lifecycle(&journal, n);
            n += 1;
        }
        for _ in 0..5 {
            lifecycle(&journal, n);
            n += 1;
        }
        // Copy the journal's files as they are now: what a kill would leave.
        let copy = dir.path().join("copy");
        std::fs::create_dir(&copy).expect("mkdir");
        for entry in std::fs::read_dir(dir.path()).expect("read_dir") {
            let entry = entry.expect("entry");
            if entry.file_type().expect("type").is_file() {
                std::fs::copy(entry.path(), copy.join(entry.file_name())).expect("copy");
            }
        }
        journal.inner.hold_checkpointer(false);
        drop(journal);
        let journal = Journal::open(copy.join("j.opj")).expect("reopen the copy");
        for i in 0..n {
            assert!(replayed(&journal, i), "op-{i:05} after the crash");
        }
    }
}
