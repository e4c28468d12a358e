//! The thread that writes a file journal's checkpoints into redb.
//!
//! A checkpoint's write transaction allocates tens of MiB of page buffers for a log of a
//! few MiB, and glibc keeps freed memory in the malloc arena of the thread that allocated it.
//! Run by whichever caller led the batch, the buffers left a copy in every caller's arena
//! (128 MiB of resident memory over 1,000,000 lifecycles on 8 threads, against 45 MiB with
//! one arena). A short thread per checkpoint fixed that only while no caller thread
//! exited: glibc hands a new thread the arena freed last, so after a caller thread ended,
//! the next checkpoint's thread took that caller's arena and grew it by another copy
//! (about +15 MiB at the end of a session). One long-lived thread per journal always
//! allocates in its own arena.
//!
//! The thread starts at the first checkpoint and ends when the journal is dropped (its
//! queue closes). A job owns what it writes (the database and the memtables, shared by
//! `Arc`) and drops it before answering, so the caller gets them back unshared. Jobs run in
//! the order they were queued: one that is waited for ([`Checkpointer::run`]) runs after
//! every job queued before it, such as a checkpoint committing beside the next cycle
//! ([`Checkpointer::start`]).

use std::sync::{Arc, Mutex, mpsc};

use super::pacing::Pace;
use crate::error::{Error, Result};
use crate::trace;

type Work = Box<dyn FnOnce() -> Result<()> + Send>;

struct Job {
    work: Work,
    /// The caller's subscriber and span, so the checkpoint's events are the caller's.
    context: trace::Context,
    reply: mpsc::SyncSender<std::thread::Result<Result<()>>>,
}

/// A journal's checkpoint thread (see the module's documentation).
#[derive(Default)]
pub(crate) struct Checkpointer {
    /// The thread's queue; `None` before the first checkpoint, or after the thread could
    /// not be started (then checkpoints run on the caller's thread).
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    /// The pacing of the commits on the thread, shared with redb's backend (see
    /// [`super::pacing`]): whoever waits for the thread hurries it.
    pace: Arc<Pace>,
}

impl Checkpointer {
    /// A checkpointer whose commits are paced by `pace` (the one redb's backend reads).
    pub(crate) fn with_pace(pace: Arc<Pace>) -> Checkpointer {
        Checkpointer {
            jobs: Mutex::default(),
            pace,
        }
    }

    /// The pacing of this thread's commits.
    pub(crate) fn pace(&self) -> &Arc<Pace> {
        &self.pace
    }

    /// Queues `work` on the checkpoint thread (starting it if needed) and returns at once:
    /// for work whose outcome nobody waits for (a checkpoint beside the next cycle, which
    /// poisons the handle itself if it fails). Without a thread it runs here.
    pub(crate) fn start(&self, work: impl FnOnce() -> Result<()> + Send + 'static) {
        // The answer, and a panic's payload, are dropped with the receiver.
        let (reply, _answer) = mpsc::sync_channel(1);
        let job = Job {
            work: Box::new(work),
            context: trace::Context::capture(),
            reply,
        };
        let unsent = {
            let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
            if jobs.is_none() {
                *jobs = spawn();
            }
            match jobs.as_ref() {
                Some(tx) => tx.send(job).err().map(|mpsc::SendError(job)| {
                    // The thread is gone: start a new one next time.
                    *jobs = None;
                    job
                }),
                None => Some(job),
            }
        };
        if let Some(job) = unsent {
            // Its outcome is its own business (it poisons the handle if it fails); a panic
            // is caught as the thread would catch it. Run by the caller, it is not paced:
            // the caller's own calls wait for it.
            let _waiting = self.pace.waiting();
            let work = job.work;
            let _ =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.context.run(work)));
        }
    }

    /// Waits until the jobs queued so far have ended (their answers are theirs), if the
    /// thread was ever started.
    pub(crate) fn wait_idle(&self) {
        let _waiting = self.pace.waiting();
        let started = self
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if started {
            let _ = self.run(|| Ok(()));
        }
    }

    /// Runs `work` on the checkpoint thread (starting it if needed) and waits for its
    /// answer. If no thread can be started, runs it on this one. A panic in `work` (redb's,
    /// on damaged data) goes on in this thread, whose panic guard answers it as it would
    /// had `work` run here.
    ///
    /// # Errors
    ///
    /// What `work` answers.
    pub(crate) fn run(&self, work: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
        // The caller waits for the jobs queued before this one too.
        let _waiting = self.pace.waiting();
        let (reply, answer) = mpsc::sync_channel(1);
        let job = Job {
            work: Box::new(work),
            context: trace::Context::capture(),
            reply,
        };
        let sent = {
            let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
            if jobs.is_none() {
                *jobs = spawn();
            }
            match jobs.as_ref() {
                Some(tx) => tx.send(job).map_err(|mpsc::SendError(job)| {
                    // The thread is gone (it cannot be, while the journal holds its
                    // queue): run here, and start a new one next time.
                    *jobs = None;
                    job
                }),
                None => Err(job),
            }
        };
        if let Err(job) = sent {
            return job.context.run(job.work);
        }
        match answer.recv() {
            Ok(Ok(answer)) => answer,
            Ok(Err(payload)) => std::panic::resume_unwind(payload),
            // The thread catches every panic and always answers; without an answer the
            // checkpoint's outcome is unknown, which poisons the handle like a failure.
            Err(_) => Err(Error::io_during(
                "write a checkpoint",
                std::io::Error::other("the checkpoint thread ended without answering"),
            )),
        }
    }
}

fn spawn() -> Option<mpsc::Sender<Job>> {
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("opjournal-checkpoint".into())
        .spawn(move || {
            while let Ok(Job {
                work,
                context,
                reply,
            }) = rx.recv()
            {
                let outcome =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| context.run(work)));
                // What the job held is dropped before the caller is answered (the context
                // holds the caller's span only with the `tracing` feature).
                #[allow(clippy::drop_non_drop)]
                drop(context);
                let _ = reply.send(outcome);
            }
        })
        .ok()
        .map(|_| tx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread::ThreadId;

    fn thread_of(c: &Checkpointer) -> ThreadId {
        let seen = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&seen);
        c.run(move || {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current().id());
            Ok(())
        })
        .unwrap_or_else(|e| panic!("the job answers Ok: {e}"));
        let id = seen.lock().unwrap_or_else(|e| e.into_inner()).take();
        id.unwrap_or_else(|| panic!("the job ran"))
    }

    #[test]
    fn every_checkpoint_runs_on_one_long_lived_thread_apart_from_the_callers() {
        let c = Checkpointer::default();
        let first = thread_of(&c);
        assert_ne!(first, std::thread::current().id());
        let from_other_callers: Vec<ThreadId> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3).map(|_| s.spawn(|| thread_of(&c))).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| panic!("a caller panicked")))
                .collect()
        });
        assert_eq!(from_other_callers, vec![first; 3]);
        assert_eq!(thread_of(&c), first, "after the callers' threads ended");
    }

    #[test]
    fn a_job_drops_what_it_owns_before_the_caller_is_answered() {
        let c = Checkpointer::default();
        let shared = Arc::new(vec![0u8; 16]);
        let job_copy = Arc::clone(&shared);
        c.run(move || {
            assert_eq!(job_copy.len(), 16);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("the job answers Ok: {e}"));
        assert_eq!(
            Arc::strong_count(&shared),
            1,
            "the caller's copy is unshared"
        );
    }

    #[test]
    fn a_panicking_job_panics_in_the_caller_and_the_thread_takes_the_next_job() {
        let c = Checkpointer::default();
        let before = thread_of(&c);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            c.run(|| panic!("damaged page"))
        }));
        let payload = caught
            .err()
            .unwrap_or_else(|| panic!("the panic reached the caller"));
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"damaged page"));
        assert_eq!(thread_of(&c), before);
        let err = c
            .run(|| Err(Error::invalid("x", "y", "z")))
            .err()
            .unwrap_or_else(|| panic!("the job's error is answered"));
        assert!(err.to_string().contains('z'), "{err}");
    }
}
